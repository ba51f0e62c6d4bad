"""MAPPO end to end: the tiny model against the live demo server for 3 steps writes
checkpoints, trainer_log.jsonl and plots; a run resumed from step 2 matches the
uninterrupted one. Also the start-up checks (retriever down, dataset without answers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from mmoa.train.mappo.workflow import run_mappo, run_mappo_from_config
from tests.mappo_fixtures import start_two_processes
from tests.mappo_fixtures import tiny_mappo_config as _config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def full_run(tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    from mmoa.train.mappo.trainer import MappoTrainer

    out = tmp_path_factory.mktemp("mappo") / "run"
    save = MappoTrainer.save_mappo_checkpoint
    writes: list[int] = []

    mtimes: dict[Path, int] = {}

    def counted_save(self: MappoTrainer, learner: Any) -> Path:
        folder = save(self, learner)
        if folder.stat().st_mtime_ns != mtimes.get(folder):  # a new or a replaced folder
            writes.append(self.state.global_step)
        mtimes[folder] = folder.stat().st_mtime_ns
        return folder

    MappoTrainer.save_mappo_checkpoint = counted_save  # type: ignore[method-assign]
    try:
        run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                          **REWARDED))
    finally:
        MappoTrainer.save_mappo_checkpoint = save  # type: ignore[method-assign]
    CHECKPOINT_WRITES[:] = writes
    return out


#: ``full_run``'s Generator penalty for answers over two words: it makes the tiny model's rewards,
#: and so its losses, depend on what it sampled (without it every reward is 0), so that a resumed
#: or interrupted run compared with ``full_run`` shows a wrong random state. Every run resumed
#: from or compared with ``full_run`` has it too.
REWARDED = {"mappo_generator_max_words": 2}
#: The steps whose checkpoint folder ``full_run`` (re)wrote, in order.
CHECKPOINT_WRITES: list[int] = []


def _log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]


def test_three_steps_write_checkpoints_logs_and_plots(full_run: Path) -> None:
    for step in (1, 2, 3):
        checkpoint = full_run / f"checkpoint-{step}"
        for name in ("model.safetensors", "value_head.safetensors", "optimizer.pt",
                     "scheduler.pt", "mappo_state.json", "rng_state.pth", "trainer_state.json",
                     "mappo_manifest.json"):
            assert (checkpoint / name).is_file(), f"{checkpoint.name}/{name}"
    for name in ("model.safetensors", "value_head.safetensors", "tokenizer.json",
                 "trainer_state.json", "training_loss.png", "training_reward.png",
                 "training_kl.png", "training_answer_f1.png", "training_agents.png"):
        assert (full_run / name).is_file(), name
    # save_steps 1 and the end of training both ask for checkpoint-3: written once
    assert CHECKPOINT_WRITES == [1, 2, 3]
    log = _log(full_run)
    assert [entry["current_steps"] for entry in log] == [1, 2, 3]
    assert all(entry["total_steps"] == 3 and "loss" in entry and "reward" in entry
               for entry in log)
    history = json.loads((full_run / "trainer_state.json").read_text())["log_history"]
    keys = set(history[0])
    for key in ("reward", "answer_f1", "kl", "kl_coef", "policy_loss", "value_loss", "entropy",
                "clipfrac", "approx_kl", "reward/qr", "reward/selector", "reward/generator",
                "penalty_rate/selector", "response_length/qr", "time/generate",
                "time/retrieve", "time/score", "time/update",
                # per agent: the tiny world's questions name their gold passages
                "selected_gold_recall", "candidate_gold_recall", "answer_words", "drift_flags",
                "empty_selection_probability", "greedy_empty_rate",
                *(f"{stat}/{agent}" for stat in ("kl", "entropy")
                  for agent in ("qr", "selector", "generator"))):
        assert key in keys, key
    assert history[0]["drift_flags"] == 0.0, "the first step is every statistic's baseline"
    # the web UI's log carries the per-agent panels' keys
    assert all("num_selected" in entry and "kl/selector" in entry for entry in log)
    assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6), "policy == reference at step 1"


def test_logged_steps_until_a_checkpoint(tmp_path: Path) -> None:
    from mmoa.train.mappo.workflow import logged_steps_until

    lines = [json.dumps({"current_steps": step, "loss": 0.1 * step}) for step in (1, 2, 3)]
    (tmp_path / "trainer_log.jsonl").write_text("\n".join(lines) + "\n" + '{"current_st')
    kept = logged_steps_until(str(tmp_path), str(tmp_path / "checkpoint-2"))
    assert kept == lines[0] + "\n" + lines[1] + "\n"
    assert logged_steps_until(str(tmp_path), None) is None
    assert logged_steps_until(str(tmp_path / "none"), str(tmp_path / "checkpoint-2")) is None


def test_resumed_run_matches_the_uninterrupted_one(full_run: Path, tiny_model_dir: Path,
                                                   tiny_mappo_data_dir: Path, tiny_server_url: str,
                                                   tmp_path: Path) -> None:
    # Resumed in its own folder (overwrite_output_dir: true, as the demo configs have it),
    # after a run that had got past the checkpoint: the log keeps steps 1-2 once each.
    out = tmp_path / "resumed"
    shutil.copytree(full_run, out, ignore=shutil.ignore_patterns("checkpoint-3"))
    run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                      resume_from_checkpoint=str(out / "checkpoint-2"), **REWARDED))
    assert [entry["current_steps"] for entry in _log(out)] == [1, 2, 3]
    full = json.loads((full_run / "trainer_state.json").read_text())["log_history"]
    resumed = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in resumed] == [1, 2, 3], "history up to step 2 comes along"
    for key in ("reward", "answer_f1", "loss", "policy_loss", "value_loss", "kl", "kl_coef",
                "response_length/qr", "num_selected"):
        assert resumed[-1][key] == pytest.approx(full[-1][key], rel=1e-4, abs=1e-5), key


def test_a_damaged_checkpoint_stops_or_falls_back(full_run: Path, tiny_model_dir: Path,
                                                  tiny_mappo_data_dir: Path,
                                                  tiny_server_url: str, tmp_path: Path,
                                                  capfd, caplog) -> None:
    """A 4 KB block flipped in checkpoint-2's weights: the resume stops before the model loads
    with one line naming the file and the checkpoint (it resumed silently with other weights);
    with mappo_resume_fallback it resumes from checkpoint-1, says so, and the log follows.
    A staging folder of a killed save is removed at the start, with a line saying so."""
    from mmoa.train.mappo.checkpoint_files import MANIFEST_FILE, verify_checkpoint

    out = tmp_path / "run"
    shutil.copytree(full_run, out, ignore=shutil.ignore_patterns("checkpoint-3"))
    assert (out / "checkpoint-2" / MANIFEST_FILE).is_file()
    weights = out / "checkpoint-2" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 4096] = bytes(b ^ 0x01 for b in data[middle: middle + 4096])
    weights.write_bytes(bytes(data))
    config = _config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                     resume_from_checkpoint=str(out / "checkpoint-2"), **REWARDED)
    assert run_mappo_from_config(config) == 1
    errors = [line for line in capfd.readouterr().err.splitlines() if "[mappo] error:" in line]
    assert len(errors) == 1, errors
    assert f"checkpoint {out / 'checkpoint-2'}: model.safetensors does not match" in errors[0]
    assert "mappo_resume_fallback" in errors[0]

    orphan = out / ".checkpoint-3.k2x9_q.tmp"
    orphan.mkdir()
    (orphan / "model.safetensors").write_bytes(b"half a file")
    run_mappo({**config, "mappo_resume_fallback": True})
    assert f"removed {orphan}" in caplog.text and not orphan.exists()
    assert f"resuming from {out / 'checkpoint-1'} instead" in caplog.text
    assert [entry["current_steps"] for entry in _log(out)] == [1, 2, 3]
    resumed = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in resumed] == [1, 2, 3]
    assert verify_checkpoint(out / "checkpoint-2"), "rewritten whole, with a new manifest"


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "scheduler.pt",
                                  "rng_state.pth"])
def test_a_truncated_file_of_a_checkpoint_without_manifest(full_run: Path, tiny_model_dir: Path,
                                                           tiny_mappo_data_dir: Path,
                                                           tiny_server_url: str, tmp_path: Path,
                                                           name: str, capfd, caplog) -> None:
    """A checkpoint saved before manifests resumes with a warning; a file of it cut in half
    stops the run with one line naming the file and the checkpoint (SafetensorError, EOFError
    and unpickling tracebacks, some naming no file)."""
    from mmoa.train.mappo.checkpoint_files import MANIFEST_FILE

    checkpoint = tmp_path / "run" / "checkpoint-2"
    shutil.copytree(full_run / "checkpoint-2", checkpoint)
    (checkpoint / MANIFEST_FILE).unlink(missing_ok=True)  # (before manifests: none there)
    damaged = checkpoint / name
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    config = _config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, tmp_path / "run",
                     resume_from_checkpoint=str(checkpoint), **REWARDED)
    assert run_mappo_from_config(config) == 1
    err = capfd.readouterr().err
    assert f"has no {MANIFEST_FILE}" in caplog.text
    errors = [line for line in err.splitlines() if "[mappo] error:" in line]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert f"checkpoint {checkpoint}: cannot read {name} (" in errors[0]


def test_unreachable_retriever_fails_before_loading_the_model(tiny_mappo_data_dir: Path,
                                                              tmp_path: Path, capsys) -> None:
    config = _config(tmp_path / "no-model-here", tiny_mappo_data_dir, "http://127.0.0.1:9",
                     tmp_path / "out", mappo_retriever_retries=0)
    assert run_mappo_from_config(config) == 1
    err = capsys.readouterr().err
    assert "127.0.0.1:9" in err


def test_dataset_without_answers_is_refused(tmp_path: Path, tiny_server_url: str,
                                            capsys) -> None:
    (tmp_path / "q.jsonl").write_text(json.dumps({"id": "1", "question": "Who?"}) + "\n")
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"noanswers": {"file_name": "q.jsonl", "mmoa_format": "demo"}}))
    config = _config(tmp_path / "no-model-here", tmp_path, tiny_server_url, tmp_path / "out",
                     dataset="noanswers")
    assert run_mappo_from_config(config) == 1
    assert "answers" in capsys.readouterr().err


@pytest.mark.slow
def test_two_processes_under_torchrun(ddp_run: Path) -> None:
    """FORCE_TORCHRUN=1 runs one process per rank (gloo on CPU) to the end: checkpoints and
    one log line per step. (The DeepSpeed tests compare their weights with this run's.)
    With ``save_total_limit: 1`` the main process removed checkpoint-1 after checkpoint-2."""
    log = (ddp_run.parent / "ddp.log").read_text()
    assert "launching 2 MAPPO processes" in log
    assert (ddp_run / "checkpoint-2" / "model.safetensors").is_file()
    assert (ddp_run / "checkpoint-2" / "mappo_manifest.json").is_file()
    assert not (ddp_run / "checkpoint-1").exists()
    assert f"save_total_limit 1: removed {ddp_run / 'checkpoint-1'}" in log
    assert len(_log(ddp_run)) == 2


def test_a_retriever_that_dies_mid_run_saves_and_stops(full_run: Path, tiny_model_dir: Path,
                                                       tiny_mappo_data_dir: Path,
                                                       tiny_index_dir: Path,
                                                       tiny_server_url: str,
                                                       tmp_path: Path) -> None:
    """The server goes away after step 1: step 2's rollout retries once, then the run saves the
    last completed step as it was before step 2's rollout drew its random numbers, and stops
    with a message saying exactly that. Resumed with a server back, the run is the
    uninterrupted one (``full_run``): same losses at steps 2 and 3, same final weights. (Both
    with ``REWARDED``'s Generator penalty, so that the losses depend on what was sampled.)"""
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    from mmoa.train.mappo.trainer import TrainingStopped
    from tests.retrieval_fixtures import running_server

    out = tmp_path / "run"
    with running_server(["--index", str(tiny_index_dir)],
                        log_path=tmp_path / "server.log") as server:

        class StopServerAfterStepOne(TrainerCallback):
            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if state.global_step == 1:
                    server.stop()

        config = _config(tiny_model_dir, tiny_mappo_data_dir, server.url, out,
                         save_steps=100, mappo_retriever_retries=1,
                         mappo_retriever_timeout=5, **REWARDED)
        with pytest.raises(TrainingStopped) as info:
            run_mappo(config, callbacks=[StopServerAfterStepOne()])
    message = str(info.value)
    assert message.startswith("retrieval failed at step 2 after 1 retry: "), message
    assert f"the last completed step (1) is saved in {out / 'checkpoint-1'}" in message
    assert json.loads((out / "checkpoint-1" / "mappo_state.json").read_text())[
        "global_step"] == 1
    # the random state the uninterrupted run had after step 1, not the one step 2's rollout
    # left (its QR generation sampled before retrieval failed)
    saved = torch.load(out / "checkpoint-1" / "rng_state.pth", weights_only=False)
    want = torch.load(full_run / "checkpoint-1" / "rng_state.pth", weights_only=False)
    assert torch.equal(saved["torch"], want["torch"]) and saved["python"] == want["python"]

    run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                      save_steps=100, resume_from_checkpoint=str(out / "checkpoint-1"),
                      **REWARDED))
    full = json.loads((full_run / "trainer_state.json").read_text())["log_history"]
    resumed = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in resumed] == [1, 2, 3]
    for step in (1, 2):
        for key in ("reward", "loss", "policy_loss", "value_loss", "kl"):
            assert resumed[step][key] == pytest.approx(full[step][key], rel=1e-4, abs=1e-5), \
                (step + 1, key)
    expected = load_file(full_run / "model.safetensors")
    got = load_file(out / "model.safetensors")
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.allclose(got[name], tensor, rtol=1e-4, atol=1e-6), name


