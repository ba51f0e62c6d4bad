"""The algorithm registry of the ``mappo`` stage: advantage estimators, policy losses and the
algorithms that combine them, each registered by name (as verl's ``core_algos.py`` registers
its estimators and losses with ``register_adv_est`` / ``register_policy_loss``).

``mappo_algorithm`` names an :class:`Algorithm`. The trainer, the learner, the workflow and the
rollouts never test an algorithm's name: they ask it for its properties (``value_head``: is a
critic created, trained and saved; ``grouped``: are a question's ``mappo_group_size`` rollouts
one group; ``kl``: is the KL to the reference a per-token reward, ``"reward"``, or a loss term,
``"loss"``) and call the functions it names from three registries:

* :data:`GROUP_ADVANTAGES` (rollout time, no model): ``[Q, G]`` shared rewards of a question's
  ``G`` rollouts to ``[Q, G]`` advantages relative to the group (``mean_std``, ``mean``,
  ``rloo``); :mod:`mmoa.train.mappo.grpo` adds each agent's own penalty afterwards;
* :data:`ADVANTAGE_ESTIMATORS` (``PPOLearner.prepare``): the rollout's token tensors to
  per-token advantages (``gae`` with the value head, ``reinforce_plus_plus``, and ``group`` /
  ``group_whitened`` that spread each sample's group advantage over its tokens);
* :data:`POLICY_LOSSES` (``PPOLearner.update``): the surrogate loss (``clipped``, with an
  optional higher upper bound, and ``gspo``'s sequence-level ratio).

To add an algorithm: register its new estimator or loss here (one function with a docstring
that cites the paper and gives the formula), register the :class:`Algorithm` that names them,
add hand-computed and learning tests to ``tests/test_algorithms.py``, and select it with
``mappo_algorithm: <name>``; nothing else changes (docs/mappo.md, "Algorithms").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch

from mmoa import defaults
from mmoa.train.mappo.ppo_math import (
    GROUP_NORMALISATIONS,
    LOG_RATIO_CLAMP,
    _group_rewards,
    compute_gae,
    group_relative_advantages,
    masked_average,
    masked_mean,
    masked_whiten,
    masked_whiten_by_group,
    pack_masked,
    policy_loss,
    token_rewards,
    unpack_masked,
)

if TYPE_CHECKING:
    from mmoa.train.mappo.samples import Sample

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ALGORITHMS",
    "GROUP_ADVANTAGES",
    "LOSS_SCOPES",
    "POLICY_LOSSES",
    "AdvantageInputs",
    "Advantages",
    "Algorithm",
    "LossSettings",
    "algorithm_names",
    "get_algorithm",
    "register_adv_est",
    "register_algorithm",
    "register_group_adv",
    "register_policy_loss",
]


# ---------------------------------------------------------------------------------------------
# Registries
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdvantageInputs:
    """What :meth:`PPOLearner.prepare` hands an advantage estimator: the rollout's ``[B, T]``
    tensors (response tokens only, right-padded; ``mask`` is the loss mask, which may have
    holes in a multi-turn response), row-aligned with ``samples``."""

    samples: Sequence[Sample]
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    values: torch.Tensor | None
    #: The KL controller's current value (beta) where the KL is a reward; a ``[B]`` tensor
    #: with per-agent scales (``mappo_agent_kl_scale``).
    kl_coef: float | torch.Tensor
    gamma: float = 1.0
    #: How that KL reward is spread over a response (``mappo_kl_reward``, :data:`KL_SHAPES`).
    kl_shape: str = "token"
    #: Which per-token estimate of that KL is paid (``mappo_kl_estimator``, :data:`KL_KINDS`).
    kl_estimator: str = "kl"
    lam: float = 0.95
    whiten_advantages: bool = True
    whiten_per_agent: bool = False
    whiten_rewards: bool = False


@dataclass(frozen=True)
class Advantages:
    """An estimator's output, ``[B, T]`` each, 0 at padding: ``returns`` are the value-loss
    targets (``None`` without a critic); ``rewards`` and ``kl`` are logged when there are
    per-token rewards (``kl``: ``logp - logp_ref`` per token, also without them when the
    reference was scored)."""

    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    kl: torch.Tensor | None = None


@dataclass(frozen=True)
class LossSettings:
    """The policy loss's settings: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``;
    ``averaging`` is ``token``, ``sequence`` or ``constant`` (:func:`masked_average`), the last
    dividing by ``norm_length`` tokens per row. ``total``: the whole batch's count of tokens
    (``token``) or rows when the mean is over the batch (``mappo_loss_scope: batch``): the
    loss of a micro-batch is then its share of that mean; ``None``: its own mean."""

    clip_low: float
    clip_high: float
    averaging: str = "token"
    norm_length: int | None = None
    total: float | None = None


GroupAdvantageFn = Callable[[torch.Tensor], torch.Tensor]
AdvantageFn = Callable[[AdvantageInputs], Advantages]
#: ``fn(logprobs, old_logprobs, advantages, mask, settings, weights)``; ``weights``
#: (``[B, T]`` or ``None``) multiply each token's loss before the averaging (truncated
#: importance sampling, ``mappo_tis_cap``).
PolicyLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LossSettings,
                         torch.Tensor | None],
                        tuple[torch.Tensor, dict[str, torch.Tensor]]]

#: ``name -> fn([Q, G] float64 rewards) -> [Q, G] advantages``, each group on its own.
GROUP_ADVANTAGES: dict[str, GroupAdvantageFn] = {}
#: ``name -> fn(AdvantageInputs) -> Advantages``.
ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}
#: ``name -> fn(logprobs, old_logprobs, advantages, mask, LossSettings, weights)
#: -> (loss, stats)``.
POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def _register(registry: dict[str, Any], kind: str, name: str) -> Callable[[Any], Any]:
    def decorator(fn: Any) -> Any:
        if name in registry and registry[name] is not fn:
            raise ValueError(f"{kind} {name!r} is already registered")
        registry[name] = fn
        return fn
    return decorator


def register_group_adv(name: str) -> Callable[[GroupAdvantageFn], GroupAdvantageFn]:
    """Registers a group advantage (``[Q, G] -> [Q, G]``) under ``name``."""
    return _register(GROUP_ADVANTAGES, "group advantage", name)


def register_adv_est(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Registers a token-level advantage estimator under ``name``."""
    return _register(ADVANTAGE_ESTIMATORS, "advantage estimator", name)


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Registers a policy loss under ``name``."""
    return _register(POLICY_LOSSES, "policy loss", name)


# ---------------------------------------------------------------------------------------------
# Group advantages (rollout time: a question's G shared rewards)
# ---------------------------------------------------------------------------------------------


@register_group_adv("mean_std")
def grpo_group_advantage(rewards: torch.Tensor) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, eq. 3):
    ``A_i = (r_i - mean(r)) / (std(r) + eps)`` over the question's ``G`` rollouts (sample std,
    ``eps = 1e-4``; :func:`~mmoa.train.mappo.ppo_math.group_relative_advantages`)."""
    return group_relative_advantages(rewards, "mean_std")


