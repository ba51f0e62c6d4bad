"""The learning-signal bench's bookkeeping: paired gains, the warm start's identity and the
runs carried over from an earlier session's JSON (the bench itself needs SmolLM2 and hours)."""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import pytest

from tests.bench_fixtures import HandClock, load_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    return load_bench("learning_signal")


@pytest.fixture(scope="module")
def runs(bench):
    """bench/bench_runs.py as the bench imported it: its trainings go through it."""
    return sys.modules["bench_runs"]


def test_paired_gain_by_hand(bench):
    sft = {"a": 0.0, "b": 1.0, "c": 0.5, "d": 0.25}
    mappo = {"a": 1.0, "b": 1.0, "c": 0.0, "extra": 1.0}  # "d" unanswered, "extra" unpaired
    gain = bench.paired_gain(sft, mappo)
    # diffs 1.0, 0.0, -0.5: mean 1/6; sample sd sqrt(((5/6)^2 + (1/6)^2 + (2/3)^2) / 2)
    assert gain["n"] == 3
    assert gain["gain"] == pytest.approx(1 / 6)
    sd = math.sqrt(((5 / 6) ** 2 + (1 / 6) ** 2 + (2 / 3) ** 2) / 2)
    assert gain["gain_se"] == pytest.approx(sd / math.sqrt(3))


def test_pooled_gain_averages_each_question_over_the_seeds_first(bench):
    sft = {"a": 0.0, "b": 1.0, "c": 0.5}
    seed_x = {"a": 1.0, "b": 1.0, "c": 0.0}  # diffs 1, 0, -0.5
    seed_y = {"a": 0.0, "b": 0.5, "c": 1.0}  # diffs 0, -0.5, 0.5
    pooled = bench.pooled_gain(sft, [seed_x, seed_y])
    # per question 0.5, -0.25, 0: mean 1/12; sd sqrt(((5/12)^2 + (1/3)^2 + (1/12)^2) / 2)
    assert pooled["n"] == 3 and pooled["seeds"] == 2
    assert pooled["gain"] == pytest.approx(1 / 12)
    sd = math.sqrt(((5 / 12) ** 2 + (1 / 3) ** 2 + (1 / 12) ** 2) / 2)
    assert pooled["gain_se"] == pytest.approx(sd / math.sqrt(3))
    one = bench.pooled_gain(sft, [seed_x])  # one seed: the paired gain
    assert one["gain"] == pytest.approx(bench.paired_gain(sft, seed_x)["gain"])
    assert one["gain_se"] == pytest.approx(bench.paired_gain(sft, seed_x)["gain_se"])


def test_mean_over_seeds_keeps_only_the_questions_every_seed_scored(bench):
    means = bench.mean_over_seeds([{"a": 1.0, "b": 0.0, "c": 0.5}, {"a": 0.0, "b": 0.5}])
    assert means == pytest.approx({"a": 0.5, "b": 0.25})  # "c" is missing from the second
    sft = {"a": 0.0, "b": 0.0, "c": 0.0}
    pooled = bench.pooled_gain(sft, [{"a": 1.0, "b": 0.0, "c": 0.5}, {"a": 0.0, "b": 0.5}])
    assert pooled["n"] == 2 and pooled["gain"] == pytest.approx(0.375)


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
    return {"f1": f1, "f1_se": 0.035, "em": 0.42, "acc": 0.42, "num_questions": 200,
            "eval_dir": "elsewhere"}


def test_carried_runs_keep_the_warm_start_they_were_paired_with(bench):
    older_run = {"seed": 1, "paired": {"gain": 0.035}}  # recorded before runs named theirs
    newer_run = {"seed": 2, "paired": {"gain": 0.01}, "carried_over_from": "first.json",
                 "warm_start": {"model": "b", "weights_sha256": "bbb", "test": {"f1": 0.41}}}
    previous = {"warm_start": {"model": "a", "test": _test_summary(0.428)},
                "mappo": {"1": older_run, "2": newer_run}, "ablation": {}}
    mappo, ablation = bench.carried_runs(previous, "prev.json")
    assert ablation == {}
    assert mappo["1"]["warm_start"] == {"model": "a", "weights_sha256": None,
                                        "test": {"f1": 0.428, "f1_se": 0.035, "em": 0.42,
                                                 "acc": 0.42}}
    assert mappo["1"]["carried_over_from"] == "prev.json"
    assert mappo["1"]["paired"] == {"gain": 0.035}  # as measured then, not recomputed
    assert mappo["2"]["warm_start"]["weights_sha256"] == "bbb"
    assert mappo["2"]["carried_over_from"] == "first.json"  # its first source is kept
    assert bench.carried_runs(None, None) == ({}, {})


