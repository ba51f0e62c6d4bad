"""Format-learning SFT data of the search agent, from known hops and real retrieved documents.

RAG-R1 teaches the format with SFT before RL, on trajectories a large teacher model wrote. We
have no teacher; we have the hops. A demo-world question records its ``decomposition`` (one
sub-question per hop) and a HotpotQA-style record its supporting facts' titles, so a correct
trajectory can be written down:

* **hops -> search turns.** Independent hops (``comparison`` and ``yes_no`` questions: each hop
  asks about one of two entities) go into ONE ``<search>`` with several queries (RAG-R1's
  parallel multi-query search, up to ``max_queries``); dependent hops (``bridge``: the second
  asks about what the first finds) get one turn each, as do ``one_hop`` questions. A dependent
  hop is asked as an agent that has read the earlier information would ask it: the record's
  ``resolved_decomposition`` names the bridge entity ("Where was Ada Brel born?", not "Where
  was the director of Nox born?"). The reference wording finds the second passage for only a
  quarter of the demo world's bridge questions (153 of 600 train questions in the top 5), so
  without it most bridge trajectories fail ``require_support`` and the model learns to search
  once.
  ``query_mode="single"`` gives every hop its own turn (the single-query baseline). A record
  without a decomposition but with ``supporting_titles`` searches its titles in one turn.
* **information from the live server.** Every query is sent to the retrieval server (one batched
  request per turn position over all records) and its top-k documents fill the
  ``<information>`` block exactly as the RL pipeline formats it
  (:func:`mmoa.agents.search_tags.format_information`). A trajectory whose information misses a
  gold supporting passage is left out (``require_support``): it would teach the model to answer
  from documents that do not hold the answer.
* **then the answer**: ``<think>..</think><answer> gold </answer>``.

Format: LLaMA-Factory ShareGPT with the ``observation`` role for each ``<information>`` block.
LLaMA-Factory never trains on a non-assistant message, so the retrieved text is masked out of
the SFT loss, and the chat template renders the observation exactly as the RL pipeline appends
it (:meth:`mmoa.agents.render.PromptRenderer.observation_ids`), so the model is trained on the
ids it will see.

Segmentation, as RAG-R1 does: a trajectory of ``n`` model turns becomes ``n`` samples, the
``k``-th holding the conversation up to and including model turn ``k`` and trained on that turn
only (the SFT config sets ``mask_history: true``, LLaMA-Factory's "train on the last turn"), so
every segment is learned once with its full context. Each sample records its ``kind``:
``search_first`` (a search from the question alone), ``search_again`` (a search after
information), ``answer_after_search`` and ``answer_direct`` (no search needed). With
``segment=False`` a trajectory is one sample whose every model turn is trained (use
``mask_history: false`` then).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mmoa.agents.search_tags import format_information, format_turn, search_prompt
from mmoa.config_values import check_at_least
from mmoa.data.records import QARecord
from mmoa.data.registry import register_datasets
from mmoa.data.sft_builder import DocumentSearcher
from mmoa.data.support import GoldSupport
from mmoa.defaults import SEARCH_MAX_QUERIES, SEARCH_MAX_TURNS, SEARCH_TOP_K
from mmoa.fileio import atomic_path

#: Question types whose hops do not depend on each other (searched in parallel).
PARALLEL_TYPES = frozenset({"comparison", "yes_no"})
QUERY_MODES = ("multi", "single")
SHAREGPT_COLUMNS = {"messages": "conversations", "system": "system"}
SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human",
                 "assistant_tag": "gpt", "observation_tag": "observation"}


@dataclass
class SearchSFTConfig:
    dataset_dir: str = "data"
    name: str = "demo_search_sft"
    top_k: int = SEARCH_TOP_K
    max_queries: int = SEARCH_MAX_QUERIES
    max_turns: int = SEARCH_MAX_TURNS
    query_mode: str = "multi"
    segment: bool = True
    require_support: bool = True

    def validate(self) -> None:
        for key in ("top_k", "max_queries", "max_turns"):
            check_at_least(key, getattr(self, key))
        if self.query_mode not in QUERY_MODES:
            raise ValueError(f"query_mode must be one of {', '.join(QUERY_MODES)}, got "
                             f"{self.query_mode!r}")


def count_line(label: str, counts: Counter[Any], sep: str = " ") -> str:
    """``"  label: k1 n1, k2 n2"``: a report line of counts, sorted by key."""
    return f"  {label}: " + ", ".join(f"{k}{sep}{n}" for k, n in sorted(counts.items()))


@dataclass
class TrajectorySFTReport:
    """The funnel a multi-turn agent's SFT builder reports (questions -> trajectories ->
    samples, what was skipped, where it was written): one definition for the search agent's
    and the decision agent's reports, which add their own counts in :meth:`detail_lines`."""

    questions: int = 0
    trajectories: int = 0
    samples: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    output_file: str = ""
    #: the report's first word (``"search-agent"``)
    title: ClassVar[str] = ""

    def detail_lines(self) -> list[str]:
        """The lines between the funnel and the skipped records."""
        return [count_line("samples by kind", self.kinds)]

    def lines(self) -> list[str]:
        out = [f"{self.title} SFT data: {self.questions} questions -> {self.trajectories} "
               f"trajectories -> {self.samples} samples", *self.detail_lines()]
        if self.skipped:
            out.append(count_line("skipped", self.skipped))
        if self.output_file:
            out.append(f"  written to {self.output_file}")
        return out


