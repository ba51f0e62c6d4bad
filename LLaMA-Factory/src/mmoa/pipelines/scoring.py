"""Scores of one evaluated question that every pipeline's rows share: ROUGE-L against the gold
answers and the recall / precision of the gold supporting passages.

Here, below the pipelines that fill ``predictions.jsonl`` and the evaluation that aggregates it
(:mod:`mmoa.evaluation` re-exports the functions under their former names).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mmoa.data.records import QARecord
from mmoa.data.support import GoldSupport

if TYPE_CHECKING:
    from mmoa.agents.pipeline import Trace


@functools.lru_cache(maxsize=1)
def _rouge_scorer() -> Any:
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"])


def rouge_l(prediction: str, golds: Sequence[str]) -> float:
    return max(_rouge_scorer().score(g, prediction)["rougeL"].fmeasure for g in golds)


def support_recall(record: QARecord, trace: Trace, selected_only: bool) -> float | None:
    """Share of the gold supporting passages among the candidates (or the selected ones);
    ``None`` when the record names none. Matched by id, else by title (:class:`GoldSupport`)."""
    support = GoldSupport.of(record)
    if support is None:
        return None
    indices = trace.selected if selected_only else range(len(trace.candidates))
    return support.recall([trace.candidates[i] for i in indices])


def support_precision(record: QARecord, trace: Trace) -> float | None:
    """Share of the selected passages that are gold supporting passages (``None`` for an empty
    selection or a record without supporting passages)."""
    support = GoldSupport.of(record)
    if support is None:
        return None
    return support.precision([trace.candidates[i] for i in trace.selected])
