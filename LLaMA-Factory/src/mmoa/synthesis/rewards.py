"""Rewards that score the responses of the three agents during data synthesis.

A reward is any callable ``reward(tasks, responses) -> list[float]`` (:class:`Reward`): batched,
because the Selector's reward runs a Generator and the QR's reward calls the retriever, both of
which are cheap per batch and dear per item. Replace any of them (a reward model, an LLM judge)
by passing another callable in :class:`AgentRewards`. Rewards are raw numbers; the tree squashes
them with ``sigmoid(r / tau)`` (:func:`mmoa.synthesis.tree.squash`).

The defaults use what the world knows:

* **Generator**: token F1 of the parsed answer against the gold aliases (:mod:`mmoa.metrics`,
  the same function MAPPO is rewarded and evaluated with).
* **Selector**: the F1 that a frozen Generator (:class:`Answerer`) reaches from the selected
  documents, plus ``support_weight`` x the F1 of the selection against the gold supporting
  passages when the record names them (:class:`mmoa.data.support.GoldSupport`). F1, not
  recall: a recall bonus pays for selecting every candidate and never for leaving one out (a
  smoke run on SmolLM2 selected 9.5 of 10 candidates, precision 10.5 %).
* **Query Rewriter**: the recall of the gold supporting passages among the K candidates its
  sub-questions retrieve (merged as the pipeline merges them). A record without gold passages
  scores 1 when a gold answer appears in a candidate, else 0: the closest thing the record knows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from mmoa.agents.candidates import Candidate, merge_candidates
from mmoa.agents.parsers import parse_answer, parse_selection, parse_subquestions
from mmoa.agents.pipeline import DocumentRetriever
from mmoa.agents.prompts import AgentName, AgentPrompt
from mmoa.data.records import QARecord
from mmoa.data.support import GoldSupport
from mmoa.defaults import QR_MAX_SUBQUESTIONS, TOA_SELECTOR_SUPPORT_WEIGHT
from mmoa.metrics import DEFAULT_PROFILE, contains_answer_words, score_answer

__all__ = [
    "AgentRewards",
    "AgentTask",
    "Answerer",
    "GeneratorF1Reward",
    "QRRecallReward",
    "Reward",
    "SelectorReward",
]


@dataclass(frozen=True)
class AgentTask:
    """One agent call to synthesise responses for: the record, the agent's canonical prompt and,
    for the Selector, the candidates its prompt shows (in the prompt's order)."""

    agent: AgentName
    record: QARecord
    prompt: AgentPrompt
    candidates: tuple[Candidate, ...] = ()


class Reward(Protocol):
    def __call__(self, tasks: Sequence[AgentTask], responses: Sequence[str]) -> list[float]: ...


class Answerer(Protocol):
    """A frozen Generator: answers (parsed, not raw) for questions with their documents."""

    def answer(self, questions: Sequence[str], documents: Sequence[Sequence[str]]
               ) -> list[str]: ...


def _check(tasks: Sequence[AgentTask], responses: Sequence[str], agent: str) -> None:
    if len(tasks) != len(responses):
        raise ValueError(f"{len(tasks)} tasks but {len(responses)} responses")
    for task in tasks:
        if task.agent != agent:
            raise ValueError(f"the {agent} reward got a task of agent {task.agent!r}")
        if not task.record.answers and agent != "qr":
            raise ValueError(f"record {task.record.id!r} has no gold answer to score against")


@dataclass
class GeneratorF1Reward:
    """F1 of the Generator's parsed answer against the gold aliases."""

    profile: str = DEFAULT_PROFILE

    def __call__(self, tasks: Sequence[AgentTask], responses: Sequence[str]) -> list[float]:
        _check(tasks, responses, "generator")
        return [score_answer(parse_answer(r).answer, t.record.answers, profile=self.profile).f1
                for t, r in zip(tasks, responses, strict=True)]


@dataclass
class SelectorReward:
    """F1 of the frozen Generator's answer from the selected documents, plus ``support_weight``
    x the selection's F1 against the gold passages where the record knows them.

    Answers are cached per (record, selection): the answerer is greedy, so the same selection
    always gets the same answer, and a search proposes the same selection many times.
    """

    answerer: Answerer
    support_weight: float = TOA_SELECTOR_SUPPORT_WEIGHT
    profile: str = DEFAULT_PROFILE
    _cache: dict[tuple[str, str, tuple[int, ...]], str] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.support_weight < 0:
            raise ValueError(f"support_weight must be >= 0, got {self.support_weight}")

    def __call__(self, tasks: Sequence[AgentTask], responses: Sequence[str]) -> list[float]:
        _check(tasks, responses, "selector")
        selections = [tuple(parse_selection(r, len(t.candidates)).ids)
                      for t, r in zip(tasks, responses, strict=True)]
        keys = [(t.record.id, t.record.question, ids) for t, ids in zip(tasks, selections,
                                                                          strict=True)]
        missing = list(dict.fromkeys(k for k in keys if k not in self._cache))
        if missing:
            by_key = {k: t for k, t in zip(keys, tasks, strict=True)}
            answers = self.answerer.answer(
                [by_key[k].record.question for k in missing],
                [[by_key[k].candidates[i].text for i in k[2]] for k in missing])
            self._cache.update(zip(missing, answers, strict=True))
        out = []
        for task, key in zip(tasks, keys, strict=True):
            value = score_answer(self._cache[key], task.record.answers, profile=self.profile).f1
            support = GoldSupport.of(task.record)
            if support is not None and self.support_weight:
                value += self.support_weight * support.f1([task.candidates[i] for i in key[2]])
            out.append(value)
        return out


def answer_in_candidates(answers: Sequence[str], candidates: Sequence[Candidate],
                         profile: str = DEFAULT_PROFILE) -> float:
    """1.0 when a normalised gold alias occurs in a normalised candidate text, else 0.0."""
    return float(any(contains_answer_words(c.text, list(answers), profile)
                     for c in candidates))


@dataclass
class QRRecallReward:
    """Recall of the gold passages among the K candidates the sub-questions retrieve."""

    retriever: DocumentRetriever
    k: int = 10
    max_subquestions: int = QR_MAX_SUBQUESTIONS
    profile: str = DEFAULT_PROFILE

    def candidates(self, tasks: Sequence[AgentTask], responses: Sequence[str]
                   ) -> list[list[Candidate]]:
        """The merged candidates of each response, with ONE retrieval call for the batch."""
        subquestions = [parse_subquestions(r, t.record.question,
                                           max_subquestions=self.max_subquestions).subquestions
                        for t, r in zip(tasks, responses, strict=True)]
        unique = list(dict.fromkeys(q for qs in subquestions for q in qs))
        ranked: dict[str, Any] = dict(zip(unique, self.retriever.search_documents(unique, self.k),
                                          strict=True)) if unique else {}
        return [merge_candidates([ranked[q] for q in qs], self.k) for qs in subquestions]

    def __call__(self, tasks: Sequence[AgentTask], responses: Sequence[str]) -> list[float]:
        _check(tasks, responses, "qr")
        out = []
        for task, cands in zip(tasks, self.candidates(tasks, responses), strict=True):
            support = GoldSupport.of(task.record)
            if support is not None:
                out.append(support.recall(cands))
            else:
                out.append(answer_in_candidates(task.record.answers, cands, self.profile))
        return out


@dataclass
class AgentRewards:
    """The reward of each agent; any of them may be replaced by another :class:`Reward`."""

    qr: Reward
    selector: Reward
    generator: Reward

    def of(self, agent: AgentName) -> Reward:
        return {"qr": self.qr, "selector": self.selector, "generator": self.generator}[agent]