@dataclass
class SearchSFTReport(TrajectorySFTReport):
    searches_per_trajectory: Counter[int] = field(default_factory=Counter)
    title: ClassVar[str] = "search-agent"

    def detail_lines(self) -> list[str]:
        return [count_line("samples by kind", self.kinds),
                count_line("search turns per trajectory", self.searches_per_trajectory, ": ")]


def plan_searches(record: QARecord, max_queries: int = SEARCH_MAX_QUERIES,
                  query_mode: str = "multi") -> list[list[str]] | None:
    """The queries of each search turn of a correct trajectory, or ``None`` when the record
    says nothing about its hops."""
    if record.decomposition:
        asked = record.resolved_decomposition or record.decomposition
        hops = list(dict.fromkeys(h.strip() for h in asked if h.strip()))
    elif record.supporting_titles:
        hops = list(dict.fromkeys(t.strip() for t in record.supporting_titles if t.strip()))
    else:
        return None
    if not hops:
        return None
    parallel = record.type in PARALLEL_TYPES or not record.decomposition
    if query_mode == "single" or not parallel:
        return [[hop] for hop in hops]
    return [hops[i: i + max_queries] for i in range(0, len(hops), max_queries)]


class _Passage:
    """A retrieved document as :class:`mmoa.data.support.PassageLike`."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.id = None if doc.get("id") is None else str(doc["id"])
        self.text = str(doc.get("contents", ""))


def _search_think(queries: Sequence[str], after_information: bool) -> str:
    lead = "The information is not enough yet. I need to find" if after_information \
        else "To answer, I need to find"
    return f"{lead}: {'; '.join(queries)}."


def build_trajectories(records: Sequence[QARecord], retriever: DocumentSearcher,
                       config: SearchSFTConfig
                       ) -> tuple[list[list[dict[str, str]]], SearchSFTReport]:
    """Every usable record's conversation (ShareGPT messages, ``human`` first)."""
    config.validate()
    report = SearchSFTReport(questions=len(records))
    plans: list[tuple[QARecord, list[list[str]]]] = []
    for record in records:
        plan = plan_searches(record, config.max_queries, config.query_mode)
        if plan is None:
            report.skipped["no hops or supporting facts"] += 1
        elif len(plan) > config.max_turns:
            report.skipped[f"more than {config.max_turns} search turns"] += 1
        elif not record.answers:
            report.skipped["no gold answer"] += 1
        else:
            plans.append((record, plan))
    docs = retrieve_plans([plan for _, plan in plans], retriever, config.top_k)
    conversations = []
    for record, plan in plans:
        support = GoldSupport.of(record)
        retrieved = [_Passage(d) for turn in plan for q in turn for d in docs[q]]
        if config.require_support and support is not None and support.recall(retrieved) < 1:
            report.skipped["a supporting passage was not retrieved"] += 1
            continue
        messages = [{"from": "human",
                     "value": search_prompt(record.question, config.max_queries).user}]
        for index, queries in enumerate(plan):
            messages.append({"from": "gpt", "value": format_turn(
                _search_think(queries, index > 0), queries=queries)})
            messages.append({"from": "observation", "value": format_information(
                queries, [[str(d.get("contents", "")) for d in docs[q]] for q in queries])})
        think = "The information answers the question." if plan \
            else "I know the answer without searching."
        messages.append({"from": "gpt", "value": format_turn(think, answer=record.answers[0])})
        conversations.append(messages)
        report.trajectories += 1
        report.searches_per_trajectory[len(plan)] += 1
    return conversations, report


