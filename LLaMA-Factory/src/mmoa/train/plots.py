"""The training plots of our stages: LLaMA-Factory's ``plot_loss``, with its figures closed, and
the MAPPO per-agent figure ``training_agents.png``.

``plot_loss`` draws each key on a new pyplot figure and saves it but never closes it, so a
process that trains several runs (the tests, a web UI session, a bench in-process) keeps every
figure alive and matplotlib warns after 20 of them.

The per-agent figure exists because the pooled curves hide an agent's collapse: the demo's MAPPO
run kept a plausible loss, reward and KL while its Selector went from 4.9 documents to 1. One
panel per agent statistic (:mod:`mmoa.train.mappo.agent_stats`, the per-agent reward, KL,
entropy and penalty rates) makes such a fall a cliff in its panel. The web UI draws the same
panels under its loss and reward (:mod:`mmoa.webui.plots`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmoa.train.mappo.agent_stats import BONUS_LOG_NAMES, COUNTERFACTUAL_AGENTS

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: The per-agent figure's file name in the output directory.
AGENT_PLOT_FILE = "training_agents.png"
#: Pipeline order and one colour per agent, the same in every panel.
_AGENT_COLOURS = (("qr", "#1f77b4"), ("selector", "#ff7f0e"), ("generator", "#2ca02c"))


@dataclass(frozen=True)
class Curve:
    key: str
    label: str
    colour: str
    #: Drawn on the panel's right-hand axis, which reads fractions in [0, 1].
    fraction: bool = False


@dataclass(frozen=True)
class Panel:
    title: str
    curves: tuple[Curve, ...]
    ylabel: str = ""
    fraction_label: str = ""
    #: The left axis starts at 0 (counts and rates, never below it).
    from_zero: bool = False


def _per_agent(stat: str) -> tuple[Curve, ...]:
    return tuple(Curve(f"{stat}/{agent}", agent, colour) for agent, colour in _AGENT_COLOURS)


def _credit_curves() -> tuple[Curve, ...]:
    """The agents' own credit: the gold-passage bonus of the Query Rewriter and the Selector
    (``mappo_qr_retrieval_reward`` / ``mappo_selector_selection_reward``, weight included),
    and the share of traces whose output beat its counterfactual default
    (``mappo_counterfactual_agents``): whether the signal meant to teach an agent a
    per-question choice reaches it, step by step, beside what it does to that agent's
    statistics in the panels above. A key a run does not log draws nothing."""
    colours = dict(_AGENT_COLOURS)
    return (*(Curve(f"{name}/{agent}", f"{agent} gold bonus", colours[agent])
              for agent, name in BONUS_LOG_NAMES.items()),
            *(Curve(f"cf_beat/{agent}", f"{agent} beats its default", colours[agent], True)
              for agent in COUNTERFACTUAL_AGENTS))


#: The per-agent figure, panel by panel: each agent's own statistics (a count on the left axis
#: from 0, its gold recall on a right-hand axis from 0 to 1), then the statistics every agent has.
AGENT_PANELS: tuple[Panel, ...] = (
    Panel("Selector", (Curve("num_selected", "documents chosen", "#ff7f0e"),
                       Curve("selected_gold_recall", "gold recall", "#d62728", True),
                       Curve("selected_gold_precision", "gold precision", "#9467bd", True),
                       Curve("empty_selection_probability", "P(select nothing)", "#7f7f7f",
                             True)),
          "documents", "gold recall / precision / P(none)", from_zero=True),
    Panel("Query Rewriter", (Curve("num_subquestions", "sub-questions", "#1f77b4"),
                             Curve("candidate_gold_recall", "candidate recall", "#d62728", True)),
          "sub-questions", "candidate recall", from_zero=True),
    Panel("Generator", (Curve("answer_words", "answer words", "#2ca02c"),), "words",
          from_zero=True),
    Panel("reward per agent", _per_agent("reward"), "reward"),
    Panel("credit per agent", _credit_curves(), "bonus", "share beating its default"),
    Panel("KL to the warm start per token", _per_agent("kl"), "KL"),
    Panel("entropy per token", _per_agent("entropy"), "entropy"),
    Panel("penalty rate", _per_agent("penalty_rate"), "fraction penalised", from_zero=True),
    Panel("drift flags", (Curve("drift_flags", "statistics past a threshold", "#7f7f7f"),),
          "flags", from_zero=True),
)
#: Every key the per-agent figure draws (the web UI's trainer log carries these too).
AGENT_PLOT_KEYS: tuple[str, ...] = tuple(c.key for p in AGENT_PANELS for c in p.curves)


def save_training_plots(output_dir: str | Path, keys: Sequence[str]) -> None:
    """``training_<key>.png`` for each logged ``key`` of ``output_dir/trainer_state.json``."""
    import matplotlib.pyplot as plt
    from llamafactory.extras.ploting import plot_loss

    before = set(plt.get_fignums())
    try:
        plot_loss(str(output_dir), keys=list(keys))
    finally:
        for number in set(plt.get_fignums()) - before:
            plt.close(number)


def series(entries: Sequence[Mapping[str, Any]], key: str, step_key: str
           ) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of ``key`` over the log entries that hold a number for it."""
    points = [(e[step_key], e[key]) for e in entries
              if isinstance(e.get(key), int | float) and step_key in e]
    return [s for s, _ in points], [v for _, v in points]


