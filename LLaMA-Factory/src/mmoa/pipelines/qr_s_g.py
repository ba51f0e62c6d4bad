"""The three-agent pipeline of MMOA-RAG (``mappo_pipeline: qr_s_g``): Query Rewriter ->
retrieval -> Selector -> Generator, one shared policy.

Rollout: one batched :class:`~mmoa.agents.pipeline.RagPipeline` run for the whole step
(generate calls of at most ``mappo_rollout_batch_size`` rows, ONE retrieval call for every
sub-question of the step). Samples: every optimised agent's call of every trace is one PPO
sample; its score is the shared answer reward plus the agent's own penalty
(:func:`mmoa.train.mappo.rewards.compute_agent_rewards`) and, where on, its bonus from the
training record's gold passages (:func:`gold_bonuses`), or under a grouped algorithm its
group advantage (:func:`mmoa.train.mappo.grpo.group_samples`). With the counterfactual credit
(``mappo_counterfactual_agents``) the rollout also runs, batched, each listed agent's
counterfactual (its output replaced by a default, :mod:`mmoa.pipelines.counterfactual`) and that
agent's part of the shared reward is its gain over it. Evaluation: the full pipeline
and its ablations ``g``, ``rag``, ``s_g``, ``qr_g`` (:mod:`mmoa.agents.modes`), with per-agent
statistics in every row, and the oracle ``gold_g`` (the Generator on the gold passages).

Model libraries are imported inside the methods: the command line reads the registry (the
evaluation's ``--mode`` choices) without loading torch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from mmoa.agents.modes import MODE_AGENTS, MODES, ORACLE_MODES
from mmoa.agents.prompts import AGENTS  # every step logs each agent's statistics
from mmoa.data.records import QARecord
from mmoa.metrics import DEFAULT_PROFILE, score_answer
from mmoa.pipelines.base import Batch, Evaluator, Timings, register_pipeline
from mmoa.pipelines.counterfactual import (
    CF_GENERATOR_STAGE,
    CF_SELECTOR_STAGE,
    COUNTERFACTUAL_AGENTS,
    counterfactual_rewards,
    run_counterfactuals,
    uses_default,
)
from mmoa.pipelines.scoring import rouge_l, support_precision, support_recall

if TYPE_CHECKING:
    from mmoa.agents.pipeline import DocumentRetriever, GenerationSettings, Trace
    from mmoa.agents.render import PromptRenderer
    from mmoa.evaluation import EvalConfig
    from mmoa.train.mappo.args import MappoArguments
    from mmoa.train.mappo.rewards import PenaltyConfig
    from mmoa.train.mappo.samples import Sample
    from mmoa.train.progress import RolloutStage


def penalty_config(args: MappoArguments) -> PenaltyConfig:
    """The per-agent penalties of the run's ``mappo_qr_*`` / ``mappo_selector_*`` /
    ``mappo_generator_*`` keys."""
    from mmoa.train.mappo.rewards import PenaltyConfig

    return PenaltyConfig(
        qr_penalty=args.mappo_qr_penalty,
        qr_max_subquestions=args.mappo_qr_max_subquestions,
        qr_max_chars=args.mappo_qr_max_chars,
        selector_penalty=args.mappo_selector_penalty,
        generator_penalty=args.mappo_generator_penalty,
        generator_max_words=args.mappo_generator_max_words,
    )


def gold_bonuses(record: QARecord, trace: Trace, args: MappoArguments) -> dict[str, float]:
    """``agent -> bonus`` of the trace from the record's gold passages, for every optimised
    agent whose bonus is on: the Query Rewriter's retrieval reward
    (``mappo_qr_retrieval_reward``) and the Selector's selection reward
    (``mappo_selector_selection_reward``); an agent is left out where its bonus is off or the
    record gives it nothing to score (:func:`mmoa.train.mappo.rewards.retrieval_bonus`,
    :func:`~mmoa.train.mappo.rewards.selection_bonus`)."""
    from mmoa.train.mappo.agent_stats import candidate_gold_recall, selection_gold_f1
    from mmoa.train.mappo.rewards import retrieval_bonus, selection_bonus

    agents = args.optimized_agents
    bonuses: dict[str, float | None] = {}
    if "qr" in agents:
        bonuses["qr"] = retrieval_bonus(candidate_gold_recall(record, trace),
                                        args.mappo_qr_retrieval_reward)
    if "selector" in agents:
        bonuses["selector"] = selection_bonus(selection_gold_f1(record, trace),
                                              args.mappo_selector_selection_reward)
    return {agent: value for agent, value in bonuses.items() if value is not None}


def counterfactual_baselines(record: QARecord, trace: Trace, args: MappoArguments
                             ) -> dict[str, float]:
    """``agent -> R_cf`` of the trace for ``mappo_counterfactual_agents`` (empty when off):
    the shared reward, as the trace's own is computed, of each agent's counterfactual answer
    (:mod:`mmoa.pipelines.counterfactual`)."""
    from mmoa.train.mappo.rewards import shared_reward

    if not args.counterfactual_agents:
        return {}

    def reward(answer: str) -> float:
        return shared_reward(answer, record.answers, metric=args.mappo_reward_metric,
                             scoring=args.mappo_scoring)

    return counterfactual_rewards(trace, args.counterfactual_agents,
                                  args.mappo_counterfactual_selector_default, reward,
                                  reward(trace.answer))


def score_trace(record: QARecord, trace: Trace, mode: str,
                scoring: str = DEFAULT_PROFILE) -> dict[str, Any]:
    """One line of ``predictions.jsonl``: the trace, the gold answers and the scores under the
    scoring profile ``scoring``."""
    scores = score_answer(trace.answer, record.answers, profile=scoring)
    row = {"id": record.id, **trace.to_dict(), "answers": record.answers, "type": record.type}
    if record.group is not None:
        row["group"] = record.group
    row["scores"] = {**scores.as_dict(), "rouge_l": rouge_l(trace.answer, record.answers)}
    agents = MODE_AGENTS[mode]
    stats: dict[str, Any] = {}
    if "qr" in agents and trace.qr_parse is not None:
        stats["qr"] = {"num_subquestions": len(trace.subquestions),
                       "well_formed": trace.qr_parse.well_formed}
    if mode != "g":
        stats["retrieval"] = {"support_recall": support_recall(record, trace, False)}
    if "selector" in agents and trace.selection_parse is not None:
        stats["selector"] = {"num_selected": len(trace.selected),
                             "well_formed": trace.selection_parse.well_formed,
                             "support_recall": support_recall(record, trace, True),
                             "support_precision": support_precision(record, trace)}
    if trace.answer_parse is not None:
        stats["generator"] = {"answer_words": trace.answer_parse.answer_words,
                              "well_formed": trace.answer_parse.well_formed}
    row["agent_stats"] = stats
    return row


@register_pipeline("qr_s_g")
class QrSGPipeline:
    """Query Rewriter, Selector and Generator over one policy (the paper's pipeline)."""

    name = "qr_s_g"
    #: The ablations, then the oracle ``gold_g`` (the Generator on the gold passages).
    eval_modes: tuple[str, ...] = MODES + ORACLE_MODES
    retrieval_k_key = "mappo_top_k"
    agent_plot = True
    counterfactual_agents = COUNTERFACTUAL_AGENTS

    def rollout(self, policy: Any, tokenizer: Any, renderer: PromptRenderer,
                retriever: DocumentRetriever, args: MappoArguments,
                questions: Sequence[str]) -> Batch:
        from mmoa.agents.pipeline import GenerationSettings, RagPipeline

        settings = GenerationSettings(
            do_sample=True,
            temperature=args.mappo_temperature,
            agent_temperatures=args.agent_temperatures,
            top_p=args.mappo_top_p,
            max_new_tokens=args.max_new_tokens(),
            constrained_selector=args.mappo_constrained_selector,
            record_logprobs=args.record_sampling_logprobs,  # the ratio log, TIS
            record_support=args.mappo_masked_scoring,
            max_subquestions=args.mappo_qr_max_subquestions,
            cache=args.mappo_generation_cache,
        )
        # One run for the whole step: generate calls of at most mappo_rollout_batch_size
        # pipelines each, and ONE retrieval call for every sub-question of the step.
        pipeline = RagPipeline(policy, tokenizer, renderer, retriever, mode="qr_s_g",
                               k=args.mappo_top_k, settings=settings,
                               batch_size=args.mappo_rollout_batch_size)
        traces = pipeline.run(list(questions), group_size=args.rollouts_per_question)
        timings = pipeline.last_timings.as_dict()
        if args.counterfactual_agents:
            # after the traces' own sampling, so that the credit leaves the traces as they are
            pipeline.settings = replace(settings, record_logprobs=False, record_support=False)
            extra = run_counterfactuals(pipeline, traces, args.counterfactual_agents,
                                        args.mappo_counterfactual_selector_default)
            for stage, seconds in extra.items():
                timings[stage] = timings.get(stage, 0.0) + seconds
        return Batch(traces, Timings(timings))

    def rollout_stages(self, args: MappoArguments, questions: int) -> tuple[RolloutStage, ...]:
        """Each agent generates one row per pipeline (a question, or one of its group's
        rollouts), agent after agent."""
        from mmoa.train.progress import RolloutStage

        copies = args.rollouts_per_question
        unit = "question" if copies == 1 else "rollout"
        stages = [RolloutStage(agent, questions * copies, unit) for agent in AGENTS]
        agents = args.counterfactual_agents
        if "qr" in agents:  # at most: an output that is its default has no counterfactual
            stages.append(RolloutStage(CF_SELECTOR_STAGE, questions * copies, unit, exact=False))
        if agents:
            stages.append(RolloutStage(CF_GENERATOR_STAGE, questions * copies * len(agents),
                                       unit, exact=False))
        return tuple(stages)

    def samples(self, records: Sequence[QARecord], traces: Sequence[Trace],
                args: MappoArguments) -> tuple[list[Sample], dict[str, float]]:
        """Scores every trace and makes one sample per optimised agent and trace: under ppo
        with its score (GAE turns it into advantages), under a grouped algorithm (grpo, ...)
        with its group advantage."""
        import numpy as np

        from mmoa.train.mappo.agent_stats import (
            BONUS_LOG_NAMES,
            counterfactual_stats,
            step_agent_stats,
        )
        from mmoa.train.mappo.grpo import OverlongShaping, PipelineOutcome, group_samples
        from mmoa.train.mappo.rewards import compute_agent_rewards
        from mmoa.train.mappo.samples import Sample

        penalties = penalty_config(args)
        samples: list[Sample] = []
        outcomes: list[PipelineOutcome] = []
        logs: dict[str, list[float]] = defaultdict(list)
        credit: dict[str, list[float]] = defaultdict(list)  # agent -> R_cf per trace
        copies = args.rollouts_per_question
        repeated = [record for record in records for _ in range(copies)]
        agents = args.optimized_agents
        grouped = args.algorithm.grouped
        for record, trace in zip(repeated, traces, strict=True):
            if trace.qr_parse is None or trace.selection_parse is None \
                    or trace.answer_parse is None:
                raise RuntimeError(f"the qr_s_g rollout of {record.id!r} has an agent without a "
                                   "parsed output")
            bonuses = gold_bonuses(record, trace, args)
            baselines = counterfactual_baselines(record, trace, args)
            rewards = compute_agent_rewards(
                trace.qr_parse, trace.selection_parse, trace.answer_parse, trace.answer,
                record.answers, config=penalties, metric=args.mappo_reward_metric,
                scoring=args.mappo_scoring, bonuses=bonuses,
                baselines=baselines)
            logs["answer_f1"].append(rewards.shared)
            for agent, value in baselines.items():
                credit[agent].append(value)
            for agent, value in bonuses.items():
                logs[f"{BONUS_LOG_NAMES[agent]}/{agent}"].append(value)
            for agent in AGENTS:
                logs[f"penalty_rate/{agent}"].append(float(rewards.penalties[agent].fired))
                logs[f"reward/{agent}"].append(rewards.totals[agent])
                logs[f"response_length/{agent}"].append(len(trace.calls[agent].response_ids))
            logs["num_subquestions"].append(len(trace.subquestions))
            logs["num_selected"].append(len(trace.selected))
            if grouped:
                outcomes.append(PipelineOutcome(
                    calls={a: (trace.calls[a].prompt_ids, trace.calls[a].response_ids,
                               trace.calls[a].sampling_logprobs) for a in agents},
                    shared=rewards.shared,
                    penalties={a: rewards.penalty(a) for a in agents},
                    supports={a: trace.calls[a].support for a in agents
                              if trace.calls[a].support is not None},
                    baselines=dict(baselines)))
                continue
            for agent in agents:
                call = trace.calls[agent]
                samples.append(Sample(agent, call.prompt_ids, call.response_ids,
                                      rewards.totals[agent], call.sampling_logprobs,
                                      support=call.support))
        summary = {k: float(np.mean(v)) for k, v in logs.items()}
        # gold recall / precision of the selection, candidate recall, answer words
        summary.update(step_agent_stats(repeated, traces))
        summary.update(counterfactual_stats(logs["answer_f1"], credit, {
            agent: [uses_default(agent, t, args.mappo_counterfactual_selector_default)
                    for t in traces] for agent in credit}))
        if grouped:
            samples, group_logs = group_samples(outcomes, copies, agents, args.group_advantage,
                                                args.group_filter,
                                                OverlongShaping.from_args(args))
            summary.update(group_logs)
        # the mean score of every optimised agent's call, kept or filtered alike
        summary["reward"] = float(np.mean([logs[f"reward/{a}"] for a in agents]))
        return samples, summary

    def evaluator(self, model: Any, tokenizer: Any, retriever: DocumentRetriever | None,
                  settings: GenerationSettings, config: EvalConfig) -> Evaluator:
        from mmoa.agents.pipeline import RagPipeline

        pipeline = RagPipeline(model, tokenizer, config.template, retriever,
                               mode=config.mode,  # type: ignore[arg-type]
                               k=config.k, settings=settings)

        def run(questions: Sequence[str]) -> Batch:
            traces = pipeline.run(list(questions))
            return Batch(traces, Timings(pipeline.last_timings.as_dict()))

        return run

    def eval_row(self, record: QARecord, trace: Trace, config: EvalConfig) -> dict[str, Any]:
        return score_trace(record, trace, config.mode, config.scoring)

    def eval_retrieval_k(self, config: EvalConfig) -> tuple[str, int] | None:
        return None if config.mode == "g" else ("k", config.k)

    def eval_label(self, config: EvalConfig) -> str:
        return config.mode

    def eval_metrics(self, config: EvalConfig) -> dict[str, Any]:
        return {}
