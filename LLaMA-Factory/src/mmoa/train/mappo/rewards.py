"""MAPPO rewards: the shared answer reward and each agent's format penalty.

Every agent's score is ``R_shared + P_agent``: the shared reward is a QA metric of the final
answer (F1 by default, through :mod:`mmoa.metrics`, the same definition the evaluation reports),
and the penalty (a value <= 0, added; the paper writes ``R - P`` with a positive P) punishes an
output that breaks its agent's format. The trainer puts each score on that agent's last response
token (:func:`mmoa.train.mappo.ppo_math.token_rewards`). With the counterfactual credit
(``mappo_counterfactual_agents``) an agent's shared part is its gain ``R - R_cf`` over the same
pipeline with its output replaced by a default (:attr:`AgentRewards.baselines`).

The penalties read the flags and counts of :mod:`mmoa.agents.parsers`; they never re-parse text.
Defaults are the paper's values, with these decisions (all configurable in :class:`PenaltyConfig`):

Query Rewriter, ``-0.5`` when any rule fires (one penalty, not one per rule, as the original):
    more than 4 sub-questions written, more than 300 characters over the written lines, or an
    empty output. The count is checked on the output as written (``raw_count``); the original
    truncated to 4 first, so its count rule could never fire. An empty output (nothing usable, so
    the pipeline falls back to the original question) is penalised by default: without it,
    emitting nothing would be a free way to copy the question, and a collapse to the empty output
    would cost the policy nothing. ``qr_penalize_empty=False`` restores the original behaviour.
Selector, ``-1.0`` when any rule fires:
    an output that is not exactly ``DocumentI,DocumentJ,...``, an id outside ``0..K-1``, or a
    repeated id. An empty output (no document selected) is well-formed and not penalised, as in
    the original; ``selector_penalize_empty`` can change that.
Generator, ``-0.5`` when the output has more than 30 words:
    the paper's value (the original code used ``-1.0``). Words are counted over everything the
    Generator wrote (:attr:`AnswerParse.num_words`), as the original did: counting only the
    extracted ``**answer**`` would let a bold short answer followed by any amount of text pass
    unpenalised. An answer without the ``**answer**`` form
    costs ``generator_format_penalty``, 0 by default: the SFT warm start already teaches the form,
    and the answer is still extracted and scored without it. Length and format penalties add up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmoa import defaults
from mmoa.agents.parsers import AnswerParse, SelectionParse, SubquestionParse
from mmoa.agents.prompts import AGENTS, AgentName
from mmoa.metrics import DEFAULT_PROFILE, score_answer

__all__ = [
    "METRICS",
    "AgentRewards",
    "Penalty",
    "PenaltyConfig",
    "compute_agent_rewards",
    "generator_penalty",
    "qr_penalty",
    "selector_penalty",
    "shared_reward",
]

#: Metrics of :func:`mmoa.metrics.score_answer` usable as the shared reward.
METRICS: tuple[str, ...] = ("f1", "em", "acc")


@dataclass(frozen=True)
class PenaltyConfig:
    """Penalty values (each <= 0, added to the shared reward) and the limits that trigger them.

    Defaults: the paper (MMOA-RAG §3.3.1, Table 6) where it gives a value; see the module
    docstring for the decisions where it does not.
    """

    qr_penalty: float = defaults.QR_PENALTY
    qr_max_subquestions: int = defaults.QR_MAX_SUBQUESTIONS
    qr_max_chars: int = defaults.QR_MAX_CHARS
    qr_penalize_empty: bool = True
    selector_penalty: float = defaults.SELECTOR_PENALTY
    selector_penalize_empty: bool = False
    generator_penalty: float = defaults.GENERATOR_PENALTY
    generator_max_words: int = defaults.GENERATOR_MAX_WORDS
    generator_format_penalty: float = 0.0

    def __post_init__(self) -> None:
        for name in ("qr_penalty", "selector_penalty", "generator_penalty",
                     "generator_format_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{name} must be a number, got {type(value).__name__}")
            if not math.isfinite(value) or value > 0:
                raise ValueError(
                    f"{name} must be a finite number <= 0 (penalties are added to the reward; "
                    f"write -0.5, not 0.5), got {value}"
                )
        for name in ("qr_max_subquestions", "qr_max_chars", "generator_max_words"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("qr_penalize_empty", "selector_penalize_empty"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be true or false, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class Penalty:
    """One agent's penalty: its ``value`` (<= 0) and the names of the rules that fired.

    Only rules with a non-zero penalty are reported (a disabled rule never fires), so the rate of
    each reason is the rate at which it actually cost reward.
    """

    value: float = 0.0
    reasons: tuple[str, ...] = ()

    @property
    def fired(self) -> bool:
        return bool(self.reasons)


def qr_penalty(parse: SubquestionParse, config: PenaltyConfig) -> Penalty:
    """The Query Rewriter's penalty; reasons among ``too_many``, ``too_long``, ``empty``.

    The limits are the config's, applied to the counts of the output as written
    (``raw_count``, ``total_chars``), so the config alone decides; the parser's own flags use the
    parser's limits and serve logging.
    """
    reasons: list[str] = []
    if config.qr_penalty != 0:
        if parse.raw_count > config.qr_max_subquestions:
            reasons.append("too_many")
        if parse.total_chars > config.qr_max_chars:
            reasons.append("too_long")
        if parse.empty and config.qr_penalize_empty:
            reasons.append("empty")
    return Penalty(config.qr_penalty if reasons else 0.0, tuple(reasons))


def selector_penalty(parse: SelectionParse, config: PenaltyConfig) -> Penalty:
    """The Selector's penalty; reasons among ``malformed``, ``out_of_range``, ``duplicate``,
    ``empty`` (the last only with ``selector_penalize_empty``)."""
    reasons: list[str] = []
    if config.selector_penalty != 0:
        reasons = [name for name in ("malformed", "out_of_range", "duplicate")
                   if getattr(parse, name)]
        # Nothing selected and no violation: the output was empty (or blank).
        if config.selector_penalize_empty and not parse.ids and not reasons:
            reasons.append("empty")
    return Penalty(config.selector_penalty if reasons else 0.0, tuple(reasons))


def generator_penalty(parse: AnswerParse, config: PenaltyConfig) -> Penalty:
    """The Generator's penalty; reasons ``too_long`` (more than ``generator_max_words`` words in
    the whole output) and ``not_bold`` (no ``**answer**``, only if
    ``generator_format_penalty != 0``), whose values add up."""
    value = 0.0
    reasons: list[str] = []
    if config.generator_penalty != 0 and parse.num_words > config.generator_max_words:
        value += config.generator_penalty
        reasons.append("too_long")
    if config.generator_format_penalty != 0 and not parse.bold:
        value += config.generator_format_penalty
        reasons.append("not_bold")
    return Penalty(value, tuple(reasons))


def shared_reward(
    prediction: str,
    golds: str | Sequence[str],
    metric: str = "f1",
    scoring: str = DEFAULT_PROFILE,
) -> float:
    """The reward every agent shares: ``metric`` of the final answer against the gold aliases.

    :func:`mmoa.metrics.score_answer` under the scoring profile ``scoring`` (by default the
    MMOA-RAG rules: answer extraction, the yes/no rule, maximum over aliases), the same function
    and profile names the evaluation reports with, so the policy is trained on the number it is
    evaluated with. ``metric``: ``"f1"`` (the paper's), ``"em"`` or ``"acc"``.
    """
    if metric not in METRICS:
        raise ValueError(f"unknown reward metric {metric!r}; expected one of {list(METRICS)}")
    return float(getattr(score_answer(prediction, golds, profile=scoring), metric))


@dataclass(frozen=True)
class AgentRewards:
    """The rewards of one question's pipeline trace.

    ``penalties`` has one entry per agent that acted (an agent absent from the pipeline mode,
    e.g. the Query Rewriter in ``s_g``, has none and gets no PPO sample). ``bonuses`` are
    optional per-agent shaping terms (>= 0) added to an agent's score, e.g. the Query
    Rewriter's retrieval reward (:func:`retrieval_bonus`) or the Selector's selection reward
    (:func:`selection_bonus`); an agent without one gets 0.
    ``baselines`` are optional per-agent counterfactual rewards ``R_cf`` (the shared reward of
    the same pipeline with that agent's output replaced by a default,
    ``mappo_counterfactual_agents``): such an agent's share of the shared reward is its gain
    ``R - R_cf`` (:meth:`shared_for`); its penalty and bonus are unchanged.
    """

    shared: float
    penalties: Mapping[AgentName, Penalty] = field(default_factory=dict)
    bonuses: Mapping[AgentName, float] = field(default_factory=dict)
    baselines: Mapping[AgentName, float] = field(default_factory=dict)

    @property
    def agents(self) -> tuple[AgentName, ...]:
        """The agents that acted, in pipeline order."""
        return tuple(a for a in AGENTS if a in self.penalties)

    def penalty(self, agent: AgentName) -> float:
        return self._penalty(agent).value

    def bonus(self, agent: AgentName) -> float:
        """The agent's shaping term (0 when it has none)."""
        self._penalty(agent)  # an agent that did not act has no score at all
        return float(self.bonuses.get(agent, 0.0))

    def shared_for(self, agent: AgentName) -> float:
        """The agent's part of the shared reward: ``R``, or with a counterfactual baseline its
        gain ``R - R_cf`` over its default (COMA's counterfactual baseline, s3's "gain beyond
        RAG"): what the team scored because of this agent's output, not despite it."""
        self._penalty(agent)
        return self.shared - float(self.baselines.get(agent, 0.0))

    def total(self, agent: AgentName) -> float:
        """The agent's PPO score: its part of the shared reward + its penalty + its bonus."""
        return self.shared_for(agent) + self._penalty(agent).value + self.bonus(agent)

    @property
    def totals(self) -> dict[AgentName, float]:
        return {agent: self.total(agent) for agent in self.agents}

    def _penalty(self, agent: AgentName) -> Penalty:
        try:
            return self.penalties[agent]
        except KeyError:
            raise KeyError(
                f"no reward for agent {agent!r}: only {list(self.agents)} acted in this trace"
            ) from None

    def as_dict(self) -> dict[str, Any]:
        """A flat, JSON-ready view for logs: ``shared``, ``penalty/<agent>``, ``total/<agent>``,
        ``bonus/<agent>`` and ``baseline/<agent>`` (only for an agent with one) and
        ``reason/<agent>/<rule>`` (1.0 where that rule fired)."""
        row: dict[str, Any] = {"shared": self.shared}
        for agent in self.agents:
            pen = self.penalties[agent]
            row[f"penalty/{agent}"] = pen.value
            row[f"total/{agent}"] = self.total(agent)
            if agent in self.bonuses:
                row[f"bonus/{agent}"] = float(self.bonuses[agent])
            if agent in self.baselines:
                row[f"baseline/{agent}"] = float(self.baselines[agent])
            for reason in pen.reasons:
                row[f"reason/{agent}/{reason}"] = 1.0
        return row


def compute_agent_rewards(
    qr: SubquestionParse | None,
    selection: SelectionParse | None,
    answer: AnswerParse | None,
    prediction: str,
    golds: str | Sequence[str],
    *,
    config: PenaltyConfig | None = None,
    metric: str = "f1",
    scoring: str = DEFAULT_PROFILE,
    bonuses: Mapping[AgentName, float] | None = None,
    baselines: Mapping[AgentName, float] | None = None,
) -> AgentRewards:
    """Shared reward and per-agent penalties of one question, from the three parse results.

    Pass ``None`` for an agent that did not act in this pipeline mode. ``prediction`` is the
    final answer as the pipeline reports it (``Trace.answer``, normally ``answer.answer``);
    ``golds`` the gold aliases. Independent of the pipeline module on purpose: the trainer calls
    it per question with whatever it rolled out. ``bonuses``: per-agent shaping terms (see
    :class:`AgentRewards`), each for an agent that acted; ``baselines``: per-agent
    counterfactual rewards (finite numbers, each for an agent that acted).
    """
    config = config or PenaltyConfig()
    penalties: dict[AgentName, Penalty] = {}
    if qr is not None:
        penalties["qr"] = qr_penalty(qr, config)
    if selection is not None:
        penalties["selector"] = selector_penalty(selection, config)
    if answer is not None:
        penalties["generator"] = generator_penalty(answer, config)
    bonuses = dict(bonuses or {})
    for agent, value in bonuses.items():
        if agent not in penalties:
            raise ValueError(f"a bonus for {agent!r}, which did not act in this trace")
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"the bonus of {agent!r} must be a finite number >= 0, got {value}")
    baselines = dict(baselines or {})
    for agent, value in baselines.items():
        if agent not in penalties:
            raise ValueError(f"a counterfactual baseline for {agent!r}, which did not act in "
                             "this trace")
        if not math.isfinite(value):
            raise ValueError(f"the counterfactual baseline of {agent!r} must be a finite "
                             f"number, got {value}")
    return AgentRewards(
        shared=shared_reward(prediction, golds, metric=metric, scoring=scoring),
        penalties=penalties,
        bonuses=bonuses,
        baselines=baselines,
    )