@register_group_adv("mean")
def dr_grpo_group_advantage(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783,
    section 3.2): ``A_i = r_i - mean(r)``; no division by the group's std, which up-weights
    the questions that are nearly always right or wrong. Also the baseline of
    REINFORCE++-baseline before its batch whitening."""
    return group_relative_advantages(rewards, "mean")


@register_group_adv("rloo")
@torch.no_grad()
def rloo_group_advantage(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO (Kool et al. 2019, "Buy 4 REINFORCE samples, get a baseline for free!";
    Ahmadian et al. 2024, "Back to Basics", arXiv:2402.14740, eq. 6): each rollout's baseline is
    the mean of the OTHER ``G - 1`` rollouts' rewards,
    ``A_i = r_i - (sum_j r_j - r_i) / (G - 1) = G / (G - 1) * (r_i - mean(r))``: unbiased, as
    the baseline does not depend on the rollout it is subtracted from. A group of one has no
    other rollout: its advantage is 0."""
    r = _group_rewards(rewards)
    g = r.shape[1]
    if g == 1:
        return torch.zeros_like(r)
    return r - (r.sum(dim=1, keepdim=True) - r) / (g - 1)


# ---------------------------------------------------------------------------------------------
# Advantage estimators (PPOLearner.prepare)
# ---------------------------------------------------------------------------------------------


