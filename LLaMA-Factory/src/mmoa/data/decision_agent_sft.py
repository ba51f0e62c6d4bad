"""Warm-start SFT data of the decision agent: answer directly where the model already knows.

SmartRAG warm-starts its policy on decisions before RL. Our labels come from measured
correctness, not from a teacher: every record carries a ``group``, set by the known-questions
builder (``data_builders/decision_known_split.py``) from the zero-shot model's closed-book
answers on dev:

* ``known`` (the model answered it correctly without documents): ``[Answer] gold``, one turn;
* ``world`` or no group (only retrieval answers it): ``[Search] query``, the ``[Documents]``
  observation the live server returns, then ``[Answer] gold``. The queries are the record's
  hops, one per search (its ``decomposition``, bridge entities named where the record
  resolves them, else its ``supporting_titles``: the search agent's single-query plan),
  else the question itself; a record needing more than
  ``max_searches`` searches is left out, and so is one whose documents miss a gold supporting
  passage (``require_support``, as the search agent's builder does).

The format is LLaMA-Factory ShareGPT with each document block as an ``observation`` message
(never trained on), segmented per model turn like the search agent's data (train with
``mask_history: true``); sample kinds: ``answer_direct``, ``search_first``, ``search_again``,
``answer_after_search``. Prompt, tags and observation text come from
:mod:`mmoa.agents.decision_tags`, the definitions the rollouts and the evaluation use.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mmoa.agents.decision_tags import (
    SEARCH_TAG,
    decision_prompt,
    format_decision,
    format_documents,
)
from mmoa.config_values import check_at_least
from mmoa.data.records import QARecord
from mmoa.data.search_agent_sft import (
    TrajectorySFTReport,
    _Passage,
    count_line,
    plan_searches,
    retrieve_plans,
    segment_conversations,
)
from mmoa.data.sft_builder import DocumentSearcher
from mmoa.data.support import GoldSupport
from mmoa.defaults import DECISION_MAX_SEARCHES, DECISION_TOP_K

#: The group whose questions the model answers without retrieval; every other one searches.
KNOWN_GROUP = "known"
WORLD_GROUP = "world"


@dataclass
class DecisionSFTConfig:
    dataset_dir: str = "data"
    name: str = "demo_decision_sft"
    top_k: int = DECISION_TOP_K
    max_searches: int = DECISION_MAX_SEARCHES
    segment: bool = True
    require_support: bool = True

    def validate(self) -> None:
        for key in ("top_k", "max_searches"):
            check_at_least(key, getattr(self, key))


@dataclass
class DecisionSFTReport(TrajectorySFTReport):
    groups: Counter[str] = field(default_factory=Counter)
    title: ClassVar[str] = "decision-agent"

    def detail_lines(self) -> list[str]:
        return [count_line("questions by group", self.groups), *super().detail_lines()]


def decision_queries(record: QARecord) -> list[str]:
    """The queries of a world question's searches, one per search: its hops, else the
    question."""
    plan = plan_searches(record, max_queries=1, query_mode="single")
    return [turn[0] for turn in plan] if plan else [record.question.strip()]


def build_decision_trajectories(records: Sequence[QARecord], retriever: DocumentSearcher,
                                config: DecisionSFTConfig
                                ) -> tuple[list[list[dict[str, str]]], DecisionSFTReport]:
    """Every usable record's conversation (ShareGPT messages, ``human`` first)."""
    config.validate()
    report = DecisionSFTReport(questions=len(records))
    plans: list[tuple[QARecord, list[str]]] = []
    for record in records:
        group = record.group or WORLD_GROUP
        report.groups[group] += 1
        if not record.answers:
            report.skipped["no gold answer"] += 1
            continue
        queries = [] if group == KNOWN_GROUP else decision_queries(record)
        if len(queries) > config.max_searches:
            report.skipped[f"more than {config.max_searches} searches"] += 1
            continue
        plans.append((record, queries))
    # a decision search has one query: a plan of one-query turns
    docs = retrieve_plans([[[q] for q in queries] for _, queries in plans], retriever,
                          config.top_k)
    conversations = []
    for record, queries in plans:
        support = GoldSupport.of(record)
        retrieved = [_Passage(d) for q in queries for d in docs[q]]
        if queries and config.require_support and support is not None \
                and support.recall(retrieved) < 1:
            report.skipped["a supporting passage was not retrieved"] += 1
            continue
        messages = [{"from": "human", "value": decision_prompt(record.question).user}]
        for index, query in enumerate(queries):
            # the last allowed search's documents end with the quota note, as in the rollouts
            messages.append({"from": "gpt", "value": format_decision(query=query)})
            messages.append({"from": "observation", "value": format_documents(
                [query], [[str(d.get("contents", "")) for d in docs[query]]],
                force_answer=index == config.max_searches - 1)})
        messages.append({"from": "gpt", "value": format_decision(answer=record.answers[0])})
        conversations.append(messages)
        report.trajectories += 1
    return conversations, report


def build_decision_sft_records(records: Sequence[QARecord], retriever: DocumentSearcher,
                               config: DecisionSFTConfig
                               ) -> tuple[list[dict[str, Any]], DecisionSFTReport]:
    """ShareGPT SFT samples (segmented unless ``config.segment`` is off) and the report."""
    conversations, report = build_decision_trajectories(records, retriever, config)
    samples = segment_conversations(conversations, decision_prompt("").system, config.segment,
                                    report.kinds, search_tag=SEARCH_TAG)
    report.samples = len(samples)
    return samples, report