def retrieval_bonus(candidate_recall: float | None, weight: float) -> float | None:
    """The Query Rewriter's retrieval reward: ``weight`` x the share of the record's gold
    passages among the K candidates its sub-questions retrieved (``None``, no bonus, when the
    record names no gold passage or the weight is 0).

    Why: the shared answer reward reaches the Query Rewriter only through two more agents, so
    on a small model its sub-questions can drift to ones that retrieve less than the question
    alone (the demo's MAPPO run: candidate recall 76.8 -> 72.0 % against 88.0 % for the
    question). The gold passages are known at training time (HotpotQA's supporting facts, the
    demo world's gold ids), as in retrieval-reward methods (RAG-R1, HARR); never at test time.
    """
    return _weighted_bonus("the retrieval reward", candidate_recall, weight)


def selection_bonus(selection_f1: float | None, weight: float) -> float | None:
    """The Selector's selection reward: ``weight`` x the F1 of its selection against the gold
    passages among its candidates (:func:`mmoa.train.mappo.agent_stats.selection_gold_f1`;
    ``None``, no bonus, when there is none among them or the weight is 0).

    Why: under the shared answer reward alone a 135 M Generator scores about the same from the
    top candidate as from the top two, so the Selector's RL drifts to a constant (the distractor
    set's 40-step MAPPO run: the top candidate for every dev question, which is ``rag`` K = 1),
    while the Generator on the gold passages alone scores 43.3 F1 against 24.8 for all five
    candidates. F1, not recall: keeping every candidate (recall 1) and keeping the top one
    (precision high) both score below keeping exactly the gold ones. Training data only, as
    the Query Rewriter's retrieval reward.
    """
    return _weighted_bonus("the selection reward", selection_f1, weight)


