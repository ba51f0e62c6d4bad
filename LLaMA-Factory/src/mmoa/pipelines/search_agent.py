"""The multi-turn search agent (``mappo_pipeline: search_agent``; RAG-R1 / Search-R1).

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

Evaluation (``mode: search_agent``) records per question its turns, retrieval rounds, queries,
retrieved tokens and seconds. Model libraries are imported inside the functions, so the
registry stays light for the command line.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from mmoa.agents.search_tags import StopReason
from mmoa.data.records import QARecord
from mmoa.data.support import GoldSupport
from mmoa.metrics import DEFAULT_PROFILE, score_answer
from mmoa.pipelines.base import Batch, Evaluator, Timings, register_pipeline
from mmoa.pipelines.scoring import rouge_l

if TYPE_CHECKING:
    from mmoa.agents.pipeline import DocumentRetriever, GenerationSettings
    from mmoa.agents.render import PromptRenderer
    from mmoa.agents.search_agent import SearchAgentPipeline, SearchTrajectory
    from mmoa.evaluation import EvalConfig
    from mmoa.train.mappo.args import MappoArguments
    from mmoa.train.mappo.samples import Sample
    from mmoa.train.progress import RolloutStage

#: The one agent name of the search agent's samples (logs: ``response_length/search``).
SEARCH_AGENT = "search"


def search_pipeline(policy: Any, tokenizer: Any, renderer: PromptRenderer,
                    retriever: DocumentRetriever, args: MappoArguments) -> SearchAgentPipeline:
    """The sampling pipeline of a rollout, configured by the ``mappo_search_*`` keys."""
    from mmoa.agents.search_agent import SearchAgentPipeline

    return SearchAgentPipeline(
        policy, tokenizer, renderer, retriever, max_turns=args.mappo_search_max_turns,
        max_queries=args.mappo_search_max_queries, top_k=args.mappo_search_top_k,
        max_new_tokens=args.mappo_max_new_tokens_search, settings=rollout_settings(args),
        batch_size=args.mappo_rollout_batch_size)


def rollout_settings(args: MappoArguments) -> GenerationSettings:
    """How a multi-turn agent (search or decision) samples its rollouts: one definition, so
    both agents read ``mappo_temperature``, ``mappo_top_p`` and ``mappo_generation_cache`` alike
    (the three-agent pipeline has per-agent temperatures and builds its own)."""
    from mmoa.agents.pipeline import GenerationSettings

    return GenerationSettings(do_sample=True, temperature=args.mappo_temperature,
                              top_p=args.mappo_top_p, cache=args.mappo_generation_cache)


def trajectory_score(trajectory: SearchTrajectory, golds: Sequence[str],
                     args: MappoArguments) -> tuple[float, float]:
    """``(shared answer reward, format penalty)`` of one trajectory."""
    from mmoa.train.mappo.rewards import shared_reward

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
TrajectoryScore = Callable[[QARecord, "SearchTrajectory"], tuple[float, float, dict[str, float]]]


def trajectory_samples(records: Sequence[QARecord], trajectories: Sequence[SearchTrajectory],
                       args: MappoArguments, *, agent: str, score: TrajectoryScore,
                       stop_reasons: Iterable[enum.StrEnum], stop_prefix: str,
                       mask: bool) -> tuple[list[Sample], dict[str, float]]:
    """The samples of a multi-turn agent's step, one per trajectory, and the step's logs (the
    mean of every value ``score`` logs, ``response_length/<agent>`` and the rate of every stop
    reason). Shared by the search agent and the decision agent
    (:mod:`mmoa.pipelines.decision_agent`): they differ only in ``score``.

    Under PPO (and any algorithm without groups) a sample's score is ``shared + penalty``; under
    a grouped algorithm (GRPO, ...) a question's trajectories are one group whose ``shared``
    rewards are normalised and the penalty added (as for the three agents). ``mask``: keep the
    pipeline's appended tokens out of the loss (``loss_mask``)."""
    import numpy as np

    from mmoa.train.mappo.grpo import PipelineOutcome, group_samples
    from mmoa.train.mappo.samples import Sample

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


def score_search_trajectory(record: QARecord, trajectory: Any,
                            scoring: str = DEFAULT_PROFILE) -> dict[str, Any]:
    """One line of ``predictions.jsonl`` for the search agent: the trajectory (its turns,
    queries, stop reason), the scores, and the statistics the table shows."""
    scores = score_answer(trajectory.answer, record.answers, profile=scoring)
    row = {"id": record.id, **trajectory.to_dict(), "answers": record.answers,
           "type": record.type}
    if record.group is not None:
        row["group"] = record.group
    row["scores"] = {**scores.as_dict(), "rouge_l": rouge_l(trajectory.answer, record.answers)}
    support = GoldSupport.of(record)
    recall = None
    if support is not None:
        retrieved = getattr(trajectory, "retrieved_passages", [])
        recall = support.recall(retrieved) if retrieved else 0.0
    row["agent_stats"] = {"search": {
        "turns": len(trajectory.turns), "searches": trajectory.num_searches,
        "queries": trajectory.num_queries, "retrieved_tokens": trajectory.retrieved_tokens,
        "seconds": trajectory.seconds, "well_formed": trajectory.well_formed,
        "forced": trajectory.stop_reason is not None
        and trajectory.stop_reason.value == "forced_answer"},
        "retrieval": {"support_recall": recall}}
    return row


