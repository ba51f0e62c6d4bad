"""What the tests of the bench scripts share (the scripts themselves live in bench/)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"
#: ``bench/side_by_side.py`` overrides that cut its trainings to 2 CPU cores on the tiny model
#: (the tiny configs' other values stand).
SIDE_BY_SIDE_TINY_OVERRIDES = [
    "sft.max_steps=2", "sft.preprocessing_num_workers=1", "mappo.max_steps=1",
    "mappo.ppo_epochs=1", "mappo.mappo_questions_per_rollout=2",
    "mappo.mappo_rollout_batch_size=2", "mappo.per_device_train_batch_size=2",
    "mappo.save_steps=1"]


def write_hotpotqa_slice(source: Path, prefix: str, sizes: dict[str, int],
                         out: Path) -> dict[str, Path]:
    """The first ``sizes[split]`` records of each split's ``{prefix}_{split}.json`` in
    ``source`` (an official HotpotQA folder: one JSON list a split), written to ``out`` in the
    same layout: the real-data tests' slice, under pytest's tmp_path, so that nothing of the data
    is copied into the repository. Returns ``{split: path}``."""
    out.mkdir(parents=True)
    paths = {}
    for split, n in sizes.items():
        name = f"{prefix}_{split}.json"
        records = json.loads((source / name).read_text(encoding="utf-8"))[:n]
        (out / name).write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
        paths[split] = out / name
    return paths


class HandClock:
    """A monotonic clock the test moves by hand (``clock.now += seconds``), for
    ``bench_runs.AttemptClock``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def import_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as the top-level module ``name``, as the scripts import
    each other (``bench/`` first on ``sys.path``): one module object for the test and the
    siblings that import it, unlike :func:`load_bench`'s fresh copy."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


def load_bench(name: str) -> ModuleType:
    """The bench script ``bench/<name>.py`` as a module (the scripts import their shared
    helpers, ``bench/bench_runs.py`` and each other, as top-level sibling modules). Registered in
    ``sys.modules`` under ``name``, as an import of it from a sibling would be, so that its
    dataclasses can look their module up."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