def test_a_retriever_down_before_the_first_step_saves_nothing(tiny_model_dir: Path,
                                                              tiny_mappo_data_dir: Path,
                                                              tiny_index_dir: Path,
                                                              tmp_path: Path) -> None:
    """Down after the start-up check and before step 1, with no retries: the message says that
    no retry was made and that no checkpoint was written (it claimed both)."""
    from transformers import TrainerCallback

    from mmoa.train.mappo.trainer import TrainingStopped
    from tests.retrieval_fixtures import running_server

    out = tmp_path / "run"
    with running_server(["--index", str(tiny_index_dir)],
                        log_path=tmp_path / "server.log") as server:

        class StopServerAtStart(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any,
                               **kwargs: Any) -> None:
                server.stop()

        config = _config(tiny_model_dir, tiny_mappo_data_dir, server.url, out,
                         mappo_retriever_retries=0, mappo_retriever_timeout=5)
        with pytest.raises(TrainingStopped) as info:
            run_mappo(config, callbacks=[StopServerAtStart()])
    message = str(info.value)
    assert message.startswith("retrieval failed at step 1 after no retry "
                              "(mappo_retriever_retries: 0): "), message
    assert "no checkpoint was written" in message and "after all retries" not in message
    assert not list(out.glob("checkpoint-*"))


