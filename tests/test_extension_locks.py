"""Stale build locks of torch extensions: found, kept while a build runs, removed before a
DeepSpeed MAPPO run (a leftover lock made every later ZeRO run wait forever)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from mmoa.train.extension_locks import MIN_AGE_S, clear_stale_extension_locks, stale_locks


def _lock(root: Path, op: str, age_s: float) -> Path:
    """A lock in torch's default layout (a Python / accelerator tag folder, then the op's)."""
    folder = root / "py311_cpu" / op
    folder.mkdir(parents=True)
    lock = folder / "lock"
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_old_locks_without_a_build_are_stale_and_others_are_kept(tmp_path: Path) -> None:
    old = _lock(tmp_path, "deepspeed_shm_comm", MIN_AGE_S + 60)
    young = _lock(tmp_path, "cpu_adam", MIN_AGE_S - 60)
    building = _lock(tmp_path, "fused_adam", 3 * MIN_AGE_S)
    (tmp_path / "py311_cpu" / "unlocked").mkdir()
    found = stale_locks(tmp_path, working_directories=[building.parent])
    assert found == [old]
    assert young.exists() and building.exists()


def test_a_running_build_in_the_folder_keeps_its_lock(tmp_path: Path) -> None:
    """Seen through /proc: a process whose working directory is the build folder."""
    lock = _lock(tmp_path, "deepspeed_shm_comm", MIN_AGE_S + 60)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                          cwd=lock.parent) as builder:
        try:
            assert clear_stale_extension_locks(tmp_path) == []
            assert lock.exists()
        finally:
            builder.kill()
    assert clear_stale_extension_locks(tmp_path) == [lock]
    assert not lock.exists()


def test_a_deepspeed_mappo_run_clears_a_stale_lock_first(tmp_path: Path) -> None:
    """The launcher clears locks before anything else (here the run then stops at its
    pre-flight check: no dataset, no server); a left lock would make DeepSpeed wait forever."""
    # TORCH_EXTENSIONS_DIR set: the op folders lie directly under it
    lock = _lock(tmp_path, "deepspeed_shm_comm", MIN_AGE_S + 60)
    extensions = lock.parents[1]
    model = tmp_path / "model"
    model.mkdir()
    config = {"stage": "mappo", "model_name_or_path": str(model), "dataset": "x",
              "deepspeed": "ds_z2_config.json", "output_dir": str(tmp_path / "out")}
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions)}
    result = subprocess.run([sys.executable, "-m", "mmoa.cli", "train", str(path)], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert not lock.exists(), result.stderr
    assert "removed a stale build lock" in result.stderr
