"""Which agents of the three-agent pipeline run in each evaluation mode.

Kept apart from :mod:`mmoa.agents.pipeline` (which loads torch and transformers) so that the
command line's parser and the evaluation config read the modes without loading a model library.
"""

from __future__ import annotations

from typing import Literal

from mmoa.agents.prompts import AgentName

Mode = Literal["g", "rag", "s_g", "qr_g", "qr_s_g"]
MODES: tuple[Mode, ...] = ("g", "rag", "s_g", "qr_g", "qr_s_g")
#: Evaluation-only modes that read the record's gold supporting passages instead of retrieving
#: (``gold_g``: the Generator on them, :mod:`mmoa.retrieval.gold`). Not in :data:`MODES`: the
#: Playground lists those, and a typed question has no gold passages.
OracleMode = Literal["gold_g"]
ORACLE_MODES: tuple[OracleMode, ...] = ("gold_g",)
MODE_AGENTS: dict[str, tuple[AgentName, ...]] = {
    "g": ("generator",),
    "rag": ("generator",),
    "s_g": ("selector", "generator"),
    "qr_g": ("qr", "generator"),
    "qr_s_g": ("qr", "selector", "generator"),
    "gold_g": ("generator",),
}