def test_retrieval_failure_message_says_what_happened(tmp_path: Path) -> None:
    from mmoa.retrieval.client import RetrieverRequestError, RetrieverUnavailableError
    from mmoa.train.mappo.trainer import retrieval_failure_message

    down = RetrieverUnavailableError("retrieval server at http://x unavailable", attempts=3)
    message = retrieval_failure_message(4, down, 2, tmp_path / "checkpoint-3", 3)
    assert message.startswith("retrieval failed at step 4 after 2 retries: ")
    assert f"(3) is saved in {tmp_path / 'checkpoint-3'}" in message
    assert f"resume_from_checkpoint={tmp_path / 'checkpoint-3'}" in message

    once = RetrieverUnavailableError("down", attempts=1)
    message = retrieval_failure_message(1, once, 0, None, 0)
    assert "no retry (mappo_retriever_retries: 0)" in message
    assert "no checkpoint was written" in message and "saved" not in message

    refused = RetrieverRequestError("http://x/retrieve", 500, "boom")
    message = retrieval_failure_message(2, refused, 5, tmp_path / "checkpoint-1", 1)
    assert "not retried" in message and "retries" not in message
    assert "on another process" in retrieval_failure_message(2, None, 5, None, 0)


@pytest.mark.slow
def test_two_processes_stop_together_when_the_retriever_dies(tiny_model_dir: Path,
                                                             tiny_mappo_data_dir: Path,
                                                             tiny_index_dir: Path,
                                                             tmp_path: Path) -> None:
    """Under torchrun both processes see the failure, save one checkpoint together (each its
    own RNG state) and exit; none is left waiting for the other."""
    import re
    import time

    from tests.retrieval_fixtures import running_server

    out = tmp_path / "ddp"
    with running_server(["--index", str(tiny_index_dir)],
                        log_path=tmp_path / "server.log") as server:
        config = _config(tiny_model_dir, tiny_mappo_data_dir, server.url, out, max_steps=50,
                         save_steps=100, mappo_retriever_retries=1, mappo_retriever_timeout=5)
        proc = start_two_processes(config, tmp_path / "ddp.yaml")
        log = out / "trainer_log.jsonl"
        deadline = time.monotonic() + 400
        while not (log.is_file() and log.read_text().strip()) and proc.poll() is None:
            assert time.monotonic() < deadline, "step 1 never finished"
            time.sleep(0.5)
        server.stop()
        stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode != 0, stdout[-2000:]
    # The server stops a few seconds after step 1: the run fails at whichever step came next.
    found = re.search(r"retrieval failed at step (\d+) .*the last completed step \((\d+)\)",
                      stderr)
    assert found, stderr[-3000:]
    failed, saved = int(found.group(1)), int(found.group(2))
    assert failed == saved + 1 and saved >= 1
    checkpoint = out / f"checkpoint-{saved}"
    for name in ("model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"):
        assert (checkpoint / name).is_file(), name


