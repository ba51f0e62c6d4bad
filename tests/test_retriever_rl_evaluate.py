"""The retrieval rounds shared by the retriever_rl rollout and its greedy evaluation, and the
evaluation itself against the real server over the tiny world (recall@k checked against the
server's own rankings, F1 from the tiny model's answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mmoa.data.loaders import load_qa
from mmoa.data.records import QARecord
from mmoa.retrieval.client import RetrievalClient
from mmoa.train.retriever_rl.evaluate import (
    evaluate_encoder,
    frozen_generator,
    has_gold_passages,
    summarize,
    support_recall,
)
from mmoa.train.retriever_rl.state import observation, retrieval_rounds, state_text


def _ranked(prefix: str, n: int) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{j}", "contents": f"{prefix}{j}\ntext {j}"} for j in range(n)]


def test_rounds_batch_each_round_and_build_the_history_from_the_kept_documents() -> None:
    calls: list[tuple[int, list[str]]] = []

    def retrieve(states: list[str], hop: int) -> list[dict[str, Any]]:
        calls.append((hop, list(states)))
        # round 0 of both samples returns d0..d3; round 1 of sample 0 returns d1, e0, e1, e2
        return [{"documents": _ranked("d", 4) if hop == 0 else
                 [_ranked("d", 2)[1], *_ranked("e", 3)]} for _ in states]

    queries = [["a0", "a1"], ["b0"]]
    documents, events = retrieval_rounds(queries, True, retrieve, keep=2)
    assert [hop for hop, _ in calls] == [0, 1]  # one call per round, all samples together
    assert calls[0][1] == ["a0", "b0"]
    kept = observation(["d0\ntext 0", "d1\ntext 1"])
    assert calls[1][1] == [state_text("a1", [("a0", kept)])]
    # sample 0 keeps d0, d1 from round 0 and d1 (again: once), e0 from round 1
    assert [list(d) for d in documents] == [["d0", "d1", "e0"], ["d0", "d1"]]
    assert [(i, s) for i, s, _ in events] == [(0, "a0"), (1, "b0"), (0, calls[1][1][0])]
    _, _ = retrieval_rounds(queries, False, retrieve)
    assert calls[-1] == (1, ["a1"])  # without history the state is the sub-query


def test_support_recall_and_summary_by_type() -> None:
    record = QARecord(id="r", question="q", answers=["a"], supporting_ids=["p1", "p2"])
    assert support_recall(record, [{"id": "p1", "contents": "A\na"},
                                   {"id": "p9", "contents": "B\nb"}]) == 0.5
    assert support_recall(record, _ranked("p", 3)) == 1.0  # p0, p1, p2: both gold ones
    with pytest.raises(ValueError, match="no gold passage"):
        support_recall(QARecord(id="n", question="q", answers=["a"]), [])
    titled = QARecord(id="t", question="q", answers=["a"], supporting_titles=["A", "C"])
    assert has_gold_passages(titled) and not has_gold_passages(
        QARecord(id="n", question="q", answers=["a"]))
    # HotpotQA names titles: matched on the passage's first line, the corpus's title
    assert support_recall(titled, [{"id": "x1", "contents": "A\na"},
                                   {"id": "x2", "contents": "B\nb"}]) == 0.5
    rows = [{"id": "a", "type": "x", "recall@5": 1.0, "f1": 1.0, "em": 1.0},
            {"id": "b", "type": "x", "recall@5": 0.5, "f1": 0.0, "em": 0.0},
            {"id": "c", "type": "y", "recall@5": 0.0, "f1": 0.5, "em": 0.0}]
    summary = summarize(rows)
    assert summary["n"] == 3 and summary["recall@5"] == pytest.approx(0.5)
    assert summary["f1"] == pytest.approx(0.5)
    assert summary["f1_se"] == pytest.approx(0.5 / 3 ** 0.5)  # stdev 0.5 over 3 questions
    assert summary["by_type"]["x"] == {"n": 2, "recall@5": 0.75, "f1": 0.5,
                                       "f1_se": pytest.approx(0.5), "em": 0.5}
    assert summary["by_type"]["y"]["f1_se"] is None


def test_greedy_evaluation_matches_the_servers_rankings(tiny_server_url: str,
                                                        tiny_world_dir: Path) -> None:
    records = [r for r in load_qa(tiny_world_dir / "dev.jsonl") if r.decomposition][:6]
    client = RetrievalClient(tiny_server_url)
    plain = evaluate_encoder(records, client, queries="decomposition", history=False, top_k=2,
                             recall_at=(1, 4))
    for record, row in zip(records, plain["rows"], strict=True):
        ranked = client.retrieve(record.decomposition, topk=4)
        for k in (1, 4):
            want = support_recall(record, [d for r in ranked for d in r[:k]])
            assert row[f"recall@{k}"] == want
        assert row["rounds"] == len(record.decomposition)
        assert row["documents"] == list(dict.fromkeys(d["id"] for r in ranked for d in r[:2]))
    single = evaluate_encoder(records, client, queries="question", history=False, top_k=2)
    ranked = client.retrieve([r.question for r in records], topk=5)
    assert [row["recall@5"] for row in single["rows"]] == [
        support_recall(r, docs)
        for docs, r in zip(ranked, records, strict=True)]
    # the history changes the second round's state, so what the server is asked differs
    history = evaluate_encoder(records, client, queries="decomposition", history=True, top_k=2)
    assert history["summary"]["n"] == len(records)


@pytest.mark.slow
def test_evaluation_scores_the_frozen_generators_answers(tiny_server_url: str,
                                                         tiny_world_dir: Path,
                                                         tiny_model_dir: Path) -> None:
    records = load_qa(tiny_world_dir / "dev.jsonl")[:4]
    generator = frozen_generator(str(tiny_model_dir), "llama3", max_new_tokens=6, batch_size=4)
    out = evaluate_encoder(records, RetrievalClient(tiny_server_url), queries="question",
                           history=False, top_k=2, generator=generator)
    from mmoa.metrics import f1_score

    for record, row in zip(records, out["rows"], strict=True):
        assert row["f1"] == f1_score(row["answer"], record.answers)
    assert out["summary"]["f1"] == pytest.approx(sum(r["f1"] for r in out["rows"]) / 4)


def test_evaluation_refuses_questions_without_gold_passages(tiny_server_url: str) -> None:
    with pytest.raises(ValueError, match="supporting_ids"):
        evaluate_encoder([QARecord(id="q", question="Who?", answers=["X"])],
                         RetrievalClient(tiny_server_url), queries="question", history=False,
                         top_k=2)
