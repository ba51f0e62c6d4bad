"""The pure math of our MAPPO stage: masked statistics, log-probs, KL, rewards, GAE, PPO losses.

Plain torch, no model and no trainer state, so every formula can be unit tested against values
worked out by hand. The trainer composes these functions; it never re-derives them.

Why our own and not trl's: llamafactory 0.9.5 installs trl 0.24, which no longer has the old
``PPOTrainer``/``trl.core`` that the original MMOA-RAG system used (trl 0.9.6). The formulas here
reproduce that trl version's PPO, which is what the paper's numbers were obtained with:

* per-token reward ``-kl_coef * (logp - logp_ref)`` plus the scalar score on the last response
  token (``kl_penalty="kl"``), no reward whitening, no score scaling;
* GAE with ``gamma=1.0, lam=0.95`` over one agent's response only (each agent's response is its
  own single-turn episode: the value after its last token is 0, nothing is bootstrapped from
  another agent);
* advantages whitened over the whole batch, agents pooled (``masked_whiten``);
* the clipped surrogate, the clipped value loss ``0.5 * max(...)``, ``approx_kl`` as
  ``0.5 * mean((logp - old)^2)``;
* the adaptive KL controller (Ziegler et al. 2019) with a floor on the coefficient.

Conventions for every ``[B, T]`` tensor here: row ``i`` holds the RESPONSE tokens of sample ``i``
only (prompt tokens are never in these tensors), right-padded, and ``mask`` (bool or 0/1 float of
the same shape) is true on real response tokens. Positions where the mask is false are never read:
they may hold anything, even ``inf`` or ``nan``, without changing any output; outputs are 0 there.
This is enforced with ``torch.where`` rather than a multiplication by the mask, because
``inf * 0`` is ``nan``: e.g. a padded ratio ``exp(logp - old)`` can overflow. Where a function
needs the padding to be on the right (rewards, GAE), it checks.

Differences from trl 0.9.6, on purpose: ``masked_whiten`` returns 0 at padded positions (trl left
shifted garbage there that only its loss masking hid), and statistics are returned as detached
0-dim tensors instead of Python floats, so that the trainer decides when to synchronise the device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from mmoa import defaults

__all__ = [
    "FLAT_GROUP_TOL",
    "GROUP_NORMALISATIONS",
    "GROUP_STD_EPS",
    "K3_CLAMP",
    "KL_KINDS",
    "KL_SHAPES",
    "LOG_RATIO_CLAMP",
    "LOSS_AVERAGING",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "KLKind",
    "add_agent_penalties",
    "compute_gae",
    "entropy_from_logits",
    "group_relative_advantages",
    "grpo_advantages",
    "kl_loss",
    "logprobs_from_logits",
    "loss_count",
    "masked_average",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "masked_whiten_by_group",
    "pack_masked",
    "per_token_kl",
    "policy_loss",
    "restrict_to_support",
    "tis_weights",
    "token_rewards",
    "unpack_masked",
    "value_loss",
    "zero_variance_groups",
]

#: Added to the variance before the inverse square root in :func:`masked_whiten` (as trl).
WHITEN_EPS = 1e-8

KLKind = Literal["kl", "abs", "mse", "low_var_kl"]
KL_KINDS: tuple[str, ...] = ("kl", "abs", "mse", "low_var_kl")

#: How a loss is averaged over a mini-batch: over all its tokens (every token weighs the same;
#: trl's PPO, DAPO), per sequence first, then over sequences (the GRPO paper), or summed and
#: divided by a constant number of tokens per sequence (Dr. GRPO).
LossAveraging = Literal["token", "sequence", "constant"]
LOSS_AVERAGING: tuple[str, ...] = ("token", "sequence", "constant")

#: GRPO's group normalisation: ``(r - mean) / (std + eps)`` or, Dr. GRPO, ``r - mean``.
GroupNormalisation = Literal["mean_std", "mean"]
GROUP_NORMALISATIONS: tuple[str, ...] = ("mean_std", "mean")
#: Added to the group's standard deviation (as trl's GRPOTrainer).
GROUP_STD_EPS = 1e-4
#: A group is flat (every rollout rewarded alike, no signal) when its rewards' max - min is at
#: most this. Not ``advantage == 0``: a flat group's advantage is 0 only up to rounding (RLOO
#: with four rewards of 0.1 gives -1.4e-17), which let such groups escape the filters.
FLAT_GROUP_TOL = 1e-9
#: The log-ratio ``logp - old_logp`` is clamped to +-this before ``exp`` (verl's
#: ``compute_policy_loss_vanilla``): a token whose probability moved by e^20 would otherwise
#: overflow the ratio to ``inf`` and the loss to ``nan``; inside the range nothing changes.
LOG_RATIO_CLAMP = 20.0
#: The k3 KL estimate is clamped to +-this, its log-ratio to +-:data:`LOG_RATIO_CLAMP` (verl's
#: ``kl_penalty(..., "low_var_kl")``): k3 grows like ``exp(ref - logp)``, so one token the policy
#: has all but ruled out could dominate a whole batch's KL loss or reward.
K3_CLAMP = 10.0


# ---------------------------------------------------------------------------------------------
# Masks and masked statistics
# ---------------------------------------------------------------------------------------------


def _bool_mask(x: torch.Tensor, mask: torch.Tensor, name: str = "x") -> torch.Tensor:
    """``mask`` as a bool tensor, after checking that it has exactly the shape of ``x``.

    The shapes must match exactly: broadcasting a ``[B]`` mask against ``[B, T]`` values would
    silently compute something else.
    """
    if mask.shape != x.shape:
        raise ValueError(
            f"mask has shape {tuple(mask.shape)} but {name} has shape {tuple(x.shape)}; "
            "they must be equal ([batch, response_len])"
        )
    return mask if mask.dtype == torch.bool else mask != 0


def _check_right_padded(mask: torch.Tensor) -> None:
    """Raise unless every row of the ``[B, T]`` bool mask is ones then zeros (right padding).

    Rewards go on the last real token and GAE treats the first padded position as the end of the
    episode; both are wrong for a left-padded or holed mask, so this is an error, not a warning.
    (One device synchronisation per call; these functions run once per PPO batch.)
    """
    if mask.dim() != 2:
        raise ValueError(f"expected a [batch, response_len] mask, got shape {tuple(mask.shape)}")
    if mask.shape[1] > 1:
        bad = mask[:, 1:] & ~mask[:, :-1]  # a real token right after a padded one
        if bool(bad.any()):
            row = int(bad.any(dim=1).nonzero()[0, 0])
            raise ValueError(
                f"mask row {row} is not right-padded ({mask[row].int().tolist()}): response "
                "tensors must hold the real tokens first and the padding after them"
            )


def masked_mean(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None
) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is true.

    ``dim=None``: one scalar over every masked element of the batch (a token-level mean, which is
    how trl averages losses over a mini-batch). ``dim=d``: the mean along ``d`` (e.g. ``dim=1``
    gives a per-sample mean, shape ``[B]``). An empty mask (along ``dim``) gives ``nan`` (0/0);
    the trainer drops samples with no response token, so a loss never sees one.
    """
    m = _bool_mask(x, mask)
    total = torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))
    count = m.to(x.dtype)
    if dim is None:
        return total.sum() / count.sum()
    return total.sum(dim=dim) / count.sum(dim=dim)


