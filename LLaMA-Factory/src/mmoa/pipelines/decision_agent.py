"""The retrieve-or-answer decision agent (``mappo_pipeline: decision_agent``; SmartRAG).

The trainer loop, the learner, the PPO maths, checkpoints and resume are MAPPO's; the samples are
made by the search agent's :func:`mmoa.pipelines.search_agent.trajectory_samples` (one sample
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

Evaluation (``mode: decision_agent``) runs ``decision_policy`` ``model`` (the policy decides),
``always`` (retrieve once with the question, then answer) or ``never`` (answer closed book) and
records the retrieval rate and the searches per question.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mmoa.agents.decision_tags import DecisionStop
from mmoa.data.records import QARecord
from mmoa.metrics import DEFAULT_PROFILE, score_answer
from mmoa.pipelines.base import Evaluator, register_pipeline
from mmoa.pipelines.scoring import rouge_l
from mmoa.pipelines.search_agent import (
    MultiTurnSpec,
    multiturn_evaluator,
    rollout_settings,
    trajectory_samples,
    turn_stages,
)

if TYPE_CHECKING:
    from mmoa.agents.decision_agent import DecisionAgentPipeline
    from mmoa.agents.pipeline import DocumentRetriever, GenerationSettings
    from mmoa.agents.render import PromptRenderer
    from mmoa.agents.search_agent import SearchTrajectory
    from mmoa.evaluation import EvalConfig
    from mmoa.train.mappo.args import MappoArguments
    from mmoa.train.mappo.rewards import DecisionReward
    from mmoa.train.mappo.samples import Sample
    from mmoa.train.progress import RolloutStage

#: The one agent name of the decision agent's samples (logs: ``response_length/decision``).
DECISION_AGENT = "decision"


def decision_pipeline(policy: Any, tokenizer: Any, renderer: PromptRenderer,
                      retriever: DocumentRetriever, args: MappoArguments
                      ) -> DecisionAgentPipeline:
    """The sampling pipeline of a rollout, configured by the ``mappo_decision_*`` keys."""
    from mmoa.agents.decision_agent import DecisionAgentPipeline

    return DecisionAgentPipeline(
        policy, tokenizer, renderer, retriever, max_searches=args.mappo_decision_max_searches,
        top_k=args.mappo_decision_top_k, max_new_tokens=args.mappo_max_new_tokens_decision,
        settings=rollout_settings(args), batch_size=args.mappo_rollout_batch_size)


def trajectory_reward(trajectory: SearchTrajectory, golds: Sequence[str],
                      args: MappoArguments) -> DecisionReward:
    """SmartRAG's reward of one trajectory under the run's keys."""
    from mmoa.train.mappo.rewards import decision_answer_reward, decision_reward

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


def score_decision_trajectory(record: QARecord, trajectory: Any,
                              scoring: str = DEFAULT_PROFILE) -> dict[str, Any]:
    """One line of ``predictions.jsonl`` for the decision agent: the trajectory (its turns and
    stop reason), the record's group, the scores and the decision statistics."""
    from mmoa.agents.decision_agent import trajectory_summary

    scores = score_answer(trajectory.answer, record.answers, profile=scoring)
    row = {"id": record.id, **trajectory.to_dict(), "answers": record.answers,
           "type": record.type, "group": record.group}
    row["scores"] = {**scores.as_dict(), "rouge_l": rouge_l(trajectory.answer, record.answers)}
    row["agent_stats"] = {"decision": {**trajectory_summary(trajectory),
                                       "seconds": trajectory.seconds}}
    return row


@register_pipeline("decision_agent")
class DecisionAgentSpec(MultiTurnSpec):
    """One policy that answers, or searches first at a cost per search."""

    name = "decision_agent"
    eval_modes: tuple[str, ...] = ("decision_agent",)
    retrieval_k_key = "mappo_decision_top_k"
    # one retrieval call per decision round for every trajectory that searched
    sampling_pipeline = staticmethod(decision_pipeline)

    def rollout_stages(self, args: MappoArguments, questions: int) -> tuple[RolloutStage, ...]:
        # training samples the decision (policy "model"): rounds 0 .. max_searches
        return turn_stages("decision", questions, args, args.mappo_decision_max_searches + 1)

    def samples(self, records: Sequence[QARecord], traces: Sequence[Any],
                args: MappoArguments) -> tuple[list[Sample], dict[str, float]]:
        return decision_samples(records, traces, args)

    def evaluator(self, model: Any, tokenizer: Any, retriever: DocumentRetriever | None,
                  settings: GenerationSettings, config: EvalConfig) -> Evaluator:
        from mmoa.agents.decision_agent import DecisionAgentPipeline

        return multiturn_evaluator(DecisionAgentPipeline(
            model, tokenizer, config.template, retriever,
            max_searches=config.decision_max_searches, top_k=config.decision_top_k,
            max_new_tokens=config.max_new_tokens_decision, policy=config.decision_policy,
            settings=settings))

    def eval_row(self, record: QARecord, trace: Any, config: EvalConfig) -> dict[str, Any]:
        return score_decision_trajectory(record, trace, config.scoring)

    def eval_retrieval_k(self, config: EvalConfig) -> tuple[str, int] | None:
        needed = config.decision_policy == "always" or (
            config.decision_policy == "model" and config.decision_max_searches > 0)
        return ("decision_top_k", config.decision_top_k) if needed else None

    def eval_label(self, config: EvalConfig) -> str:
        return f"{config.mode} ({config.decision_policy})"

    def eval_metrics(self, config: EvalConfig) -> dict[str, Any]:
        return {"decision_policy": config.decision_policy}
