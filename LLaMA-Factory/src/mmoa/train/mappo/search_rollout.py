"""Rollouts and samples of the multi-turn search agent (``mappo_pipeline: search_agent``).

The trainer loop, the learner, the PPO maths, checkpoints and resume are those of MAPPO; this
module only says how a step's questions become samples when one policy plays one multi-turn
agent instead of three single-turn ones:

* each trajectory is ONE sample: the prompt, the whole multi-turn response (model turns and the
  appended ``<information>`` turns) and its ``loss_mask`` (1 on the tokens the model sampled, 0 on
  what the pipeline appended), so retrieved tokens are context for the forward pass but get no
  policy loss, KL, value loss or advantage (:mod:`mmoa.train.mappo.learner` packs the model's
  tokens for GAE);
* its score is the shared answer reward (``mappo_reward_metric`` of the answer under
  ``mappo_scoring``, the same function as the three-agent pipeline's) plus
  ``mappo_search_format_penalty`` when the trajectory ended malformed;
* under GRPO a question's ``mappo_group_size`` trajectories are one group (the same
  :func:`mmoa.train.mappo.grpo.group_samples` as the three agents, with one agent ``search``).
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from mmoa.agents.pipeline import DocumentRetriever, GenerationSettings
from mmoa.agents.render import PromptRenderer
from mmoa.agents.search_agent import SearchAgentPipeline, SearchTrajectory
from mmoa.agents.search_tags import StopReason
from mmoa.data.records import QARecord
from mmoa.train.mappo.args import MappoArguments
from mmoa.train.mappo.grpo import PipelineOutcome, group_samples
from mmoa.train.mappo.rewards import shared_reward
from mmoa.train.mappo.samples import Sample

#: The one agent name of the search agent's samples (logs: ``response_length/search``).
SEARCH_AGENT = "search"


def search_pipeline(policy: Any, tokenizer: Any, renderer: PromptRenderer,
                    retriever: DocumentRetriever, args: MappoArguments) -> SearchAgentPipeline:
    """The sampling pipeline of a rollout, configured by the ``mappo_search_*`` keys."""
    settings = GenerationSettings(do_sample=True, temperature=args.mappo_temperature,
                                  top_p=args.mappo_top_p)
    return SearchAgentPipeline(
        policy, tokenizer, renderer, retriever, max_turns=args.mappo_search_max_turns,
        max_queries=args.mappo_search_max_queries, top_k=args.mappo_search_top_k,
        max_new_tokens=args.mappo_max_new_tokens_search, settings=settings,
        batch_size=args.mappo_rollout_batch_size)


def trajectory_score(trajectory: SearchTrajectory, golds: Sequence[str],
                     args: MappoArguments) -> tuple[float, float]:
    """``(shared answer reward, format penalty)`` of one trajectory."""
    shared = shared_reward(trajectory.answer, list(golds), args.mappo_reward_metric,
                           args.mappo_scoring)
    penalty = 0.0 if trajectory.well_formed else args.mappo_search_format_penalty
    return shared, penalty


def search_samples(records: Sequence[QARecord], trajectories: Sequence[SearchTrajectory],
                   args: MappoArguments) -> tuple[list[Sample], dict[str, float]]:
    """The step's samples (one per trajectory) and its logs."""
    def score(record: QARecord, trajectory: SearchTrajectory
              ) -> tuple[float, float, dict[str, float]]:
        shared, penalty = trajectory_score(trajectory, record.answers, args)
        return shared, penalty, {
            "answer_f1": shared, "reward": shared + penalty,
            "search/turns": len(trajectory.turns),
            "search/searches": trajectory.num_searches,
            "search/queries": trajectory.num_queries,
            "search/retrieved_tokens": trajectory.retrieved_tokens,
            "search/well_formed": float(trajectory.well_formed),
            "search/forced": float(trajectory.stop_reason == StopReason.FORCED_ANSWER)}

    return trajectory_samples(records, trajectories, args, agent=SEARCH_AGENT, score=score,
                              stop_reasons=StopReason, stop_prefix="search/stop/",
                              mask=args.mappo_search_mask_information)


#: ``(record, trajectory) -> (shared reward, penalty, this trajectory's log values)``.
TrajectoryScore = Callable[[QARecord, SearchTrajectory], tuple[float, float, dict[str, float]]]


def trajectory_samples(records: Sequence[QARecord], trajectories: Sequence[SearchTrajectory],
                       args: MappoArguments, *, agent: str, score: TrajectoryScore,
                       stop_reasons: Iterable[enum.StrEnum], stop_prefix: str,
                       mask: bool) -> tuple[list[Sample], dict[str, float]]:
    """The samples of a multi-turn agent's step, one per trajectory, and the step's logs (the
    mean of every value ``score`` logs, ``response_length/<agent>`` and the rate of every stop
    reason). Shared by the search agent and the decision agent (:mod:`.decision_rollout`): they
    differ only in ``score``.

    Under PPO (and any algorithm without groups) a sample's score is ``shared + penalty``; under
    a grouped algorithm (GRPO, ...) a question's trajectories are one group whose ``shared``
    rewards are normalised and the penalty added (as for the three agents). ``mask``: keep the
    pipeline's appended tokens out of the loss (``loss_mask``)."""
    copies = args.rollouts_per_question
    grouped = args.algorithm.grouped
    repeated = [record for record in records for _ in range(copies)]
    samples: list[Sample] = []
    outcomes: list[PipelineOutcome] = []
    logs: dict[str, list[float]] = {}
    reasons: Counter[str] = Counter()
    for record, trajectory in zip(repeated, trajectories, strict=True):
        if trajectory.stop_reason is None:
            raise RuntimeError(f"the {agent}-agent rollout of {record.id!r} did not finish")
        shared, penalty, values = score(record, trajectory)
        reasons[trajectory.stop_reason.value] += 1
        for key, value in {**values,
                           f"response_length/{agent}": trajectory.model_tokens}.items():
            logs.setdefault(key, []).append(float(value))
        loss_mask = list(trajectory.loss_mask) if mask else None
        if grouped:
            outcomes.append(PipelineOutcome(
                calls={agent: (trajectory.prompt_ids, trajectory.response_ids, None)},
                shared=shared, penalties={agent: penalty},
                loss_masks={agent: loss_mask} if loss_mask is not None else {}))
        else:
            samples.append(Sample(agent, trajectory.prompt_ids, trajectory.response_ids,
                                  shared + penalty, None, loss_mask=loss_mask))
    summary = {key: float(np.mean(values)) for key, values in logs.items() if values}
    total = max(1, len(trajectories))
    for reason in stop_reasons:
        summary[f"{stop_prefix}{reason.value}"] = reasons[reason.value] / total
    if grouped:
        samples, group_logs = group_samples(outcomes, copies, (agent,), args.group_advantage,
                                            args.group_filter)
        summary.update(group_logs)
    return samples, summary