def masked_average(x: torch.Tensor, mask: torch.Tensor,
                   averaging: LossAveraging | str = "token",
                   norm_length: int | None = None,
                   total: float | None = None) -> torch.Tensor:
    """A loss's mean over a mini-batch: ``"token"`` is :func:`masked_mean` over every masked
    element (a long response weighs more, token by token); ``"sequence"`` is the mean over rows
    of each row's own masked mean (every sample weighs the same, whatever its length). A row
    with no masked element is left out of the ``"sequence"`` mean (its own mean is 0/0).
    ``"constant"`` (Dr. GRPO, arXiv:2503.20783; verl's ``seq-mean-token-sum-norm``) is the sum
    over every masked element divided by ``rows * norm_length`` (default: ``x``'s width): no
    sequence's length enters its weight, so a long wrong answer is not penalised less per token
    than a short one.

    ``total``: the batch's count the mean is over, when ``x`` is only part of that batch (one
    micro-batch of a gradient-accumulation group, on one of several processes): its masked
    tokens under ``"token"``, its rows under ``"sequence"`` and ``"constant"``. The sum over
    ``x`` is then divided by ``total`` instead of ``x``'s own count, so the shares of every
    micro-batch and process add up to the mean over the whole batch (verl's ``agg_loss`` with
    global token counts, TRL's ``loss_type="dapo"``); see :func:`loss_count`."""
    if total is not None and not total > 0:
        raise ValueError(f"total must be > 0, got {total}")
    m = _bool_mask(x, mask)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    if averaging == "token":
        if total is None:
            return masked_mean(x, m)
        return torch.where(m, x, zero).sum() / total
    if averaging == "constant":
        length = x.shape[1] if norm_length is None else norm_length
        if length < 1:
            raise ValueError(f"norm_length must be at least 1, got {length}")
        rows = x.shape[0] if total is None else total
        return torch.where(m, x, zero).sum() / (rows * length)
    if averaging != "sequence":
        raise ValueError(f"unknown loss averaging {averaging!r}; expected one of "
                         f"{list(LOSS_AVERAGING)}")
    rows = m.any(dim=1)
    per_row = masked_mean(x[rows], m[rows], dim=1)
    if total is None:
        return per_row.mean()
    return per_row.sum() / total


