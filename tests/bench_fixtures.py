"""What the tests of the bench scripts share (the scripts themselves live in bench/)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


class HandClock:
    """A monotonic clock the test moves by hand (``clock.now += seconds``), for
    ``bench_runs.AttemptClock``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


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