def test_earlier_warm_starts_and_the_summary_over_warm_starts(bench):
    a = {"model": "a", "test": _test_summary(0.40)}
    b = {"model": "b", "weights_sha256": "bbb", "test": _test_summary(0.42),
         "per_question_f1": {"q": 1.0}}
    assert bench.earlier_warm_starts(None) == []
    assert bench.earlier_warm_starts({"warm_start": b, "earlier_warm_starts": [a]}) == [b, a]
    ref_a, ref_b = bench.warm_start_ref(a), bench.warm_start_ref(b)
    result = {"config": {"seeds": [1, 2, 3]}, "warm_start": b, "ablation": {}, "mappo": {
        "1": {"test": {"f1": 0.43}, "paired": {"gain": 0.03}, "warm_start": ref_a},
        "2": {"test": {"f1": 0.43}, "paired": {"gain": 0.01}, "warm_start": ref_b},
    }}
    summary = bench._summarise(result, 0.0)
    assert summary["warm_starts_used"] == 2
    assert summary["sft_f1_mean_of_seeds"] == pytest.approx(0.41)
    assert summary["mean_gain"] == pytest.approx(0.02)
    assert summary["seeds_above_sft"] == 2 and summary["target_met"] is None  # 2 of 3 planned
    result["mappo"]["3"] = {"test": {"f1": 0.40}, "paired": {"gain": -0.001},
                            "warm_start": bench.warm_start_ref(b)}
    assert bench._summarise(result, 0.0)["target_met"] is False
    result["config"]["seeds"] = [3]  # one seed asked for: still judged on three
    del result["mappo"]["3"]
    assert bench._summarise(result, 0.0)["seeds_planned"] == 3


def test_a_previous_json_of_another_question_set_is_not_carried_over(bench, tmp_path):
    import argparse
    import json

    path = tmp_path / "previous.json"
    path.write_text(json.dumps({"config": {"eval_file": "data/demo/test.jsonl", "max_eval": None},
                                "warm_start": {}, "mappo": {}, "ablation": {}}))
    same = argparse.Namespace(eval_file="data/demo/test.jsonl", max_eval=None, algorithm="ppo",
                              agents="qr,selector,generator")
    assert bench.load_previous(str(path), same)["mappo"] == {}
    other = argparse.Namespace(**{**vars(same), "eval_file": "data/test_world/test.jsonl"})
    with pytest.raises(SystemExit, match=r"eval_file='data/demo/test\.jsonl'.*--previous none"):
        bench.load_previous(str(path), other)
    fewer = argparse.Namespace(**{**vars(same), "max_eval": 600})
    with pytest.raises(SystemExit, match="max_eval=None"):
        bench.load_previous(str(path), fewer)
    grpo = argparse.Namespace(**{**vars(same), "algorithm": "grpo"})  # the JSON predates it
    with pytest.raises(SystemExit, match="algorithm='ppo'"):
        bench.load_previous(str(path), grpo)
    generator = argparse.Namespace(**{**vars(same), "agents": "generator"})
    with pytest.raises(SystemExit, match="agents='qr,selector,generator'"):
        bench.load_previous(str(path), generator)
    assert bench.load_previous(str(tmp_path / "missing.json"), same) is None


def test_the_rl_config_follows_the_algorithm(bench):
    import argparse

    import yaml

    for model in bench.MODELS:
        ppo = bench.rl_config(argparse.Namespace(model=model, algorithm="ppo"))
        grpo = bench.rl_config(argparse.Namespace(model=model, algorithm="grpo"))
        assert ppo == bench.MODELS[model][3]
        assert yaml.safe_load((ROOT / grpo).read_text())["mappo_algorithm"] == "grpo"
        assert yaml.safe_load((ROOT / ppo).read_text()).get("mappo_algorithm", "ppo") == "ppo"


