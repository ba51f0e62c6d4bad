"""Reading a training config file (``CONFIG.yaml [key=value ...]``) as LLaMA-Factory reads it.

Below the launcher and the stages' workflows, so that a stage that reads a second config (the
joint MAPPO option reads the ``retriever_rl`` config it names) does not import the launcher,
which imports every stage (that was an import cycle).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class TrainConfigError(ValueError):
    """The config file or an override cannot be read."""


def read_train_config(argv: Sequence[str]) -> dict[str, Any]:
    """The merged config (file + ``key=value`` overrides) exactly as LLaMA-Factory reads it."""
    from omegaconf import OmegaConf

    if not argv:
        raise TrainConfigError("usage: mmoa-cli train CONFIG.yaml [key=value ...]")
    path = Path(argv[0])
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise TrainConfigError(f"{path}: expected a .yaml, .yml or .json config file")
    if not path.is_file():
        raise TrainConfigError(f"{path}: config file not found")
    for override in argv[1:]:
        if "=" not in override:  # OmegaConf reads a bare "key" as key: null, a crash later
            raise TrainConfigError(f"override {override!r}: expected key=value")
    try:
        if path.suffix == ".json":
            base = OmegaConf.create(json.loads(path.read_text(encoding="utf-8")))
        else:
            base = OmegaConf.load(path.absolute())
        overrides = OmegaConf.from_cli(list(argv[1:]))
        merged = OmegaConf.to_container(OmegaConf.merge(base, overrides))
    except Exception as err:  # OmegaConf raises several unrelated types
        # one line: YAML errors span several ("while parsing ...\n  in file, line 2, ...")
        detail = "; ".join(line.strip() for line in str(err).splitlines() if line.strip())
        raise TrainConfigError(f"{path}: cannot read the config ({detail})") from err
    if not isinstance(merged, dict):
        raise TrainConfigError(f"{path}: the config must be a mapping of keys to values")
    return merged