def _scores(inputs: AdvantageInputs) -> torch.Tensor:
    return torch.tensor([s.score for s in inputs.samples], dtype=torch.float32,
                        device=inputs.mask.device)


@register_adv_est("gae")
@torch.no_grad()
def gae_advantages(inputs: AdvantageInputs) -> Advantages:
    """PPO's advantages (Schulman et al. 2016, GAE, arXiv:1506.02438; the MMOA-RAG paper's
    MAPPO, trl 0.9.6): per-token rewards ``r_t = -beta * (logp_t - logp_ref_t)`` (or their
    mean, once, on the last token: ``kl_shape``) plus the score on the last token,
    ``delta_t = r_t + gamma V_{t+1} - V_t``,
    ``A_t = delta_t + gamma lambda A_{t+1}`` over each response (one episode), returns
    ``A + V``; then whitened over the batch (agents pooled, or per agent). Runs on each row's
    own tokens packed together, so that a multi-turn response's retrieved tokens get nothing."""
    mask, ref, values = inputs.mask, inputs.ref_logprobs, inputs.values
    assert ref is not None and values is not None, "gae needs reference log-probs and values"
    # Rewards and GAE run over each row's own tokens only, packed together: a multi-turn
    # response's retrieved tokens (loss_mask 0) get no reward, KL, value or advantage, and
    # the model's tokens on either side of them are one episode (identity when no holes).
    packed_mask = pack_masked(mask, mask)[1]
    rewards, _, kl = token_rewards(_scores(inputs), pack_masked(inputs.old_logprobs, mask)[0],
                                   pack_masked(ref, mask)[0], packed_mask, inputs.kl_coef,
                                   inputs.kl_shape, inputs.kl_estimator)
    if inputs.whiten_rewards:
        rewards = masked_whiten(rewards, packed_mask, shift_mean=False) * packed_mask
    advantages, returns = compute_gae(rewards, pack_masked(values, mask)[0], packed_mask,
                                      inputs.gamma, inputs.lam)
    rewards, kl, advantages, returns = (unpack_masked(t, mask)
                                        for t in (rewards, kl, advantages, returns))
    if inputs.whiten_advantages and inputs.whiten_per_agent:
        advantages = masked_whiten_by_group(advantages, mask, [s.agent for s in inputs.samples])
    elif inputs.whiten_advantages and mask.sum() > 1:
        advantages = masked_whiten(advantages, mask) * mask
    return Advantages(advantages, returns, rewards, kl)


