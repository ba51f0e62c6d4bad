"""Stochastic retrieval: an ordered top-k sampled from a candidate pool, and its log-probability.

HARR (arXiv 2602.03645) turns a dense retriever into a policy: the ``pool_size`` passages with
the highest inner-product scores form a candidate pool, and ``k`` of them are drawn in order,
without replacement, from ``softmax(score / alpha)`` over the candidates not yet drawn
(Plackett-Luce). Its log-probability is

    log p(picks) = sum_j [ s_{picks_j} / alpha - logsumexp_{i in pool \\ picks_<j} s_i / alpha ]

normalised within the pool, not over the whole corpus: passages outside the pool have
probability 0 under the sampler (an acknowledged approximation of HARR, which is exact here
because the sampler never leaves the pool either).

One definition serves both sides: the server computes the log-probability of what it sampled
with :func:`plackett_luce_logprob` on the scores of its own encoder, and the trainer calls the
same function on scores recomputed with gradients (``mmoa.train.retriever_rl``).

Sampling uses the Gumbel-top-k trick: adding independent Gumbel(0, 1) noise to ``s / alpha`` and
taking the ``k`` largest gives exactly a Plackett-Luce sample (Kool et al. 2019), in one sort
instead of ``k`` rounds of renormalisation. The noise of query ``i`` of a request comes from its
own generator seeded with ``(seed, i)``, so a response does not depend on how the server batched
the request with others, and the same seed gives the same response.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mmoa import defaults

if TYPE_CHECKING:  # imported where used: the server's argument parser needs no torch
    import torch

#: Largest seed accepted (JSON integers beyond 2**63 lose precision in many clients).
MAX_SEED = 2**63 - 1
#: Range of ``alpha`` a server request may ask for: beyond it ``score / alpha`` overflows or the
#: ranking no longer depends on the scores (1e-309 gave a NaN log-probability, not valid JSON).
MIN_ALPHA = 1e-8
MAX_ALPHA = 1e8


@dataclass(frozen=True)
class SampleSpec:
    """What a sampled retrieval request asks for (``k`` is the request's ``topk``/``N``)."""

    pool_size: int = defaults.RETRIEVER_POOL_SIZE
    alpha: float = defaults.RETRIEVER_ALPHA
    seed: int = 0
    #: Index of the request's first query in the caller's whole batch: a client that splits a
    #: batch into several requests sends each chunk's offset, so query ``i`` of the batch draws
    #: from the stream ``(seed, i)`` however the batch was split.
    query_offset: int = 0

    def __post_init__(self) -> None:
        if self.pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {self.pool_size}")
        if not (math.isfinite(self.alpha) and self.alpha > 0):
            raise ValueError(f"alpha must be a positive finite number, got {self.alpha}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed must lie in 0..2**63-1, got {self.seed}")
        if self.query_offset < 0:
            raise ValueError(f"query_offset must be >= 0, got {self.query_offset}")


def query_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of query ``index`` under ``seed``: independent streams per query."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(index)]))


def gumbel_top_k(scores: np.ndarray, k: int, alpha: float, rng: np.random.Generator
                 ) -> np.ndarray:
    """Positions (into ``scores``) of an ordered Plackett-Luce sample of ``min(k, n)`` items.

    ``scores``: the pool's scores, 1-d. Equivalent to drawing ``k`` times without replacement
    from ``softmax(scores / alpha)`` renormalised over what is left; computed in float64 so a
    small ``alpha`` (large logits) keeps the score order exact.
    """
    logits = np.asarray(scores, dtype=np.float64) / alpha
    if logits.ndim != 1:
        raise ValueError(f"scores must be 1-d, got shape {logits.shape}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    perturbed = logits + rng.gumbel(size=logits.shape[0])
    # Stable sort on the negated keys: ties (only possible with alpha so large the noise is
    # irrelevant, or equal scores) resolve to the pool order, like the greedy ranking.
    return np.argsort(-perturbed, kind="stable")[: min(k, logits.shape[0])]


def plackett_luce_logprob(scores: torch.Tensor, picks: torch.Tensor, alpha: float,
                          valid: torch.Tensor | None = None) -> torch.Tensor:
    """Log-probability of the ordered ``picks`` under Plackett-Luce over ``softmax(scores/alpha)``.

    ``scores``: ``[..., P]`` pool scores (differentiable: the trainer's gradient flows through
    them into the query encoder). ``picks``: ``[..., k]`` positions into the pool, distinct per
    row, in the order drawn. ``valid``: optional ``[..., P]`` bool, false for pool slots that do
    not exist (a corpus smaller than the pool, padding in a batch); those are never candidates.
    Returns ``[...]``: ``sum_j (s[picks_j] - logsumexp(s over the not-yet-picked valid slots))
    / alpha`` scaled as logits. Computed in the dtype of ``scores`` (float64 recommended for a
    small ``alpha``).
    """
    import torch

    if scores.shape[:-1] != picks.shape[:-1]:
        raise ValueError(f"scores {tuple(scores.shape)} and picks {tuple(picks.shape)} must "
                         f"agree on every dimension but the last")
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"alpha must be a positive finite number, got {alpha}")
    picks = picks.long()
    n_pool = scores.shape[-1]
    if picks.numel() and (int(picks.min()) < 0 or int(picks.max()) >= n_pool):
        raise ValueError(f"picks must be positions in the pool 0..{n_pool - 1}")
    logits = scores / alpha
    remaining = (torch.ones_like(scores, dtype=torch.bool) if valid is None
                 else valid.to(torch.bool).clone())
    if not bool(remaining.gather(-1, picks).all()):
        raise ValueError("a pick points at an invalid pool slot")
    neg_inf = torch.tensor(float("-inf"), dtype=logits.dtype, device=logits.device)
    total = torch.zeros(scores.shape[:-1], dtype=logits.dtype, device=logits.device)
    for j in range(picks.shape[-1]):
        pick = picks[..., j:j + 1]
        if not bool(remaining.gather(-1, pick).all()):
            raise ValueError(f"pick {j} repeats an earlier pick; picks are without replacement")
        norm = torch.logsumexp(torch.where(remaining, logits, neg_inf), dim=-1)
        total = total + logits.gather(-1, pick).squeeze(-1) - norm
        remaining = remaining.scatter(-1, pick, False)
    return total


def sample_pool(scores: np.ndarray, k: int, alpha: float, rng: np.random.Generator
                ) -> tuple[np.ndarray, float]:
    """One sampled retrieval from a pool: the ordered positions and their log-probability.

    ``scores``: the valid pool scores, best first (as Faiss returns them). What the server
    answers for one query of a sampled request.
    """
    import torch

    positions = gumbel_top_k(scores, k, alpha, rng)
    logprob = plackett_luce_logprob(torch.from_numpy(np.asarray(scores, dtype=np.float64)),
                                    torch.from_numpy(positions.astype(np.int64)), alpha)
    return positions, float(logprob)
