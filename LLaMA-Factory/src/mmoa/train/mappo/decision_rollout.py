"""Rollouts and samples of the retrieve-or-answer decision agent (``mappo_pipeline:
decision_agent``; SmartRAG).

The trainer loop, the learner, the PPO maths, checkpoints and resume are MAPPO's; the samples are
made by the search agent's :func:`mmoa.train.mappo.search_rollout.trajectory_samples` (one sample
per trajectory, the documents masked out of the loss). Only the score differs: SmartRAG's

    reward = answer reward - mappo_decision_retrieval_cost x searches
             - mappo_decision_malformed_penalty (when the trajectory ended malformed)

(:func:`mmoa.train.mappo.rewards.decision_reward`). The whole reward is the trajectory's one
score: under PPO it is the sample's score, under GRPO the group-normalised quantity (a cost that
only shifted a raw advantage would weigh differently in every group), so the policy trades the
answer against the searches exactly as the reward says.

Logs: ``reward``, its parts ``decision/answer_reward``, ``decision/retrieval_cost``,
``decision/malformed_penalty``, ``answer_f1`` and ``answer_em``, ``decision/retrieval_rate``
(share of trajectories that searched), ``decision/searches``, ``decision/well_formed``,
``decision/forced``, ``decision/retrieved_tokens``, ``decision/stop/<reason>`` and
``response_length/decision``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mmoa.agents.decision_agent import DecisionAgentPipeline
from mmoa.agents.decision_tags import DecisionStop
from mmoa.agents.pipeline import DocumentRetriever, GenerationSettings
from mmoa.agents.render import PromptRenderer
from mmoa.agents.search_agent import SearchTrajectory
from mmoa.data.records import QARecord
from mmoa.metrics import score_answer
from mmoa.train.mappo.args import MappoArguments
from mmoa.train.mappo.rewards import DecisionReward, decision_answer_reward, decision_reward
from mmoa.train.mappo.samples import Sample
from mmoa.train.mappo.search_rollout import trajectory_samples

#: The one agent name of the decision agent's samples (logs: ``response_length/decision``).
DECISION_AGENT = "decision"


def decision_pipeline(policy: Any, tokenizer: Any, renderer: PromptRenderer,
                      retriever: DocumentRetriever, args: MappoArguments
                      ) -> DecisionAgentPipeline:
    """The sampling pipeline of a rollout, configured by the ``mappo_decision_*`` keys."""
    settings = GenerationSettings(do_sample=True, temperature=args.mappo_temperature,
                                  top_p=args.mappo_top_p)
    return DecisionAgentPipeline(
        policy, tokenizer, renderer, retriever, max_searches=args.mappo_decision_max_searches,
        top_k=args.mappo_decision_top_k, max_new_tokens=args.mappo_max_new_tokens_decision,
        settings=settings, batch_size=args.mappo_rollout_batch_size)


def trajectory_reward(trajectory: SearchTrajectory, golds: Sequence[str],
                      args: MappoArguments) -> DecisionReward:
    """SmartRAG's reward of one trajectory under the run's keys."""
    answer = decision_answer_reward(trajectory.answer, list(golds),
                                    args.mappo_decision_answer_reward, args.mappo_scoring)
    return decision_reward(answer, trajectory.num_searches, not trajectory.well_formed,
                           retrieval_cost=args.mappo_decision_retrieval_cost,
                           malformed_penalty=args.mappo_decision_malformed_penalty)


def decision_samples(records: Sequence[QARecord], trajectories: Sequence[SearchTrajectory],
                     args: MappoArguments) -> tuple[list[Sample], dict[str, float]]:
    """The step's samples (one per trajectory) and its logs."""
    def score(record: QARecord, trajectory: SearchTrajectory
              ) -> tuple[float, float, dict[str, float]]:
        reward = trajectory_reward(trajectory, record.answers, args)
        scores = score_answer(trajectory.answer, record.answers, profile=args.mappo_scoring)
        return reward.total, 0.0, {
            "reward": reward.total, "answer_f1": scores.f1, "answer_em": scores.em,
            "decision/answer_reward": reward.answer,
            "decision/retrieval_cost": reward.retrieval_cost,
            "decision/malformed_penalty": reward.malformed_penalty,
            "decision/searches": trajectory.num_searches,
            "decision/retrieval_rate": float(trajectory.num_searches > 0),
            "decision/well_formed": float(trajectory.well_formed),
            "decision/forced": float(trajectory.stop_reason == DecisionStop.FORCED_ANSWER),
            "decision/retrieved_tokens": trajectory.retrieved_tokens}

    return trajectory_samples(records, trajectories, args, agent=DECISION_AGENT, score=score,
                              stop_reasons=DecisionStop, stop_prefix="decision/stop/",
                              mask=True)
