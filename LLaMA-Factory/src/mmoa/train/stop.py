"""Stopping a training loop cleanly on SIGINT / SIGTERM, shared by the stages' loops.

Kept apart from the loops themselves so that the ``mappo`` and ``retriever_rl`` loops use one
handler without importing each other (they did, and formed an import cycle with the launcher).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from typing import Any


class StepAbandoned(Exception):
    """Raised inside a step when a stop was requested before the step changed any weight (its
    rollout, or the update before its first optimiser step): the loop discards the step,
    puts the random state back as it was when the step began and saves the last completed
    step, so that a resume runs the abandoned step exactly as an uninterrupted run would."""


class StopRequest:
    """The SIGINT/SIGTERM (and, for MAPPO, SIGABRT: LlamaBoard's Abort) handler: the first
    signal asks the loop to stop (the MAPPO loop checks between generate calls and between
    micro-batches, the others after the step), with a checkpoint; a second one ends the
    process at once, as it would unhandled (the web UI's second Abort)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __call__(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum


#: The signals our own loops stop on: SIGINT (Ctrl-C), SIGTERM (a job scheduler, a session's
#: end) and SIGABRT (LlamaBoard's Abort).
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGABRT)


def install_stop_handlers(stop: StopRequest, signals: Iterable[int] = STOP_SIGNALS
                          ) -> dict[int, Any]:
    """Route ``signals`` to ``stop``; returns the handlers :func:`restore_handlers` puts back.
    Outside the main thread (a web UI worker) signals cannot be caught and none is installed."""
    previous: dict[int, Any] = {}
    for sig in signals:
        with contextlib.suppress(ValueError):
            previous[sig] = signal.signal(sig, stop)
    return previous


def restore_handlers(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
