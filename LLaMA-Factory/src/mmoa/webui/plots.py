"""The live plot of a MAPPO run in the Train tab: loss *and* shared reward.

LlamaBoard's own plot (``gen_loss_plot``) draws only the loss; for PPO the reward is the curve a
user watches, so MAPPO runs get both, one above the other (the plot sits in LlamaBoard's narrow
right-hand column), in LlamaBoard's style (raw and smoothed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: trainer_log key (also the axis label) and colour of each panel.
PLOTTED = (("loss", "#1f77b4"), ("reward", "#2ca02c"))


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

    plt.close("all")
    plt.switch_backend("agg")
    fig, axes = plt.subplots(len(PLOTTED), 1, figsize=(5, 6), sharex=True)
    for ax, (key, color) in zip(axes, PLOTTED, strict=True):
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
