"""What the tests of the bench scripts share (the scripts themselves live in bench/)."""

from __future__ import annotations


class HandClock:
    """A monotonic clock the test moves by hand (``clock.now += seconds``), for
    ``bench_runs.AttemptClock``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
