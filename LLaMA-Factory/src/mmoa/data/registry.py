"""LLaMA-Factory's dataset registry (``dataset_info.json``): resolving and registering entries.

LLaMA-Factory finds training data by name in ``<dataset_dir>/dataset_info.json``. Our SFT data
is registered there in its Alpaca formatting; our QA sets (the MAPPO prompt set, evaluation
splits) are registered there too, with an extra ``mmoa_format`` key naming the loader in
:mod:`mmoa.data.loaders`, so one registry serves ``mmoa-cli train``, MAPPO and evaluation.
Updates rewrite the file atomically and keep every entry they do not touch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mmoa.data.records import QARecord
from mmoa.fileio import DataFormatError, atomic_write_json, read_utf8_text

DATASET_INFO = "dataset_info.json"


def read_dataset_info(dataset_dir: str | Path) -> dict[str, Any]:
    path = Path(dataset_dir) / DATASET_INFO
    if not path.exists():
        return {}
    try:
        info = json.loads(read_utf8_text(path))
    except json.JSONDecodeError as err:
        raise DataFormatError(f"{path}: invalid JSON at line {err.lineno} ({err.msg})") from err
    if not isinstance(info, dict):
        raise DataFormatError(f"{path}: expected a JSON object of dataset entries")
    return info


def register_datasets(dataset_dir: str | Path, entries: dict[str, dict[str, Any]]) -> Path:
    """Adds or replaces ``entries`` in ``dataset_info.json``; other entries are kept as they are."""
    info = read_dataset_info(dataset_dir)
    for name, entry in entries.items():
        if "file_name" not in entry:
            raise ValueError(f"dataset entry {name!r} needs a 'file_name'")
        info[name] = entry
    path = Path(dataset_dir) / DATASET_INFO
    atomic_write_json(path, info)
    return path


def resolve_dataset(name: str, dataset_dir: str | Path) -> tuple[Path, str]:
    """``(file path, loader format)`` of a registered dataset; a clear error if it is unknown."""
    info = read_dataset_info(dataset_dir)
    registry = Path(dataset_dir) / DATASET_INFO
    if name not in info:
        known = ", ".join(sorted(info)) or "none"
        raise KeyError(f"dataset {name!r} is not registered in {registry} (registered: {known})")
    entry = info[name]
    if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
        raise DataFormatError(f"{registry}: entry {name!r} has no string 'file_name'")
    path = Path(dataset_dir) / entry["file_name"]
    if not path.exists():
        raise FileNotFoundError(f"dataset {name!r}: {path} (from {registry}) does not exist")
    return path, str(entry.get("mmoa_format", "auto"))


def load_dataset_records(
    dataset: str | None,
    dataset_dir: str | Path,
    data_file: str | Path | None,
    data_format: str = "auto",
    max_samples: int | None = None,
    ambigqa_answers: str | None = None,
) -> list[QARecord]:
    """QA records from exactly one of a registered ``dataset`` name or a ``data_file``.

    ``ambigqa_answers`` is the gold answer set of an AmbigQA file (``None``: the loader's
    default, the paper's ``nq_answer``; see :mod:`mmoa.data.loaders`).
    """
    from mmoa.data.loaders import DEFAULT_AMBIGQA_ANSWERS, load_qa

    if (dataset is None) == (data_file is None):
        raise ValueError("give exactly one of --dataset (a registered name) or --data_file")
    if dataset is not None:
        path, fmt = resolve_dataset(dataset, dataset_dir)
    else:
        path, fmt = Path(data_file), data_format  # type: ignore[arg-type]
    return load_qa(path, fmt, max_samples=max_samples,
                   ambigqa_answers=ambigqa_answers or DEFAULT_AMBIGQA_ANSWERS)