def test_a_lora_output_is_evaluated_as_adapters_over_the_model_it_was_trained_from(
        bench, tmp_path):
    full, single, per_agent, empty = (tmp_path / name for name in
                                      ("full", "single", "per_agent", "empty"))
    for folder in (full, single, per_agent, empty):
        folder.mkdir()
    (full / "config.json").write_text("{}")
    (single / "adapter_config.json").write_text("{}")
    (per_agent / "agent_adapters.json").write_text("{}")
    assert bench.model_arguments(full, "warm") == ["--model_name_or_path", str(full)]
    assert bench.model_arguments(single, "warm") == [
        "--model_name_or_path", "warm", "--adapter_name_or_path", str(single)]
    assert bench.model_arguments(per_agent, tmp_path / "warm") == [
        "--model_name_or_path", str(tmp_path / "warm"), "--adapter_name_or_path", str(per_agent)]
    with pytest.raises(SystemExit, match="the model they were trained from"):
        bench.model_arguments(single)
    with pytest.raises(SystemExit, match="neither a model"):
        bench.model_arguments(empty, "warm")


def test_a_run_resumed_after_a_cut_counts_the_seconds_of_every_attempt(bench, runs, tmp_path,
                                                                       monkeypatch):
    """A MAPPO run whose training is cut after 600 s and resumed for 300 s more, then evaluated
    in 40 s, reports 940 s over 2 attempts: not the last attempt's 340 s."""
    import argparse

    clock = HandClock(500.0)
    real = bench.AttemptClock
    monkeypatch.setattr(bench, "AttemptClock",
                        lambda folder: real(folder, heartbeat_s=3600.0, clock=clock))
    monkeypatch.setattr(bench, "code_version", lambda script: "abc1234")
    cuts = iter([True, False])

    def train(config, overrides, log):
        clock.now += 600.0 if next(cuts) else 300.0
        if clock.now == 1100.0:
            raise KeyboardInterrupt("the session ended")

    def evaluate(output, args, eval_dir, base=None):
        clock.now += 40.0
        return {}

    monkeypatch.setattr(runs, "train", train)  # train_to_end calls it
    monkeypatch.setattr(bench, "evaluate", evaluate)
    monkeypatch.setattr(bench, "summary", lambda metrics, eval_dir: {"f1": 0.5})
    monkeypatch.setattr(bench, "per_question_f1", lambda eval_dir: {"q1": 0.5})
    monkeypatch.setattr(bench, "_training_tail", lambda output: {})
    args = argparse.Namespace(model="tiny", algorithm="ppo", retriever_url="http://x", k=5,
                              mappo_overrides=[], overrides=[])
    with pytest.raises(KeyboardInterrupt):
        bench.mappo_run(args, tmp_path, "seed1", 1, "qr,selector,generator", "warm")
    done = bench.mappo_run(args, tmp_path, "seed1", 1, "qr,selector,generator", "warm")
    assert done["seconds"] == 940.0 and done["attempts"] == 2 and done["test"]["f1"] == 0.5
    assert not (tmp_path / "seed1" / "attempt.json").exists()
    # a finished run is read back, not run again
    assert bench.mappo_run(args, tmp_path, "seed1", 1, "", "warm") == done


def test_a_warm_start_cut_mid_training_resumes_from_its_checkpoint(bench, runs, tmp_path,
                                                                    monkeypatch):
    """An SFT warm start cut after writing ``checkpoint-20`` resumes from it (the trainer gets
    ``resume_from_checkpoint``), its checkpoints are removed once it has trained, and a cut
    during its evaluation does not train it again."""
    import argparse

    sft = tmp_path / "warm_start" / "sft"
    calls: list[list[str]] = []

    def train(config, overrides, log):
        calls.append(overrides)
        if len(calls) == 1:  # the session ends after the first checkpoint
            (sft / "checkpoint-20").mkdir(parents=True)
            raise KeyboardInterrupt("the session ended")
        (sft / "checkpoint-40").mkdir()
        (sft / "model.safetensors").write_bytes(b"weights")

    evaluations = iter([KeyboardInterrupt("cut again"), None])

    def evaluate(output, args, eval_dir, base=None):
        if (cut := next(evaluations)) is not None:
            raise cut
        return {}

    monkeypatch.setattr(runs, "train", train)  # train_to_end calls it
    monkeypatch.setattr(bench, "evaluate", evaluate)
    monkeypatch.setattr(bench, "summary", lambda metrics, eval_dir: {"f1": 0.5})
    monkeypatch.setattr(bench, "per_question_f1", lambda eval_dir: {"q1": 0.5})
    args = argparse.Namespace(model="tiny", warm_start=None, base_model=None,
                              sft_overrides=[], overrides=[])
    for _ in range(2):
        with pytest.raises(KeyboardInterrupt):
            bench.warm_start(args, tmp_path, [])
    done = bench.warm_start(args, tmp_path, [])
    assert len(calls) == 2  # trained once more after the cut, not after the evaluation's cut
    assert not any(o.startswith("resume_from_checkpoint") for o in calls[0])
    assert f"resume_from_checkpoint={sft / 'checkpoint-20'}" in calls[1]
    assert "overwrite_output_dir=false" in calls[1]
    assert not list(sft.glob("checkpoint-*")) and done["test"]["f1"] == 0.5
    assert done["attempts"] == 3