@register_adv_est("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus_advantages(inputs: AdvantageInputs) -> Advantages:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262, section 3): no critic and no group; the per-token
    reward is PPO's (``r_t = -beta * (logp_t - logp_ref_t)``, plus the score on the last
    token), the advantage is the return to go ``A_t = sum_{s >= t} gamma^(s - t) r_s``
    (GAE with ``V = 0`` and ``lambda = 1``), normalised over the whole batch:
    ``A <- (A - mean(A)) / std(A)`` ("global batch advantage normalisation")."""
    mask, ref = inputs.mask, inputs.ref_logprobs
    assert ref is not None, "reinforce_plus_plus needs reference log-probs (its KL reward)"
    packed_mask = pack_masked(mask, mask)[1]
    rewards, _, kl = token_rewards(_scores(inputs), pack_masked(inputs.old_logprobs, mask)[0],
                                   pack_masked(ref, mask)[0], packed_mask, inputs.kl_coef,
                                   inputs.kl_shape, inputs.kl_estimator)
    if inputs.whiten_rewards:
        rewards = masked_whiten(rewards, packed_mask, shift_mean=False) * packed_mask
    returns, _ = compute_gae(rewards, torch.zeros_like(rewards), packed_mask, inputs.gamma, 1.0)
    rewards, kl, returns = (unpack_masked(t, mask) for t in (rewards, kl, returns))
    advantages = masked_whiten(returns, mask) * mask if mask.sum() > 1 else returns
    return Advantages(advantages, None, rewards, kl)


def _sample_advantages(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    mask = inputs.mask
    advantages = torch.tensor([s.advantage for s in inputs.samples], dtype=torch.float32,
                              device=mask.device)[:, None] * mask
    kl = None if inputs.ref_logprobs is None else \
        torch.where(mask.bool(), inputs.old_logprobs - inputs.ref_logprobs, 0.0)
    return advantages, kl


@register_adv_est("group")
@torch.no_grad()
def group_advantages(inputs: AdvantageInputs) -> Advantages:
    """The critic-free estimators of GRPO, Dr. GRPO, RLOO, DAPO and GSPO (outcome
    supervision, DeepSeekMath, arXiv:2402.03300, section 4.1.2): each sample's advantage,
    computed at rollout time from its group (:data:`GROUP_ADVANTAGES`, plus the agent's
    penalty), on every one of its response tokens, ``A_{i,t} = A_i``; nothing is whitened."""
    advantages, kl = _sample_advantages(inputs)
    return Advantages(advantages, None, None, kl)


@register_adv_est("group_whitened")
@torch.no_grad()
def group_whitened_advantages(inputs: AdvantageInputs) -> Advantages:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262, the group variant): the group-mean
    baseline ``A_i = r_i - mean(r)`` (:func:`dr_grpo_group_advantage`) on every token, then
    normalised over the whole batch's tokens, ``A <- (A - mean(A)) / std(A)``, which keeps the
    group baseline's variance reduction without GRPO's per-question std."""
    advantages, kl = _sample_advantages(inputs)
    mask = inputs.mask
    if mask.sum() > 1:
        advantages = masked_whiten(advantages, mask) * mask
    return Advantages(advantages, None, None, kl)


# ---------------------------------------------------------------------------------------------
# Policy losses (PPOLearner.update)
# ---------------------------------------------------------------------------------------------


@register_policy_loss("clipped")
def clipped_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                        advantages: torch.Tensor, mask: torch.Tensor, settings: LossSettings,
                        weights: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO's clipped surrogate (Schulman et al. 2017, arXiv:1707.06347, eq. 7), per token
    ``max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))`` with ``r = exp(logp - logp_old)``.
    ``eps_high > eps_low`` is DAPO's clip-higher (Yu et al. 2025, arXiv:2503.14476, section
    3.1): a low-probability token that did well may rise further before its gradient is cut,
    which keeps the policy's entropy from collapsing. Averaged by ``settings.averaging``
    (:func:`~mmoa.train.mappo.ppo_math.policy_loss`). verl's ``compute_policy_loss_vanilla``
    without its dual clip (``clip_ratio_c``): the MMOA-RAG paper's and trl's PPO have none."""
    return policy_loss(logprobs, old_logprobs, advantages, mask, settings.clip_low,
                       settings.averaging, cliprange_high=settings.clip_high,
                       norm_length=settings.norm_length, total=settings.total,
                       weights=weights)


@register_policy_loss("gspo")
def gspo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                     advantages: torch.Tensor, mask: torch.Tensor, settings: LossSettings,
                     weights: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, eqs.
    5-7 and the GSPO-token form of section 4.3): the importance ratio of a whole response,
    length-normalised, ``s_i = (pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|)
    = exp(mean_t (logp_t - logp_old_t))``, clipped as a whole:
    ``L = mean_i max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))``. Written per token
    as ``s_{i,t} = sg[s_i] * pi(y_t) / sg[pi(y_t)]`` (equal to ``s_i`` in value, and to GSPO's
    gradient when ``A_{i,t} = A_i``) and averaged per sequence first
    (``settings.averaging``, ``sequence`` for gspo). A response is clipped or not as a whole,
    so one off-policy token no longer decides for its neighbours. A response's ratio is a
    geometric mean of token ratios and stays within about 1e-3 of 1, so gspo registers the
    paper's clip ranges, 3e-4 / 4e-4 (section 5.1), as its defaults of ``mappo_cliprange`` /
    ``mappo_cliprange_high``; PPO's 0.2 would never clip. The log-ratio is clamped to
    +-:data:`~mmoa.train.mappo.ppo_math.LOG_RATIO_CLAMP` before ``exp`` (verl's
    ``compute_policy_loss_gspo`` clamps it at 10 above). ``weights`` multiply each token's
    loss (truncated importance sampling)."""
    m = mask if mask.dtype == torch.bool else mask != 0
    if m.shape != logprobs.shape:
        raise ValueError(f"mask has shape {tuple(m.shape)} but logprobs have shape "
                         f"{tuple(logprobs.shape)}")
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), zero)
    advantages = torch.where(m, advantages.detach().to(logprobs.dtype), zero)
    lengths = m.sum(dim=1).clamp(min=1).to(logprobs.dtype)
    seq_log_ratio = log_ratio.sum(dim=1) / lengths  # [B]
    token_log_ratio = (logprobs - logprobs.detach() + seq_log_ratio.detach()[:, None]).clamp(
        -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(torch.where(m, token_log_ratio, zero))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * torch.where(m, weights.detach().to(logprobs.dtype), zero)
    loss = masked_average(per_token, m, settings.averaging, settings.norm_length, settings.total)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).to(logprobs.dtype), m),
            "approx_kl": 0.5 * masked_mean(log_ratio.square(), m),
            "policy_kl": masked_mean(-log_ratio, m),
            "ratio_mean": masked_mean(ratio.detach(), m),
        }
    return loss, {k: v.detach() for k, v in stats.items()}


