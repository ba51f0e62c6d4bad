"""The learning-signal bench's bookkeeping: paired gains, the warm start's identity and the
runs carried over from an earlier session's JSON (the bench itself needs SmolLM2 and hours)."""

from __future__ import annotations

import hashlib
import importlib.util
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("learning_signal",
                                                  ROOT / "bench" / "learning_signal.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_paired_gain_by_hand(bench):
    sft = {"a": 0.0, "b": 1.0, "c": 0.5, "d": 0.25}
    mappo = {"a": 1.0, "b": 1.0, "c": 0.0, "extra": 1.0}  # "d" unanswered, "extra" unpaired
    gain = bench.paired_gain(sft, mappo)
    # diffs 1.0, 0.0, -0.5: mean 1/6; sample sd sqrt(((5/6)^2 + (1/6)^2 + (2/3)^2) / 2)
    assert gain["n"] == 3
    assert gain["gain"] == pytest.approx(1 / 6)
    sd = math.sqrt(((5 / 6) ** 2 + (1 / 6) ** 2 + (2 / 3) ** 2) / 2)
    assert gain["gain_se"] == pytest.approx(sd / math.sqrt(3))


def test_weights_digest_covers_every_weight_file(bench, tmp_path):
    (tmp_path / "model-00002.safetensors").write_bytes(b"second")
    (tmp_path / "model-00001.safetensors").write_bytes(b"first")
    expected = hashlib.sha256(b"model-00001.safetensorsfirstmodel-00002.safetensorssecond")
    assert bench.weights_digest(tmp_path) == expected.hexdigest()
    (tmp_path / "model-00002.safetensors").write_bytes(b"changed")
    assert bench.weights_digest(tmp_path) != expected.hexdigest()
    with pytest.raises(SystemExit, match="no weight files"):
        bench.weights_digest(tmp_path / "missing")


def _test_summary(f1: float) -> dict:
    return {"f1": f1, "em": 0.42, "acc": 0.42, "num_questions": 200,
            "candidate_support_recall": 0.7775, "mean_subquestions": 1.305,
            "selector_support_recall": 0.77, "selector_support_precision": 0.214,
            "mean_selected": 4.96, "mean_answer_words": 1.4, "eval_dir": "elsewhere"}


def test_same_warm_start_by_digest_else_by_every_test_figure(bench):
    assert bench.same_warm_start({"weights_sha256": "abc", "test": _test_summary(0.4)}, "abc",
                                 None)
    assert not bench.same_warm_start({"weights_sha256": "abc", "test": _test_summary(0.4)},
                                     "def", _test_summary(0.4))
    older = {"test": _test_summary(0.4278)}  # written before digests were recorded
    assert bench.same_warm_start(older, "any", _test_summary(0.4278))
    assert not bench.same_warm_start(older, "any", _test_summary(0.4279))
    assert not bench.same_warm_start(older, "any", None)  # not evaluated: cannot tell


def test_carried_runs_are_marked_and_a_different_warm_start_is_refused(bench):
    previous = {"warm_start": {"weights_sha256": "abc", "test": _test_summary(0.4)},
                "mappo": {"1": {"seed": 1, "paired": {"gain": 0.035}}},
                "ablation": {"qr": {"seed": 1, "carried_over_from": "first.json"}}}
    sft = {"weights_sha256": "abc", "test": _test_summary(0.4)}
    mappo, ablation = bench.carried_runs(previous, sft, "prev.json")
    assert mappo["1"]["carried_over_from"] == "prev.json"
    assert mappo["1"]["paired"] == {"gain": 0.035}
    assert ablation["qr"]["carried_over_from"] == "first.json"  # its first source is kept
    assert bench.carried_runs(None, sft, None) == ({}, {})
    with pytest.raises(SystemExit, match="different warm start"):
        bench.carried_runs(previous, {**sft, "weights_sha256": "other"}, "prev.json")