def test_a_later_seed_alone_keeps_the_earlier_seeds_of_the_previous_json(bench, tmp_path):
    """``--seeds 2`` with the JSON of a seed-1 invocation as ``--previous``: seed 1 (finished,
    its result in the work folder) stays in the new JSON, seed 2 is added (both finished here,
    so nothing is trained or evaluated)."""
    import argparse
    import json

    warm = {"model": "sft", "weights_sha256": "aaa", "test": _test_summary(0.30),
            "per_question_f1": {"q1": 0.0, "q2": 1.0}}
    work = tmp_path / "work"
    (work / "warm_start").mkdir(parents=True)
    (work / "warm_start" / bench.RESULT).write_text(json.dumps(warm))

    def finished(seed: int, per_question: dict) -> dict:
        run = {"seed": seed, "agents": "qr,selector,generator", "test": _test_summary(0.5),
               "per_question_f1": per_question}
        (work / f"mappo_seed{seed}").mkdir()
        (work / f"mappo_seed{seed}" / bench.RESULT).write_text(json.dumps(run))
        return run

    seed1 = finished(1, {"q1": 1.0, "q2": 1.0})
    finished(2, {"q1": 0.5, "q2": 1.0})
    previous = tmp_path / "previous.json"
    previous.write_text(json.dumps({
        "config": {"eval_file": "test.jsonl", "max_eval": None, "algorithm": "ppo",
                   "agents": "qr,selector,generator"},
        "warm_start": warm, "ablation": {},
        "mappo": {"1": {**seed1, "paired": bench.paired_gain(warm["per_question_f1"],
                                                             seed1["per_question_f1"]),
                        "warm_start": bench.warm_start_ref(warm)}}}))
    args = argparse.Namespace(
        model="smollm2", work_dir=str(work), previous=str(previous),
        json_out=str(tmp_path / "out.json"),
        seeds=[2], ablation=[], agents="qr,selector,generator", eval_file="test.jsonl",
        max_eval=None, algorithm="ppo", scoring=None, warm_start="sft", baselines=[])
    result = bench.run(args)
    assert sorted(result["mappo"]) == ["1", "2"]
    assert result["mappo"]["1"]["paired"]["gain"] == pytest.approx(0.5)
    assert result["mappo"]["2"]["paired"]["gain"] == pytest.approx(0.25)
    assert sorted(json.loads((tmp_path / "out.json").read_text())["mappo"]) == ["1", "2"]


