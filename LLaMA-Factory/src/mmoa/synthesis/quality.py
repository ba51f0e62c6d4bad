"""Label quality of warm-start data: how close each dataset's labels are to the gold.

The issue's comparison (heuristic vs best-of-N vs TOA) starts here, before any training:

* **QR**: recall of the gold supporting passages among the K candidates that the labelled
  sub-questions retrieve (questions whose record names gold passages);
* **Selector**: precision and recall of the labelled documents against the gold supporting
  passages, micro-averaged exactly as :class:`mmoa.data.sft_builder.SFTBuildReport` computes
  them (precision over all labelled documents, recall over all gold passages);
* **Generator**: EM and F1 of the labelled answer against the gold aliases (a question without
  a Generator label counts as 0). The heuristic builder labels the gold answer itself, so its
  EM and F1 are 1 by construction; the column is there for the searched datasets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from mmoa.agents.candidates import Candidate, merge_candidates
from mmoa.data.records import QARecord
from mmoa.data.sft_builder import (
    DocumentSearcher,
    SFTBuildConfig,
    build_sft_records,
    qr_target,
    retrieve_all,
)
from mmoa.data.support import GoldSupport
from mmoa.metrics import score_answer

__all__ = ["LabelQuality", "format_quality_table", "heuristic_quality", "label_quality"]


@dataclass
class LabelQuality:
    """One dataset's label quality (fractions in [0, 1]; ``None`` where nothing is known)."""

    method: str
    questions: int
    qr_support_recall: float | None = None
    selector_precision: float | None = None
    selector_recall: float | None = None
    mean_selected: float = 0.0
    answer_em: float = 0.0
    answer_f1: float = 0.0
    #: Per agent: which model wrote the winning response how often (searched datasets).
    wins: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def label_quality(
    method: str,
    records: Sequence[QARecord],
    candidates: Sequence[Sequence[Candidate]],
    selected: Sequence[Sequence[int]],
    answers: Sequence[str | None],
) -> LabelQuality:
    """Quality of one dataset's labels, given per question the K candidates that its QR label
    retrieves, the selected candidate indices and the answer label."""
    n = len(records)
    qr_recalls: list[float] = []
    label_hits = label_total = gold_hits = gold_total = 0
    em = f1 = 0.0
    for record, cands, ids, answer in zip(records, candidates, selected, answers, strict=True):
        support = GoldSupport.of(record)
        if support is not None:
            qr_recalls.append(support.recall(cands))
            labelled = [cands[i] for i in ids]
            label_total += len(labelled)
            label_hits += sum(support.matches(c) for c in labelled)
            gold_hits += len(support.covered(labelled))
            gold_total += len(support.keys)
        if answer is not None:
            scores = score_answer(answer, record.answers)
            em += scores.em
            f1 += scores.f1
    quality = LabelQuality(method=method, questions=n,
                           mean_selected=sum(len(s) for s in selected) / max(n, 1),
                           answer_em=em / max(n, 1), answer_f1=f1 / max(n, 1))
    if qr_recalls:
        quality.qr_support_recall = sum(qr_recalls) / len(qr_recalls)
    if gold_total:
        quality.selector_precision = label_hits / label_total if label_total else 0.0
        quality.selector_recall = gold_hits / gold_total
    return quality


def heuristic_quality(records: Sequence[QARecord], retriever: DocumentSearcher, k: int,
                      seed: int, rewrites: dict[str, list[str]] | None = None) -> LabelQuality:
    """The label quality of ``mmoa-cli data sft``'s heuristic data on the same questions.

    The Selector's precision / recall come from the heuristic builder's own report (one
    computation); QR recall re-retrieves its targets (one batched call)."""
    _, report = build_sft_records(records, retriever, SFTBuildConfig(k=k, seed=seed), rewrites)
    targets = [qr_target(r, rewrites or {})[0] for r in records]
    ranked = retrieve_all(retriever, [q for t in targets for q in t], k, 64)
    qr_recalls = []
    for record, target in zip(records, targets, strict=True):
        support = GoldSupport.of(record)
        if support is not None:
            qr_recalls.append(support.recall(merge_candidates([ranked[q] for q in target], k)))
    n = len(records)
    golds = [score_answer(r.answers[0], r.answers) for r in records]
    return LabelQuality(
        method="heuristic", questions=n,
        qr_support_recall=sum(qr_recalls) / len(qr_recalls) if qr_recalls else None,
        selector_precision=report.supporting_precision,
        selector_recall=report.supporting_recall, mean_selected=report.mean_positives,
        answer_em=sum(s.em for s in golds) / max(n, 1),
        answer_f1=sum(s.f1 for s in golds) / max(n, 1),
        note="QR targets: " + ", ".join(f"{s} {c}" for s, c in
                                        sorted(report.qr_target_sources.items()))
        + "; Generator labels are the gold answers",
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def format_quality_table(rows: Sequence[LabelQuality]) -> str:
    """A plain-text table, one line per dataset."""
    header = (f"{'labels':<12} {'questions':>9} {'QR gold R':>9} {'Sel P':>6} {'Sel R':>6} "
              f"{'#sel':>5} {'ans EM':>6} {'ans F1':>6}")
    lines = [header, "-" * len(header)]
    for q in rows:
        lines.append(f"{q.method:<12} {q.questions:>9} {_pct(q.qr_support_recall):>9} "
                     f"{_pct(q.selector_precision):>6} {_pct(q.selector_recall):>6} "
                     f"{q.mean_selected:>5.2f} {_pct(q.answer_em):>6} {_pct(q.answer_f1):>6}")
    return "\n".join(lines)