def test_sigterm_saves_the_step_and_exits_unfinished(tiny_model_dir: Path,
                                                     tiny_mappo_data_dir: Path,
                                                     tiny_server_url: str, tmp_path: Path) -> None:
    """SIGTERM: the step under way is finished and saved, no final model is written (the run is
    not complete) and the exit code is 143, so that a scheduler sees an interrupted job."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    out = tmp_path / "run"
    config = _config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out, max_steps=50,
                     save_steps=100, plot_loss=False)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "mmoa.cli", "train", str(tmp_path / "run.yaml")],
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        log = out / "trainer_log.jsonl"
        while not (log.is_file() and log.read_text().strip()):  # the first step is logged
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "[mappo] interrupted: SIGTERM received: stopped after step" in stderr
    checkpoints = sorted(out.glob("checkpoint-*"))
    assert len(checkpoints) == 1 and (checkpoints[0] / "mappo_state.json").is_file()
    assert f"resume_from_checkpoint={checkpoints[0]}" in stderr
    assert not (out / "model.safetensors").exists(), "an interrupted run writes no final model"
    assert not os.path.exists(out / "trainer_state.json")



def test_abort_mid_rollout_discards_the_step_and_resumes_exactly(
        full_run: Path, tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGABRT (the web UI's Abort) after step 2's Query Rewriter call: no other generate call
    runs (the stop is within one micro-step), step 2 is discarded, step 1 is saved with its
    manifest and step_progress.json says so; resumed from it, the run ends as the
    uninterrupted one (the discarded step's random draws were put back)."""
    import os
    import signal

    from mmoa.train.mappo.checkpoint_files import verify_checkpoint
    from mmoa.train.mappo.trainer import MappoTrainer, TrainingInterrupted
    from mmoa.train.progress import PROGRESS_FILE, read_progress

    original = MappoTrainer._before_generate
    calls: list[int] = []  # the completed steps at each generate call

    def before_generate(self: MappoTrainer) -> None:
        calls.append(self.state.global_step)
        if calls.count(1) == 2:  # step 2's second call (the Selector's)
            os.kill(os.getpid(), signal.SIGABRT)
        original(self)

    monkeypatch.setattr(MappoTrainer, "_before_generate", before_generate)
    out = tmp_path / "run"
    config = _config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out, save_steps=100,
                     **REWARDED)  # as full_run, which the resumed run is compared with
    previous = signal.getsignal(signal.SIGABRT)
    with pytest.raises(TrainingInterrupted) as stopped:
        run_mappo(config)
    assert signal.getsignal(signal.SIGABRT) is previous
    assert calls == [0, 0, 0, 1, 1], "a generate call ran after the stop request"
    checkpoint = out / "checkpoint-1"
    assert stopped.value.exit_code == 128 + signal.SIGABRT
    assert str(stopped.value) == (
        f"SIGABRT received: stopped after step 1, saved in {checkpoint}; resume with "
        f"resume_from_checkpoint={checkpoint} (step 2 was under way and is discarded: a resume "
        "runs it again)")
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-1"]
    assert verify_checkpoint(checkpoint)
    assert json.loads((checkpoint / "mappo_state.json").read_text())["global_step"] == 1
    assert not (out / "model.safetensors").exists(), "an interrupted run writes no final model"
    record = read_progress(out / PROGRESS_FILE)
    assert record is not None and record["state"] == "stopped"
    assert record["completed_steps"] == 1 and record["checkpoint"] == str(checkpoint)

    monkeypatch.setattr(MappoTrainer, "_before_generate", original)
    run_mappo({**config, "resume_from_checkpoint": str(checkpoint)})
    full = json.loads((full_run / "trainer_state.json").read_text())["log_history"]
    resumed = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in resumed] == [1, 2, 3]
    for key in ("reward", "answer_f1", "loss", "policy_loss", "value_loss", "kl", "kl_coef",
                "response_length/qr", "num_selected"):
        assert resumed[-1][key] == pytest.approx(full[-1][key], rel=1e-4, abs=1e-5), key
    assert read_progress(out / PROGRESS_FILE)["state"] == "finished"


