"""LLaMA-Factory's ``LogCallback`` with the per-agent statistics in ``trainer_log.jsonl``.

The web UI draws a running job's curves from ``trainer_log.jsonl`` alone, and LogCallback writes
a fixed set of keys there (loss, reward, learning rate, progress). The MAPPO per-agent panels
(documents chosen, gold recall, per-agent KL, ...; :data:`mmoa.train.plots.AGENT_PLOT_KEYS`)
must show while the job runs, which is when a collapse is worth seeing, so each line also gets
the step's per-agent keys, and the keys of the algorithm's own curves (answer F1, KL, the value
loss, ...: ``workflow.plot_keys``) that LogCallback leaves out. ``trainer_state.json`` keeps
every key as before; a resumed run keeps the lines up to its checkpoint as before
(``workflow.logged_steps_until``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llamafactory.train.callbacks import LogCallback

from mmoa.train.plots import AGENT_PLOT_KEYS


class MappoLogCallback(LogCallback):
    """Adds the logged step's :data:`AGENT_PLOT_KEYS` and ``curve_keys`` to its
    ``trainer_log.jsonl`` line.

    LogCallback hands each line to a writer thread; the keys are kept per step until that
    line is written, so a slow write never pairs a line with another step's statistics."""

    def __init__(self, curve_keys: Sequence[str] = ()) -> None:
        super().__init__()
        self._keys = tuple(dict.fromkeys([*AGENT_PLOT_KEYS, *curve_keys]))
        self._agent_keys: dict[int, dict[str, Any]] = {}

    def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if args.should_save and state.log_history:
            entry = state.log_history[-1]
            self._agent_keys[state.global_step] = {key: entry[key] for key in self._keys
                                                   if key in entry}
        super().on_log(args, state, control, **kwargs)

    def _write_log(self, output_dir: str, logs: dict[str, Any]) -> None:
        extra = self._agent_keys.pop(logs.get("current_steps", -1), {})
        super()._write_log(output_dir, {**logs, **extra})
