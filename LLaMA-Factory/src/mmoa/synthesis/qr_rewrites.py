"""Query Rewriter labels that are not the question: sampled rewrites scored by the live retriever.

A real training set rarely ships sub-questions, so the heuristic SFT data teach the Query
Rewriter to copy the question (``QR targets from: question``), and a copied question makes
every downstream row retrieve the same candidates. This module synthesises the labels instead:

1. the question alone is retrieved and merged into K candidates as the pipeline does, and its
   **question recall** (the share of the record's gold supporting passages among them) is the
   bar to beat;
2. a search (TOA's tree or best-of-N at the same budget, :mod:`mmoa.synthesis.search`) samples
   ``budget`` rewrites (sub-question sets) per question from local models and scores each with
   :class:`~mmoa.synthesis.rewards.QRRecallReward`, the same recall over the K candidates its
   sub-questions retrieve;
3. the label is the best rewrite **where it beats the question alone**, else the question: a
   rewrite that only ties teaches the model nothing the copy would not, and one that loses
   would teach it to retrieve worse.

The labels are written as a Rewrite-Retrieve-Read rewrites file (``source`` / ``target``, the
sub-questions joined by ``;``), the format ``mmoa-cli data sft --rewrites_file`` already reads,
holding only the questions that got a better rewrite (the SFT builder falls back to the question
for the others). The report measures both search methods at equal budget: the mean recall of
the labels after each model call (``recall_by_calls``: the best of the first n rewrites or the
question, for n = 1..budget), so "TOA beats best-of-N at equal budget" is a measured claim.

The search runs in resumable chunks (one JSON per finished chunk of questions in a cache
folder, keyed by the settings and the chunk's questions): on a CPU a full training split takes
tens of minutes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmoa.agents.parsers import parse_subquestions
from mmoa.agents.prompts import qr_prompt
from mmoa.data.records import QARecord
from mmoa.fileio import atomic_write_json
from mmoa.synthesis.rewards import AgentTask, QRRecallReward, Reward
from mmoa.synthesis.search import METHODS, Method, Play, SearchConfig, SearchResult, run_search

if TYPE_CHECKING:
    from mmoa.synthesis.policies import SeedablePolicy

__all__ = [
    "QuestionRewrite",
    "RewriteRun",
    "label_of",
    "question_recalls",
    "recall_by_calls",
    "rewrite_rows",
    "search_rewrites",
    "summarise",
]


@dataclass(frozen=True)
class QuestionRewrite:
    """One question's label: the sub-questions kept, where they came from, and the recalls."""

    id: str
    question: str
    subquestions: list[str]
    #: ``rewrite`` (a sampled rewrite beat the question) or ``question`` (none did).
    source: str
    label_recall: float
    question_recall: float
    #: The rewards of every play, in order (for the per-call curve and the report).
    play_rewards: list[float] = field(default_factory=list)
    #: The model that wrote the kept rewrite, and the 0-based play at which it was written.
    model: str | None = None
    play: int | None = None


@dataclass
class RewriteRun:
    """The labels of one search method over every question."""

    method: str
    budget: int
    labels: list[QuestionRewrite]

    @property
    def improved(self) -> int:
        return sum(label.source == "rewrite" for label in self.labels)


def question_recalls(records: Sequence[QARecord], reward: Reward) -> list[float]:
    """Each question's own recall: the question as its only sub-question (one batched call)."""
    tasks = [AgentTask("qr", r, qr_prompt(r.question)) for r in records]
    return reward(tasks, [r.question for r in records])


def label_of(record: QARecord, result: SearchResult, question_recall: float) -> QuestionRewrite:
    """The best play where its recall is strictly above the question's, else the question."""
    rewards = [play.reward for play in result.plays]
    if result.plays and result.best.reward > question_recall:
        best: Play = result.best
        subquestions = parse_subquestions(best.text, record.question).subquestions
        return QuestionRewrite(record.id, record.question, subquestions, "rewrite", best.reward,
                               question_recall, rewards, best.model,
                               result.plays.index(best))
    return QuestionRewrite(record.id, record.question, [record.question], "question",
                           question_recall, question_recall, rewards)


def recall_by_calls(labels: Sequence[QuestionRewrite], budget: int) -> list[float]:
    """Mean label recall over the questions if the search had stopped after n model calls,
    for n = 1..budget: per question, the best of its first n rewrites or the question."""
    if not labels:
        return [0.0] * budget
    out = []
    for n in range(1, budget + 1):
        total = sum(max([label.question_recall, *label.play_rewards[:n]]) for label in labels)
        out.append(total / len(labels))
    return out


