"""bench/qr_span_rewrites.py: whether a fixed extractive rewrite (the question plus its own
spans) raises the candidate recall over the question alone. Its span extraction and summary
against hand-worked values, and a run against the tiny world's real retrieval server."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from tests.bench_fixtures import load_bench

bench = load_bench("qr_span_rewrites")


@pytest.mark.parametrize(("question", "spans"), [
    ("Who was born first David Draiman or Terry Kath?", ["David Draiman", "Terry Kath"]),
    # joiners inside a name stay ("Hook and Ladder"), "NY" is too short, the leading "Who" goes
    ("Who was the brother of the architect of Hook and Ladder No. 4 located in Albany, NY?",
     ["Hook and Ladder No. 4", "Albany"]),
    # a quoted title first; a joiner at the end of a run is dropped ("Bank of" -> "Bank")
    ('Is "Yesterday" by the Bank of the band?', ["Yesterday", "Bank"]),
    # numbers count as name words; "Which" starts the question
    ("Which 2011 film cast Dominic Cooper as Howard Stark?",
     ["2011", "Dominic Cooper", "Howard Stark"]),
    ("what is it?", []),
])
def test_question_spans(question: str, spans: list[str]) -> None:
    assert bench.question_spans(question, max_spans=3) == spans


def test_spans_are_unique_and_capped() -> None:
    question = "Did Alan Turing meet Alan Turing, Kurt Godel or John Nash or Emmy Noether?"
    assert bench.question_spans(question, 2) == ["Alan Turing", "Kurt Godel"]


def test_each_rule_puts_the_question_first_and_respects_the_qr_limit() -> None:
    plan = bench.rule_subquestions("q?", ["a", "b", "c", "d", "e"])
    assert plan["question"] == ["q?"]
    assert plan["question+first span"] == ["q?", "a"]
    assert plan["question+two spans"] == ["q?", "a", "b"]
    assert plan["question+spans"] == ["q?", "a", "b", "c"]  # MAX_SUBQUESTIONS = 4
    assert plan["spans"] == ["a", "b", "c", "d"]
    assert bench.rule_subquestions("q?", [])["spans"] == ["q?"]  # no span: the question


def test_the_summary_pairs_each_rule_with_the_question() -> None:
    recalls = {name: {"x": 0.5, "y": 1.0} for name in bench.RULES}
    recalls["spans"] = {"x": 1.0, "y": 0.5}  # +0.5 on x, -0.5 on y
    best = {"x": 1.0, "y": 1.0}
    args = argparse.Namespace(data_file="d.json", k=5, max_spans=3)
    result = bench.summarise(recalls, best, [{"id": "x", "spans": ["a"]},
                                             {"id": "y", "spans": []}], 1.0, args)
    assert result["rules"]["question"] == {"recall": 0.75}
    spans = result["rules"]["spans"]
    # diffs +0.5, -0.5: mean 0, sample sd 0.7071, SE 0.5
    assert spans["gain"] == 0.0 and spans["gain_se"] == pytest.approx(0.5)
    assert (spans["better"], spans["worse"]) == (1, 1)
    assert result["best_of_rules"]["improved"] == 1
    assert result["best_of_rules"]["gain"] == pytest.approx(0.25)
    assert result["with_spans"] == 1
    assert "best rule per question" in bench.table(result)


def test_the_bench_against_the_tiny_server(tiny_world_dir: Path, tiny_server_url: str,
                                           tmp_path: Path) -> None:
    out = tmp_path / "spans.json"
    assert bench.main(["--data-file", str(tiny_world_dir / "dev.jsonl"), "--retriever-url",
                       tiny_server_url, "--k", "3", "--max-questions", "6",
                       "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["questions"] == 6 and len(result["per_question"]) == 6
    for row in result["per_question"]:
        assert set(row["recall"]) == set(bench.RULES)
        assert all(0.0 <= v <= 1.0 for v in row["recall"].values())
    assert result["best_of_rules"]["recall"] >= max(r["recall"]
                                                    for r in result["rules"].values())
    assert "code" in result and not result["data_file"].startswith("/")  # no machine path


def test_bad_arguments_are_one_line_errors(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as missing:
        bench.parse_args(["--data-file", str(tmp_path / "none.json"), "--retriever-url", "x"])
    assert missing.value.code == 2 and "--data-file" in capsys.readouterr().err
    present = tmp_path / "d.json"
    present.write_text("[]")
    with pytest.raises(SystemExit):
        bench.parse_args(["--data-file", str(present), "--retriever-url", "x", "--k", "0"])
    assert "--k" in capsys.readouterr().err
