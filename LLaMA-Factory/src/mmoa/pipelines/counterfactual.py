"""Counterfactual credit per agent of the three-agent pipeline (``mappo_counterfactual_agents``).

Why: with one shared answer reward every agent of a trace gets the same score, so an agent is
credited for answers it did nothing for. The demo's runs showed it: the Selector learnt a
constant ("keep the top candidate") and the Query Rewriter learnt nothing per question. Here,
as COMA's counterfactual baseline (Foerster et al., 2018) and s3's "gain beyond RAG" (Jiang et
al., 2025), an agent's part of the shared reward becomes ``R - R_cf``: the answer reward of the
trace minus that of the *same pipeline with the agent's output replaced by a default*:

* the Query Rewriter's default is the question itself as the only sub-question (then the
  question's candidates, the Selector and the Generator, sampled as in the trace);
* the Selector's default is all candidates (``all``, the default) or the top candidate
  (``top1``) of the trace's own candidates (then the Generator, sampled).

Where the agent's output already is its default the trace is its own counterfactual
(``R_cf = R``, a tie) and nothing is generated. That saves the generations where the default and
the output coincide (a warm start that keeps every candidate) and it keeps the expected
gradient: for that output ``E[R_cf] = E[R]`` either way. ``R_cf`` depends on the agent's input
(question, candidates) and not on its output, so it is a baseline: the policy gradient's
expectation is that of the shared reward; what it changes is the variance, per question.

The counterfactual pipelines run after the trace's own, in the same rollout, batched: one
retrieval call for every Query Rewriter default, one Selector stage for them, then one Generator
stage for every counterfactual of every agent. The trace's own sampling is untouched (the
counterfactuals draw their random numbers after it), so with the credit on a step rolls out the
traces it would roll out without it. This module only builds and runs the counterfactuals and
reads their rewards; :mod:`mmoa.pipelines.qr_s_g` puts them into the samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mmoa.train.mappo.agent_stats import COUNTERFACTUAL_AGENTS

if TYPE_CHECKING:
    from mmoa.agents.pipeline import RagPipeline, Trace

#: ``mappo_counterfactual_selector_default``: what the Selector's default keeps.
SELECTOR_DEFAULTS: tuple[str, ...] = ("all", "top1")
#: Stage names of the counterfactual generations in the rollout's timings (every stage but
#: ``retrieve`` counts as generation).
CF_SELECTOR_STAGE = "selector_counterfactual"
CF_GENERATOR_STAGE = "generator_counterfactual"


def default_selection(num_candidates: int, default: str) -> list[int]:
    """The Selector's default over ``num_candidates`` candidates: every one in rank order
    (``all``: the pipeline without a Selector, the ``qr_g`` ablation) or the first (``top1``:
    the top passage of the first sub-question, the constant the demo's Selector learnt)."""
    if default not in SELECTOR_DEFAULTS:
        raise ValueError(f"mappo_counterfactual_selector_default must be one of "
                         f"{', '.join(SELECTOR_DEFAULTS)}, got {default!r}")
    return list(range(num_candidates if default == "all" else min(1, num_candidates)))


def default_subquestions(question: str) -> list[str]:
    """The Query Rewriter's default: the question itself as the only sub-question (what the
    ``rag`` and ``s_g`` ablations retrieve with)."""
    return [question]


def uses_default(agent: str, trace: Trace, selector_default: str) -> bool:
    """Whether ``agent``'s output in ``trace`` already is its default, so that the trace is its
    own counterfactual: the sub-questions are exactly the question, or the selection is exactly
    the default's ids in the default's order (another order is another Generator prompt)."""
    if agent == "qr":
        return trace.subquestions == default_subquestions(trace.question)
    if agent == "selector":
        return trace.selected == default_selection(len(trace.candidates), selector_default)
    raise ValueError(f"no counterfactual default for agent {agent!r}; expected one of "
                     f"{', '.join(COUNTERFACTUAL_AGENTS)}")


def counterfactual_trace(agent: str, trace: Trace, selector_default: str) -> Trace:
    """The start of ``agent``'s counterfactual of ``trace``: the Query Rewriter's default with
    only the question and its sub-question (retrieval and the Selector still to run), the
    Selector's default with the trace's candidates and the default selection (the Generator
    still to run)."""
    from mmoa.agents.pipeline import Trace

    if agent == "qr":
        return Trace(question=trace.question, subquestions=default_subquestions(trace.question))
    if agent == "selector":
        return Trace(question=trace.question, subquestions=list(trace.subquestions),
                     candidates=list(trace.candidates),
                     selected=default_selection(len(trace.candidates), selector_default))
    raise ValueError(f"no counterfactual default for agent {agent!r}; expected one of "
                     f"{', '.join(COUNTERFACTUAL_AGENTS)}")


def run_counterfactuals(pipeline: RagPipeline, traces: Sequence[Trace],
                        agents: Sequence[str], selector_default: str) -> dict[str, float]:
    """Runs ``agents``' counterfactuals of every trace whose agent output is not its default
    and keeps each in ``trace.counterfactuals[agent]``; returns the seconds per stage
    (``retrieve``, :data:`CF_SELECTOR_STAGE`, :data:`CF_GENERATOR_STAGE`; a stage that ran no
    row is absent). ``pipeline`` is the rollout's, sampling as the traces were sampled."""
    made: dict[str, list[Trace]] = {agent: [] for agent in agents}
    for agent in agents:
        for trace in traces:
            if not uses_default(agent, trace, selector_default):
                trace.counterfactuals[agent] = counterfactual_trace(agent, trace,
                                                                    selector_default)
                made[agent].append(trace.counterfactuals[agent])
    timings: dict[str, float] = {}
    if made.get("qr"):
        stages = pipeline.retrieve_and_select(made["qr"])
        timings.update({"retrieve": stages.retrieve, CF_SELECTOR_STAGE: stages.selector})
    answered = [cf for agent in agents for cf in made[agent]]
    if answered:
        timings[CF_GENERATOR_STAGE] = pipeline.answer(answered)
    return timings

def counterfactual_rewards(trace: Trace, agents: Sequence[str], selector_default: str,
                           reward: Callable[[str], float], factual: float) -> dict[str, float]:
    """``agent -> R_cf`` for one trace: ``reward`` of the counterfactual's answer, or the trace's
    own reward ``factual`` where the agent's output was its default. Fails when a counterfactual
    is missing (a rollout without the credit scored with it)."""
    rewards: dict[str, float] = {}
    for agent in agents:
        if uses_default(agent, trace, selector_default):
            rewards[agent] = factual
            continue
        if agent not in trace.counterfactuals:
            raise RuntimeError(f"the trace of {trace.question!r} has no counterfactual for "
                               f"{agent!r}: the rollout ran without "
                               "mappo_counterfactual_agents")
        rewards[agent] = reward(trace.counterfactuals[agent].answer)
    return rewards
