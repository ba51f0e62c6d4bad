"""What the web UI says about a MAPPO run in progress, stopping and ended, from the run's
``step_progress.json`` (:mod:`mmoa.train.progress`).

Why: LlamaBoard knows a run only from ``trainer_log.jsonl`` (once per step) and its exit code.
So a CPU step showed no progress for minutes; Abort replaced the log with "Aborted, wait for
terminating..." until the step ended; and any aborted run ended "Finished." whether or not
anything was saved. These functions are pure (a record, a folder, an exit code in; text out),
so the tests check every string without a browser.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from mmoa.train.progress import (
    FAILED,
    FINISHED,
    PROGRESS_FILE,
    STOPPED,
    STOPPING,
    format_seconds,
    read_progress,
)

#: The phases in which a stop discards the step under way (no weight has changed yet).
DISCARDING_PHASES = (None, "rollout", "score")


def progress_path(output_path: str | Path) -> Path:
    return Path(output_path) / PROGRESS_FILE


def live_record(output_path: str | Path) -> dict[str, Any] | None:
    """The run's progress record while it runs or stops; ``None`` when there is none (not a
    MAPPO run, not started yet) or it says the run has ended."""
    record = read_progress(progress_path(output_path))
    if record is None or record.get("state") in (STOPPED, FINISHED, FAILED):
        return None
    return record


def loading_label(output_path: str | Path, now: float | None = None) -> str | None:
    """The progress bar's label between Start and the first step: the run has written its
    ``training_args.yaml`` (Start does) but neither ``step_progress.json`` nor a logged step
    yet, so it is loading the model and the data. About a minute on a CPU in which the page
    showed nothing at all; ``None`` once the run reports its own progress."""
    folder = Path(output_path)
    if progress_path(folder).exists() or (folder / "trainer_log.jsonl").exists():
        return None
    config = folder / "training_args.yaml"
    try:
        started = config.stat().st_mtime
    except OSError:
        return None
    elapsed = (time.time() if now is None else now) - started
    return (f"Loading the model and the data (step 1 starts after that) · "
            f"{format_seconds(max(0.0, elapsed))} elapsed")


def progress_label(record: dict[str, Any]) -> str:
    """The progress bar's label: where the step is, elapsed time and ETA."""
    head = "Stopping" if record.get("state") == STOPPING else "Running"
    text = str(record.get("text") or "")
    # the record's text ends with the trainer's stop message: the output box says it
    return f"{head} {text.split(' · stop requested', 1)[0]}"


def stopping_line(record: dict[str, Any] | None) -> str:
    """The output box's first line after Abort: after which step the run stops and that a
    second Abort stops it at once."""
    again = ("Press Abort again to stop at once (nothing more is saved; the newest checkpoint "
             "stays).")
    if record is None or not record.get("step"):
        return f"**Stopping** after the current micro-step, with a checkpoint. {again}"
    step = int(record["step"])
    phase = record.get("phase")
    if record.get("state") == STOPPED or phase in DISCARDING_PHASES:
        after = int(record.get("completed_steps", step - 1))
        part = f"step {after + 1}'s {phase}" if phase else f"step {after + 1}"
        what = f"{part} is discarded (a resume runs it again)"
    else:
        after = step
        what = f"step {step}'s update ends after the current micro-batch"
    saved = (f"checkpoint-{after} is saved" if after > 0
             else "no step has completed, so nothing will be saved")
    return f"**Stopping after step {after}**: {what}; {saved}. {again}"


def latest_checkpoint(output_path: str | Path) -> tuple[Path, int] | None:
    """The newest complete ``checkpoint-N`` in the folder (one with its manifest, written
    last) and its step."""
    from mmoa.train.mappo.checkpoint_files import MANIFEST_FILE, checkpoint_step
    from mmoa.train.restart_check import newest_checkpoint

    newest = newest_checkpoint(output_path, holding=MANIFEST_FILE)
    if newest is None:
        return None
    step = checkpoint_step(newest)
    assert step is not None
    return newest, step


def final_status(output_path: str | Path, return_code: int | None, aborted: bool) -> str | None:
    """The output box's first line when a MAPPO run has ended, saying what was saved;
    ``None`` when LlamaBoard's own text is right (a failure without a stop: the failure
    report says what went wrong)."""
    record = read_progress(progress_path(output_path))
    state = record.get("state") if record else None
    if state == STOPPED:
        assert record is not None
        checkpoint = record.get("checkpoint")
        step = record.get("completed_steps")
        if checkpoint:
            note = record.get("note") or ""
            return (f"**Stopped at step {step}**, checkpoint `{checkpoint}` (resume with "
                    f"`resume_from_checkpoint: {checkpoint}`)" + (f"; {note}." if note else "."))
        return f"**Stopped; nothing was saved.** {record.get('message', '')}"
    if state == FINISHED and return_code == 0:
        assert record is not None
        return f"**Finished.** {record.get('message', '')}; final model in `{output_path}`."
    if not aborted and state != STOPPING:
        return None  # a failure (or another stage): LlamaBoard's text and the failure report
    # killed: a second Abort (or anything else that ended the process at once)
    how = _ended_by(return_code)
    newest = latest_checkpoint(output_path)
    at = f" during step {record['step']}" if record and record.get("step") else ""
    if newest is None:
        return f"**Stopped at once**{at} ({how}): nothing was saved."
    folder, step = newest
    return (f"**Stopped at once**{at} ({how}); the newest checkpoint is `{folder}` (step "
            f"{step}): resume with `resume_from_checkpoint: {folder}`.")


def _ended_by(return_code: int | None) -> str:
    if return_code is None:
        return "the process ended"
    if return_code < 0:
        try:
            return f"killed by {signal.Signals(-return_code).name}"
        except ValueError:
            pass
    return f"exit code {return_code}"
