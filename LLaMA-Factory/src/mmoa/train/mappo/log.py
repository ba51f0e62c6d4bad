"""The MAPPO stage's logger, and the one-line step summary shown in LlamaBoard's log box."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

#: Agents in pipeline order, as the penalty-rate log keys name them.
_AGENTS = ("qr", "selector", "generator")


def mappo_logger() -> logging.Logger:
    """A child of LLaMA-Factory's "llamafactory" logger: its lines reach stderr and, under the web
    UI, the LlamaBoard log box (LogCallback attaches its file handler to that logger only)."""
    from llamafactory.extras import logging as lf_logging

    return lf_logging.get_logger("llamafactory.mmoa.mappo")


def in_web_ui() -> bool:
    """Whether LlamaBoard started this run (it sets ``LLAMABOARD_ENABLED`` for its runs)."""
    return os.environ.get("LLAMABOARD_ENABLED", "0").lower() in ("1", "true", "y")


def step_summary(step: int, total: int, logs: Mapping[str, float]) -> str:
    """One line per logged step with what tells whether MAPPO learns: LlamaBoard's own log line
    carries loss, learning rate and epoch only (and drops a reward of 0)."""
    def num(key: str, digits: int = 3) -> str:
        value = logs.get(key)
        return "-" if value is None else f"{value:.{digits}f}"

    penalties = " / ".join(f"{agent} {num(f'penalty_rate/{agent}', 2)}" for agent in _AGENTS
                           if f"penalty_rate/{agent}" in logs)
    parts = [f"reward {num('reward')}", f"answer F1 {num('answer_f1')}", f"KL {num('kl')}",
             f"loss {num('loss', 4)}", f"approx_kl {num('approx_kl', 4)}"]
    if penalties:
        parts.append(f"penalty rate {penalties}")
    if "grpo/zero_variance_groups" in logs:  # grpo: groups whose rollouts all scored the same
        parts.append(f"zero-variance groups {logs['grpo/zero_variance_groups']:g}/"
                     f"{logs.get('grpo/groups', 0):g}")
    if "time/step" in logs:
        parts.append(f"{logs['time/step']:.1f} s")
    return f"[mappo] step {step}/{total}: " + ", ".join(parts)
