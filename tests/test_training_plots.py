"""Our stages' training plots (mmoa.train.plots): one PNG per logged key, and no pyplot figure
left open, so a process that trains many runs does not accumulate them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_plots_are_saved_and_their_figures_closed(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mmoa.train.plots import save_training_plots

    history = [{"step": s, "reward": 0.1 * s, "loss": 1.0 / s} for s in range(1, 6)]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    kept = plt.figure()  # a figure of the caller's stays open
    open_before = set(plt.get_fignums())  # with any an earlier test in this worker left
    for _ in range(25):  # more than matplotlib's 20-figure warning
        save_training_plots(tmp_path, ["reward", "loss"])
    assert (tmp_path / "training_reward.png").stat().st_size > 0
    assert (tmp_path / "training_loss.png").stat().st_size > 0
    assert set(plt.get_fignums()) == open_before
    plt.close(kept)