def test_a_baseline_is_paired_with_the_warm_start_and_every_seed(bench, tmp_path, monkeypatch):
    """``--baselines rag:1``: the warm start evaluated once as rag with K = 1 (the evaluation's
    mode and K checked), paired by hand with the warm start, each seed and the seeds pooled; a
    second invocation with that JSON as ``--previous`` reuses it (same warm-start weights)."""
    import argparse
    import json

    warm = {"model": "sft", "weights_sha256": "aaa", "test": _test_summary(0.30),
            "per_question_f1": {"q1": 0.0, "q2": 1.0, "q3": 0.0}}
    work = tmp_path / "work"
    (work / "warm_start").mkdir(parents=True)
    (work / "warm_start" / bench.RESULT).write_text(json.dumps(warm))
    for seed, per_question in ((1, {"q1": 1.0, "q2": 1.0, "q3": 0.0}),
                               (2, {"q1": 0.0, "q2": 1.0, "q3": 1.0})):
        (work / f"mappo_seed{seed}").mkdir()
        (work / f"mappo_seed{seed}" / bench.RESULT).write_text(json.dumps(
            {"seed": seed, "agents": "qr,selector,generator", "test": _test_summary(0.6),
             "per_question_f1": per_question}))
    calls = []

    def evaluate(model, args, out, mode="qr_s_g", base=None, k=None):
        calls.append((str(model), mode, k))
        return {}

    monkeypatch.setattr(bench, "evaluate", evaluate)
    monkeypatch.setattr(bench, "summary", lambda metrics, eval_dir: _test_summary(0.5))
    monkeypatch.setattr(bench, "per_question_f1",
                        lambda eval_dir: {"q1": 1.0, "q2": 0.5, "q3": 0.0})
    args = argparse.Namespace(
        model="smollm2", work_dir=str(work), previous=None, json_out=str(tmp_path / "out.json"),
        seeds=[1, 2], ablation=[], agents="qr,selector,generator", eval_file="test.jsonl",
        max_eval=None, algorithm="ppo", scoring=None, warm_start="sft", baselines=["rag:1"])
    result = bench.run(args)
    assert calls == [("sft", "rag", 1)]
    paired = result["baselines"]["rag_k1"]["paired"]
    # rag K=1 per question 1, 0.5, 0; warm start 0, 1, 0: diffs -1, 0.5, 0
    assert paired["warm_start"]["gain"] == pytest.approx(-1 / 6)
    # seed 1: 0, 0.5, 0 -> 1/6; seed 2: -1, 0.5, 1 -> 1/6; pooled per question -0.5, 0.5, 0.5
    assert paired["mappo_seed1"]["gain"] == pytest.approx(1 / 6)
    assert paired["mappo_seed2"]["gain"] == pytest.approx(1 / 6)
    assert paired["mappo_seeds_pooled"]["gain"] == pytest.approx(1 / 6)
    assert paired["mappo_seeds_pooled"]["gain_se"] == pytest.approx(
        math.sqrt(((2 / 3) ** 2 + (1 / 3) ** 2 + (1 / 3) ** 2) / 2) / math.sqrt(3))
    assert "over rag K=1 (paired, F1): warm start -16.7" in bench.format_table(result)
    # the next invocation (another work folder) reuses it from --previous: no evaluation
    args.work_dir, args.previous = str(tmp_path / "work2"), str(tmp_path / "out.json")
    (tmp_path / "work2").mkdir()
    (tmp_path / "work2" / "warm_start").symlink_to(work / "warm_start")
    args.seeds = [3]
    (tmp_path / "work2" / "mappo_seed3").mkdir()
    (tmp_path / "work2" / "mappo_seed3" / bench.RESULT).write_text(json.dumps(
        {"seed": 3, "agents": "qr,selector,generator", "test": _test_summary(0.6),
         "per_question_f1": {"q1": 1.0, "q2": 0.5, "q3": 0.0}}))
    again = bench.run(args)
    assert calls == [("sft", "rag", 1)]
    assert again["baselines"]["rag_k1"]["paired"]["mappo_seed3"]["gain"] == 0.0
    assert sorted(again["mappo"]) == ["1", "2", "3"]


@pytest.mark.parametrize("keep", [False, True])
def test_checkpoints_are_deleted_after_training_unless_kept(bench, runs, tmp_path, monkeypatch,
                                                           keep):
    """The final model is in the run's output folder; its ``checkpoint-N`` folders go once it
    has trained, unless kept for a dev curve (``side_by_side.py --keep-checkpoints``)."""
    import argparse

    monkeypatch.setattr(bench, "code_version", lambda script: "abc1234")

    def train(config, overrides, log):
        output = Path(next(o for o in overrides if o.startswith("output_dir="))[11:])
        for step in (2, 4):
            (output / f"checkpoint-{step}").mkdir(parents=True)
        (output / "model.safetensors").write_text("final")

    monkeypatch.setattr(runs, "train", train)  # train_to_end calls it
    monkeypatch.setattr(bench, "evaluate", lambda output, args, eval_dir, base=None: {})
    monkeypatch.setattr(bench, "summary", lambda metrics, eval_dir: {"f1": 0.5})
    monkeypatch.setattr(bench, "per_question_f1", lambda eval_dir: {"q1": 0.5})
    monkeypatch.setattr(bench, "_training_tail", lambda output: {})
    args = argparse.Namespace(model="tiny", algorithm="ppo", retriever_url="http://x", k=5,
                              mappo_overrides=[], overrides=[])
    bench.mappo_run(args, tmp_path, "seed1", 1, "qr,selector,generator", "warm",
                    keep_checkpoints=keep)
    output = tmp_path / "seed1" / "mappo"
    assert (output / "model.safetensors").is_file()
    assert sorted(p.name for p in output.glob("checkpoint-*")) == (
        ["checkpoint-2", "checkpoint-4"] if keep else [])
