"""Warm-start SFT data for the three agents, and the MAPPO prompt set.

For every training question the builder writes three Alpaca records, one per agent, with the
prompt definitions of :mod:`mmoa.agents.prompts` (the ones rollouts and evaluation use):

* **Query Rewriter** — target sub-questions from a Rewrite-Retrieve-Read rewrites file
  (``source`` / ``target`` with ``;``-separated queries), else the dataset's gold decomposition,
  else the question itself.
* **Selector** — the QR target sub-questions are retrieved from the live server and merged into
  K candidates exactly as the pipeline merges them; a candidate is labelled helpful when it
  contains an answer word after stop-word removal (question words for yes/no answers), the
  heuristic of the original system, or — as an option — when it is a gold supporting passage
  (by passage id, or by title for HotpotQA / 2Wiki, which name titles: :mod:`mmoa.data.support`).
  The candidates are shuffled so positives sit at random positions (MMOA-RAG's layout), or,
  with ``candidate_order="ranked"``, kept in the merged retrieval order the pipeline shows the
  Selector at rollout and evaluation time: shuffled labels teach a position-free choice but
  hide the rank, the strongest prior where the first candidate is usually gold.
* **Generator** — ``**gold answer**`` given the positive documents renumbered from 0, or the
  no-document prompt when there are none.

The word-overlap labels are noisy on purpose: they are what a real training set without passage
annotations gives, and they leave MAPPO room to improve on the warm start.
"""

from __future__ import annotations

import json
import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol, get_args

from mmoa.agents.candidates import Candidate, merge_candidates
from mmoa.agents.prompts import (
    MAX_SUBQUESTIONS,
    format_answer,
    format_selection,
    format_subquestions,
    generator_prompt,
    qr_prompt,
    selector_prompt,
)
from mmoa.data.records import QARecord
from mmoa.data.registry import register_datasets
from mmoa.data.support import GoldSupport
from mmoa.fileio import DataFormatError, atomic_path, atomic_write_jsonl, read_utf8_text

LabelSource = Literal["heuristic", "supporting"]
#: The order of the Selector's candidates in its SFT records (see the module docstring).
CandidateOrder = Literal["shuffled", "ranked"]
CANDIDATE_ORDERS: tuple[str, ...] = get_args(CandidateOrder)
#: MMOA-RAG's layout; ``ranked`` is the opt-in that matches the retriever's order at rollout time.
DEFAULT_CANDIDATE_ORDER: CandidateOrder = "shuffled"

#: Function words that say nothing about whether a document holds the answer.
_STOP_WORDS_TEXT = """
a an the and or but if then else of at by for with about against between into through during
before after above below to from up down in out on off over under again further once here there
when where why how all any both each few more most other some such no nor not only own same so
than too very can will just should now is are was were be been being have has had having do does
did doing i me my we our you your he him his she her it its they them their what which who whom
this that these those am as until while also
"""
STOP_WORDS = frozenset(_STOP_WORDS_TEXT.split())

_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")
ALPACA_COLUMNS = {"prompt": "instruction", "query": "input", "response": "output",
                  "system": "system"}


class DocumentSearcher(Protocol):
    def search_documents(self, queries: Sequence[str], k: int) -> list[list[dict[str, Any]]]: ...


def _words(text: str) -> list[str]:
    return _PUNCT.sub(" ", text.lower()).split()


def label_words(answers: Sequence[str], question: str) -> set[str]:
    """The words whose presence marks a document as helpful (the original heuristic)."""
    if answers and _PUNCT.sub("", answers[0].strip().lower()) in ("yes", "no"):
        source = [question]
    else:
        source = list(answers)
    return {w for text in source for w in _words(text) if len(w) > 1 and w not in STOP_WORDS}


def is_heuristic_positive(document: str, words: set[str]) -> bool:
    text = " ".join(_words(document))
    return any(w in text for w in words)


@dataclass
class SFTBuildConfig:
    dataset_dir: str = "data"
    name: str = "demo_sft"
    k: int = 10
    label_source: LabelSource = "heuristic"
    candidate_order: CandidateOrder = DEFAULT_CANDIDATE_ORDER
    seed: int = 42
    request_size: int = 64

    def __post_init__(self) -> None:
        if self.candidate_order not in CANDIDATE_ORDERS:
            raise ValueError(f"candidate_order must be one of {', '.join(CANDIDATE_ORDERS)}, "
                             f"got {self.candidate_order!r}")


