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


def _collapse_history() -> list[dict[str, float]]:
    """Six MAPPO steps in which the Selector falls from 4.9 documents to 1."""
    history = []
    for step, selected in enumerate((4.9, 4.9, 3.5, 2.0, 1.0, 1.0), start=1):
        entry = {"step": step, "loss": 0.5, "reward": 0.4, "num_selected": selected,
                 "selected_gold_recall": 0.76 * selected / 4.9, "num_subquestions": 2.0,
                 "candidate_gold_recall": 0.8, "answer_words": 2.5, "drift_flags": 0.0}
        for agent in ("qr", "selector", "generator"):
            entry |= {f"reward/{agent}": 0.4, f"kl/{agent}": 0.01 * step,
                      f"entropy/{agent}": 1.0, f"penalty_rate/{agent}": 0.0}
        history.append(entry)
    return history


def test_the_per_agent_figure_is_saved(tmp_path: Path) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mmoa.train.plots import AGENT_PLOT_FILE, save_agent_plot

    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history":
                                                             _collapse_history()}))
    open_before = set(plt.get_fignums())
    path = save_agent_plot(tmp_path)
    assert path == tmp_path / AGENT_PLOT_FILE == tmp_path / "training_agents.png"
    assert path.stat().st_size > 0
    assert set(plt.get_fignums()) == open_before
    # a run that logged no per-agent statistic (another pipeline) gets no empty figure
    other = tmp_path / "other"
    other.mkdir()
    (other / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": 1, "loss": 0.5, "reward": 0.1}]}))
    assert save_agent_plot(other) is None and not (other / AGENT_PLOT_FILE).exists()


def test_the_web_ui_per_agent_figure_has_the_agent_panels() -> None:
    """The web UI draws loss and reward in LlamaBoard's plot and the per-agent panels in a
    figure of their own (``agent_figure``), the same panels as ``training_agents.png``."""
    pytest.importorskip("matplotlib")
    from mmoa.train.plots import AGENT_PANELS
    from mmoa.webui.plots import agent_figure, mappo_plot

    log = [{"current_steps": e["step"], **{k: v for k, v in e.items() if k != "step"}}
           for e in _collapse_history()]
    assert [ax.get_title() for ax in mappo_plot(log).axes] == ["", ""]  # loss, reward
    figure = agent_figure(log)
    assert figure is not None
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible()]
    assert titles[:len(AGENT_PANELS)] == [p.title for p in AGENT_PANELS]
    selector = figure.axes[0]
    assert list(selector.lines[0].get_ydata()) == [4.9, 4.9, 3.5, 2.0, 1.0, 1.0]
    assert selector.get_ylim()[0] == 0.0, "a fall to one document is drawn from 0"


def test_the_credit_panel_draws_the_bonus_and_the_share_beating_the_default() -> None:
    """The Selector's selection bonus on the left axis, the share of traces whose output beat
    its counterfactual default on the right (from 0 to 1); a run that logs neither draws an
    empty panel, not an error."""
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mmoa.train.plots import AGENT_PANELS, draw_agent_panels

    panel = next(p for p in AGENT_PANELS if p.title == "credit per agent")
    entries = [{"step": step, "selection_reward/selector": bonus, "cf_beat/selector": beat}
               for step, bonus, beat in ((1, 0.24, 0.25), (2, 0.31, 0.5))]
    fig, (ax, empty) = plt.subplots(1, 2)
    try:
        draw_agent_panels([ax], entries, "step", panels=[panel])
        assert [list(line.get_ydata()) for line in ax.lines] == [[0.24, 0.31]]
        right = next(other for other in fig.axes if other not in (ax, empty)
                     and other.bbox.bounds == ax.bbox.bounds)
        assert [list(line.get_ydata()) for line in right.lines] == [[0.25, 0.5]]
        assert right.get_ylim() == (0.0, 1.05)
        assert [line.get_label() for line in ax.lines + right.lines] == [
            "selector gold bonus", "selector beats its default"]
        draw_agent_panels([empty], [], "step", panels=[panel])
        assert not empty.lines
    finally:
        plt.close(fig)