def loss_count(mask: torch.Tensor, averaging: LossAveraging | str) -> int:
    """What :func:`masked_average` divides by, for one micro-batch's ``[B, T]`` mask: its
    masked tokens (``"token"``) or its rows with at least one (``"sequence"``, ``"constant"``).
    Summed over a batch's micro-batches (and processes) it is that batch's ``total``."""
    m = mask if mask.dtype == torch.bool else mask != 0
    if averaging == "token":
        return int(m.sum())
    return int(m.any(dim=1).sum())


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``x`` over all masked elements of the batch (a 0-dim tensor).

    ``unbiased=True`` applies Bessel's correction ``n / (n - 1)`` like trl; it then needs at
    least two masked elements (one with ``unbiased=False``) and raises ``ValueError`` otherwise,
    instead of returning ``inf`` or ``nan`` that would poison the whitened advantages.
    """
    m = _bool_mask(x, mask)
    n = int(m.sum())
    if n < (2 if unbiased else 1):
        raise ValueError(
            f"masked_var needs at least {2 if unbiased else 1} masked element(s), got {n}"
            + (" (unbiased variance divides by n - 1)" if unbiased else "")
        )
    mean = masked_mean(x, m)
    variance = masked_mean((x - mean) ** 2, m)
    if unbiased:
        variance = variance * (n / (n - 1))
    return variance


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Whiten ``x`` with the mean and (unbiased) variance of all its masked elements.

    Returns ``(x - mean) / sqrt(var + 1e-8)``, plus ``mean`` again when ``shift_mean=False``
    (scale only), and 0 at padded positions. The statistics are pooled over the whole batch, i.e.
    over the samples of all three agents together, as the original system did (it passed the 96
    QR/Selector/Generator samples to one ``PPOTrainer.step``).
    """
    m = _bool_mask(x, mask)
    mean = masked_mean(x, m)
    var = masked_var(x, m, unbiased=True)
    whitened = (x - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(m, whitened, torch.zeros((), dtype=whitened.dtype, device=x.device))


def masked_whiten_by_group(x: torch.Tensor, mask: torch.Tensor, groups: Sequence[str]
                           ) -> torch.Tensor:
    """:func:`masked_whiten` applied to each group of rows on its own (``groups[i]`` names row
    i's group, e.g. its agent), so every group's advantages have mean 0 and variance 1 over its
    own tokens.

    Why: pooled whitening (the original system's) ranks every agent's tokens against one mean,
    so an agent whose samples score above the pooled mean (or whose responses are longer, and
    so weigh more in a token mean) is pushed up as a whole, and the scale of one agent's signal
    is set by the others' spread. Per agent, each agent learns only which of its own actions
    did better than its own average, as MAPPO's per-agent baselines intend. A group with a
    single masked token has no variance: it is only shifted to 0.
    """
    if len(groups) != x.shape[0]:
        raise ValueError(f"{len(groups)} group names for {x.shape[0]} rows")
    out = torch.zeros_like(x)
    m = _bool_mask(x, mask)
    for name in dict.fromkeys(groups):
        rows = torch.tensor([g == name for g in groups], device=x.device)[:, None] & m
        count = int(rows.sum())
        if count == 0:
            continue
        if count == 1:
            out = torch.where(rows, torch.zeros_like(x), out)
            continue
        out = torch.where(rows, masked_whiten(x, rows), out)
    return out


# ---------------------------------------------------------------------------------------------
# Log-probabilities, entropy, KL
# ---------------------------------------------------------------------------------------------


def _check_logits(logits: torch.Tensor, labels: torch.Tensor | None = None) -> None:
    if logits.dim() < 2:
        raise ValueError(f"logits must be [..., vocab], got shape {tuple(logits.shape)}")
    if labels is not None and labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels have shape {tuple(labels.shape)} but logits have shape "
            f"{tuple(logits.shape)}; expected labels of shape {tuple(logits.shape[:-1])}"
        )


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[label]`` per position, in fp32, differentiable.

    ``logits``: ``[B, T, V]`` (any leading shape ``[..., V]``) in any float dtype, e.g. the bf16
    output of the policy for the positions that predict the response tokens; ``labels``:
    ``[B, T]`` token ids. Returns fp32 ``[B, T]``.

    Memory: ``log_softmax`` of the whole batch would materialise a second ``[B, T, V]`` tensor,
    in fp32 four times the size of bf16 logits (for Llama-3's 128k vocabulary, 32 x 512 tokens is
    8 GiB). Here one row of the first dimension is upcast at a time and the log-probability is
    ``logit[label] - logsumexp(logits)``, so the extra memory is one ``[T, V]`` fp32 row.
    Labels at padded positions must still be valid ids (any id, e.g. the pad id): the values
    there are garbage that the masks ignore.
    """
    _check_logits(logits, labels)
    if logits.dim() == 2:
        logits, labels = logits.unsqueeze(0), labels.unsqueeze(0)
        return logprobs_from_logits(logits, labels).squeeze(0)
    rows = []
    for row_logits, row_labels in zip(logits, labels, strict=True):
        row = row_logits.float()
        picked = row.gather(-1, row_labels.unsqueeze(-1).long()).squeeze(-1)
        rows.append(picked - torch.logsumexp(row, dim=-1))
    return torch.stack(rows)


def restrict_to_support(logits: torch.Tensor, support_ids: torch.Tensor | None) -> torch.Tensor:
    """``logits`` with ``-inf`` outside each position's support, out of place, differentiable.

    ``logits``: ``[B, T, V]``; ``support_ids``: ``[B, T, A]`` token ids, ``-1``-padded, where a
    position whose entries are all ``-1`` keeps its whole vocabulary (``None``: every position
    does). Then ``logprobs_from_logits`` gives ``logit[label] - logsumexp(logits[support])``,
    the log-prob under the renormalised masked distribution a grammar-constrained sampler drew
    from, and ``entropy_from_logits`` that distribution's entropy. Only the rows with a
    constrained position are masked (a ``[rows, T, V]`` boolean), as one agent's rows of a
    pooled batch usually are the only ones.
    """
    if support_ids is None:
        return logits
    if support_ids.shape[:2] != logits.shape[:2]:
        raise ValueError(f"support_ids {tuple(support_ids.shape)} does not match logits "
                         f"{tuple(logits.shape)} in its first two dimensions")
    constrained = (support_ids >= 0).any(dim=-1)  # [B, T]
    rows = constrained.any(dim=1).nonzero().squeeze(1)
    if rows.numel() == 0:
        return logits
    vocab = logits.shape[-1]
    ids = support_ids[rows]
    if int(ids.max()) >= vocab:
        raise ValueError(f"a support id ({int(ids.max())}) is outside the vocabulary ({vocab})")
    # padding (-1) is scattered into an extra column that is then dropped
    index = torch.where(ids >= 0, ids, torch.full_like(ids, vocab))
    allowed = torch.zeros((*ids.shape[:2], vocab + 1), dtype=torch.bool, device=logits.device)
    allowed.scatter_(-1, index, True)
    allowed = allowed[..., :vocab] | ~constrained[rows].unsqueeze(-1)
    masked = logits[rows].masked_fill(~allowed, float("-inf"))
    return logits.index_put((rows,), masked)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy ``-sum p log p`` of the softmax distribution at every position, fp32.

    ``logits``: ``[..., V]``; returns ``[...]``. ``0 log 0`` counts as 0, so ``-inf`` logits
    (tokens masked out) are fine. One upcast row of the first dimension at a time (see
    :func:`logprobs_from_logits`). Used for logging only.
    """
    _check_logits(logits)
    if logits.dim() == 2:
        return entropy_from_logits(logits.unsqueeze(0)).squeeze(0)
    rows = []
    for row_logits in logits:
        row = row_logits.float()
        probs = torch.softmax(row, dim=-1)
        rows.append(-torch.special.xlogy(probs, probs).sum(dim=-1))
    return torch.stack(rows)


