"""Query Rewriter labels from the live retriever (``mmoa.synthesis.qr_rewrites``): the keep rule
(a rewrite only where it beats the question), the recall per model call, the rewrites file the
SFT builder reads, and the whole command on the tiny model and the real retrieval server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmoa.agents.prompts import qr_prompt
from mmoa.data.records import QARecord
from mmoa.data.sft_builder import load_rewrites, qr_target
from mmoa.synthesis.qr_rewrites import (
    QuestionRewrite,
    RewriteRun,
    label_of,
    recall_by_calls,
    rewrite_rows,
    summarise,
)
from mmoa.synthesis.rewards import AgentTask
from mmoa.synthesis.search import Play, SearchResult


def _record(question: str = "Who directed the film that starred Ann Lee?") -> QARecord:
    return QARecord(id="q1", question=question, answers=["Bob Ray"],
                    supporting_titles=["Blue Harbor", "Bob Ray"])


def _result(record: QARecord, rewards: list[float], texts: list[str] | None = None
            ) -> SearchResult:
    texts = texts or [f"Sub {i} of it?\nOther {i}?" for i in range(len(rewards))]
    task = AgentTask("qr", record, qr_prompt(record.question))
    return SearchResult(task, [Play("m" + str(i % 2), t, r)
                               for i, (t, r) in enumerate(zip(texts, rewards, strict=True))])


def test_a_rewrite_is_kept_only_where_it_beats_the_question() -> None:
    record = _record()
    better = label_of(record, _result(record, [0.0, 1.0, 0.5],
                                      ["A?", "Which film starred Ann Lee?\nWho directed it?",
                                       "B?"]), 0.5)
    assert better.source == "rewrite" and better.label_recall == 1.0
    assert better.subquestions == ["Which film starred Ann Lee?", "Who directed it?"]
    assert better.model == "m1" and better.play == 1 and better.question_recall == 0.5
    tie = label_of(record, _result(record, [0.5, 0.5]), 0.5)
    assert tie.source == "question" and tie.subquestions == [record.question]
    assert tie.label_recall == 0.5 and tie.model is None and tie.play is None
    worse = label_of(record, _result(record, [0.0, 0.0]), 0.5)
    assert worse.source == "question" and worse.play_rewards == [0.0, 0.0]


def test_recall_by_calls_is_the_best_so_far_floored_at_the_question() -> None:
    labels = [
        QuestionRewrite("a", "A?", ["A?"], "rewrite", 1.0, 0.5, [0.0, 1.0, 0.5]),
        QuestionRewrite("b", "B?", ["B?"], "question", 0.5, 0.5, [0.0, 0.0, 0.0]),
        QuestionRewrite("c", "C?", ["C?"], "rewrite", 1.0, 0.0, [0.5, 0.5, 1.0]),
    ]
    # n=1: max(.5, 0), max(.5, 0), max(0, .5) -> (.5 + .5 + .5) / 3
    # n=2: 1.0, .5, .5 -> 2/3; n=3: 1.0, .5, 1.0 -> 2.5/3
    assert recall_by_calls(labels, 3) == pytest.approx([0.5, 2 / 3, 2.5 / 3])
    assert recall_by_calls([], 2) == [0.0, 0.0]
    summary = summarise(RewriteRun("toa", 3, labels))
    assert summary["improved"] == 2 and summary["improved_share"] == pytest.approx(2 / 3)
    assert summary["question_recall"] == pytest.approx(1 / 3)
    assert summary["label_recall"] == pytest.approx(2.5 / 3)
    assert summary["model_calls"] == 9 and summary["ties_with_question"] == 0


def test_rewrites_file_round_trips_through_the_sft_builder(tmp_path: Path) -> None:
    record = _record()
    other = _record("What is the capital of Lumeria?")
    labels = [label_of(record, _result(record, [1.0], ["Which film starred Ann Lee?\n"
                                                       "Who directed it?"]), 0.5),
              label_of(other, _result(other, [0.0]), 0.5)]
    rows = rewrite_rows(RewriteRun("best_of_n", 1, labels))
    assert len(rows) == 1 and rows[0]["target"] == "Which film starred Ann Lee?; Who directed it?"
    path = tmp_path / "rewrites.json"
    path.write_text(json.dumps(rows))
    rewrites = load_rewrites(path)
    assert qr_target(record, rewrites) == (["Which film starred Ann Lee?", "Who directed it?"],
                                           "rewrites")
    assert qr_target(other, rewrites) == ([other.question], "question")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_qr_rewrites_command_on_the_tiny_model_and_the_real_server(
        tmp_path: Path, tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    from mmoa.cli import main as cli_main

    out, report = tmp_path / "rewrites.json", tmp_path / "rewrites_report.json"
    spec = f"path={tiny_model_dir},template=llama3"
    argv = ["data", "qr-rewrites", "--data_file", str(tiny_world_dir / "train.jsonl"),
            "--max_samples", "6", "--output", str(out), "--retriever_url", tiny_server_url,
            "--model", f"name=tiny,{spec}",
            "--model", f"name=careful,{spec},variant=careful,temperature=0.7",
            "--samples_per_model", "2", "--k", "5", "--compare", "--chunk_size", "4",
            "--max_new_tokens_qr", "12", "--no_progress"]
    assert cli_main(argv) == 0
    first = json.loads(report.read_text())
    chunks = sorted((tmp_path / "rewrites_chunks").rglob("chunk-*.json"))
    assert len(chunks) == 4  # two chunks of each method
    stamps = [c.stat().st_mtime_ns for c in chunks]
    # a rerun resumes from the finished chunks: the same labels, nothing searched again
    assert cli_main(argv) == 0
    assert [c.stat().st_mtime_ns for c in chunks] == stamps
    printed = capsys.readouterr().out
    assert "question recall" in printed and "best_of_n" in printed
    second = json.loads(report.read_text())
    assert second["labels"] == first["labels"]
    for method in ("toa", "best_of_n"):
        summary = first["summaries"][method]
        assert summary["questions"] == 6 and summary["budget_per_question"] == 4
        curve = summary["recall_by_calls"]
        assert len(curve) == 4 and curve == sorted(curve)  # best-so-far never falls
        assert curve[-1] == pytest.approx(summary["label_recall"])
        assert summary["label_recall"] >= summary["question_recall"]
        for label in first["labels"][method]:
            assert len(label["play_rewards"]) == 4
            if label["source"] == "rewrite":
                assert label["label_recall"] > label["question_recall"]
            else:
                assert label["subquestions"] == [label["question"]]
    rows = json.loads(out.read_text())
    assert len(rows) == first["summaries"]["toa"]["improved"]
    assert load_rewrites(out) if rows else True


def test_qr_rewrites_refuses_records_without_gold_passages(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mmoa.cli import main as cli_main

    data = tmp_path / "nq.jsonl"
    data.write_text(json.dumps({"id": "1", "question": "Who?", "answers": ["x"]}) + "\n")
    code = cli_main(["data", "qr-rewrites", "--data_file", str(data), "--output",
                     str(tmp_path / "r.json"), "--model", "name=a,path=nowhere,template=llama3"])
    assert code == 2
    err = capsys.readouterr().err
    assert "gold supporting passages" in err and "nothing was written" in err
    assert not (tmp_path / "r.json").exists()
