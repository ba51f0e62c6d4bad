"""Progress inside a MAPPO step: ``step_progress.json`` for the web UI, one console line.

Why: LLaMA-Factory's progress (``trainer_log.jsonl``, the step bar) moves once per step, and a
MAPPO step on a CPU takes minutes (16 questions through three agents, then several PPO epochs),
so a run looked hung. One :class:`StepProgress` per run follows the step through its phases:

* ``rollout``: generate calls of the pipeline, counted in rows (a question, or one of a group's
  rollouts) per stage (``qr``, ``selector``, ``generator``; a multi-turn agent's turns, whose
  total is only an upper bound). Pipelines say what their stages are
  (``Pipeline.rollout_stages``) and never report anything themselves: the trainer hands them
  the policy wrapped in :class:`WatchedPolicy`, whose ``generate`` counts the rows;
* ``score``: the learner's no-grad forward batches (old and reference log-probs, values);
* ``update``: the learner's micro-batches over all PPO epochs.

It writes ``step_progress.json`` atomically, at most once per ``min_interval_s`` (and at once
when a step or a phase begins, a stop is noticed and the run ends: a step shorter than the
interval still shows its phases), and hands the same line to a console sink as often. The
estimates are simple on purpose (tests check them against a hand-run):

* fraction of the step: the phases before the current one plus the current one's done/total,
  each phase weighted by its share of the last completed step's time (equal shares before any
  step completed);
* percentage: ``100 * (completed steps + fraction) / total steps``;
* seconds per step: the mean of this run's completed steps, else (first step) the step's
  elapsed time divided by its fraction; ETA: that times ``(1 - fraction) + steps after this
  one``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmoa.fileio import atomic_write_json

#: The file in the run's output folder that the web UI reads.
PROGRESS_FILE = "step_progress.json"
#: The phases of one step, in order.
PHASES = ("rollout", "score", "update")
#: What a phase counts (the console line and the web UI's label).
PHASE_UNITS = {"score": "batch", "update": "micro-batch"}
#: ``state`` values: the run goes on, a stop was asked for, or how it ended.
RUNNING, STOPPING, STOPPED, FINISHED, FAILED = "running", "stopping", "stopped", "finished", \
    "failed"


@dataclass(frozen=True)
class RolloutStage:
    """One stage of a pipeline's rollout: ``rows`` generated rows (``exact=False``: at most
    that many, as for a multi-turn agent that may answer before its last turn), each a
    ``unit`` (``question``; ``rollout`` under a grouped algorithm; ``generation``)."""

    name: str
    rows: int
    unit: str = "question"
    exact: bool = True

    def describe(self, done: int) -> str:
        bound = "" if self.exact else "at most "
        return f"{self.name}, {self.unit} {done}/{bound}{self.rows}"


def format_seconds(seconds: float | None) -> str:
    """``1:02:03`` / ``2:03``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class StepProgress:
    """Where one run is inside its steps (see the module docstring); ``path`` ``None``: no
    file (processes other than the first), the console sink still gets its lines."""

    def __init__(self, path: str | Path | None, total_steps: int, *,
                 console: Callable[[str], None] | None = None, min_interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.path = Path(path) if path is not None else None
        self.total_steps = max(1, int(total_steps))
        self.console = console
        self.min_interval_s = min_interval_s
        self.clock = clock
        self.wall = wall
        self.started = clock()
        self.state = RUNNING
        self.step = 0  # the step under way, 1-based; 0 before the first
        self.completed = 0
        self.phase: str | None = None
        self.done = 0
        self.total = 0
        self.detail = ""
        self.message = ""
        self.note = ""
        self.checkpoint: str | None = None
        self._step_started = self.started
        self._phase_started = self.started
        self._phase_seconds: dict[str, float] = {}
        self._weights: dict[str, float] = {phase: 1 / len(PHASES) for phase in PHASES}
        self._step_seconds: list[float] = []
        self._last_emit: float | None = None

    # -- what the loop reports -------------------------------------------------------------------

    def begin_step(self, step: int) -> None:
        """Step ``step`` (1-based) begins; steps before it are complete (a resumed run starts
        past its checkpoint)."""
        self.step = step
        self.completed = step - 1
        self.phase, self.done, self.total, self.detail = None, 0, 0, ""
        self._step_started = self._phase_started = self.clock()
        self._phase_seconds = {}
        self._emit(force=True)

    def begin_phase(self, phase: str, total: int, detail: str = "") -> None:
        """``phase`` begins with ``total`` units; ``detail``: where it starts (the rollout's
        first stage)."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")
        now = self.clock()
        if self.phase is not None:
            self._phase_seconds[self.phase] = now - self._phase_started
        self.phase, self.done, self.total, self.detail = phase, 0, max(0, int(total)), detail
        self._phase_started = now
        self._emit(force=True)

    def advance(self, done: int, detail: str = "") -> None:
        """``done`` of the phase's ``total`` units are done; ``detail`` names where (the
        rollout's stage)."""
        self.done = min(int(done), self.total) if self.total else int(done)
        self.detail = detail
        self._emit()

    def end_step(self) -> None:
        """The step under way completed: its time and phase shares feed the estimates."""
        now = self.clock()
        if self.phase is not None:
            self._phase_seconds[self.phase] = now - self._phase_started
        self._step_seconds.append(now - self._step_started)
        spent = sum(self._phase_seconds.get(phase, 0.0) for phase in PHASES)
        if spent > 0:
            self._weights = {phase: self._phase_seconds.get(phase, 0.0) / spent
                             for phase in PHASES}
        self.completed = self.step
        self.phase, self.done, self.total, self.detail = None, 0, 0, ""

    def stopping(self, message: str) -> None:
        """A stop was asked for; written at once."""
        self.state, self.message = STOPPING, message
        self._emit(force=True)

    def finish(self, state: str, message: str, checkpoint: str | Path | None = None,
               note: str = "") -> None:
        """How the run ended (``stopped``, ``finished``, ``failed``); written at once. ``note``:
        what became of the step under way when it stopped (the web UI shows it)."""
        self.state, self.message, self.note = state, message, note
        self.checkpoint = str(checkpoint) if checkpoint is not None else None
        self.phase, self.done, self.total, self.detail = None, 0, 0, ""
        self._emit(force=True)

    # -- the estimates ---------------------------------------------------------------------------

    def step_fraction(self) -> float:
        """Share of the step under way that is done (0 before its first phase)."""
        if self.phase is None:
            return 0.0
        index = PHASES.index(self.phase)
        before = sum(self._weights[phase] for phase in PHASES[:index])
        inside = self.done / self.total if self.total else 0.0
        return min(1.0, before + self._weights[self.phase] * inside)

    def seconds_per_step(self) -> float | None:
        if self._step_seconds:
            return sum(self._step_seconds) / len(self._step_seconds)
        fraction = self.step_fraction()
        if fraction <= 0:
            return None
        return (self.clock() - self._step_started) / fraction

    def eta_seconds(self) -> float | None:
        per_step = self.seconds_per_step()
        if per_step is None or self.state not in (RUNNING, STOPPING) or self.step == 0:
            return None
        return per_step * ((1 - self.step_fraction()) + (self.total_steps - self.step))

    def percentage(self) -> float:
        if self.state == FINISHED:
            return 100.0
        return round(100 * (self.completed + (self.step_fraction() if self.step > self.completed
                                              else 0.0)) / self.total_steps, 2)

    def text(self) -> str:
        """The line the console and the web UI's label show."""
        if self.state in (STOPPED, FINISHED, FAILED):
            return self.message
        where = f"step {max(self.step, 1)}/{self.total_steps}"
        if self.phase is not None:
            unit = PHASE_UNITS.get(self.phase)
            doing = self.detail or (f"{unit} {self.done}/{self.total}" if unit else
                                    f"{self.done}/{self.total}")
            where += f" · {self.phase}: {doing}"
        timing = f"{format_seconds(self.clock() - self.started)} elapsed"
        eta = self.eta_seconds()
        if eta is not None:
            timing += f", ETA {format_seconds(eta)}"
        line = f"{where} · {timing}"
        return f"{line} · {self.message}" if self.state == STOPPING and self.message else line

    def record(self) -> dict[str, Any]:
        """What ``step_progress.json`` holds."""
        return {
            "state": self.state, "step": self.step, "completed_steps": self.completed,
            "total_steps": self.total_steps, "phase": self.phase, "done": self.done,
            "total": self.total, "detail": self.detail,
            "percentage": self.percentage(), "eta_s": _rounded(self.eta_seconds()),
            "elapsed_s": round(self.clock() - self.started, 3), "text": self.text(),
            "message": self.message, "note": self.note, "checkpoint": self.checkpoint,
            "updated": self.wall(),
        }

    # -- output ----------------------------------------------------------------------------------

    def _emit(self, force: bool = False) -> None:
        now = self.clock()
        if not force and self._last_emit is not None \
                and now - self._last_emit < self.min_interval_s:
            return
        self._last_emit = now
        record = self.record()
        if self.path is not None:
            # progress is a convenience: a full disk must not stop the training
            with contextlib.suppress(OSError):
                atomic_write_json(self.path, record, indent=None)
        if self.console is not None:
            self.console(record["text"])


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def read_progress(path: str | Path) -> dict[str, Any] | None:
    """The record in ``path`` (a run folder's ``step_progress.json``), ``None`` when there is
    none or it cannot be read."""
    import json

    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


class ConsoleLine:
    """The console sink of :class:`StepProgress`: the postfix of the run's step bar (tqdm
    redraws its one line) when there is one, else a log line at most every ``log_every_s``,
    so a log file gets a line now and then instead of one per micro-batch."""

    def __init__(self, bar: Callable[[], Any], log: Callable[[str], None], *,
                 log_every_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.bar = bar
        self.log = log
        self.log_every_s = log_every_s
        self.clock = clock
        self._last_log: float | None = None

    def __call__(self, text: str) -> None:
        bar = self.bar()
        if bar is not None:
            bar.set_postfix_str(text, refresh=True)
            return
        now = self.clock()
        if self._last_log is None or now - self._last_log >= self.log_every_s:
            self._last_log = now
            self.log(text)


class RolloutCounter:
    """Maps the rows generated so far onto the pipeline's stages and reports them to a
    :class:`StepProgress` (the ``rollout`` phase).

    The detail names the stage *under way*: rows are counted after each generate call, so
    once a stage's last row is in, the next generate call is the next stage's, and the label
    says so (``generator, question 0/16``). It used to name the finished stage until the next
    call returned, so the last stage (the Generator's) never showed at all: its only call ended
    the rollout."""

    def __init__(self, progress: StepProgress, stages: Sequence[RolloutStage]) -> None:
        self.progress = progress
        self.stages = tuple(stages)
        self.rows = 0
        progress.begin_phase("rollout", sum(stage.rows for stage in self.stages),
                             self.stages[0].describe(0) if self.stages else "")

    def add(self, rows: int) -> None:
        self.rows += rows
        left = self.rows
        detail = ""
        for index, stage in enumerate(self.stages):
            last = index == len(self.stages) - 1
            if left < stage.rows or last:
                detail = stage.describe(min(left, stage.rows))
                break
            if left == stage.rows:  # this stage is complete: the next one is under way
                detail = self.stages[index + 1].describe(0)
                break
            left -= stage.rows
        self.progress.advance(self.rows, detail)


class WatchedPolicy:
    """The policy as a pipeline sees it during a rollout: ``before()`` runs ahead of each
    ``generate`` call (it raises :class:`~mmoa.train.stop.StepAbandoned` when a stop was asked
    for, so a stop waits for one generate call at most) and ``after(rows)`` after it; every
    other attribute is the policy's own. It draws no random number and passes every argument
    on unchanged, so a watched rollout samples exactly what an unwatched one does."""

    def __init__(self, policy: Any, before: Callable[[], None],
                 after: Callable[[int], None]) -> None:
        self._policy = policy
        self._before = before
        self._after = after

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self._before()
        output = self._policy.generate(*args, **kwargs)
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._after(int(ids.shape[0]) if hasattr(ids, "shape") else 0)
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)