def retrieve_plans(plans: Sequence[Sequence[Sequence[str]]], retriever: DocumentSearcher,
                   top_k: int) -> dict[str, list[dict[str, Any]]]:
    """The documents of every query of ``plans`` (a plan: its turns, a turn: its queries): one
    batched request per turn position, over every plan that searches in it, each distinct
    query once. Shared by the search agent's and the decision agent's builders."""
    docs: dict[str, list[dict[str, Any]]] = {}
    for position in range(max((len(plan) for plan in plans), default=0)):
        queries = list(dict.fromkeys(q for plan in plans if position < len(plan)
                                     for q in plan[position] if q not in docs))
        if queries:
            docs.update(zip(queries, retriever.search_documents(queries, top_k), strict=True))
    return docs


def segment_kind(messages: Sequence[dict[str, str]], search_tag: str = "<search>") -> str:
    """The RAG-R1 sample kind of a conversation that ends with a model turn (``search_tag``
    marks a search turn: the decision agent's is ``[Search]``)."""
    searched_before = any(m["from"] == "observation" for m in messages[:-1])
    searching = search_tag in messages[-1]["value"]
    if searching:
        return "search_again" if searched_before else "search_first"
    return "answer_after_search" if searched_before else "answer_direct"


def build_search_sft_records(records: Sequence[QARecord], retriever: DocumentSearcher,
                             config: SearchSFTConfig
                             ) -> tuple[list[dict[str, Any]], SearchSFTReport]:
    """ShareGPT SFT samples (segmented unless ``config.segment`` is off) and the report."""
    conversations, report = build_trajectories(records, retriever, config)
    samples = segment_conversations(conversations, search_prompt("").system, config.segment,
                                    report.kinds)
    report.samples = len(samples)
    return samples, report


def segment_conversations(conversations: Sequence[list[dict[str, str]]], system: str,
                          segment: bool, kinds: Counter[str], search_tag: str = "<search>"
                          ) -> list[dict[str, Any]]:
    """ShareGPT samples of the conversations: with ``segment`` one per model turn (the
    conversation up to it, trained on it only), else one per conversation; ``kinds`` counts
    the samples' kinds. Shared by the search agent's and the decision agent's builders."""
    samples: list[dict[str, Any]] = []
    for messages in conversations:
        ends = [i + 1 for i, m in enumerate(messages) if m["from"] == "gpt"] \
            if segment else [len(messages)]
        for end in ends:
            part = messages[:end]
            kind = segment_kind(part, search_tag) if segment else "trajectory"
            samples.append({"conversations": part, "system": system, "kind": kind})
            kinds[kind] += 1
    return samples


def write_search_sft_dataset(samples: list[dict[str, Any]], config: Any, report: Any) -> Path:
    """Writes ``<dataset_dir>/<name>.json`` and registers it as ShareGPT; both atomic.
    ``config`` has ``dataset_dir`` and ``name`` and ``report`` an ``output_file`` (the search
    agent's or the decision agent's)."""
    path = Path(config.dataset_dir) / f"{config.name}.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(samples, ensure_ascii=False, indent=1) + "\n",
                       encoding="utf-8")
    register_datasets(config.dataset_dir, {config.name: {
        "file_name": path.name, "formatting": "sharegpt", "columns": SHAREGPT_COLUMNS,
        "tags": SHAREGPT_TAGS}})
    report.output_file = str(path)
    return path
