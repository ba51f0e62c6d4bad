"""GRPO samples: a question's G pipelines become one group, and every agent sample of them gets
its advantage relative to that group.

The trainer rolls out each question ``G`` times (``mappo_group_size``), scores every pipeline
(the shared answer reward and each agent's own penalty, :mod:`mmoa.train.mappo.rewards`) and hands
the scores here. The advantage formula itself is :func:`mmoa.train.mappo.ppo_math.grpo_advantages`
(the group-normalised shared reward plus the agent's own penalty; the group advantage is any
of :data:`mmoa.train.mappo.algorithms.GROUP_ADVANTAGES`); this module only arranges
the pipelines into ``[questions, G]`` groups, applies ``mappo_grpo_filter`` and counts the groups
that carry no signal, which is why it is separate from the maths and from the trainer.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mmoa.train.mappo.algorithms import GROUP_ADVANTAGES
from mmoa.train.mappo.ppo_math import add_agent_penalties, zero_variance_groups
from mmoa.train.mappo.rewards import soft_overlong_punishment
from mmoa.train.mappo.samples import Sample

if TYPE_CHECKING:
    from mmoa.train.mappo.args import MappoArguments


@dataclass(frozen=True)
class OverlongShaping:
    """DAPO's overlong reward shaping and overlong filtering (Yu et al. 2025, section 3.4),
    per agent: ``limits[agent]`` is its generation budget L_max (``mappo_max_new_tokens_*``),
    ``buffer`` the share of it that is the buffer L_cache (``mappo_overlong_buffer``, 0: no
    shaping), ``factor`` the punishment at L_max and ``filter`` whether a response that reached
    L_max is left out of the loss (``mappo_overlong_filter``)."""

    limits: Mapping[str, int]
    buffer: float = 0.0
    factor: float = 1.0
    filter: bool = False

    @classmethod
    def from_args(cls, args: MappoArguments) -> OverlongShaping | None:
        """The shaping ``args`` configure, ``None`` when both options are off."""
        limits = args.overlong_limits
        if not limits:
            return None
        return cls(limits, args.mappo_overlong_buffer, args.mappo_overlong_penalty_factor,
                   args.mappo_overlong_filter)

    def reward(self, agent: str, length: int) -> float:
        """The soft overlong punishment of ``agent``'s response of ``length`` tokens (0 with
        the shaping off or for an agent without a budget here)."""
        if self.buffer <= 0 or agent not in self.limits:
            return 0.0
        limit = self.limits[agent]
        return soft_overlong_punishment(length, limit, max(1, math.ceil(self.buffer * limit)),
                                        self.factor)

    def truncated(self, agent: str, length: int) -> bool:
        """Whether the response reached its budget (was cut off, or ended exactly there:
        the two are not told apart, as the stop token is part of the budget)."""
        return agent in self.limits and length >= self.limits[agent]


@dataclass(frozen=True)
class PipelineOutcome:
    """One pipeline of a group: the optimised agents' calls and the pipeline's scores."""

    #: ``agent -> (prompt ids, response ids, sampling log-probs or None)``
    calls: dict[str, tuple[list[int], list[int], list[float] | None]]
    shared: float
    #: ``agent -> penalty`` (<= 0), for every optimised agent
    penalties: dict[str, float]
    #: ``agent -> loss mask`` of a multi-turn response (0 on retrieved tokens; see
    #: :attr:`mmoa.train.mappo.samples.Sample.loss_mask`); an agent absent here trains on all.
    loss_masks: dict[str, list[int]] = field(default_factory=dict)
    #: ``agent -> support`` of a response sampled under a logits mask (see
    #: :attr:`mmoa.train.mappo.samples.Sample.support`); an agent absent here: whole vocabulary.
    supports: dict[str, list[list[int]]] = field(default_factory=dict)
    #: ``agent -> R_cf``, the counterfactual reward of the agent's default
    #: (``mappo_counterfactual_agents``): the agent's group is then over its gains
    #: ``shared - R_cf``; an agent absent here: over ``shared``.
    baselines: dict[str, float] = field(default_factory=dict)

    def shared_for(self, agent: str) -> float:
        """The reward ``agent``'s group advantage is computed from: ``shared``, or its gain over
        its counterfactual default."""
        return self.shared - self.baselines.get(agent, 0.0)


def group_samples(outcomes: Sequence[PipelineOutcome], group_size: int,
                  agents: Sequence[str], normalise: str = "mean_std",
                  filter_mode: str = "none", overlong: OverlongShaping | None = None
                  ) -> tuple[list[Sample], dict[str, float]]:
    """The GRPO samples of a step and its group statistics.

    ``outcomes`` are ordered question by question, the ``group_size`` pipelines of a question
    next to each other (as :meth:`mmoa.agents.pipeline.RagPipeline.run` returns them with
    ``group_size``). Every optimised agent of every pipeline becomes one :class:`Sample` with
    ``score = shared + penalty`` (logged as the reward) and
    ``advantage = grpo_advantages(shared, penalties)`` of its pipeline and agent, where the
    group advantage ``normalise`` is a registered group advantage (``mean_std``: GRPO,
    ``mean``: Dr. GRPO, ``rloo``; :data:`~mmoa.train.mappo.algorithms.GROUP_ADVANTAGES`).
    An agent with a counterfactual baseline (:attr:`PipelineOutcome.baselines`) has its own
    group, over its gains ``shared - R_cf``, and its score is its gain plus its penalty.

    ``overlong`` (DAPO): each agent's response-length reward
    (:meth:`OverlongShaping.reward`) is added to its reward before the group statistic, as
    DAPO adds it to the rule reward, so each agent has its own group over ``shared + R_length``;
    with its filter on, the responses that reached their budget are left out of the loss
    after their group's advantages are computed with them (``overlong/filtered``).

    A group is flat for an agent when its rewards are all equal, ``max - min <=
    FLAT_GROUP_TOL`` (:func:`~mmoa.train.mappo.ppo_math.zero_variance_groups`), decided from
    the rewards and not from the advantages, which are 0 only up to rounding (RLOO's four
    rewards of 0.1 give -1.4e-17); a flat group's group advantage is set to exactly 0.
    ``filter_mode="skip"`` leaves out the samples of the flat groups whose own penalty did not
    fire: they would only dilute the mini-batches' averages and cost a forward and backward
    pass. A penalised sample of such a group is kept, as its penalty is a signal of its own.
    Every sample carries its group's index in this call (:attr:`Sample.group`) and whether the
    group was flat for its agent (:attr:`Sample.group_flat`), for DAPO's refill.

    Logs: ``grpo/groups``, ``grpo/zero_variance_groups`` (count on this process),
    ``grpo/zero_variance_fraction``, ``grpo/reward_std`` (the mean over groups of the shared
    reward's population standard deviation within the group) and ``grpo/skipped_samples``;
    with ``overlong``, ``overlong/reward`` (the mean length reward), ``overlong/truncated``
    (the share of responses at their budget) and ``overlong/filtered``.
    """
    if group_size < 1 or len(outcomes) % group_size:
        raise ValueError(f"{len(outcomes)} pipelines do not make groups of {group_size}")
    if filter_mode not in ("none", "skip"):
        raise ValueError(f"unknown mappo_grpo_filter {filter_mode!r}; expected none or skip")
    if normalise not in GROUP_ADVANTAGES:
        raise ValueError(f"unknown group advantage {normalise!r}; expected one of "
                         f"{', '.join(GROUP_ADVANTAGES)}")
    groups = [outcomes[i: i + group_size] for i in range(0, len(outcomes), group_size)]
    shared = [[o.shared for o in group] for group in groups]
    advantages, flat_by_agent = _agent_advantages(groups, agents, normalise, overlong)
    flat = zero_variance_groups(shared)
    samples: list[Sample] = []
    skipped = filtered = truncated = 0
    length_rewards: list[float] = []
    for q, group in enumerate(groups):
        for g, outcome in enumerate(group):
            for a, agent in enumerate(agents):
                advantage = float(advantages[q, g, a])
                prompt_ids, response_ids, sampled = outcome.calls[agent]
                length_reward = 0.0
                if overlong is not None:
                    length_reward = overlong.reward(agent, len(response_ids))
                    length_rewards.append(length_reward)
                    truncated += overlong.truncated(agent, len(response_ids))
                if filter_mode == "skip" and bool(flat_by_agent[q, a]) \
                        and outcome.penalties[agent] == 0.0:
                    skipped += 1
                    continue
                if overlong is not None and overlong.filter \
                        and overlong.truncated(agent, len(response_ids)):
                    filtered += 1
                    continue
                samples.append(Sample(agent, prompt_ids, response_ids,
                                      outcome.shared_for(agent) + length_reward
                                      + outcome.penalties[agent],
                                      sampled,
                                      advantage=advantage,
                                      loss_mask=outcome.loss_masks.get(agent),
                                      support=outcome.supports.get(agent),
                                      group=q, group_flat=bool(flat_by_agent[q, a])))
    stds = [statistics.pstdev(row) for row in shared]
    logs = {
        "grpo/groups": float(len(groups)),
        "grpo/zero_variance_groups": float(flat.sum()),
        "grpo/zero_variance_fraction": float(flat.double().mean()) if groups else 0.0,
        "grpo/reward_std": float(sum(stds) / len(stds)) if stds else 0.0,
        "grpo/skipped_samples": float(skipped),
    }
    if overlong is not None:
        logs["overlong/reward"] = sum(length_rewards) / max(len(length_rewards), 1)
        logs["overlong/truncated"] = truncated / max(len(length_rewards), 1)
        logs["overlong/filtered"] = float(filtered)
    return samples, logs


def _agent_advantages(groups: Sequence[Sequence[PipelineOutcome]], agents: Sequence[str],
                      normalise: str, overlong: OverlongShaping | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``([Q, G, A] advantages, [Q, A] zero-variance flags)``: each agent's group advantage of
    its rewards plus its own penalty; a flat group's group advantage is exactly 0.

    Without counterfactual baselines or a length reward every agent shares one ``[Q, G]``
    reward matrix and one group advantage (computed once, as before). With them, each agent's
    group is over its own rewards (``shared - R_cf`` for an agent with a baseline, plus its
    overlong reward): under ``mean_std`` the spread that divides is the agent's own, and a
    group is "flat" for an agent when its rewards are."""
    penalties = [[[o.penalties[a] for a in agents] for o in group] for group in groups]
    shaped = overlong is not None and overlong.buffer > 0
    if not shaped and not any(o.baselines for group in groups for o in group):
        shared = [[o.shared for o in group] for group in groups]
        flat = zero_variance_groups(shared)
        base = _flat_to_zero(GROUP_ADVANTAGES[normalise](
            torch.as_tensor(shared, dtype=torch.float64)), flat)
        return (add_agent_penalties(base, penalties),
                flat.unsqueeze(-1).expand(len(groups), len(agents)))
    per_agent = [[[o.shared_for(agent) + (overlong.reward(agent, len(o.calls[agent][1]))
                                         if overlong is not None else 0.0)
                   for o in group] for group in groups] for agent in agents]
    flat = torch.stack([zero_variance_groups(rewards) for rewards in per_agent], dim=-1)
    base = torch.stack([_flat_to_zero(GROUP_ADVANTAGES[normalise](
        torch.as_tensor(rewards, dtype=torch.float64)), flat[:, a])
        for a, rewards in enumerate(per_agent)], dim=-1)
    return base + torch.as_tensor(penalties, dtype=torch.float64), flat


def _flat_to_zero(advantages: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """``[Q, G]`` group advantages with the flat groups' rows exactly 0 (their rewards are
    equal within the tolerance, so any value left there is rounding)."""
    return torch.where(flat.unsqueeze(-1), torch.zeros_like(advantages), advantages)