def _chunk_key(settings: dict[str, Any], records: Sequence[QARecord]) -> str:
    text = json.dumps({"settings": settings,
                       "questions": [[r.id, r.question] for r in records]},
                      sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _load_chunk(path: Path, key: str) -> list[QuestionRewrite] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("key") != key:
            return None
        return [QuestionRewrite(**row) for row in data["labels"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None  # a damaged chunk is searched again


def search_rewrites(
    records: Sequence[QARecord],
    policy: SeedablePolicy,
    reward: QRRecallReward,
    method: Method,
    search: SearchConfig,
    *,
    chunk_size: int = 64,
    cache_dir: str | Path | None = None,
    settings: dict[str, Any] | None = None,
    on_chunk: Callable[[int, int], None] | None = None,
) -> RewriteRun:
    """Search every question's rewrites with ``method`` and label it (see the module docstring).

    Questions go in chunks of ``chunk_size`` (batched within a chunk); with ``cache_dir`` each
    finished chunk is kept as JSON and a rerun with the same ``settings`` reuses it. The policy
    is reseeded per chunk (``seed + chunk index``), so a resumed run samples what an
    uninterrupted one samples."""
    if method not in METHODS:
        raise ValueError(f"unknown search method {method!r}; expected one of {METHODS}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    budget = search.budget(len(policy.models))
    folder = Path(cache_dir) / method if cache_dir is not None else None
    labels: list[QuestionRewrite] = []
    chunks = range(0, len(records), chunk_size)
    for index, start in enumerate(chunks):
        part = records[start:start + chunk_size]
        key = _chunk_key({**(settings or {}), "method": method, "chunk": index}, part)
        path = folder / f"chunk-{index:04d}.json" if folder is not None else None
        cached = _load_chunk(path, key) if path is not None else None
        if cached is None:
            policy.reseed(search.seed + index)
            chunk_search = SearchConfig(**{**asdict(search), "seed": search.seed + start})
            recalls = question_recalls(part, reward)
            tasks = [AgentTask("qr", r, qr_prompt(r.question)) for r in part]
            results = run_search(method, tasks, policy, reward, chunk_search,
                                 f"{method} qr {index + 1}/{len(chunks)}")
            cached = [label_of(r, res, q) for r, res, q in zip(part, results, recalls,
                                                                  strict=True)]
            if path is not None:
                atomic_write_json(path, {"key": key, "labels": [asdict(x) for x in cached]})
        labels.extend(cached)
        if on_chunk is not None:
            on_chunk(index + 1, len(chunks))
    return RewriteRun(method, budget, labels)


def rewrite_rows(run: RewriteRun) -> list[dict[str, Any]]:
    """The Rewrite-Retrieve-Read rows of the improved questions (``source`` / ``target``), with
    the recalls and the writer kept beside them for inspection."""
    return [{"source": label.question, "target": "; ".join(label.subquestions),
             "id": label.id, "label_recall": label.label_recall,
             "question_recall": label.question_recall, "model": label.model,
             "method": run.method}
            for label in run.labels if label.source == "rewrite"]


def summarise(run: RewriteRun) -> dict[str, Any]:
    """What a user needs to judge the labels: how many questions got a better rewrite, the
    recall of the labels against the question's, and the recall per model call."""
    n = len(run.labels)

    def mean(values: list[float]) -> float:
        return sum(values) / n if n else 0.0

    subq = [len(x.subquestions) for x in run.labels if x.source == "rewrite"]
    return {
        "method": run.method, "questions": n, "budget_per_question": run.budget,
        "model_calls": run.budget * n,
        "improved": run.improved, "improved_share": run.improved / n if n else 0.0,
        "question_recall": mean([x.question_recall for x in run.labels]),
        "label_recall": mean([x.label_recall for x in run.labels]),
        "recall_by_calls": recall_by_calls(run.labels, run.budget),
        "improved_subquestions_mean": sum(subq) / len(subq) if subq else 0.0,
        "ties_with_question": sum(x.source == "question" and x.play_rewards
                                  and max(x.play_rewards) == x.question_recall
                                  for x in run.labels),
        "wins_by_model": {m: sum(x.model == m for x in run.labels)
                          for m in sorted({x.model for x in run.labels if x.model})},
    }
