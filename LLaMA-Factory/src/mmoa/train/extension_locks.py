"""Stale build locks of PyTorch C++ extensions, which make DeepSpeed wait forever.

DeepSpeed compiles some of its ops when a run first needs them (on CPU, the shared-memory
all-reduce ``deepspeed_shm_comm``) with ``torch.utils.cpp_extension.load``. The build holds a
``lock`` file in the op's build folder; a build killed midway (Ctrl-C, a killed job, a machine
out of memory) leaves the file behind, and every later run then waits for it in a silent loop,
with no timeout and no message. That is how a two-process ZeRO run hangs at start-up after one
interrupted run.

:func:`clear_stale_extension_locks` removes such locks before a DeepSpeed run starts: a lock is
stale when no process is building in its folder (torch runs ``ninja`` with the build folder as
its working directory) and it is older than a build's first moments.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable
from pathlib import Path

#: A lock this young may belong to a build that is writing ``build.ninja`` and has not started
#: ``ninja`` yet: never removed.
MIN_AGE_S = 120.0
#: Without ``/proc`` (not Linux) nobody can be seen building: only locks older than the longest
#: plausible build are removed.
MIN_AGE_WITHOUT_PROC_S = 3600.0


def extension_build_root() -> Path:
    """Where torch builds extensions: ``TORCH_EXTENSIONS_DIR`` (one folder per op), else its
    default under ~/.cache (one folder per Python/accelerator tag, then one per op)."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def _working_directories() -> set[Path] | None:
    """Every process's working directory (those we may read); None without ``/proc``."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    folders = set()
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                folders.add(Path(os.readlink(entry / "cwd")))
            except OSError:  # gone, or another user's process
                continue
    return folders


def stale_locks(root: Path, now: float | None = None,
                working_directories: Iterable[Path] | None = None) -> list[Path]:
    """The ``lock`` files of the op folders under ``root`` (directly, or under a Python /
    accelerator tag folder) that no running build owns. ``working_directories`` defaults to
    every process's (``/proc``), read only when some lock is old enough to be stale."""
    now = time.time() if now is None else now
    can_see_builds = working_directories is not None or Path("/proc").is_dir()
    min_age = MIN_AGE_S if can_see_builds else MIN_AGE_WITHOUT_PROC_S
    old = []
    for lock in sorted([*root.glob("*/lock"), *root.glob("*/*/lock")]):
        try:
            if now - lock.stat().st_mtime >= min_age:
                old.append(lock)
        except FileNotFoundError:  # released meanwhile
            continue
    if not old:
        return []
    if working_directories is None:
        working_directories = _working_directories() or set()
    busy = {Path(folder).resolve() for folder in working_directories}
    return [lock for lock in old if lock.parent.resolve() not in busy]


def clear_stale_extension_locks(root: Path | None = None) -> list[Path]:
    """Removes the stale build locks under ``root`` (default: torch's build root), saying so
    on stderr; returns the removed paths."""
    root = extension_build_root() if root is None else root
    removed = []
    for lock in stale_locks(root) if root.is_dir() else []:
        try:
            lock.unlink()
        except FileNotFoundError:
            continue
        removed.append(lock)
        print(f"[mmoa] removed a stale build lock left by an interrupted build: {lock}",
              file=sys.stderr, flush=True)
    return removed
