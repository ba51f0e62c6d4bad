"""bench/selection_ceiling.py: the Generator on fixed selections of an evaluation's candidates.
Its rules and figures against hand-computed values, and a run on the tiny model whose ``all``
rule must reproduce the real evaluation it reads."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from tests.bench_fixtures import load_bench

bench = load_bench("selection_ceiling")


def test_each_fixed_rule_keeps_what_it_says() -> None:
    titles = ["Alpha Centauri", "Beta Pictoris", "Gamma Draconis", "Delta"]
    gold = [False, True, False, True]
    question = "Is Beta Pictoris older than Delta?"
    assert bench.fixed_selection("all", question, titles, gold) == [0, 1, 2, 3]
    assert bench.fixed_selection("top1", question, titles, gold) == [0]
    assert bench.fixed_selection("top2", question, titles, gold) == [0, 1]
    assert bench.fixed_selection("top2", question, titles[:1], gold[:1]) == [0]
    # whole titles named by the question: Beta Pictoris and Delta
    assert bench.fixed_selection("title", question, titles, gold) == [1, 3]
    assert bench.fixed_selection("title", "Who founded it?", titles, gold) == [0]
    assert bench.fixed_selection("gold", question, titles, gold) == [1, 3]
    # no gold candidate: the oracle falls back to the top one, never an empty context
    assert bench.fixed_selection("gold", question, titles, [False] * 4) == [0]
    with pytest.raises(ValueError, match="unknown rule"):
        bench.fixed_selection("best", question, titles, gold)


def test_the_marginal_rule_falls_back_to_the_top_candidate() -> None:
    assert bench.marginal_or_top([0.9, 0.2, 0.6], 0.5) == [0, 2]
    assert bench.marginal_or_top([0.1, 0.2, 0.3], 0.5) == [0]


def test_an_inclusion_spec_is_a_result_and_a_threshold() -> None:
    assert bench.parse_inclusion("runs/a@b.json@0.4") == (Path("runs/a@b.json"), 0.4)
    for bad in ("result.json", "@0.4", "result.json@x", "result.json@0", "result.json@1.5"):
        with pytest.raises(ValueError, match="--inclusion"):
            bench.parse_inclusion(bad)


def test_rule_figures_are_means_standard_errors_and_paired_gains() -> None:
    def rule(selected: list[int], f1: float) -> dict:
        return {"selected": selected, "answer": "", "f1": f1, "em": float(f1 == 1.0)}

    rows = [
        {"id": "a", "gold": [True, False], "rules": {"all": rule([0, 1], 0.0),
                                                    "top1": rule([0], 1.0)}},
        {"id": "b", "gold": [False, True], "rules": {"all": rule([0, 1], 0.5),
                                                    "top1": rule([0], 0.0)}},
        {"id": "c", "gold": [True, True], "rules": {"all": rule([0, 1], 1.0),
                                                   "top1": rule([0], 1.0)}},
    ]
    top1 = bench.rule_figures(rows, "top1")
    # F1 1, 0, 1: mean 2/3, sample sd sqrt(1/3), SE sqrt(1/3)/sqrt(3) = 1/3
    assert top1["f1"] == pytest.approx(0.6667, abs=1e-4)
    assert top1["f1_se"] == pytest.approx(0.3333, abs=1e-4)
    assert top1["em"] == pytest.approx(0.6667, abs=1e-4)
    # differences over all: +1, -0.5, 0 -> mean 1/6; sd sqrt(((5/6)^2+(2/3)^2+(1/6)^2)/2)
    sd = math.sqrt(((5 / 6) ** 2 + (2 / 3) ** 2 + (1 / 6) ** 2) / 2)
    assert top1["gain_over_all"] == pytest.approx(1 / 6, abs=1e-4)
    assert top1["gain_over_all_se"] == pytest.approx(sd / math.sqrt(3), abs=1e-4)
    assert "gain_over_top1" not in top1
    # precision 1, 0, 1 -> 2/3; recall 1/1, 0/1, 1/2 -> 1/2
    assert top1["precision"] == pytest.approx(0.6667, abs=1e-4)
    assert top1["recall"] == pytest.approx(0.5, abs=1e-4)
    everything = bench.rule_figures(rows, "all")
    assert everything["f1"] == pytest.approx(0.5)
    assert everything["gain_over_top1"] == pytest.approx(-1 / 6, abs=1e-4)
    assert everything["documents"] == 2.0


def test_on_the_tiny_model_the_all_rule_reproduces_the_evaluation(
        tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str,
        tmp_path: Path) -> None:
    from mmoa.evaluation import EvalConfig, evaluate

    eval_dir = tmp_path / "rag"
    metrics = evaluate(EvalConfig(
        model_name_or_path=str(tiny_model_dir), template="llama3", output_dir=str(eval_dir),
        data_file=str(tiny_world_dir / "dev.jsonl"), max_samples=4, mode="rag", k=3,
        retriever_url=tiny_server_url, batch_size=2, precision="fp32",
        max_new_tokens_generator=6), progress=False)
    predictions = [json.loads(line) for line in (eval_dir / "predictions.jsonl").open()]
    # a Selector's beliefs for the marginal rule: keep the second candidate only
    beliefs = tmp_path / "discrimination.json"
    beliefs.write_text(json.dumps({"per_question": [
        {"id": row["id"], "inclusion": [0.2, 0.8, 0.1]} for row in predictions]}))
    args = argparse.Namespace(
        model=str(tiny_model_dir), template="llama3",
        predictions=str(eval_dir / "predictions.jsonl"),
        corpus=str(tiny_world_dir / "corpus.jsonl"), data_file=str(tiny_world_dir / "dev.jsonl"),
        inclusion=[f"{beliefs}@0.5"], max_questions=None, max_new_tokens=None, batch_size=None,
        scoring=None, precision="fp32", use_cpu=True, json_out=None)
    result = bench.measure(args)
    assert result["questions"] == 4 and result["batch_size"] == 2
    assert result["max_new_tokens_generator"] == 6
    # the evaluation's own answers, question by question, and its F1
    by_id = {row["id"]: row for row in predictions}
    for row in result["per_question"]:
        assert row["rules"]["all"]["answer"] == by_id[row["id"]]["prediction"]
        assert row["rules"]["all"]["selected"] == [0, 1, 2]
        assert row["rules"]["top1"]["selected"] == [0]
        assert row["rules"]["marginal@0.5"]["selected"] == [1]
        gold = row["gold"]
        assert row["rules"]["gold"]["selected"] == ([i for i, g in enumerate(gold) if g] or [0])
    assert result["rules"]["all"]["f1"] == pytest.approx(metrics["f1"], abs=1e-4)
    assert result["evaluation_f1"] == pytest.approx(metrics["f1"], abs=1e-4)
    assert list(result["rules"]) == ["all", "top1", "top2", "title", "gold", "marginal@0.5"]
    assert result["rules"]["gold"]["precision"] in (None, 1.0) or \
        not any(any(r["gold"]) for r in result["per_question"])
    assert "| gold |" in bench.table(result)


def test_a_result_of_other_candidates_or_no_result_is_refused(
        tiny_world_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dev = [json.loads(line) for line in (tiny_world_dir / "dev.jsonl").open()][:1]
    predictions = tmp_path / "predictions.jsonl"
    predictions.write_text(json.dumps({
        "id": dev[0]["id"], "question": dev[0]["question"],
        "candidates": [{"id": pid} for pid in dev[0]["supporting_ids"]]}) + "\n")
    beliefs = tmp_path / "discrimination.json"
    beliefs.write_text(json.dumps({"per_question": [
        {"id": dev[0]["id"], "inclusion": [0.5] * 7}]}))
    args = argparse.Namespace(
        model="unused", template="llama3", predictions=str(predictions),
        corpus=str(tiny_world_dir / "corpus.jsonl"), data_file=str(tiny_world_dir / "dev.jsonl"),
        inclusion=[f"{beliefs}@0.5"], max_questions=None, max_new_tokens=None, batch_size=None,
        scoring=None, precision="fp32", use_cpu=True, json_out=None)
    with pytest.raises(SystemExit):
        bench.measure(args)
    assert "not in its result with these 2 candidates" in capsys.readouterr().err
    for text in (json.dumps({"rules": {}}), "{not json"):
        beliefs.write_text(text)
        with pytest.raises(SystemExit):
            bench.measure(args)
        assert "--inclusion" in capsys.readouterr().err


def test_missing_inputs_and_bad_options_are_one_line_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    present = tmp_path / "x.jsonl"
    present.write_text("")
    base = ["--model", str(tmp_path), "--predictions", str(present), "--corpus", str(present),
            "--data-file", str(present)]
    for extra, named in ((["--inclusion", f"{tmp_path / 'none.json'}@0.4"], "--inclusion"),
                         (["--inclusion", f"{present}@2"], "--inclusion"),
                         (["--batch-size", "0"], "--batch-size")):
        with pytest.raises(SystemExit) as error:
            bench.parse_args([*base, *extra])
        assert error.value.code == 2
        assert named in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args([*base[:2], "--predictions", str(tmp_path / "none.jsonl"), *base[4:]])
    assert "--predictions" in capsys.readouterr().err
