"""The weights a rollout generates with: the policy itself, or a copy of it in the compute dtype.

Training keeps fp32 master weights and computes under bf16 autocast (LLaMA-Factory's
``bf16: true``). Two things want the rollouts' ``generate`` to run on weights already *in* bf16:

- on a GPU, the project's inference rule (:func:`mmoa.precision.inference_weights_dtype`):
  evaluation loads bf16 weights there, so rollouts and evaluation compute alike, and no
  decoding step casts every fp32 weight to bf16 again;
- the static KV cache (:mod:`mmoa.agents.generation_cache`), which cannot hold the fp32 keys
  and bf16 values that autocast over fp32 weights produces.

So, as verl's rollout engine does with its own copy of the actor's weights, the trainer keeps a
second model in the compute dtype, made once by ``deepcopy`` and refreshed from the master
weights (one ``torch._foreach_copy_``) before every rollout, so it always samples from the
policy as updated. The matrix products are the same as under autocast (autocast casts each fp32
weight to bf16 too); the element-wise operations (norms, residual sums) run in bf16 instead of
fp32, as in evaluation. The learner's scoring, and so PPO's ratios, still use the master weights
under autocast. It costs the copy's memory (half the fp32 weights) and is not made under
ZeRO-3, where no process holds the whole model.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from mmoa.agents.generation_cache import resolve_generation_cache


def rollout_weights_dtype(master_dtype: torch.dtype, autocast_dtype: torch.dtype | None,
                          device_type: str, cache: str) -> torch.dtype | None:
    """The dtype of the rollout copy, or ``None`` when the rollouts generate with the policy
    itself: a copy only under autocast over weights of another dtype, and then on a GPU (the
    inference rule) or with the static cache (which needs it)."""
    if autocast_dtype is None or master_dtype == autocast_dtype:
        return None
    if device_type == "cuda" or resolve_generation_cache(cache, device_type) == "static":
        return autocast_dtype
    return None


class RolloutWeights:
    """The rollouts' model: :meth:`policy_for_rollout` returns the policy, or its copy in
    ``dtype`` brought up to date with the policy's current weights."""

    def __init__(self, dtype: torch.dtype | None) -> None:
        self.dtype = dtype
        self._copy: Any = None
        self._pairs: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    @property
    def copies(self) -> bool:
        return self.dtype is not None

    def policy_for_rollout(self, policy: Any) -> Any:
        if self.dtype is None:
            return policy
        if self._copy is None:
            self._copy = self._make_copy(policy)
        else:
            targets, sources = self._pairs
            with torch.no_grad():
                torch._foreach_copy_(targets, sources)
        self._copy.eval()
        return self._copy

    def _make_copy(self, policy: Any) -> Any:
        grads = {}
        for param in policy.parameters():  # not copied: the copy never computes a gradient
            grads[param] = param.grad
            param.grad = None
        try:
            clone = copy.deepcopy(policy)
        finally:
            for param, grad in grads.items():
                param.grad = grad
        clone.to(self.dtype)
        clone.requires_grad_(False)
        sources = list(policy.parameters())
        targets = list(clone.parameters())
        if len(sources) != len(targets) or any(
                s.shape != t.shape for s, t in zip(sources, targets, strict=True)):
            raise RuntimeError("the rollout copy's parameters do not match the policy's")
        self._pairs = (targets, sources)
        return clone