@dataclass
class SFTBuildReport:
    """What the builder made, printed at the end and returned to callers and tests."""

    records: dict[str, int] = field(default_factory=dict)
    qr_target_sources: Counter[str] = field(default_factory=Counter)
    label_source: str = "heuristic"
    candidate_order: str = DEFAULT_CANDIDATE_ORDER
    empty_selection_rate: float = 0.0
    mean_positives: float = 0.0
    supporting_precision: float | None = None
    supporting_recall: float | None = None
    #: How gold passages were matched: records compared by ``id`` and by ``title``.
    supporting_matched_by: Counter[str] = field(default_factory=Counter)
    #: Records with gold passages, by how many of them are among the K candidates: ``all``,
    #: ``some`` or ``none`` (a gold paragraph the corpus lacks or the retriever missed; with
    #: ``supporting`` labels such a record's Selector target is empty and its Generator
    #: record has no document: still true training data, counted so a user sees how many).
    gold_in_candidates: Counter[str] = field(default_factory=Counter)
    output_file: str = ""

    def lines(self) -> list[str]:
        out = [f"SFT data -> {self.output_file}"]
        out.append("  records: " + ", ".join(f"{a} {n}" for a, n in self.records.items()))
        out.append("  QR targets from: " + ", ".join(
            f"{src} {n}" for src, n in sorted(self.qr_target_sources.items())))
        out.append(f"  Selector labels: {self.label_source}, candidates "
                   f"{self.candidate_order}; mean positives "
                   f"{self.mean_positives:.2f} of K; empty selections "
                   f"{100 * self.empty_selection_rate:.1f}%")
        if self.supporting_precision is not None:
            coverage = self.gold_in_candidates
            out.append(f"  gold passages among the K candidates: all {coverage['all']}, some "
                       f"{coverage['some']}, none {coverage['none']} of "
                       f"{sum(coverage.values())} records"
                       + (" (none: empty Selector target, Generator without documents)"
                          if self.label_source == "supporting" and coverage["none"] else ""))
            matched = ", ".join(f"{kind} {n}" for kind, n in sorted(
                self.supporting_matched_by.items()))
            out.append(f"  labels vs gold supporting passages: precision "
                       f"{100 * self.supporting_precision:.1f}%, recall "
                       f"{100 * (self.supporting_recall or 0):.1f}% (matched by {matched})")
        return out


def _question_key(question: str) -> str:
    return " ".join(question.split()).lower()


