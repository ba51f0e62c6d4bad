"""The three agents' synthesis rewards on hand-computed values; the QR reward through the real
retrieval server on loopback."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from mmoa.agents.candidates import Candidate
from mmoa.agents.prompts import generator_prompt, qr_prompt, selector_prompt
from mmoa.data.loaders import load_qa
from mmoa.data.records import QARecord
from mmoa.fileio import read_jsonl
from mmoa.metrics import normalize_answer
from mmoa.retrieval.client import RetrievalClient
from mmoa.synthesis.rewards import (
    AgentTask,
    GeneratorF1Reward,
    QRRecallReward,
    SelectorReward,
    answer_in_candidates,
)


class LastWordAnswerer:
    """A frozen Generator that answers with the last word of its first document ("" without
    documents); it counts how many answers it was asked for."""

    def __init__(self) -> None:
        self.asked = 0

    def answer(self, questions: Sequence[str], documents: Sequence[Sequence[str]]) -> list[str]:
        self.asked += len(questions)
        return [docs[0].split()[-1] if docs else "" for docs in documents]


RECORD = QARecord("q1", "Where was Ada Brel born?", ["Tronford"], supporting_ids=["p1", "p3"])
CANDIDATES = (
    Candidate({"id": "p1", "contents": "Ada Brel\nAda Brel was born in Tronford."}, 0, 0),
    Candidate({"id": "p3", "contents": "Bo Crane\nBo Crane lives in Orvale."}, 0, 1),
    Candidate({"id": "p2", "contents": "Cy Dunn\nCy Dunn moved to Tronford."}, 0, 2),
)


def _generator_task(record: QARecord = RECORD) -> AgentTask:
    return AgentTask("generator", record, generator_prompt(record.question, []))


def test_generator_reward_is_the_f1_of_the_parsed_answer() -> None:
    reward = GeneratorF1Reward()
    task = _generator_task()
    values = reward([task] * 4, ["**Tronford**", "**Tronford city**", "**Orvale**",
                                 "I think the answer is **the Tronford** here"])
    # F1 of "tronford city" vs "tronford": P 1/2, R 1 -> 2/3
    assert values == pytest.approx([1.0, 2 / 3, 0.0, 1.0], abs=1e-12)
    with pytest.raises(ValueError, match="agent 'qr'"):
        reward([AgentTask("qr", RECORD, qr_prompt(RECORD.question))], ["x"])


def test_selector_reward_is_frozen_generator_f1_plus_weighted_gold_selection_f1() -> None:
    answerer = LastWordAnswerer()
    reward = SelectorReward(answerer, support_weight=0.5)
    task = AgentTask("selector", RECORD,
                     selector_prompt(RECORD.question, [c.text for c in CANDIDATES]), CANDIDATES)
    values = reward([task] * 6, ["Document0,Document2", "Document1", "", "Document2",
                                 "Document0,Document2", "Document0,Document1,Document2"])
    # gold {p1, p3}; selection F1 = 2PR / (P + R)
    # [0, 2]:    "Tronford." (F1 1) + 0.5 x F1(P 1/2, R 1/2) = 1 + 0.25   = 1.25
    # [1]:       "Orvale."   (F1 0) + 0.5 x F1(P 1, R 1/2)   = 0.5 x 2/3  = 1/3
    # []:        no document, answer ""                                   = 0
    # [2]:       "Tronford." (F1 1) + 0.5 x 0 (p2 is not gold)            = 1.0
    # [0, 1, 2]: "Tronford." (F1 1) + 0.5 x F1(P 2/3, R 1) = 1 + 0.5 x 0.8 = 1.4
    assert values == pytest.approx([1.25, 1 / 3, 0.0, 1.0, 1.25, 1.4], abs=1e-12)
    assert answerer.asked == 5, "a repeated selection is answered once"
    no_gold = QARecord("q2", RECORD.question, ["Tronford"])
    plain = AgentTask("selector", no_gold, task.prompt, CANDIDATES)
    assert SelectorReward(LastWordAnswerer())([plain], ["Document0,Document1"]) == [1.0]
    assert SelectorReward(LastWordAnswerer(), support_weight=0.0)([task], ["Document1"]) == [0.0]
    with pytest.raises(ValueError, match="support_weight"):
        SelectorReward(answerer, support_weight=-1.0)


def test_answer_in_candidates_is_word_bounded() -> None:
    assert answer_in_candidates(["Tronford"], CANDIDATES[:1]) == 1.0
    assert answer_in_candidates(["Orvale"], CANDIDATES[:1]) == 0.0
    assert answer_in_candidates(["Tron"], CANDIDATES) == 0.0


def test_qr_reward_is_gold_passage_recall_through_the_server(tiny_world_dir: Path,
                                                            tiny_server_url: str) -> None:
    """A sub-question that IS a gold passage's text retrieves that passage first."""
    corpus = {p["id"]: p for p in read_jsonl(tiny_world_dir / "corpus.jsonl")}

    def text(pid: str) -> str:
        return f"{corpus[pid]['title']} {corpus[pid]['text']}"

    def holds_answer(record: QARecord, pid: str) -> bool:
        golds = [f" {normalize_answer(a)} " for a in record.answers]
        return any(g in f" {normalize_answer(text(pid))} " for g in golds)

    record = next(r for r in load_qa(tiny_world_dir / "train.jsonl", "demo")
                  if len(r.supporting_ids or []) == 2
                  and holds_answer(r, r.supporting_ids[-1]))
    first, second = (text(i) for i in record.supporting_ids)
    task = AgentTask("qr", record, qr_prompt(record.question))
    client = RetrievalClient(tiny_server_url)
    # K=2 split [1, 1]: each line's top passage is its gold passage -> recall 1
    assert QRRecallReward(client, k=2)([task], [f"{first}\n{second}"]) == [1.0]
    # K=1: only the first line's top passage -> recall 1/2 (a list marker is stripped)
    assert QRRecallReward(client, k=1)([task, task], [first, f"1. {first}"]) == [0.5, 0.5]
    # without gold passages: 1 when a gold answer is in a candidate, else 0
    unlabelled = AgentTask("qr", QARecord("u", record.question, record.answers), task.prompt)
    answers = [holds_answer(record, record.supporting_ids[0]), True]
    assert QRRecallReward(client, k=1)([unlabelled] * 2, [first, second]) == \
        [float(a) for a in answers]