# ---------------------------------------------------------------------------------------------
# Algorithms
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Algorithm:
    """A registered algorithm: which estimator and loss it uses, and the properties the trainer,
    learner, workflow and rollouts ask for instead of testing its name."""

    name: str
    #: The paper, for the docs and the web UI.
    paper: str
    #: An :data:`ADVANTAGE_ESTIMATORS` name.
    advantage: str
    #: A :data:`POLICY_LOSSES` name.
    policy_loss: str = "clipped"
    #: :data:`GROUP_ADVANTAGES` names this algorithm accepts, its default first
    #: (``mappo_grpo_normalise`` picks among several); empty: one rollout per question.
    group_advantages: tuple[str, ...] = ()
    #: A value head (critic) is created, trained and saved.
    value_head: bool = False
    #: Where the KL to the reference goes: a per-token ``"reward"`` with the (adaptive) KL
    #: controller's beta, or a k3 ``"loss"`` term weighted by ``mappo_kl_loss_coef``.
    kl: Literal["reward", "loss"] = "loss"
    #: The loss averaging it prescribes (``None``: ``mappo_loss_averaging``).
    loss_averaging: str | None = None
    #: Over what its loss is averaged by default (``mappo_loss_scope``): ``micro_batch`` (each
    #: micro-batch its own mean, divided by the accumulation count) or ``batch`` (the mean over
    #: every token, or row, of an optimiser step, on every process: DAPO's and Dr. GRPO's).
    loss_scope: str = "micro_batch"
    #: Its default ``mappo_cliprange`` (``None``: PPO's 0.2).
    cliprange: float | None = None
    #: Its default ``mappo_cliprange_high`` (``None``: ``mappo_cliprange``, symmetric).
    cliprange_high: float | None = None
    #: DAPO's dynamic sampling: the zero-variance groups are always left out
    #: (``mappo_grpo_filter: skip``) and more groups are rolled out to refill the batch
    #: (``mappo_dapo_max_rounds``).
    dynamic_sampling: bool = False
    #: Its advantages are whitened over the whole batch by definition (REINFORCE++ and its
    #: baseline variant): ``mappo_whiten_advantages: false`` and ``mappo_whiten_per_agent``
    #: would change the algorithm and are refused.
    batch_whitened: bool = False
    #: One line for the docs and the web UI.
    summary: str = ""

    @property
    def grouped(self) -> bool:
        """A question is rolled out ``mappo_group_size`` times and its rollouts are one group."""
        return bool(self.group_advantages)

    def needs_reference(self, kl_loss_coef: float) -> bool:
        """Whether the reference policy's log-probs are computed (and a full-FT reference
        model is loaded)."""
        return self.kl == "reward" or kl_loss_coef > 0

    def group_advantage(self, normalise: str = "mean_std") -> str:
        """The :data:`GROUP_ADVANTAGES` name this algorithm uses under
        ``mappo_grpo_normalise: normalise``: that one where it accepts several, its own
        where it has one and ``normalise`` is the default; anything else is an error."""
        if not self.grouped:
            raise ValueError(f"mappo_algorithm: {self.name} has no groups")
        if normalise in self.group_advantages:
            return normalise
        if normalise == "mean_std":
            return self.group_advantages[0]
        choices = " or ".join(n for n in GROUP_NORMALISATIONS
                              if n == "mean_std" or n in self.group_advantages)
        raise ValueError(f"mappo_grpo_normalise: {normalise} does not apply to mappo_algorithm: "
                         f"{self.name}, whose group advantage is {self.group_advantages[0]}; "
                         f"set mappo_grpo_normalise to {choices} (the default mean_std "
                         f"selects {self.group_advantages[0]})")

    def resolve_loss_averaging(self, averaging: str) -> str:
        return self.loss_averaging or averaging

    def resolve_cliprange(self, cliprange: float | None) -> float:
        """The lower clip range: the configured one, else this algorithm's, else PPO's 0.2."""
        if cliprange is not None:
            return cliprange
        return self.cliprange if self.cliprange is not None else defaults.CLIPRANGE

    def resolve_cliprange_high(self, cliprange: float | None,
                               cliprange_high: float | None) -> float:
        """The upper clip range: the configured one, else this algorithm's own upper range
        (dapo, gspo) unless only the lower one was configured, else the lower one."""
        if cliprange_high is not None:
            return cliprange_high
        if self.cliprange_high is not None and (cliprange is None or self.cliprange is None):
            return self.cliprange_high
        return self.resolve_cliprange(cliprange)

    def clip_notes(self, cliprange: float | None, cliprange_high: float | None) -> list[str]:
        """One line per clip range this algorithm has a default of and the config overrides
        (the log says the paper's value is not the one in use), or that it applies."""
        notes = []
        for key, own, given in (("mappo_cliprange", self.cliprange, cliprange),
                                ("mappo_cliprange_high", self.cliprange_high, cliprange_high)):
            if own is None:
                continue
            if given is None:
                notes.append(f"mappo_algorithm: {self.name}: {key} {own:g} (its paper's)")
            elif given != own:
                notes.append(f"mappo_algorithm: {self.name}: {key} {given:g} as configured "
                             f"(its paper's is {own:g})")
        return notes

    def group_filter(self, filter_mode: str) -> str:
        """The effective ``mappo_grpo_filter``: ``skip`` under dynamic sampling."""
        return "skip" if self.dynamic_sampling else filter_mode