def multiturn_rollout(pipeline: SearchAgentPipeline, questions: Sequence[str],
                      args: MappoArguments) -> Batch:
    """A multi-turn agent's rollout of a step: ``rollouts_per_question`` trajectories per
    question, with the pipeline's timings. Shared by the search and the decision agent."""
    trajectories = pipeline.run(list(questions), group_size=args.rollouts_per_question)
    return Batch(trajectories, Timings(dict(pipeline.last_timings)))


def multiturn_evaluator(pipeline: SearchAgentPipeline) -> Evaluator:
    """Runs a multi-turn agent (search or decision) over a batch, with its timings."""
    def run(questions: Sequence[str]) -> Batch:
        trajectories = pipeline.run(list(questions))
        return Batch(trajectories, Timings(dict(pipeline.last_timings)))

    return run


def turn_stages(agent: str, questions: int, args: MappoArguments,
                rounds: int) -> tuple[RolloutStage, ...]:
    """A multi-turn agent's rollout as one stage: each of its ``questions * group size``
    trajectories generates once per round, for at most ``rounds`` rounds (most answer sooner,
    so the total is a bound). Shared by the search and the decision agent."""
    from mmoa.train.progress import RolloutStage

    return (RolloutStage(f"{agent} turns", questions * args.rollouts_per_question * rounds,
                         "generation", exact=False),)


class MultiTurnSpec:
    """What the one-agent multi-turn pipelines (search and decision agent) share: no per-agent
    plot, no counterfactual default, and a rollout that runs ``sampling_pipeline`` (their
    ``*_pipeline`` builder) for ``rollouts_per_question`` trajectories per question."""

    agent_plot = False
    counterfactual_agents: tuple[str, ...] = ()  # one agent: no default to compare
    sampling_pipeline: Callable[[Any, Any, PromptRenderer, DocumentRetriever, MappoArguments],
                                SearchAgentPipeline]

    def rollout(self, policy: Any, tokenizer: Any, renderer: PromptRenderer,
                retriever: DocumentRetriever, args: MappoArguments,
                questions: Sequence[str]) -> Batch:
        pipeline = self.sampling_pipeline(policy, tokenizer, renderer, retriever, args)
        return multiturn_rollout(pipeline, questions, args)


@register_pipeline("search_agent")
class SearchAgentSpec(MultiTurnSpec):
    """One policy that searches with up to ``mappo_search_max_queries`` queries per turn."""

    name = "search_agent"
    eval_modes: tuple[str, ...] = ("search_agent",)
    retrieval_k_key = "mappo_search_top_k"
    # one growing response per trajectory; one retrieval call per search round for every query
    # of the step's trajectories
    sampling_pipeline = staticmethod(search_pipeline)

    def rollout_stages(self, args: MappoArguments, questions: int) -> tuple[RolloutStage, ...]:
        # rounds 0 .. max_turns: the last one forces an answer
        return turn_stages(SEARCH_AGENT, questions, args, args.mappo_search_max_turns + 1)

    def samples(self, records: Sequence[QARecord], traces: Sequence[Any],
                args: MappoArguments) -> tuple[list[Sample], dict[str, float]]:
        return search_samples(records, traces, args)

    def evaluator(self, model: Any, tokenizer: Any, retriever: DocumentRetriever | None,
                  settings: GenerationSettings, config: EvalConfig) -> Evaluator:
        from mmoa.agents.search_agent import SearchAgentPipeline

        return multiturn_evaluator(SearchAgentPipeline(
            model, tokenizer, config.template, retriever,  # type: ignore[arg-type]
            max_turns=config.search_max_turns, max_queries=config.search_max_queries,
            top_k=config.search_top_k, max_new_tokens=config.max_new_tokens_search,
            settings=settings))

    def eval_row(self, record: QARecord, trace: Any, config: EvalConfig) -> dict[str, Any]:
        return score_search_trajectory(record, trace, config.scoring)

    def eval_retrieval_k(self, config: EvalConfig) -> tuple[str, int] | None:
        return "search_top_k", config.search_top_k

    def eval_label(self, config: EvalConfig) -> str:
        return config.mode

    def eval_metrics(self, config: EvalConfig) -> dict[str, Any]:
        return {}
