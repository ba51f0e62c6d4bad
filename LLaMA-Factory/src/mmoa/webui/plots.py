"""The live plots of a MAPPO run in the Train tab: loss *and* shared reward beside the log, and
the per-agent panels below it.

LlamaBoard's own plot (``gen_loss_plot``) draws only the loss; for PPO the reward is the curve a
user watches, so MAPPO runs get both, one above the other (the plot sits in LlamaBoard's narrow
right-hand column), in LlamaBoard's style (raw and smoothed).

A three-agent run's log also holds the per-agent statistics (documents chosen and gold recall,
sub-questions and candidate recall, answer words, reward, KL, entropy and penalty rate per
agent). They get a full-width figure under the log (:func:`agent_figure`): the panels of the
run's ``training_agents.png`` (:data:`mmoa.train.plots.AGENT_PANELS`) followed by one panel per
other curve the run saves as ``training_<key>.png`` (answer F1, KL, ...; the workflow's
``plot_keys``), so the UI shows the run's figures while it runs, when an agent collapsing under
a healthy-looking reward is worth seeing; and a table of the last logged step
(:func:`agent_summary`). Everything is read from ``trainer_log.jsonl``: a key the trainer does
not write there reads "not logged".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: trainer_log key (also the axis label) and colour of each panel.
PLOTTED = (("loss", "#1f77b4"), ("reward", "#2ca02c"))
#: Inches of figure height per row of the per-agent figure (as ``training_agents.png``).
AGENT_ROW_HEIGHT = 2.8
#: Columns of the per-agent figure (as ``training_agents.png``).
AGENT_COLUMNS = 2
#: Titles of the run-level curves (``training_<key>.png``) drawn after the agent panels.
RUN_CURVE_TITLES = {"answer_f1": "answer F1", "kl": "KL to the warm start",
                    "kl_coef": "KL coefficient", "kl_loss": "KL loss", "value_loss": "value loss",
                    "grpo/zero_variance_fraction": "zero-variance groups"}
#: The run-level keys drawn when the run's algorithm is not known (the ppo ones).
DEFAULT_RUN_KEYS = ("answer_f1", "kl", "kl_coef", "value_loss")


def read_trainer_log(path: str | Path) -> list[dict[str, Any]]:
    """The entries of ``trainer_log.jsonl``; a line still being written is skipped."""
    entries = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


def mappo_plot(trainer_log: list[dict[str, Any]]) -> Figure:
    """Loss above, shared reward below (LlamaBoard's narrow plot column)."""
    import matplotlib.pyplot as plt
    from llamafactory.extras.ploting import smooth

    plt.close("all")
    plt.switch_backend("agg")
    fig, axes = plt.subplots(len(PLOTTED), 1, figsize=(5, 6), sharex=True)
    for ax, (key, color) in zip(axes, PLOTTED, strict=False):
        points = [(e["current_steps"], e[key]) for e in trainer_log
                  if isinstance(e.get(key), int | float) and "current_steps" in e]
        steps = [s for s, _ in points]
        values = [v for _, v in points]
        if values:
            ax.plot(steps, values, color=color, alpha=0.4, label="original")
            ax.plot(steps, smooth(values), color=color, label="smoothed")
            ax.legend()
        ax.set_ylabel(key)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    return fig


def run_curve_keys(algorithm: str | None) -> tuple[str, ...]:
    """The run-level curves the run saves as PNGs beside loss and reward (the workflow's
    ``plot_keys`` of its algorithm), the ppo ones when the algorithm is not known."""
    from mmoa.train.mappo.algorithms import get_algorithm
    from mmoa.train.mappo.workflow import plot_keys

    try:
        keys = plot_keys(get_algorithm(algorithm or "ppo"))
    except ValueError:
        return DEFAULT_RUN_KEYS
    return tuple(k for k in keys if k not in dict(PLOTTED))


def agent_panels(trainer_log: list[dict[str, Any]], run_keys: tuple[str, ...] = DEFAULT_RUN_KEYS
                 ) -> tuple[Any, ...]:
    """The panels of the per-agent figure: ``training_agents.png``'s when the log has
    per-agent statistics (a three-agent run), then one per run-level curve."""
    from mmoa.train.plots import AGENT_PANELS, Curve, Panel, has_agent_stats

    run = tuple(Panel(RUN_CURVE_TITLES.get(key, key), (Curve(key, key, "#8c564b"),), key)
                for key in run_keys)
    return (AGENT_PANELS if has_agent_stats(trainer_log) else ()) + run


def agent_figure(trainer_log: list[dict[str, Any]],
                 run_keys: tuple[str, ...] = DEFAULT_RUN_KEYS) -> Figure | None:
    """The per-agent figure (two columns, as ``training_agents.png``); ``None`` before the
    first logged step, so that the panel is empty rather than a grid of empty axes.

    Built without pyplot: it is drawn in its own thread while LlamaBoard's monitor draws the
    loss plot with pyplot (whose ``close("all")`` would reach a pyplot figure of ours)."""
    from matplotlib.figure import Figure

    from mmoa.train.plots import draw_agent_panels

    if not trainer_log:
        return None
    panels = agent_panels(trainer_log, run_keys)
    rows = -(-len(panels) // AGENT_COLUMNS)
    fig = Figure(figsize=(11, AGENT_ROW_HEIGHT * rows))
    axes = fig.subplots(rows, AGENT_COLUMNS, squeeze=False)
    flat = list(axes.flat)
    draw_agent_panels(flat[:len(panels)], trainer_log, "current_steps", panels)
    for ax in flat[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


#: The table's rows: agent, and the log keys of its own columns (label, key, digits).
_SUMMARY_AGENTS = (
    ("qr", "Query Rewriter", (("sub-questions", "num_subquestions", 2),
                              ("candidate gold recall", "candidate_gold_recall", 2))),
    ("selector", "Selector", (("documents chosen", "num_selected", 2),
                              ("gold recall", "selected_gold_recall", 2))),
    ("generator", "Generator", (("answer words", "answer_words", 1),
                                ("answer F1", "answer_f1", 3))),
)
_SUMMARY_SHARED = (("reward", "reward", 3), ("penalty rate", "penalty_rate", 2),
                   ("KL", "kl", 4), ("entropy", "entropy", 3))
_CELL = "border-bottom:1px solid #ddd;padding:3px 6px;text-align:left"


def agent_summary(trainer_log: list[dict[str, Any]]) -> str:
    """HTML table of the last logged step, one row per agent (its reward, penalty rate, KL and
    entropy, and its own statistics); empty before the first logged step."""
    import html

    if not trainer_log:
        return ""
    last = trainer_log[-1]

    def number(key: str, digits: int) -> str:
        value = last.get(key)
        return f"{value:.{digits}f}" if isinstance(value, int | float) else "–"

    head = "".join(f'<th style="{_CELL}">{h}</th>' for h in
                   ("agent", *(label for label, _, _ in _SUMMARY_SHARED), "own statistics"))
    rows = []
    for agent, name, own in _SUMMARY_AGENTS:
        shared = "".join(f'<td style="{_CELL}">{number(f"{key}/{agent}", digits)}</td>'
                         for _, key, digits in _SUMMARY_SHARED)
        mine = "; ".join(f"{label} {number(key, digits)}" for label, key, digits in own)
        rows.append(f'<tr class="mmoa-agent-row" data-agent="{agent}"><td style="{_CELL}">'
                    f'<b>{name}</b></td>{shared}<td style="{_CELL}">{html.escape(mine)}</td></tr>')
    step = last.get("current_steps", "?")
    total = last.get("total_steps", "?")
    return (f'<div id="mmoa-agent-summary"><p>Step {step}/{total} (the last logged step)</p>'
            f'<table style="width:100%;border-collapse:collapse;font-size:0.9em"><thead><tr>'
            f"{head}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>")