#: ``name -> Algorithm``, in registration order (the web UI's dropdown).
ALGORITHMS: dict[str, Algorithm] = {}
#: ``mappo_loss_scope``: a loss is each micro-batch's own mean (divided by the accumulation
#: count), or its share of the mean over the whole optimiser step's batch on every process.
LOSS_SCOPES: tuple[str, ...] = ("micro_batch", "batch")


def register_algorithm(algorithm: Algorithm) -> Algorithm:
    """Registers ``algorithm`` after checking that its estimator, loss and group advantages are
    registered and that its properties agree with them."""
    if algorithm.advantage not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"{algorithm.name}: unknown advantage estimator {algorithm.advantage!r}")
    if algorithm.policy_loss not in POLICY_LOSSES:
        raise ValueError(f"{algorithm.name}: unknown policy loss {algorithm.policy_loss!r}")
    unknown = [g for g in algorithm.group_advantages if g not in GROUP_ADVANTAGES]
    if unknown:
        raise ValueError(f"{algorithm.name}: unknown group advantages {unknown}")
    if algorithm.kl not in ("reward", "loss"):
        raise ValueError(f"{algorithm.name}: kl must be reward or loss, got {algorithm.kl!r}")
    if algorithm.value_head and algorithm.grouped:
        raise ValueError(f"{algorithm.name}: a grouped algorithm has no value head")
    for name in ("cliprange", "cliprange_high"):
        value = getattr(algorithm, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{algorithm.name}: {name} must be > 0")
    if algorithm.loss_scope not in LOSS_SCOPES:
        raise ValueError(f"{algorithm.name}: loss_scope must be one of {', '.join(LOSS_SCOPES)}")
    _register(ALGORITHMS, "algorithm", algorithm.name)(algorithm)
    return algorithm


def algorithm_names() -> tuple[str, ...]:
    """The registered algorithms' names (``mappo_algorithm``'s choices)."""
    return tuple(ALGORITHMS)


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; a ``ValueError`` listing the names otherwise."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"mappo_algorithm must be one of {', '.join(ALGORITHMS)}, got "
                         f"{name!r}") from None


