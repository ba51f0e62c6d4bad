"""GRPO on the Plackett-Luce log-probabilities of sampled retrievals.

One update, given a step's rollouts: ``G`` sampled retrievals for each of ``Q`` questions, their
rewards ``[Q, G]``, the pools (as frozen passage vectors), the ordered picks and the behaviour
log-probabilities the server reported. The query vectors are recomputed with gradients, the
pool scores are their inner products with the frozen passage vectors, and the log-probability
is :func:`mmoa.retrieval.sampling.plackett_luce_logprob` of those scores (the server's own
definition). Advantages and the clipped surrogate come from ``mmoa.train.mappo.ppo_math``
(one sample = one "token" of the loss), so there is no second copy of the GRPO maths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mmoa.retrieval.sampling import plackett_luce_logprob
from mmoa.train.mappo.ppo_math import group_relative_advantages, policy_loss, zero_variance_groups


def sample_logprobs(query_vectors: torch.Tensor, pool_vectors: torch.Tensor,
                    valid: torch.Tensor, picks: torch.Tensor, alpha: float) -> torch.Tensor:
    """``[n]`` log-probabilities of the picks: ``query_vectors [n, d]`` against the frozen
    ``pool_vectors [n, P, d]`` (inner product, as the index scores), masked by ``valid``."""
    device = query_vectors.device
    scores = torch.einsum("nd,npd->np", query_vectors,
                          pool_vectors.to(device=device, dtype=query_vectors.dtype))
    return plackett_luce_logprob(scores.double(), picks.to(device), alpha, valid.to(device))


@dataclass
class RetrievalGroups:
    """A step's rollouts, sample ``q * G + g`` being question ``q``'s ``g``-th retrieval."""

    queries: list[str]          # [N] the query (state) text of each sample
    picks: torch.Tensor         # [N, k] positions in the pool, in sampled order
    pool_vectors: torch.Tensor  # [N, P, d] frozen passage vectors of the pool
    valid: torch.Tensor         # [N, P] pool slots that exist
    old_logprobs: torch.Tensor  # [N] behaviour log-probabilities (the server's)
    rewards: torch.Tensor       # [Q, G]

    def __post_init__(self) -> None:
        n = len(self.queries)
        q, g = self.rewards.shape
        if q * g != n or self.picks.shape[0] != n or self.old_logprobs.shape != (n,):
            raise ValueError(f"{n} samples do not match rewards [{q}, {g}], picks "
                             f"{tuple(self.picks.shape)}, old_logprobs "
                             f"{tuple(self.old_logprobs.shape)}")


def grpo_update(embed: Callable[[Sequence[str]], torch.Tensor],
                parameters: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                groups: RetrievalGroups, *, alpha: float, cliprange: float, epochs: int = 1,
                max_grad_norm: float = 1.0, normalise: str = "mean_std") -> dict[str, float]:
    """``epochs`` clipped-surrogate steps on the whole batch; returns the step's statistics.

    A batch in which every group's rewards are all equal has zero advantages everywhere and no
    gradient: the optimizer is not stepped (AdamW's update of a zero gradient is not zero once
    it has momentum, and would move the encoder without any signal).
    """
    advantages = group_relative_advantages(groups.rewards, normalise).reshape(-1)
    unique = list(dict.fromkeys(groups.queries))
    where = torch.tensor([unique.index(q) for q in groups.queries])
    ones = torch.ones((len(groups.queries), 1), dtype=torch.bool)
    old = groups.old_logprobs.double()
    stats: dict[str, float] = {
        "reward": float(groups.rewards.mean()),
        "grpo/zero_variance_fraction": float(zero_variance_groups(groups.rewards).double()
                                             .mean()),
    }
    signal = bool(advantages.abs().max() > 0)
    for epoch in range(epochs):
        logprobs = sample_logprobs(embed(unique)[where], groups.pool_vectors, groups.valid,
                                   groups.picks, alpha)
        if epoch == 0:
            # |trainer - server| before any update: ~0 when the server serves the trainer's
            # weights; large when it serves something else (a stale or a wrong encoder).
            stats["logprob_gap"] = float((logprobs.detach().cpu() - old).abs().mean())
        device = logprobs.device
        loss, loss_stats = policy_loss(logprobs[:, None], old[:, None].to(device),
                                       advantages[:, None].to(device), ones.to(device),
                                       cliprange)
        stats.update(loss=float(loss.detach()), **{k: float(v) for k, v in loss_stats.items()})
        if not signal:
            stats["grad_norm"] = 0.0
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm))
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if signal:
        # How far the update moved the batch's log-probabilities: the scale against which
        # the next step's logprob_gap tells a server that reloaded from one that did not.
        with torch.no_grad():
            after = sample_logprobs(embed(unique)[where], groups.pool_vectors, groups.valid,
                                    groups.picks, alpha)
        stats["logprob_shift"] = float((after.cpu() - old).abs().mean())
    return stats
