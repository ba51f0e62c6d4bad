"""The critic: a scalar value head on the policy's own last hidden state.

The three agents share one backbone and one value head (parameter sharing, as in MMOA-RAG).
We own this small module instead of trl's ``AutoModelForCausalLMWithValueHead``, which trl has
already moved out of its public API; the file format is LLaMA-Factory's, so a checkpoint's
``value_head.safetensors`` (keys ``v_head.summary.weight`` / ``v_head.summary.bias``) loads in
LLaMA-Factory as well.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

VALUE_HEAD_FILE = "value_head.safetensors"
KEY_PREFIX = "v_head."


class ValueHead(nn.Module):
    """``hidden [B, T, H] -> values [B, T]`` with one linear layer (named ``summary``)."""

    def __init__(self, hidden_size: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.summary = nn.Linear(hidden_size, 1)
        # A zero-initialised critic predicts 0 everywhere: the first advantages are the rewards
        # themselves instead of noise from a random projection of large hidden states.
        nn.init.zeros_(self.summary.weight)
        nn.init.zeros_(self.summary.bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden = self.dropout(hidden_states).to(self.summary.weight.dtype)
        return self.summary(hidden).squeeze(-1)

    def save(self, folder: str | Path, state_dict: dict[str, Any] | None = None) -> Path:
        """Writes this head's weights, or ``state_dict`` (this head's keys, gathered elsewhere:
        under DeepSpeed ZeRO-3 the module itself only holds a partition)."""
        path = Path(folder) / VALUE_HEAD_FILE
        own = self.state_dict() if state_dict is None else state_dict
        state = {KEY_PREFIX + k: v.detach().cpu().contiguous() for k, v in own.items()}
        save_file(state, str(path), metadata={"format": "pt"})
        return path

    def load(self, folder: str | Path) -> None:
        path = Path(folder) / VALUE_HEAD_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no value head in this checkpoint")
        state = load_file(str(path))
        own = {k.removeprefix(KEY_PREFIX): v for k, v in state.items() if k.startswith(KEY_PREFIX)}
        missing = {"summary.weight", "summary.bias"} - set(own)
        if missing:
            raise ValueError(f"{path}: missing value-head keys {sorted(missing)}")
        self.load_state_dict(own)