def per_token_kl(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind | str = "kl"
) -> torch.Tensor:
    """A per-token estimate of KL(policy || reference) from the sampled tokens' log-probs.

    With ``d = logp - logp_ref`` for a token sampled from the policy:

    * ``"kl"``: ``d`` (k1). Unbiased, can be negative per token. The original system's reward
      estimator (trl ``kl_penalty="kl"``); :func:`token_rewards`' default
      (``mappo_kl_estimator``).
    * ``"abs"``: ``|d|``.
    * ``"mse"``: ``d^2 / 2`` (k2).
    * ``"low_var_kl"``: ``exp(-d) + d - 1`` (k3, Schulman's estimator): unbiased, never
      negative, lower variance; the better number to log. ``-d`` is clamped to
      +-:data:`LOG_RATIO_CLAMP` and k3 to +-:data:`K3_CLAMP` (verl's ``kl_penalty``), so one
      token the policy has nearly ruled out cannot make the estimate ``inf``.

    All four are exactly 0 where the policy equals the reference. Returns the shape of the inputs;
    no masking (mask afterwards).
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} "
            "must have the same shape"
        )
    diff = logprobs - ref_logprobs
    if kind == "kl":
        return diff
    if kind == "abs":
        return diff.abs()
    if kind == "mse":
        return 0.5 * diff.square()
    if kind == "low_var_kl":
        # log r with r = p_ref / p; k3 = (r - 1) - log r, both clamped as verl's kl_penalty
        log_ratio = (-diff).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.expm1(log_ratio) - log_ratio).clamp(-K3_CLAMP, K3_CLAMP)
    raise ValueError(f"unknown KL estimator {kind!r}; expected one of {list(KL_KINDS)}")


# ---------------------------------------------------------------------------------------------
# Rewards and advantages (rollout time: no gradients)
# ---------------------------------------------------------------------------------------------


def _float_dtype(x: torch.Tensor) -> torch.dtype:
    """At least fp32 for rewards and advantages, whatever the model's dtype (bf16 values)."""
    return torch.promote_types(x.dtype, torch.float32)


def pack_masked(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's masked elements moved to its front, in order: ``(packed, packed_mask)``.

    A multi-turn response (the search agent) has holes in its mask: the retrieved
    ``<information>`` tokens the model did not write. Rewards and GAE treat a row as one episode
    over the model's own tokens, so they run on the packed rows (right-padded, which they
    check) and :func:`unpack_masked` puts the results back; for a right-padded mask both are the
    identity. ``x`` and ``mask``: ``[B, T]``.
    """
    m = _bool_mask(x, mask)
    index = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices
    return x.gather(1, index), m.gather(1, index)


def unpack_masked(packed: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_masked` for a ``[B, T]`` result computed on packed rows:
    every value back at its token's position, 0 where ``mask`` is false."""
    m = _bool_mask(packed, mask, "packed")
    index = torch.sort((~m).to(torch.int8), dim=1, stable=True).indices
    out = torch.zeros_like(packed).scatter(1, index, packed)
    return torch.where(m, out, torch.zeros((), dtype=packed.dtype, device=packed.device))


#: How the KL-to-reference reward is spread over a response (``mappo_kl_reward``):
#: ``token`` pays ``-beta * kl_t`` at every token, so with GAE's lambda = 1 a longer response
#: collects more penalty and a strong KL coefficient rewards short outputs (the Selector's
#: fewer documents); ``mean`` pays the response's mean per-token KL once, on its last token:
#: the same pull away from drift, but a response is not charged for its length.
KL_SHAPES = ("token", "mean")


