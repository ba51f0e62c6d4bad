"""GRPO on the Plackett-Luce log-probabilities of sampled retrievals.

One update, given a step's rollouts: ``G`` sampled retrievals for each of ``Q`` questions, their
rewards ``[Q, G]``, the pools (as frozen passage vectors), the ordered picks and the behaviour
log-probabilities the server reported. The query vectors are recomputed with gradients, the
pool scores are their inner products with the frozen passage vectors, and the log-probability
is :func:`mmoa.retrieval.sampling.plackett_luce_logprob` of those scores (the server's own
definition). Advantages and the clipped surrogate come from ``mmoa.train.mappo.ppo_math``, so
there is no second copy of the GRPO maths.

A sample (one of a question's ``G`` rollouts) may hold several retrievals (one per sub-question,
``retriever_queries: decomposition``). Each retrieval is then one "token" of the sample: row
``i`` of the ``[N, H]`` matrices holds sample ``i``'s retrievals in order, all with the sample's
advantage, and the clipped ratio is taken per retrieval, as GRPO takes it per token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mmoa.retrieval.sampling import plackett_luce_logprob
from mmoa.train.mappo.ppo_math import group_relative_advantages, policy_loss, zero_variance_groups


class NonFiniteLossError(ValueError):
    """The GRPO loss or its gradient norm is NaN or infinite: the update is not applied (the
    stage skips the step, and stops after ``retriever_max_nonfinite_steps`` in a row)."""


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
    """A step's rollouts: ``E`` retrievals belonging to ``N = Q * G`` samples, sample
    ``q * G + g`` being question ``q``'s ``g``-th rollout."""

    queries: list[str]          # [E] the state text each retrieval embedded
    picks: torch.Tensor         # [E, k] positions in the pool, in sampled order
    pool_vectors: torch.Tensor  # [E, P, d] frozen passage vectors of the pool
    valid: torch.Tensor         # [E, P] pool slots that exist
    old_logprobs: torch.Tensor  # [E] behaviour log-probabilities (the server's)
    rewards: torch.Tensor       # [Q, G]
    #: [E] the sample of each retrieval, non-decreasing (a sample's retrievals in order);
    #: ``None``: one retrieval per sample (E = N).
    sample_of: torch.Tensor | None = None

    def __post_init__(self) -> None:
        e = len(self.queries)
        q, g = self.rewards.shape
        if self.sample_of is None:
            self.sample_of = torch.arange(e)
        if self.picks.shape[0] != e or self.old_logprobs.shape != (e,) \
                or self.sample_of.shape != (e,):
            raise ValueError(f"{e} retrievals do not match picks {tuple(self.picks.shape)}, "
                             f"old_logprobs {tuple(self.old_logprobs.shape)}, sample_of "
                             f"{tuple(self.sample_of.shape)}")
        if e and (int(self.sample_of.min()) < 0 or int(self.sample_of.max()) >= q * g
                  or bool((self.sample_of.diff() < 0).any())):
            raise ValueError(f"sample_of must be non-decreasing sample numbers in 0..{q * g - 1}")

    def layout(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(sample, hop, mask)``: each retrieval's cell in the ``[N, H]`` matrices, and the
        ``[N, H]`` mask of the cells that hold one."""
        assert self.sample_of is not None
        n = self.rewards.numel()
        counts = torch.bincount(self.sample_of, minlength=n)
        starts = torch.cumsum(counts, 0) - counts
        hop = torch.arange(len(self.queries)) - starts[self.sample_of]
        mask = torch.zeros((n, int(counts.max()) if n else 0), dtype=torch.bool)
        mask[self.sample_of, hop] = True
        return self.sample_of, hop, mask


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
    sample, hop, mask = groups.layout()
    old = groups.old_logprobs.double()

    def as_matrix(values: torch.Tensor) -> torch.Tensor:  # [E] -> [N, H], differentiable
        out = torch.zeros(mask.shape, dtype=values.dtype, device=values.device)
        return out.index_put((sample.to(values.device), hop.to(values.device)), values)

    adv_matrix = advantages[:, None].expand(mask.shape)
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
        loss, loss_stats = policy_loss(as_matrix(logprobs), as_matrix(old.to(device)),
                                       adv_matrix.to(device), mask.to(device), cliprange)
        stats.update(loss=float(loss.detach()), **{k: float(v) for k, v in loss_stats.items()})
        if not torch.isfinite(loss.detach()).all():
            # stepping would write NaN into the encoder (and the run ended with exit code 0)
            raise NonFiniteLossError(
                f"the GRPO loss is not finite ({float(loss.detach())}) in update epoch "
                f"{epoch + 1}: non-finite log-probabilities (trainer "
                f"{float(logprobs.detach().abs().max())}, server "
                f"{float(old.abs().max())}) or rewards; the update was not applied")
        if not signal:
            stats["grad_norm"] = 0.0
            break
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
        if not torch.isfinite(grad_norm):
            # the norm clip_grad_norm_ computed anyway: stepping would write NaN into AdamW's
            # moments and the encoder for good
            optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"the gradient norm is not finite ({float(grad_norm)}) in update epoch "
                f"{epoch + 1}; its update was not applied")
        stats["grad_norm"] = float(grad_norm)
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