def test_abort_mid_update_ends_the_update_after_the_micro_batch(
        tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGTERM during step 2's first micro-batch (about 12 samples in micro-batches of 4, one
    optimiser step each): the update stops before the second, the step counts as completed with
    the one optimiser step it made (logged ``stopped_early``) and is saved as checkpoint-2."""
    import os
    import signal

    from mmoa.train.mappo.trainer import MappoTrainer, TrainingInterrupted

    original = MappoTrainer._on_learner_progress
    seen: list[tuple[int, str, int, int]] = []

    def on_progress(self: MappoTrainer, phase: str, done: int, total: int) -> None:
        seen.append((self.state.global_step, phase, done, total))
        if (self.state.global_step, phase, done) == (1, "update", 1):
            os.kill(os.getpid(), signal.SIGTERM)  # as step 2's first micro-batch ends
        original(self, phase, done, total)

    monkeypatch.setattr(MappoTrainer, "_on_learner_progress", on_progress)
    out = tmp_path / "run"
    with pytest.raises(TrainingInterrupted) as stopped:
        run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                          save_steps=100))
    updates = [(done, total) for step, phase, done, total in seen
               if step == 1 and phase == "update"]
    assert updates[-1][0] == 1 and updates[-1][1] >= 2, "a micro-batch ran after the stop"
    checkpoint = out / "checkpoint-2"
    assert f"stopped after step 2, saved in {checkpoint}" in str(stopped.value)
    assert "its update stopped early" in str(stopped.value)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    assert [h.get("stopped_early") for h in history] == [None, 1.0]


_STOP_PROBE = """
import os, signal, sys
from mmoa.train.mappo.trainer import StopRequest
stop = StopRequest()
signal.signal(signal.SIGTERM, stop)
os.kill(os.getpid(), signal.SIGTERM)
print("first", stop.signum, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
print("still running", flush=True)
"""


def test_a_second_signal_stops_at_once() -> None:
    import signal
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _STOP_PROBE], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.stdout.splitlines() == [f"first {int(signal.SIGTERM)}"], result.stderr
    assert result.returncode == -signal.SIGTERM


def test_non_finite_losses_stop_with_the_step_saved_under_its_number(
        tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every loss NaN, stop after 2 such steps: the second step ran (rollout, scheduler, KL
    controller, RNG) with its update skipped, so its state is checkpoint-2 and the message
    names it (it was saved as checkpoint-1, holding step 2's state, and the message named
    none); the weights are still the warm start's."""
    from safetensors.torch import load_file

    from mmoa.train.mappo.learner import PPOLearner
    from mmoa.train.mappo.trainer import TrainingStopped

    original = PPOLearner._loss

    def nan_loss(self: PPOLearner, *args: Any, **kwargs: Any) -> Any:
        loss, stats = original(self, *args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(PPOLearner, "_loss", nan_loss)
    out = tmp_path / "run"
    with pytest.raises(TrainingStopped) as stopped:
        run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                          save_steps=100, mappo_max_nonfinite_steps=2))
    checkpoint = out / "checkpoint-2"
    assert f"resume_from_checkpoint={checkpoint}" in str(stopped.value)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    state = json.loads((checkpoint / "mappo_state.json").read_text())
    assert state["global_step"] == 2 and state["nonfinite_in_a_row"] == 2
    start, saved = load_file(tiny_model_dir / "model.safetensors"), \
        load_file(checkpoint / "model.safetensors")
    assert all(saved[k].equal(start[k]) for k in start), "every update was skipped"