@torch.no_grad()
def token_rewards(
    scores: torch.Tensor | Sequence[float],
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float | torch.Tensor,
    kl_shape: str = "token",
    kl_estimator: KLKind | str = "kl",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token PPO rewards of a batch of single-turn episodes.

    ``scores``: ``[B]``, each sample's scalar reward (the shared answer F1 plus that agent's
    penalty). ``logprobs`` / ``ref_logprobs``: ``[B, T]`` log-probs of the sampled response tokens
    under the rollout policy and under the reference (warm-start) model. ``mask``: ``[B, T]``,
    right-padded. ``kl_coef``: the KL controller's current value (beta), or one value per row
    (``[B]``: per-agent coefficients).

    Returns ``(rewards, non_score_reward, kl)``, each ``[B, T]`` in at least fp32, 0 at padding:

    * ``kl``: the per-token KL estimate :func:`per_token_kl` of ``kl_estimator``: ``"kl"``
      (k1, ``logp - logp_ref``, the original's and the default) or ``"low_var_kl"`` (k3, never
      negative, lower variance; verl's ``kl_penalty: low_var_kl``), or ``"abs"`` / ``"mse"``;
    * ``non_score_reward``: with ``kl_shape="token"`` (PPO's, trl's), ``-kl_coef * kl`` on every
      real token; with ``kl_shape="mean"``, ``-kl_coef * mean(kl)`` over the row's tokens, once,
      on its last real token (:data:`KL_SHAPES`);
    * ``rewards = non_score_reward`` plus ``scores[i]`` on the last real token of row ``i``.

    A row with no response token (all-false mask) gets no reward anywhere: its score is dropped
    and all three outputs are 0 in that row. Nothing crashes; the learner drops such samples
    before the update (a 0-token action has nothing to reinforce).
    """
    m = _bool_mask(logprobs, mask, "logprobs")
    _check_right_padded(m)
    dtype = _float_dtype(logprobs)
    scores_t = torch.as_tensor(scores, dtype=dtype, device=logprobs.device)
    if scores_t.shape != (logprobs.shape[0],):
        raise ValueError(
            f"scores have shape {tuple(scores_t.shape)}; expected one score per row, "
            f"shape ({logprobs.shape[0]},)"
        )
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    kl = torch.where(m, per_token_kl(logprobs.to(dtype), ref_logprobs.to(dtype), kl_estimator),
                     zero)
    coef = torch.as_tensor(kl_coef, dtype=dtype, device=logprobs.device)
    if coef.dim() == 1:
        if coef.shape != (logprobs.shape[0],):
            raise ValueError(f"kl_coef has shape {tuple(coef.shape)}; expected a number or one "
                             f"per row, shape ({logprobs.shape[0]},)")
        coef = coef[:, None]
    # With right padding the last real token is the one whose successor is padding (or the end).
    next_real = torch.cat([m[:, 1:], torch.zeros_like(m[:, :1])], dim=1)
    is_last = m & ~next_real
    if kl_shape == "token":
        non_score_reward = -coef * kl
    elif kl_shape == "mean":
        # an empty row's mean is nan (0/0), but it has no last token, so it gets the zero
        mean_kl = masked_mean(kl, m, dim=1)[:, None]
        non_score_reward = torch.where(is_last, -coef * mean_kl, zero)
    else:
        raise ValueError(f"kl_shape must be one of {', '.join(KL_SHAPES)}, got {kl_shape!r}")
    rewards = non_score_reward + torch.where(is_last, scores_t[:, None], zero)
    return rewards, non_score_reward, kl


@torch.no_grad()
def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each row's response, one episode per row.

    ``rewards`` (from :func:`token_rewards`) and ``values`` (the value head at the rollout, the
    value of the state before each response token): ``[B, T]``, right-padded by ``mask``.

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` with ``V = 0`` after the last real token (the
    episode ends there: an agent's response is its own single-turn episode and its value is never
    bootstrapped from another agent's); ``A_t = delta_t + gamma * lam * A_{t+1}``, computed right
    to left with a loop over ``T``, vectorised over the batch.

    Returns ``(advantages, returns)``, ``[B, T]`` in at least fp32, 0 at padding, no gradient;
    ``returns = advantages + values`` are the value-loss targets. The advantages are NOT whitened
    here: whiten them over the whole batch with :func:`masked_whiten` (all agents pooled), as the
    original did.
    """
    m = _bool_mask(values, mask, "values")
    _check_right_padded(m)
    if rewards.shape != values.shape:
        raise ValueError(
            f"rewards {tuple(rewards.shape)} and values {tuple(values.shape)} must have the "
            "same shape"
        )
    dtype = _float_dtype(values)
    zero = torch.zeros((), dtype=dtype, device=values.device)
    values = torch.where(m, values.to(dtype), zero)
    rewards = torch.where(m, rewards.to(dtype), zero)
    batch, length = values.shape
    advantages = torch.zeros_like(values)
    last_gae = torch.zeros(batch, dtype=dtype, device=values.device)
    for t in reversed(range(length)):
        # Padding has value 0, so the value after the last real token is 0 (terminal).
        next_values = values[:, t + 1] if t + 1 < length else zero
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = torch.where(m[:, t], delta + gamma * lam * last_gae, zero)
        advantages[:, t] = last_gae
    returns = advantages + values
    return advantages, returns


# ---------------------------------------------------------------------------------------------
# Losses (update time: differentiable in logprobs / values)
# ---------------------------------------------------------------------------------------------


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
    averaging: LossAveraging | str = "token",
    cliprange_high: float | None = None,
    norm_length: int | None = None,
    total: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO clipped surrogate loss over the masked tokens of a mini-batch.

    ``ratio = exp(logp - old_logp)``; per token ``max(-A * ratio, -A * clip(ratio, 1 - c, 1 + c))``
    (the pessimistic of the two objectives), averaged by :func:`masked_average`: over all masked
    tokens of the mini-batch (``averaging="token"``, trl's PPO) or per sequence, then over
    sequences (``"sequence"``, the GRPO paper). Both PPO (GAE advantages) and GRPO (one group
    advantage repeated on every token of a sample) use this one loss. ``cliprange_high``
    (DAPO's clip-higher) replaces ``c`` in the upper bound, ``1 + cliprange_high``; ``None``
    keeps the symmetric range. ``norm_length`` and ``total``: see :func:`masked_average`
    (``"constant"``; a mean over the whole batch). ``weights`` (``[B, T]``, constants): each
    token's loss is multiplied by its weight before the averaging (truncated importance sampling,
    :func:`tis_weights`). ``logprobs`` carry the gradient; ``old_logprobs`` (rollout) and
    ``advantages`` (whitened) are constants and are detached here. The log-ratio is clamped to
    +-:data:`LOG_RATIO_CLAMP` before ``exp`` (verl's), so the ratio never overflows.

    Returns ``(loss, stats)`` with detached 0-dim stats: ``clipfrac`` (fraction of tokens where the
    clipped term was taken, i.e. the gradient is cut), ``approx_kl`` (``0.5 * mean((logp -
    old)^2)``, as trl), ``policy_kl`` (``mean(old - logp)``), ``ratio_mean`` (the learner skips a
    mini-batch when it is above ``PPOConfig.ratio_threshold``, 10 as in trl).
    """
    m = _bool_mask(logprobs, mask, "logprobs")
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(m, (logprobs - old_logprobs.detach()).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP), zero)  # 0 -> ratio 1 at padding
    advantages = torch.where(m, advantages.detach().to(logprobs.dtype), zero)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    high = cliprange if cliprange_high is None else cliprange_high
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + high)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * torch.where(m, weights.detach().to(logprobs.dtype), zero)
    loss = masked_average(per_token, m, averaging, norm_length, total)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).to(logprobs.dtype), m),
            "approx_kl": 0.5 * masked_mean(log_ratio.square(), m),
            "policy_kl": masked_mean(-log_ratio, m),
            "ratio_mean": masked_mean(ratio, m),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


@torch.no_grad()
def tis_weights(old_logprobs: torch.Tensor, sampling_logprobs: torch.Tensor,
                mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance sampling weights (verl's TIS, ``tis_imp_ratio_cap``; TRL's
    ``vllm_importance_sampling_correction``): per token ``min(exp(old - sampled), cap)``.

    ``old_logprobs``: the tokens' log-probs under the policy as the learner scores it (the
    policy PPO's ratio is taken against); ``sampling_logprobs``: under the distribution the
    rollout actually drew them from (the rollout copy in the compute dtype, top-p, the
    Selector's grammar mask), ``nan`` where none was recorded. The PPO objective assumes the
    tokens came from the scored policy; the weight corrects its expectation for the sampler
    that was used, and the cap bounds the variance a rare token could add. ``[B, T]``,
    detached; 1 where nothing was recorded, 0 at padding."""
    if not (math.isfinite(cap) and cap > 0):
        raise ValueError(f"the TIS cap must be a finite number > 0, got {cap}")
    m = _bool_mask(old_logprobs, mask, "old_logprobs")
    if sampling_logprobs.shape != old_logprobs.shape:
        raise ValueError(f"sampling_logprobs {tuple(sampling_logprobs.shape)} and old_logprobs "
                         f"{tuple(old_logprobs.shape)} must have the same shape")
    old = old_logprobs.detach().float()
    sampled = sampling_logprobs.detach().float().to(old.device)
    known = m & torch.isfinite(sampled)
    log_ratio = torch.where(known, old - torch.where(known, sampled, old), 0.0)
    weights = torch.exp(log_ratio.clamp(max=math.log(cap)))
    return torch.where(m, weights, 0.0)


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    averaging: LossAveraging | str = "token",
    norm_length: int | None = None,
    total: float | None = None,
) -> torch.Tensor:
    """The KL to the reference as a loss term (GRPO): the k3 estimator of :func:`per_token_kl`
    (``low_var_kl``, ``exp(ref - logp) - (ref - logp) - 1``, >= 0, unbiased for KL(pi||ref)
    under samples of pi), averaged as the policy loss is. ``logprobs`` carry the gradient;
    ``ref_logprobs`` are constants. Both are set to 0 at padded positions (k3 = 0 there) before
    the exponential, so whatever padding holds cannot leak an ``inf`` or ``nan`` into the loss
    or its gradient."""
    m = _bool_mask(logprobs, mask, "logprobs")
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    current = torch.where(m, logprobs, zero)
    ref = torch.where(m, ref_logprobs.detach().to(logprobs.dtype), zero)
    return masked_average(per_token_kl(current, ref, "low_var_kl"), m, averaging, norm_length,
                          total)


# ---------------------------------------------------------------------------------------------
# GRPO: group-relative advantages (rollout time: no gradients)
# ---------------------------------------------------------------------------------------------


def _group_rewards(rewards: torch.Tensor | Sequence[Sequence[float]]) -> torch.Tensor:
    r = torch.as_tensor(rewards, dtype=torch.float64)
    if r.dim() != 2 or r.shape[1] < 1:
        raise ValueError(f"group rewards must be [questions, group_size] with group_size >= 1, "
                         f"got shape {tuple(r.shape)}")
    if not bool(torch.isfinite(r).all()):
        raise ValueError("group rewards must be finite")
    return r


@torch.no_grad()
def group_relative_advantages(
    rewards: torch.Tensor | Sequence[Sequence[float]],
    normalise: GroupNormalisation | str = "mean_std",
    eps: float = GROUP_STD_EPS,
) -> torch.Tensor:
    """GRPO's advantage of each rollout relative to the other rollouts of its question.

    ``rewards``: ``[Q, G]``, row ``q`` the rewards of question ``q``'s ``G`` rollouts. Returns
    ``[Q, G]`` (float64): ``r - mean_q`` (``normalise="mean"``, Dr. GRPO) or
    ``(r - mean_q) / (std_q + eps)`` (``"mean_std"``, the GRPO paper), with ``std_q`` the
    sample standard deviation (``n - 1``, as trl's GRPOTrainer and DeepSeekMath). A group of
    one (``G = 1``) has no spread: its advantage is 0 under both. A group whose rewards are all
    equal gets 0 everywhere (see :func:`zero_variance_groups`).
    """
    r = _group_rewards(rewards)
    if normalise not in GROUP_NORMALISATIONS:
        raise ValueError(f"unknown group normalisation {normalise!r}; expected one of "
                         f"{list(GROUP_NORMALISATIONS)}")
    centred = r - r.mean(dim=1, keepdim=True)
    if normalise == "mean" or r.shape[1] == 1:
        return centred
    return centred / (r.std(dim=1, keepdim=True) + eps)


@torch.no_grad()
def zero_variance_groups(rewards: torch.Tensor | Sequence[Sequence[float]],
                         tol: float = FLAT_GROUP_TOL) -> torch.Tensor:
    """``[Q]`` bool: the questions whose ``G`` rollouts all got the same reward (all right or
    all wrong), i.e. ``max - min <= tol``: their group-relative advantage is 0, so they carry
    no signal. Decided from the rewards, never from the advantages, which are 0 only up to
    rounding (:data:`FLAT_GROUP_TOL`)."""
    r = _group_rewards(rewards)
    return (r.amax(dim=1) - r.amin(dim=1)) <= tol


@torch.no_grad()
def grpo_advantages(
    shared: torch.Tensor | Sequence[Sequence[float]],
    penalties: torch.Tensor | Sequence[Sequence[Sequence[float]]],
    normalise: GroupNormalisation | str = "mean_std",
) -> torch.Tensor:
    """Each agent's GRPO advantage in a multi-agent group: the group-normalised SHARED reward
    of its pipeline plus that agent's OWN penalty, as is.

    ``shared``: ``[Q, G]``, the answer reward of each of a question's ``G`` pipelines (every
    agent of a pipeline shares it). ``penalties``: ``[Q, G, A]``, agent ``a``'s penalty (<= 0)
    in pipeline ``g``. Returns ``[Q, G, A]``:
    ``A[q, g, a] = group_relative_advantages(shared)[q, g] + penalties[q, g, a]``.

    Why the penalty is added after the normalisation and not normalised with the reward: it is
    the agent's own format signal, not a share of the team's result, so it should not move the
    other agents' baselines, and it keeps its configured size (a malformed Selector output costs
    ``mappo_selector_penalty`` in advantage units whatever the group's spread); a group in
    which every rollout broke its format still pushes those outputs down, where a normalised
    penalty would cancel out.
    """
    return add_agent_penalties(group_relative_advantages(shared, normalise), penalties)


@torch.no_grad()
def add_agent_penalties(
    base: torch.Tensor,
    penalties: torch.Tensor | Sequence[Sequence[Sequence[float]]],
) -> torch.Tensor:
    """``[Q, G, A]``: the group advantage ``base[q, g]`` of a pipeline (any registered group
    advantage, :mod:`mmoa.train.mappo.algorithms`) plus each agent's own penalty, as is (see
    :func:`grpo_advantages`)."""
    p = torch.as_tensor(penalties, dtype=torch.float64)
    if p.dim() != 3 or p.shape[:2] != base.shape:
        raise ValueError(f"penalties must be [questions, group_size, agents] = "
                         f"[{base.shape[0]}, {base.shape[1]}, A], got shape {tuple(p.shape)}")
    return base.unsqueeze(-1) + p


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped value loss ``0.5 * mean(max((v - R)^2, (clip(v, old - c, old + c) - R)^2))``.

    ``values`` carry the gradient (current value head); ``old_values`` (rollout) and ``returns``
    (from :func:`compute_gae`) are constants. Clipping keeps the value head within ``c`` of its
    rollout prediction, as the policy is kept near its rollout policy. The trainer multiplies the
    loss by ``vf_coef`` (0.1 in the paper).

    Returns ``(loss, stats)`` with detached 0-dim stats: ``vf_clipfrac`` (fraction of tokens where
    the clipped error was the larger), ``value_mean`` (mean of ``values``), ``return_mean``, and
    ``explained_variance`` ``1 - Var(R - v) / Var(R)`` of the current ``values`` (1: perfect,
    0: no better than a constant; ``nan`` when the returns are constant).
    """
    m = _bool_mask(values, mask, "values")
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    values = torch.where(m, values, zero)
    old_values = torch.where(m, old_values.detach().to(values.dtype), zero)
    returns = torch.where(m, returns.detach().to(values.dtype), zero)
    clipped_values = torch.minimum(
        torch.maximum(values, old_values - cliprange_value), old_values + cliprange_value
    )
    err_unclipped = (values - returns).square()
    err_clipped = (clipped_values - returns).square()
    loss = 0.5 * masked_mean(torch.maximum(err_unclipped, err_clipped), m)
    with torch.no_grad():
        var_returns = _population_var(returns, m)
        var_residual = _population_var(returns - values, m)
        undefined = torch.full_like(var_returns, math.nan)
        explained = torch.where(var_returns > 0, 1.0 - var_residual / var_returns, undefined)
        stats = {
            "vf_clipfrac": masked_mean((err_clipped > err_unclipped).to(values.dtype), m),
            "value_mean": masked_mean(values, m),
            "return_mean": masked_mean(returns, m),
            "explained_variance": explained,
        }
    return loss, {k: v.detach() for k, v in stats.items()}


def _population_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Biased variance without a device sync (for statistics; ``nan`` on an empty mask)."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean).square(), mask)


# ---------------------------------------------------------------------------------------------
# KL coefficient controllers
# ---------------------------------------------------------------------------------------------


class KLController(Protocol):
    """What the trainer needs from a KL controller."""

    value: float

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def _finite_float(value: float | torch.Tensor, name: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {number}")
    return number


def _check_state(state: dict[str, Any], kind: str) -> float:
    if not isinstance(state, dict) or state.get("type") != kind:
        found = state.get("type") if isinstance(state, dict) else type(state).__name__
        raise ValueError(
            f"KL controller state is of type {found!r}, expected {kind!r}: the checkpoint was "
            "written with the other controller; resume with the same mappo KL settings"
        )
    if "value" not in state:
        raise ValueError(f"KL controller state has no 'value' key (keys: {sorted(state)})")
    return _finite_float(state["value"], "KL controller state 'value'")


@dataclass
class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019; trl 0.9.6), with a floor.

    After each PPO step, with ``current_kl`` the batch's mean summed KL per sample:
    ``e = clip(current_kl / target - 1, -0.2, 0.2)``, ``value *= 1 + e * n_steps / horizon``,
    then ``value = max(value, min_kl_coef)``. ``n_steps`` is the number of samples in the step
    (trl passed its batch size: 3 agents x 32 questions = 96 in the original).

    Defaults are the original's: ``init_kl_coef`` 0.2 (the paper's beta_max), ``target`` 6,
    ``horizon`` 10000, and the paper's beta_min 0.06 as the floor (the code used 0.05, 0.06 or
    0.08 depending on the file). The floor keeps the policy tied to the warm-start model when the
    KL stays below target for a long time, which otherwise decays beta towards 0.
    """

    init_kl_coef: float = defaults.INIT_KL_COEF
    target: float = defaults.KL_TARGET
    horizon: float = defaults.KL_HORIZON
    min_kl_coef: float = defaults.MIN_KL_COEF

    def __post_init__(self) -> None:
        for name in ("init_kl_coef", "target", "horizon"):
            if not (_finite_float(getattr(self, name), name) > 0):
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not _finite_float(self.min_kl_coef, "min_kl_coef") >= 0:
            raise ValueError(f"min_kl_coef must be >= 0, got {self.min_kl_coef}")
        self.value: float = max(float(self.init_kl_coef), float(self.min_kl_coef))

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """Adapt ``value`` to the measured KL; returns the new value."""
        kl = _finite_float(current_kl, "current_kl")
        if n_steps < 0:
            raise ValueError(f"n_steps must be >= 0, got {n_steps}")
        proportional_error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon
        self.value = max(self.value, float(self.min_kl_coef))
        return self.value

    def state_dict(self) -> dict[str, Any]:
        """The adapted value and, for the record, the settings it was adapted under."""
        return {
            "type": "adaptive",
            "value": self.value,
            "init_kl_coef": self.init_kl_coef,
            "target": self.target,
            "horizon": self.horizon,
            "min_kl_coef": self.min_kl_coef,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the adapted value on resume; settings come from the resumed run's arguments.

        The floor of the resumed run applies to the restored value.
        """
        self.value = max(_check_state(state, "adaptive"), float(self.min_kl_coef))


@dataclass
class FixedKLController:
    """A constant KL coefficient (trl's ``adap_kl_ctrl=False``)."""

    kl_coef: float = defaults.INIT_KL_COEF

    def __post_init__(self) -> None:
        if not _finite_float(self.kl_coef, "kl_coef") >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        self.value: float = float(self.kl_coef)

    def update(self, current_kl: float | torch.Tensor, n_steps: int) -> float:
        """No adaptation; returns the value."""
        return self.value

    def state_dict(self) -> dict[str, Any]:
        return {"type": "fixed", "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check the checkpoint's controller type; the value stays the configured ``kl_coef``.

        A fixed coefficient is a setting, not state: a resumed run uses its own ``kl_coef``.
        """
        _check_state(state, "fixed")