register_algorithm(Algorithm(
    "ppo", "Schulman et al. 2017 (PPO, arXiv:1707.06347) with GAE (arXiv:1506.02438); "
    "MMOA-RAG's MAPPO (arXiv:2501.15228)", advantage="gae", value_head=True, kl="reward",
    summary="value head, GAE, KL in the reward (the paper's default)"))
register_algorithm(Algorithm(
    "grpo", "Shao et al. 2024 (DeepSeekMath, arXiv:2402.03300)", advantage="group",
    group_advantages=("mean_std", "mean"),
    summary="critic-free, group-normalised advantages (mappo_grpo_normalise), k3 KL loss"))
register_algorithm(Algorithm(
    "dr_grpo", "Liu et al. 2025 (Dr. GRPO, arXiv:2503.20783)", advantage="group",
    group_advantages=("mean",), loss_averaging="constant", loss_scope="batch",
    summary="GRPO without the std division and the per-response length normalisation: "
            "summed over the batch, divided by a constant generation budget"))
register_algorithm(Algorithm(
    "rloo", "Ahmadian et al. 2024 (RLOO, arXiv:2402.14740)", advantage="group",
    group_advantages=("rloo",),
    summary="leave-one-out group baseline"))
register_algorithm(Algorithm(
    "reinforce_plus_plus", "Hu 2025 (REINFORCE++, arXiv:2501.03262)",
    advantage="reinforce_plus_plus", kl="reward", batch_whitened=True,
    summary="no critic, no group: KL-penalised return to go, normalised over the batch"))
register_algorithm(Algorithm(
    "reinforce_plus_plus_baseline", "Hu 2025 (REINFORCE++-baseline, arXiv:2501.03262)",
    advantage="group_whitened", group_advantages=("mean",), batch_whitened=True,
    summary="group-mean baseline, then normalised over the batch"))
register_algorithm(Algorithm(
    "dapo", "Yu et al. 2025 (DAPO, arXiv:2503.14476)", advantage="group",
    group_advantages=("mean_std",), loss_averaging="token", loss_scope="batch",
    cliprange_high=defaults.DAPO_CLIPRANGE_HIGH, dynamic_sampling=True,
    summary="clip-higher (0.2 / 0.28), token mean over the batch, dynamic sampling (flat "
            "groups dropped, more rolled out to refill the batch)"))
register_algorithm(Algorithm(
    "gspo", "Zheng et al. 2025 (GSPO, arXiv:2507.18071)", advantage="group",
    group_advantages=("mean_std",), policy_loss="gspo", loss_averaging="sequence",
    cliprange=defaults.GSPO_CLIPRANGE, cliprange_high=defaults.GSPO_CLIPRANGE_HIGH,
    summary="sequence-level importance ratio, clipped per response to [1 - 3e-4, 1 + 4e-4]"))
