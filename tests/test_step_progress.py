"""Progress inside a MAPPO step (:mod:`mmoa.train.progress`): the fraction, percentage and ETA
against a hand-run with a fake clock, the rate limit of the file and the console line, the
rollout's stages, and the watched policy that counts generate calls and stops between them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mmoa.train.progress import (
    PROGRESS_FILE,
    ConsoleLine,
    RolloutCounter,
    RolloutStage,
    StepProgress,
    WatchedPolicy,
    format_seconds,
    read_progress,
)
from mmoa.train.stop import StepAbandoned


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _progress(tmp_path: Path, clock: Clock, lines: list[str], total: int = 4,
              interval: float = 1.0) -> StepProgress:
    return StepProgress(tmp_path / PROGRESS_FILE, total, console=lines.append,
                        min_interval_s=interval, clock=clock, wall=lambda: 1000.0)


def test_fraction_percentage_and_eta_match_a_hand_run(tmp_path: Path) -> None:
    """Hand-run: 4 steps. Step 1 (no history, equal phase shares 1/3): rollout of 16 rows,
    4 done at t=8 -> fraction 1/3 * 4/16 = 1/12, 96 s a step (8 / (1/12)), ETA 96 * (11/12 +
    3) = 376, 2.08 %. Step 1 then spends rollout 32 s, score 4 s, update 28 s (64 s): shares
    1/2, 1/16, 7/16. Step 2: rollout 8/16 at t=80 -> fraction 1/4, ETA 64 * (3/4 + 2) = 176,
    31.25 %; update 1/4 at t=91 -> fraction 1/2 + 1/16 + 7/16 * 1/4 = 0.671875, 41.8 %, ETA
    64 * (0.328125 + 2) = 149."""
    clock, lines = Clock(), []
    progress = _progress(tmp_path, clock, lines, interval=0.0)
    progress.begin_step(1)
    progress.begin_phase("rollout", 16)
    clock.now = 8
    progress.advance(4, "qr, question 4/16")
    assert progress.step_fraction() == pytest.approx(1 / 12)
    assert progress.seconds_per_step() == pytest.approx(96)
    assert progress.eta_seconds() == pytest.approx(376)
    assert progress.percentage() == 2.08
    assert lines[-1] == "step 1/4 · rollout: qr, question 4/16 · 0:08 elapsed, ETA 6:16"
    clock.now = 32
    progress.advance(16)
    progress.begin_phase("score", 2)
    clock.now = 36
    progress.advance(2)
    progress.begin_phase("update", 8)
    clock.now = 60
    progress.advance(8)
    clock.now = 64
    progress.end_step()
    assert progress.completed == 1 and progress.percentage() == 25.0

    progress.begin_step(2)
    progress.begin_phase("rollout", 16)
    clock.now = 80
    progress.advance(8)
    assert progress.step_fraction() == pytest.approx(0.25)
    assert progress.eta_seconds() == pytest.approx(176)
    assert progress.percentage() == 31.25
    clock.now = 90
    progress.begin_phase("update", 4)  # a step without scoring batches is still counted
    clock.now = 91
    progress.advance(1)
    assert progress.step_fraction() == pytest.approx(0.671875)
    assert progress.percentage() == 41.8
    assert progress.eta_seconds() == pytest.approx(149)
    assert lines[-1] == "step 2/4 · update: micro-batch 1/4 · 1:31 elapsed, ETA 2:29"
    record = read_progress(tmp_path / PROGRESS_FILE)
    assert record is not None
    assert {k: record[k] for k in ("state", "step", "completed_steps", "total_steps", "phase",
                                   "done", "total", "percentage", "eta_s", "elapsed_s")} == {
        "state": "running", "step": 2, "completed_steps": 1, "total_steps": 4,
        "phase": "update", "done": 1, "total": 4, "percentage": 41.8, "eta_s": 149.0,
        "elapsed_s": 91.0}


def test_the_file_and_the_console_are_rate_limited(tmp_path: Path) -> None:
    """At most one write a second; a step's start, a phase's start, a stop and the end are
    written at once."""
    clock, lines = Clock(), []
    progress = _progress(tmp_path, clock, lines)
    progress.begin_step(1)  # forced
    progress.begin_phase("update", 100)  # forced, at the same instant
    for done in range(1, 100):
        clock.now = done * 0.1  # ten micro-batches a second for ten seconds
        progress.advance(done)
    assert len(lines) == 11  # t = 0 (the step, the phase), then 1.0, 2.0, ..., 9.0 s
    assert json.loads((tmp_path / PROGRESS_FILE).read_text())["done"] == 90
    progress.stopping("stop requested")  # forced, though 0.9 s after the last write
    assert len(lines) == 12 and lines[-1].endswith("· stop requested")
    assert read_progress(tmp_path / PROGRESS_FILE)["state"] == "stopping"
    progress.finish("stopped", "stopped after step 0", None)
    record = read_progress(tmp_path / PROGRESS_FILE)
    assert record["state"] == "stopped" and record["text"] == "stopped after step 0"
    assert record["eta_s"] is None and len(lines) == 13


def test_a_step_shorter_than_the_interval_still_shows_its_phases(tmp_path: Path) -> None:
    """A step of a fraction of a second (a tiny model): each phase's start reaches the file,
    so the web UI's label names the phase under way, not only the step."""
    clock, lines = Clock(), []
    progress = _progress(tmp_path, clock, lines)
    progress.begin_step(1)
    for phase, at in (("rollout", 0.1), ("score", 0.2), ("update", 0.3)):
        clock.now = at
        progress.begin_phase(phase, 2)
        assert read_progress(tmp_path / PROGRESS_FILE)["phase"] == phase
        clock.now = at + 0.05
        progress.advance(1)  # within the interval: not written
        assert read_progress(tmp_path / PROGRESS_FILE)["done"] == 0
    assert [line.split(" · ")[1].split(":")[0] for line in lines[1:]] == [
        "rollout", "score", "update"]


