"""SIGTERM / SIGINT stop a LLaMA-Factory stage after the step under way and keep it
(``mmoa.train.save_on_stop``): the callback's decisions on hand-made states, then a real SFT
run of the tiny model stopped by SIGTERM and resumed from the checkpoint it saved."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import TrainerControl

from mmoa.train.save_on_stop import SaveOnStop
from mmoa.train.stop import StopRequest
from tests.test_train_equivalence import SFT_YAML, _write_alpaca

ROOT = Path(__file__).resolve().parents[1]


def _callback(signum: int | None) -> SaveOnStop:
    stop = StopRequest()
    stop.signum = signum
    return SaveOnStop(stop)


def test_no_signal_changes_nothing() -> None:
    control = TrainerControl()
    args, state = SimpleNamespace(output_dir="out"), SimpleNamespace(global_step=3, max_steps=9)
    callback = _callback(None)
    callback.on_train_begin(args, state, control)
    callback.on_step_end(args, state, control)
    callback.on_save(args, state, control)
    assert not control.should_save and not control.should_training_stop


def test_a_signal_saves_the_step_then_exits_with_128_plus_it() -> None:
    control = TrainerControl()
    args, state = SimpleNamespace(output_dir="out"), SimpleNamespace(global_step=3, max_steps=9)
    callback = _callback(int(signal.SIGTERM))
    callback.on_step_end(args, state, control)
    assert control.should_save and control.should_training_stop
    with pytest.raises(SystemExit) as stopped:
        callback.on_save(args, state, control)
    assert stopped.value.code == 143


def test_a_signal_before_the_first_step_exits_at_once() -> None:
    with pytest.raises(SystemExit) as stopped:
        _callback(int(signal.SIGINT)).on_train_begin(SimpleNamespace(), SimpleNamespace(),
                                                     TrainerControl())
    assert stopped.value.code == 130


def _command(model: Path, data: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "mmoa.cli", "train", str(SFT_YAML),
            f"model_name_or_path={model}", "dataset=tiny_qa", f"dataset_dir={data}",
            f"output_dir={out}", "logging_steps=1", "save_strategy=steps", "save_steps=1000000",
            "save_only_model=false",
            "per_device_train_batch_size=2", "gradient_accumulation_steps=1", "cutoff_len=128",
            "preprocessing_num_workers=1", "warmup_ratio=0.0", "report_to=none", *extra]


def _logged_steps(out: Path) -> int:
    log = out / "trainer_log.jsonl"
    return len(log.read_text().splitlines()) if log.is_file() else 0


@pytest.mark.slow
def test_sigterm_keeps_the_last_step_and_the_rerun_resumes_from_it(
        tiny_model_dir: Path, tiny_world_dir: Path, tmp_path: Path) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    _write_alpaca(tiny_world_dir, data)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "LLAMAFACTORY_VERBOSITY": "WARN",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "LLaMA-Factory" / "src"),
                                          os.environ.get("PYTHONPATH", "")])}
    # far more steps than the test waits for: only the signal ends this run
    run = subprocess.Popen(_command(tiny_model_dir, data, out, "max_steps=100000"),
                           cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while _logged_steps(out) < 2 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run.poll() is None, run.communicate()[1][-3000:]
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    checkpoints = sorted(out.glob("checkpoint-*"))
    assert len(checkpoints) == 1, stderr[-3000:]  # no save_steps reached: the stop's own save
    step = int(checkpoints[0].name.split("-")[1])
    assert 2 <= step < 100000
    state = json.loads((checkpoints[0] / "trainer_state.json").read_text())
    assert state["global_step"] == step
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt"} <= {
        p.name for p in checkpoints[0].iterdir()}
    assert f"SIGTERM received: stopped after step {step} of 100000" in stderr
    assert not (out / "model.safetensors").exists()  # an interrupted run never looks finished

    done = subprocess.run(_command(tiny_model_dir, data, out, f"max_steps={step + 2}",
                                   f"resume_from_checkpoint={checkpoints[0]}",
                                   "overwrite_output_dir=false"),
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == step + 2
    assert (out / "model.safetensors").is_file()
