"""Stopping a training loop cleanly on SIGINT / SIGTERM, shared by the stages' loops.

Kept apart from the loops themselves so that the ``mappo`` and ``retriever_rl`` loops use one
handler without importing each other (they did, and formed an import cycle with the launcher).
"""

from __future__ import annotations

import os
import signal
from typing import Any


class StopRequest:
    """The SIGINT/SIGTERM handler: the first signal asks the loop to stop after the current
    step (with a checkpoint); a second one ends the process at once, as it would unhandled."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