def test_the_first_record_has_no_eta_and_a_finished_run_is_at_100(tmp_path: Path) -> None:
    clock, lines = Clock(), []
    progress = _progress(tmp_path, clock, lines, total=2)
    progress.begin_step(1)
    assert progress.eta_seconds() is None and lines == ["step 1/2 · 0:00 elapsed"]
    progress.finish("finished", "finished 2 steps", "/x/checkpoint-2")
    record = read_progress(tmp_path / PROGRESS_FILE)
    assert record["percentage"] == 100.0 and record["checkpoint"] == "/x/checkpoint-2"
    assert read_progress(tmp_path / "missing.json") is None
    (tmp_path / "torn.json").write_text('{"state": "run')
    assert read_progress(tmp_path / "torn.json") is None


def test_the_rollout_counter_names_the_stage_of_each_row(tmp_path: Path) -> None:
    clock, lines = Clock(), []
    progress = _progress(tmp_path, clock, lines, interval=0.0)
    progress.begin_step(1)
    counter = RolloutCounter(progress, [RolloutStage(a, 4) for a in ("qr", "selector",
                                                                      "generator")])
    assert progress.phase == "rollout" and progress.total == 12
    assert progress.detail == "qr, question 0/4"  # the first stage, before any row is in
    seen = []
    for _ in range(6):
        counter.add(2)
        seen.append(progress.detail)
    # the stage under way: once a stage's rows are in, the next one's generate call runs
    # (the Generator's phase used to never show: its one call ended the rollout)
    assert seen == ["qr, question 2/4", "selector, question 0/4", "selector, question 2/4",
                    "generator, question 0/4", "generator, question 2/4",
                    "generator, question 4/4"]
    assert progress.done == 12
    one_call = RolloutCounter(progress, [RolloutStage(a, 4) for a in ("qr", "selector",
                                                                       "generator")])
    one_call.add(4)
    assert progress.detail == "selector, question 0/4"
    one_call.add(4)
    assert progress.detail == "generator, question 0/4"
    turns = RolloutStage("search turns", 12, "generation", exact=False)
    assert turns.describe(5) == "search turns, generation 5/at most 12"


def test_a_watched_policy_counts_rows_and_stops_between_calls() -> None:
    class Policy:
        config = "the policy's config"

        def __init__(self) -> None:
            self.calls: list[dict[str, Any]] = []

        def generate(self, **kwargs: Any) -> str:
            self.calls.append(kwargs)
            return "output"

    policy, rows, stop = Policy(), [], [False]

    def before() -> None:
        if stop[0]:
            raise StepAbandoned("stop")

    watched = WatchedPolicy(policy, before, rows.append)
    ids = torch.zeros((3, 5), dtype=torch.long)
    assert watched.generate(input_ids=ids, do_sample=True) == "output"
    assert policy.calls == [{"input_ids": ids, "do_sample": True}]  # passed on unchanged
    assert rows == [3] and watched.config == "the policy's config"
    stop[0] = True
    with pytest.raises(StepAbandoned):
        watched.generate(input_ids=ids)
    assert len(policy.calls) == 1  # the call after the stop request never ran


def test_the_console_line_is_the_bars_postfix_or_a_log_line_now_and_then() -> None:
    class Bar:
        def __init__(self) -> None:
            self.postfix: list[str] = []

        def set_postfix_str(self, text: str, refresh: bool = True) -> None:
            self.postfix.append(text)

    bar, logged, clock = Bar(), [], Clock()
    ConsoleLine(lambda: bar, logged.append, clock=clock)("step 1/2 · rollout")
    assert bar.postfix == ["step 1/2 · rollout"] and logged == []
    line = ConsoleLine(lambda: None, logged.append, log_every_s=30, clock=clock)
    for second in range(0, 65, 5):
        clock.now = second
        line(f"t={second}")
    assert logged == ["t=0", "t=30", "t=60"]


@pytest.mark.parametrize(("seconds", "text"), [(None, "?"), (float("nan"), "?"), (0, "0:00"),
                                               (61.4, "1:01"), (3725, "1:02:05")])
def test_format_seconds(seconds: float | None, text: str) -> None:
    assert format_seconds(seconds) == text
