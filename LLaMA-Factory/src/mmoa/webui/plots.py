"""The live plot of a MAPPO run in the Train tab: loss *and* shared reward, then the per-agent
panels.

LlamaBoard's own plot (``gen_loss_plot``) draws only the loss; for PPO the reward is the curve a
user watches, so MAPPO runs get both, one above the other (the plot sits in LlamaBoard's narrow
right-hand column), in LlamaBoard's style (raw and smoothed). A three-agent run's log also holds
the per-agent statistics (documents chosen and gold recall, sub-questions and candidate recall,
answer words, reward, KL and entropy per agent): their panels, those of ``training_agents.png``
(:data:`mmoa.train.plots.AGENT_PANELS`), follow below, so that an agent collapsing under a
healthy-looking reward shows while the run is still going.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: trainer_log key (also the axis label) and colour of each panel.
PLOTTED = (("loss", "#1f77b4"), ("reward", "#2ca02c"))
#: Inches of figure height per per-agent panel below the two above.
AGENT_PANEL_HEIGHT = 2.5


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
    import matplotlib.pyplot as plt
    from llamafactory.extras.ploting import smooth

    from mmoa.train.plots import AGENT_PANELS, draw_agent_panels, has_agent_stats

    plt.close("all")
    plt.switch_backend("agg")
    agents = AGENT_PANELS if has_agent_stats(trainer_log) else ()
    fig, axes = plt.subplots(len(PLOTTED) + len(agents), 1,
                             figsize=(5, 6 + AGENT_PANEL_HEIGHT * len(agents)), sharex=True)
    draw_agent_panels(axes[len(PLOTTED):], trainer_log, "current_steps", agents)
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