def load_rewrites(path: str | Path) -> dict[str, list[str]]:
    """Rewrite-Retrieve-Read rewrites: a JSON list (or JSON Lines) of ``{"source", "target"}``
    with ``;``-separated sub-queries in ``target``. Keyed by the whitespace-folded question."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: rewrites file not found")
    text = read_utf8_text(source)
    try:
        items = json.loads(text) if text.lstrip().startswith("[") else [
            json.loads(line) for line in text.splitlines() if line.strip()
        ]
    except json.JSONDecodeError as err:
        raise DataFormatError(f"{source}: invalid JSON ({err.msg}, line {err.lineno})") from err
    rewrites: dict[str, list[str]] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("source"), str) \
                or not isinstance(item.get("target"), str):
            raise DataFormatError(
                f"{source}: record {i}: expected {{\"source\": str, \"target\": str}} "
                f"(Rewrite-Retrieve-Read format), got {str(item)[:80]!r}"
            )
        queries = [q.strip() for q in item["target"].split(";") if q.strip()]
        if queries:
            rewrites[_question_key(item["source"])] = queries[:MAX_SUBQUESTIONS]
    return rewrites


def qr_target(record: QARecord, rewrites: dict[str, list[str]]) -> tuple[list[str], str]:
    """``(sub-questions, where they came from)``."""
    found = rewrites.get(_question_key(record.question))
    if found:
        return found, "rewrites"
    if record.decomposition:
        return list(record.decomposition[:MAX_SUBQUESTIONS]), "decomposition"
    return [record.question], "question"


def retrieve_all(
    searcher: DocumentSearcher, queries: list[str], k: int, request_size: int
) -> dict[str, list[dict[str, Any]]]:
    from tqdm.auto import tqdm

    unique = list(dict.fromkeys(queries))
    ranked: dict[str, list[dict[str, Any]]] = {}
    chunks = range(0, len(unique), request_size)
    for offset in tqdm(chunks, desc="retrieve", unit="request"):
        chunk = unique[offset: offset + request_size]
        ranked.update(zip(chunk, searcher.search_documents(chunk, k), strict=True))
    return ranked


def agent_records(
    question: str,
    subquestions: Sequence[str],
    candidates: Sequence[str],
    positive_ids: Sequence[int],
    answer: str | None,
) -> list[dict[str, str]]:
    """The Alpaca records of one question: QR, Selector, and (when ``answer`` is given) the
    Generator on the positive documents renumbered from 0. One construction for every builder
    (the heuristic one here, the TOA one in :mod:`mmoa.synthesis.builder`)."""
    out = [
        qr_prompt(question).alpaca(format_subquestions(subquestions)),
        selector_prompt(question, candidates).alpaca(format_selection(positive_ids)),
    ]
    if answer is not None:
        documents = [candidates[i] for i in positive_ids]
        out.append(generator_prompt(question, documents).alpaca(format_answer(answer)))
    return out


def build_sft_records(
    records: Sequence[QARecord],
    searcher: DocumentSearcher,
    config: SFTBuildConfig,
    rewrites: dict[str, list[str]] | None = None,
) -> tuple[list[dict[str, str]], SFTBuildReport]:
    """The Alpaca records of all three agents (QR, Selector, Generator per question).

    Gold supporting passages (the ``supporting`` labels and the report's precision / recall)
    are matched by passage id when a record has ids, else by title (:class:`GoldSupport`).
    """
    supports = [GoldSupport.of(r) for r in records]
    if config.label_source == "supporting":
        missing = [r.id for r, s in zip(records, supports, strict=True) if s is None]
        if missing:
            raise ValueError(
                f"label_source='supporting' needs gold supporting passages (supporting_ids, or "
                f"supporting_titles as HotpotQA and 2Wiki give) on every record; "
                f"{len(missing)} of {len(records)} have none (first: {missing[0]!r})"
            )
    rewrites = rewrites or {}
    rng = random.Random(config.seed)
    report = SFTBuildReport(label_source=config.label_source,
                            candidate_order=config.candidate_order)
    targets = []
    for record in records:
        subquestions, source = qr_target(record, rewrites)
        report.qr_target_sources[source] += 1
        targets.append(subquestions)
    ranked = retrieve_all(searcher, [s for t in targets for s in t], config.k,
                           config.request_size)

    out: list[dict[str, str]] = []
    counts = Counter()
    positives_total, empty = 0, 0
    label_hits = label_total = gold_hits = gold_total = 0
    for record, support, subquestions in zip(records, supports, targets, strict=True):
        candidates: list[Candidate] = merge_candidates([ranked[s] for s in subquestions], config.k)
        if config.candidate_order == "shuffled":
            rng.shuffle(candidates)
        texts = [c.text for c in candidates]
        if config.label_source == "supporting":
            positive = [support is not None and support.matches(c) for c in candidates]
        else:
            words = label_words(record.answers, record.question)
            positive = [is_heuristic_positive(t, words) for t in texts]
        positive_ids = [i for i, p in enumerate(positive) if p]
        positives_total += len(positive_ids)
        empty += not positive_ids
        if support is not None:
            labelled = [candidates[i] for i in positive_ids]
            label_total += len(labelled)
            label_hits += sum(support.matches(c) for c in labelled)
            gold_hits += len(support.covered(labelled))
            gold_total += len(support.keys)
            found = len(support.covered(candidates))
            report.gold_in_candidates[
                "none" if not found else "all" if found == len(support.keys) else "some"] += 1
            report.supporting_matched_by[support.by] += 1

        out.extend(agent_records(record.question, subquestions, texts, positive_ids,
                                 record.answers[0]))
        counts.update(("qr", "selector", "generator"))

    n = max(len(records), 1)
    report.records = dict(counts)
    report.empty_selection_rate = empty / n
    report.mean_positives = positives_total / n
    if gold_total:
        report.supporting_precision = label_hits / label_total if label_total else 0.0
        report.supporting_recall = gold_hits / gold_total
    return out, report


def write_sft_dataset(
    records: list[dict[str, str]], config: SFTBuildConfig, report: SFTBuildReport
) -> Path:
    """Writes ``<dataset_dir>/<name>.json`` and registers it; both writes are atomic."""
    path = Path(config.dataset_dir) / f"{config.name}.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(records, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    register_datasets(config.dataset_dir, {
        config.name: {"file_name": path.name, "formatting": "alpaca", "columns": ALPACA_COLUMNS},
    })
    report.output_file = str(path)
    return path


def write_mappo_dataset(records: Sequence[QARecord], dataset_dir: str | Path, name: str) -> Path:
    """The MAPPO prompt set: ``{"id", "question", "answers", ...}`` per line, every alias kept."""
    path = Path(dataset_dir) / f"{name}.jsonl"
    for record in records:
        if not record.answers:
            raise DataFormatError(f"record {record.id!r} has no gold answers; MAPPO needs them")
    atomic_write_jsonl(path, (r.to_dict() for r in records))
    register_datasets(dataset_dir, {
        name: {"file_name": path.name, "formatting": "alpaca", "columns": {"prompt": "question"},
               "mmoa_format": "demo"},
    })
    return path
