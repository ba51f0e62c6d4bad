"""Per-agent statistics of a three-agent (``qr_s_g``) MAPPO step, and the drift monitor.

Why this exists: on one shared backbone the joint update can raise the pooled reward while one
agent collapses. The demo's MAPPO run moved the Selector from 4.9 kept documents to exactly 1
(gold recall of the selection 76 -> 37 %) while loss, reward and KL looked ordinary. These
statistics are what shows such a collapse, step by step, and :class:`DriftMonitor` says so in
the log the step it happens instead of after the evaluation.

The statistics are pure functions of the step's traces and records (no model), computed the way
the evaluation computes its table (:mod:`mmoa.evaluation`, :class:`mmoa.data.support.GoldSupport`:
passages matched to the record's gold ones by id, else by title), so a training curve and the
evaluation's ``S rec%`` / ``cand rec%`` columns mean the same thing:

* ``selected_gold_recall`` / ``selected_gold_precision``: share of the record's gold passages
  among the selected documents, and share of the selected documents that are gold;
* ``candidate_gold_recall``: share of the gold passages among the K candidates the Query
  Rewriter's sub-questions retrieved;
* ``answer_words``: the Generator's extracted answer, in words;
* ``empty_selection_probability`` / ``greedy_empty_rate``: the Selector's probability of
  selecting nothing (stopping at its first token, under its grammar, before the sampling
  temperature), and the share of its prompts on which the greedy Selector would: what a
  Selector sampled at a low temperature hides until evaluation (from the rollout's
  ``AgentCall.opening_stop_probability``; no gold needed).

A record without gold passages is left out of a gold mean, a selection of no document out of
the precision mean; a key no record of the step could give is not logged at all.

With the counterfactual credit (``mappo_counterfactual_agents``), :func:`counterfactual_stats`
adds per agent how its output compared with its default's (``cf_reward/<agent>``,
``cf_gain/<agent>``, ``cf_beat/<agent>``, ``cf_tie/<agent>``, ``cf_lost/<agent>``,
``cf_default/<agent>``): a Selector that keeps a constant ties or loses on every question; one
that learnt a per-question choice beats its default on some.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from mmoa import defaults
from mmoa.agents.prompts import AGENTS
from mmoa.data.support import GoldSupport

if TYPE_CHECKING:
    from mmoa.agents.pipeline import Trace
    from mmoa.data.records import QARecord

#: The per-step flag count the monitor adds to the logs.
DRIFT_FLAGS_KEY = "drift_flags"
#: The log name of each agent's gold-passage bonus (``retrieval_reward/qr``,
#: ``selection_reward/selector``: the step's mean bonus, weight included, the part of the
#: agent's ``reward/<agent>`` that comes from the gold passages).
BONUS_LOG_NAMES: dict[str, str] = {"qr": "retrieval_reward", "selector": "selection_reward"}


def selection_gold_stats(record: QARecord, trace: Trace) -> tuple[float | None, float | None]:
    """``(recall, precision)`` of the trace's selection against the record's gold passages.

    Recall is ``None`` when the record names no gold passage; precision also when nothing was
    selected (there is no share of nothing), while recall is then 0: every gold passage is
    missing from it."""
    support = GoldSupport.of(record)
    if support is None:
        return None, None
    chosen = [trace.candidates[i] for i in trace.selected]
    return support.recall(chosen), support.precision(chosen)


def selection_gold_f1(record: QARecord, trace: Trace) -> float | None:
    """F1 of the trace's selection against the gold passages *among its candidates*: the
    Selector's part of retrieval, whatever the Query Rewriter brought back. Precision is the
    share of the selected documents that are gold, recall the share of the candidates' gold
    passages that were selected; nothing selected scores 0. ``None`` when the record names no
    gold passage or none is among the candidates (no choice of the Selector could hold one)."""
    support = GoldSupport.of(record)
    if support is None:
        return None
    reachable = support.covered(trace.candidates)
    if not reachable:
        return None
    chosen = [trace.candidates[i] for i in trace.selected]
    precision = support.precision(chosen)
    recall = len(support.covered(chosen)) / len(reachable)
    if not precision or not recall:
        return 0.0
    return 2 * precision * recall / (precision + recall)


def candidate_gold_recall(record: QARecord, trace: Trace) -> float | None:
    """Share of the record's gold passages among the trace's K candidates (what the Query
    Rewriter's sub-questions brought back); ``None`` when the record names none."""
    support = GoldSupport.of(record)
    if support is None:
        return None
    return support.recall(trace.candidates)


def answer_words(trace: Trace) -> int:
    """Length of the Generator's extracted answer in words (the evaluation's ``answer_words``);
    the raw output when the trace has no parse."""
    if trace.answer_parse is not None:
        return trace.answer_parse.answer_words
    return len(trace.answer.split())


def empty_selection_stats(traces: Sequence[Trace]) -> dict[str, float | None]:
    """``empty_selection_probability`` and ``greedy_empty_rate`` over the Selector calls that
    recorded them (decoded under the grammar); ``None`` for both when none did."""
    calls = [t.calls["selector"] for t in traces if "selector" in t.calls]
    recorded = [c for c in calls if c.opening_stop_probability is not None]
    return {
        "empty_selection_probability": _mean(c.opening_stop_probability for c in recorded),
        "greedy_empty_rate": _mean(float(bool(c.opening_greedy_stop)) for c in recorded),
    }


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def step_agent_stats(records: Sequence[QARecord], traces: Sequence[Trace]) -> dict[str, float]:
    """The step's means of the statistics above; ``records[i]`` is the record of ``traces[i]``
    (repeat a record for each of its rollouts). Keys without a single value are left out."""
    if len(records) != len(traces):
        raise ValueError(f"{len(records)} records for {len(traces)} traces")
    selection = [selection_gold_stats(r, t) for r, t in zip(records, traces, strict=True)]
    means = {
        "selected_gold_recall": _mean(recall for recall, _ in selection),
        "selected_gold_precision": _mean(precision for _, precision in selection),
        "candidate_gold_recall": _mean(candidate_gold_recall(r, t)
                                       for r, t in zip(records, traces, strict=True)),
        "answer_words": _mean(answer_words(t) for t in traces),
        **empty_selection_stats(traces),
    }
    return {key: value for key, value in means.items() if value is not None}


#: The agents whose output has a default to compare it with (``mappo_counterfactual_agents``'
#: choices; the defaults themselves are in :mod:`mmoa.pipelines.counterfactual`). Defined here,
#: beside the statistics they are logged under, so that the training plots can name them
#: without importing a pipeline.
COUNTERFACTUAL_AGENTS: tuple[str, ...] = ("qr", "selector")
#: The per-agent statistics of the counterfactual credit, each logged as ``<stat>/<agent>``.
COUNTERFACTUAL_STATS: tuple[str, ...] = ("cf_reward", "cf_gain", "cf_beat", "cf_tie", "cf_lost",
                                         "cf_default")
#: Two rewards closer than this are a tie (F1 of the same answer computed twice is equal; this
#: only absorbs float noise).
TIE_TOLERANCE = 1e-9


def counterfactual_log_keys(agents: Sequence[str]) -> list[str]:
    """The keys :func:`counterfactual_stats` logs for ``agents`` (the trainer log carries them,
    so a running job shows them)."""
    return [f"{stat}/{agent}" for agent in agents for stat in COUNTERFACTUAL_STATS]


def counterfactual_stats(rewards: Sequence[float],
                         counterfactual: Mapping[str, Sequence[float]],
                         defaults_used: Mapping[str, Sequence[bool]]) -> dict[str, float]:
    """Per agent of ``counterfactual`` (``agent -> R_cf`` per trace, beside the traces' own
    rewards ``rewards``): the mean counterfactual reward (``cf_reward``), the mean gain
    ``R - R_cf`` (``cf_gain``), the shares of traces whose output beat, tied or lost to its
    default (``cf_beat`` / ``cf_tie`` / ``cf_lost``, summing to 1) and the share whose output
    was its default (``cf_default``, ties by construction, and no generation spent).

    Why the shares and not only the gain: a mean gain near 0 is both "always the default" and
    "better on half the questions, worse on the other half"; the shares tell a constant from a
    per-question choice."""
    stats: dict[str, float] = {}
    for agent, values in counterfactual.items():
        if len(values) != len(rewards) or len(defaults_used[agent]) != len(rewards):
            raise ValueError(f"{len(values)} counterfactual rewards of {agent!r} for "
                             f"{len(rewards)} traces")
        if not rewards:
            continue
        gains = [r - cf for r, cf in zip(rewards, values, strict=True)]
        count = len(gains)
        stats.update({
            f"cf_reward/{agent}": sum(values) / count,
            f"cf_gain/{agent}": sum(gains) / count,
            f"cf_beat/{agent}": sum(g > TIE_TOLERANCE for g in gains) / count,
            f"cf_tie/{agent}": sum(abs(g) <= TIE_TOLERANCE for g in gains) / count,
            f"cf_lost/{agent}": sum(g < -TIE_TOLERANCE for g in gains) / count,
            f"cf_default/{agent}": sum(map(bool, defaults_used[agent])) / count,
        })
    return stats


# -- the drift monitor ---------------------------------------------------------------------------

RuleKind = Literal["fraction_at_most", "drop_over", "ratio_at_least", "below", "rise_over"]


@dataclass(frozen=True)
class DriftRule:
    """When the logged statistic ``key`` of ``agent`` has moved too far from its baseline.

    ``fraction_at_most``: ``now <= threshold * baseline`` (a count that collapses);
    ``drop_over``: ``baseline - now > threshold`` (a fraction that loses points);
    ``ratio_at_least``: ``now >= threshold * baseline`` (a length that grows); ``below``:
    ``now < threshold`` whatever the baseline (a value that should never get there);
    ``rise_over``: ``now - baseline > threshold`` (a probability that should stay low). The ratio
    rules need a positive baseline: half or double of nothing says nothing."""

    agent: str
    key: str
    kind: RuleKind
    threshold: float

    def crossed(self, baseline: float, now: float) -> bool:
        if self.kind == "below":
            return now < self.threshold
        if self.kind == "rise_over":
            return now - baseline > self.threshold
        if self.kind == "drop_over":
            return baseline - now > self.threshold
        if baseline <= 0:
            return False
        if self.kind == "fraction_at_most":
            return now <= self.threshold * baseline
        return now >= self.threshold * baseline

    def describe(self) -> str:
        if self.kind == "below":
            return f"fell below {self.threshold:g}"
        if self.kind == "rise_over":
            return f"rose by more than {self.threshold * 100:g} points"
        if self.kind == "drop_over":
            return f"fell by more than {self.threshold * 100:g} points"
        if self.kind == "fraction_at_most":
            return f"fell to {self.threshold:g} x the first step's or less"
        return f"grew to {self.threshold:g} x the first step's or more"


#: What the monitor watches; the thresholds live in :mod:`mmoa.defaults`.
DRIFT_RULES: tuple[DriftRule, ...] = (
    DriftRule("selector", "num_selected", "fraction_at_most", defaults.DRIFT_SELECTED_FRACTION),
    DriftRule("selector", "selected_gold_recall", "drop_over", defaults.DRIFT_RECALL_DROP),
    DriftRule("qr", "candidate_gold_recall", "drop_over", defaults.DRIFT_RECALL_DROP),
    DriftRule("generator", "answer_words", "ratio_at_least", defaults.DRIFT_ANSWER_WORDS_RATIO),
    DriftRule("selector", "empty_selection_probability", "rise_over",
              defaults.DRIFT_EMPTY_SELECTION_RISE),
    # a negative KL estimate: scored under another distribution than the sampled one
    *(DriftRule(agent, f"kl/{agent}", "below", defaults.DRIFT_NEGATIVE_KL)
      for agent in AGENTS),
)


@dataclass
class DriftReport:
    """One step's verdict: how many watched statistics are past their threshold now
    (``flags``), and a warning line for each one that crossed for the first time this run."""

    flags: int
    warnings: list[str] = field(default_factory=list)


class DriftMonitor:
    """Keeps the first logged value of each watched statistic as its baseline and flags every
    step at which a statistic is past its rule's threshold; warns once per statistic per run
    (a collapse that lasts fifty steps is one line, not fifty), while the per-step flag count
    shows in the logs and plots whether it lasts."""

    def __init__(self, rules: Sequence[DriftRule] = DRIFT_RULES) -> None:
        self.rules = tuple(rules)
        self.baselines: dict[str, float] = {}
        self.warned: set[str] = set()

    def observe(self, step: int, logs: Mapping[str, float]) -> DriftReport | None:
        """Check the step's logs; ``None`` when none of the watched statistics is logged (a
        pipeline other than ``qr_s_g``), so no flag count is logged for it either."""
        watched = [rule for rule in self.rules if _finite(logs.get(rule.key))]
        if not watched:
            return None
        report = DriftReport(flags=0)
        for rule in watched:
            now = float(logs[rule.key])
            baseline = self.baselines.setdefault(rule.key, now)
            if not rule.crossed(baseline, now):
                continue
            report.flags += 1
            if rule.key not in self.warned:
                self.warned.add(rule.key)
                report.warnings.append(
                    f"[mappo] step {step}: drift: {rule.agent} {rule.key} {baseline:.3g} -> "
                    f"{now:.3g} ({rule.describe()}; warned once per run)")
        return report

    def replay(self, history: Iterable[Mapping[str, float]]) -> None:
        """Feed the logged steps of the run being resumed (``trainer_state``'s log history),
        silently: the baselines stay those of the run's first step and a statistic already
        warned about is not warned about again."""
        for entry in history:
            self.observe(int(entry.get("step", 0)), entry)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
