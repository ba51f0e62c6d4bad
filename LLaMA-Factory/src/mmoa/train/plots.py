"""The training plots of our stages: LLaMA-Factory's ``plot_loss``, with its figures closed.

``plot_loss`` draws each key on a new pyplot figure and saves it but never closes it, so a
process that trains several runs (the tests, a web UI session, a bench in-process) keeps every
figure alive and matplotlib warns after 20 of them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


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