def _weighted_bonus(name: str, value: float | None, weight: float) -> float | None:
    """``weight`` x ``value``; ``None`` (no bonus) when the value is ``None`` or the weight 0."""
    if weight < 0 or not math.isfinite(weight):
        raise ValueError(f"{name}'s weight must be a finite number >= 0, got {weight}")
    if weight == 0 or value is None:
        return None
    return weight * value


# -- the decision agent (SmartRAG) ------------------------------------------------------------

#: ``mappo_decision_answer_reward``: the answer part of the decision agent's reward. ``em_f1`` is
#: SmartRAG's EM + F1 (in [0, 2]).
DECISION_ANSWER_REWARDS: tuple[str, ...] = ("em_f1", "em", "f1")


def decision_answer_reward(prediction: str, golds: str | Sequence[str],
                           kind: str = defaults.DECISION_ANSWER_REWARD,
                           scoring: str = DEFAULT_PROFILE) -> float:
    """The answer part of the decision agent's reward: EM, F1 or EM + F1 of the answer under
    the scoring profile ``scoring`` (the evaluation's function, so training and evaluation
    count the same way)."""
    if kind not in DECISION_ANSWER_REWARDS:
        raise ValueError(f"mappo_decision_answer_reward must be one of "
                         f"{', '.join(DECISION_ANSWER_REWARDS)}, got {kind!r}")
    scores = score_answer(prediction, golds, profile=scoring)
    return {"em": scores.em, "f1": scores.f1, "em_f1": scores.em + scores.f1}[kind]


