"""The ablation bench (``bench/ablation_table.py``): gains and differences against hand-computed
values on made-up learning-signal JSONs, and the refusals of incomparable ones."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.bench_fixtures import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("ablation_table")


WARM = {"a": 0.0, "b": 1.0, "c": 0.5}


def _test(f1: float) -> dict:
    return {"f1": f1, "f1_se": 0.1, "candidate_support_recall": 0.8, "mean_subquestions": 1.5,
            "mean_selected": 5.0, "selector_support_recall": 0.7}


def _run(per_question: dict, digest: str = "w") -> dict:
    gain = sum(per_question[q] - WARM[q] for q in WARM) / len(WARM)
    return {"test": _test(sum(per_question.values()) / len(per_question)),
            "per_question_f1": per_question, "paired": {"gain": gain},
            "warm_start": {"model": "sft", "weights_sha256": digest}}


def _write(path: Path, agents: str, seeds: dict, digest: str = "w",
           max_eval: int | None = 3) -> Path:
    path.write_text(json.dumps({
        "config": {"agents": agents, "eval_file": "test.jsonl", "max_eval": max_eval},
        "warm_start": {"model": "sft", "weights_sha256": digest, "test": _test(0.5),
                       "per_question_f1": WARM},
        "mappo": seeds}))
    return path


def test_ablation_rows_by_hand(bench, tmp_path):
    joint = _write(tmp_path / "joint.json", "qr,selector,generator", {
        "1": _run({"a": 1.0, "b": 1.0, "c": 0.0}),    # gain (1 + 0 - 0.5) / 3 = 1/6
        "2": _run({"a": 0.5, "b": 1.0, "c": 1.0})})   # gain (0.5 + 0 + 0.5) / 3 = 1/3
    no_qr = _write(tmp_path / "no_qr.json", "selector,generator", {
        "1": _run({"a": 0.0, "b": 1.0, "c": 0.5}),    # the warm start's answers: gain 0
        "9": _run({"a": 1.0, "b": 1.0, "c": 1.0}, digest="other")})  # another warm start
    table = bench.build([bench.load_configuration("joint", joint),
                         bench.load_configuration("no_qr", no_qr)])
    first, second = table["rows"]
    assert first["gain_mean"] == pytest.approx(1 / 4)
    # two gains 1/6 and 1/3: sample sd (1/6) / sqrt(2), over sqrt(2) seeds: 1/12
    assert first["gain_se_over_seeds"] == pytest.approx(1 / 12)
    assert first["seeds_above_warm_start"] == 2 and first["pooled_vs_reference"] is None
    # pooled: per question (0.75 - 0, 1 - 1, 0.5 - 0.5) -> mean 1/4
    assert first["pooled_gain"]["gain"] == pytest.approx(1 / 4)
    assert second["seeds"] == ["1"]  # seed 9 was trained from another warm start
    assert second["gain_se_over_seeds"] is None
    # against joint's per-question mean (0.75, 1, 0.5): diffs -0.75, 0, 0
    versus = second["pooled_vs_reference"]
    assert versus["gain"] == pytest.approx(-0.25)
    sd = math.sqrt((0.5 ** 2 + 0.25 ** 2 + 0.25 ** 2) / 2)
    assert versus["gain_se"] == pytest.approx(sd / math.sqrt(3))
    markdown = bench.format_markdown(table)
    assert "| no_qr | selector, generator | 50.0 |" in markdown
    assert "-25.0 +- 25.0" in markdown


def test_incomparable_configurations_are_refused(bench, tmp_path):
    joint = bench.load_configuration("joint", _write(
        tmp_path / "joint.json", "qr,selector,generator", {"1": _run(WARM)}))
    other_warm = bench.load_configuration("x", _write(
        tmp_path / "x.json", "qr", {"1": _run(WARM, digest="v")}, digest="v"))
    with pytest.raises(SystemExit, match="different warm starts"):
        bench.build([joint, other_warm])
    fewer = bench.load_configuration("y", _write(
        tmp_path / "y.json", "qr", {"1": _run(WARM)}, max_eval=2))
    with pytest.raises(SystemExit, match="max_eval"):
        bench.build([joint, fewer])
    with pytest.raises(SystemExit, match="no seed paired"):
        bench.load_configuration("z", _write(
            tmp_path / "z.json", "qr", {"1": _run(WARM, digest="v")}))