def has_agent_stats(entries: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any entry holds a statistic only the per-agent figure draws (the pooled
    ``reward`` of another pipeline is not enough)."""
    return any(key in entry for entry in entries for key in AGENT_PLOT_KEYS)


def draw_agent_panels(axes: Sequence[Axes], entries: Sequence[Mapping[str, Any]],
                      step_key: str, panels: Sequence[Panel] = AGENT_PANELS) -> None:
    """Draws ``panels`` on ``axes`` (one each) from log ``entries``, steps read from
    ``step_key`` (``step`` in ``trainer_state.json``, ``current_steps`` in the web UI's log).
    Counts start at 0, so that a fall to one document is a fall, not a rescaled wiggle."""
    for ax, panel in zip(axes, panels, strict=True):
        ax.set_title(panel.title, fontsize=10)
        right = None
        handles = []
        for curve in panel.curves:
            steps, values = series(entries, curve.key, step_key)
            if not values:
                continue
            if curve.fraction:
                if right is None:
                    right = ax.twinx()
                    right.set_ylim(0.0, 1.05)
                    right.set_ylabel(panel.fraction_label, fontsize=8)
                target, style = right, "--"
            else:
                target, style = ax, "-"
            handles += target.plot(steps, values, style, color=curve.colour, marker=".",
                                   label=curve.label)
        if handles:
            ax.legend(handles=handles, fontsize=7, loc="best")
            if panel.from_zero and ax.lines:
                ax.set_ylim(bottom=0.0, top=max(ax.get_ylim()[1], 1.0))
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes,
                    color="#7f7f7f")
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.set_xlabel("step", fontsize=8)


def save_agent_plot(output_dir: str | Path) -> Path | None:
    """``training_agents.png`` from ``output_dir/trainer_state.json``; ``None`` (nothing
    written) when no step logged a per-agent statistic."""
    import matplotlib.pyplot as plt

    output = Path(output_dir)
    history = json.loads((output / "trainer_state.json").read_text(encoding="utf-8")
                         ).get("log_history", [])
    if not has_agent_stats(history):
        return None
    plt.switch_backend("agg")
    columns = 2
    rows = -(-len(AGENT_PANELS) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(11, 2.8 * rows), squeeze=False)
    try:
        flat = list(axes.flat)
        draw_agent_panels(flat[:len(AGENT_PANELS)], history, "step")
        for ax in flat[len(AGENT_PANELS):]:
            ax.set_visible(False)
        fig.suptitle(f"MAPPO per agent: {output.name}")
        fig.tight_layout()
        path = output / AGENT_PLOT_FILE
        fig.savefig(path, format="png", dpi=100)
    finally:
        plt.close(fig)
    return path