@dataclass(frozen=True)
class DecisionReward:
    """``total = answer - retrieval_cost - malformed_penalty`` and its parts (the costs >= 0)."""

    answer: float
    retrieval_cost: float
    malformed_penalty: float

    @property
    def total(self) -> float:
        return self.answer - self.retrieval_cost - self.malformed_penalty


def decision_reward(answer_reward: float, searches: int, malformed: bool, *,
                    retrieval_cost: float = defaults.DECISION_RETRIEVAL_COST,
                    malformed_penalty: float = defaults.DECISION_MALFORMED_PENALTY
                    ) -> DecisionReward:
    """SmartRAG's reward of one trajectory: the answer reward, minus ``retrieval_cost`` per
    search, minus ``malformed_penalty`` when the trajectory ended malformed.

    A pure function of the three numbers so that it can be checked by hand; costs are given as
    non-negative amounts that are subtracted (a negative cost would pay the policy to search)."""
    if searches < 0:
        raise ValueError(f"searches must be >= 0, got {searches}")
    for name, value in (("retrieval_cost", retrieval_cost),
                        ("malformed_penalty", malformed_penalty)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0 (it is subtracted), got "
                             f"{value}")
    return DecisionReward(float(answer_reward), retrieval_cost * searches,
                          malformed_penalty if malformed else 0.0)


def soft_overlong_punishment(length: int, max_length: int, buffer: int,
                             factor: float = 1.0) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), a reward
    added to a response of ``length`` tokens under a generation budget ``L_max = max_length``
    with a buffer ``L_cache = buffer``: 0 up to ``L_max - L_cache`` tokens, then falling
    linearly, ``((L_max - L_cache) - |y|) / L_cache``, to -1 at ``L_max``, and -1 beyond (a
    response longer than the budget is never generated here, but the formula is the paper's).
    Scaled by ``factor`` (verl's ``overlong_buffer.penalty_factor``). Why: a response cut off by
    the budget is punished for its truncation, not for its reasoning, so the punishment rises
    smoothly over the buffer instead of as a step at the limit."""
    if max_length < 1 or not 0 <= buffer <= max_length:
        raise ValueError(f"expected 0 <= buffer <= max_length and max_length >= 1, got buffer "
                         f"{buffer}, max_length {max_length}")
    expected = max_length - buffer
    if length <= expected:
        return 0.0
    if length > max_length or buffer == 0:
        return -float(factor)
    return factor * (expected - length) / buffer
