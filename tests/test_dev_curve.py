"""``bench/dev_curve.py``: a 2-step MAPPO run of the tiny model (a checkpoint every step) and its
dev curve over 2 dev questions (steps 0, 1, 2, the checkpoints evaluated as they are saved), a
rerun that evaluates nothing, bad inputs; the pure parts (checkpoint order, the final model,
the best step, the paired gain) and ``--follow`` against hand-made run folders."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest

from tests.bench_fixtures import load_bench
from tests.mappo_fixtures import tiny_mappo_config


@pytest.fixture(scope="module")
def bench():
    return load_bench("dev_curve")


@pytest.fixture(scope="module")
def mappo_run(tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two MAPPO steps from the tiny model, two questions a step, a checkpoint every step."""
    from mmoa.train.mappo.workflow import run_mappo

    out = tmp_path_factory.mktemp("dev_curve_run") / "mappo"
    run_mappo(tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                                max_steps=2, save_steps=1, per_device_train_batch_size=2,
                                mappo_questions_per_rollout=2, mappo_rollout_batch_size=2))
    return out


def _argv(run_dir: Path, eval_file: Path, url: str, work: Path, warm: Path) -> list[str]:
    return ["--run-dir", str(run_dir), "--eval-file", str(eval_file), "--retriever-url", url,
            "--model", "tiny", "--k", "5", "--scoring", "demo", "--precision", "fp32",
            "--max-eval", "2", "--warm-start", str(warm), "--work-dir", str(work)]


def test_the_curve_of_a_two_step_run_and_a_rerun_that_evaluates_nothing(
        bench, mappo_run: Path, tiny_model_dir: Path, tiny_world_dir: Path,
        tiny_server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    work = tmp_path / "curve"
    argv = _argv(mappo_run, tiny_world_dir / "dev.jsonl", tiny_server_url, work, tiny_model_dir)
    # the checkpoints are evaluated as the trainer wrote them (weights, config, tokenizer)
    assert (mappo_run / "checkpoint-1" / "tokenizer.json").is_file()
    bench.main(argv)
    result = json.loads((work / "dev_curve.json").read_text())
    assert [p["step"] for p in result["points"]] == [0, 1, 2]
    assert [p["source"] for p in result["points"]] == ["warm_start", "checkpoint", "checkpoint"]
    assert result["final_model_evaluated"] is True  # checkpoint-2 holds the final weights
    for point in result["points"]:
        dev = point["dev"]
        assert dev["num_questions"] == 2
        for key in ("f1", "f1_se", "em", "candidate_support_recall", "mean_subquestions",
                    "selector_support_recall", "mean_selected"):
            assert isinstance(dev[key], float) and math.isfinite(dev[key]), (point["step"], key)
        # the precision of no selected document is undefined: None, as the evaluation says
        precision = dev["selector_support_precision"]
        assert (precision is None and dev["mean_selected"] == 0.0) or math.isfinite(precision)
        if point["step"] == 0:
            assert point["paired"] is None
        else:
            assert point["paired"]["n"] == 2 and math.isfinite(point["paired"]["gain"])
    best = result["best"]
    top = max(p["dev"]["f1"] for p in result["points"])
    assert best["f1"] == top and best["step"] == min(
        p["step"] for p in result["points"] if p["dev"]["f1"] == top)
    # write_result: the commit and no path of this machine
    assert result["code"] and result["config"]["run_dir"].startswith("<tmp>/")
    assert (work / "dev_curve.png").stat().st_size > 0
    table = capsys.readouterr().out
    assert f"best step on dev: {best['step']}" in table and "3 step(s) evaluated" in table

    kept = {p: p.stat().st_mtime_ns for p in work.glob("step-*/point.json")}
    assert len(kept) == 3

    def no_evaluation(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a rerun evaluated a step again")

    monkeypatch.setattr(bench.learning_signal, "evaluate", no_evaluation)
    bench.main(argv)
    assert "0 step(s) evaluated" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in work.glob("step-*/point.json")} == kept
    assert json.loads((work / "dev_curve.json").read_text())["points"] == result["points"]


@pytest.mark.parametrize("missing", ["run_dir", "eval_file"])
def test_a_missing_run_or_dev_file_is_one_line_and_exit_2(bench, tmp_path: Path, capsys,
                                                          missing: str) -> None:
    run_dir, eval_file = tmp_path / "run", tmp_path / "dev.jsonl"
    if missing != "run_dir":
        (run_dir / "checkpoint-1").mkdir(parents=True)
    if missing != "eval_file":
        eval_file.write_text("{}\n")
    work = tmp_path / "work"
    with pytest.raises(SystemExit) as stop:
        bench.main(["--run-dir", str(run_dir), "--eval-file", str(eval_file),
                    "--work-dir", str(work), "--model", "tiny"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--{missing.replace('_', '-')}" in err
    assert "no such" in err
    assert not work.exists()


def test_an_empty_run_folder_without_follow_is_refused(bench, tmp_path: Path, capsys) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "dev.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit) as stop:
        bench.main(["--run-dir", str(tmp_path / "run"), "--eval-file",
                    str(tmp_path / "dev.jsonl"), "--work-dir", str(tmp_path / "work")])
    assert stop.value.code == 2
    assert "no checkpoint-N folder" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


# -- the pure parts ----------------------------------------------------------------------------

def _folder(path: Path, weights: bytes = b"w") -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(weights)
    return path


def _final(run: Path, step: int, mtime: float | None = None) -> None:
    (run / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if mtime is not None:
        os.utime(run / "trainer_state.json", (mtime, mtime))


def test_checkpoints_in_numeric_order_and_the_final_model(bench, tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (10, 9, 1):
        _folder(run / f"checkpoint-{step}")
    for other in ("checkpoint-x", ".checkpoint-11.parts", "checkpoint-12.tmp"):
        (run / other).mkdir()
    (run / "checkpoint-13").write_text("a file, not a checkpoint")
    points, complete = bench.model_points(run, None)
    assert [(p.step, p.source) for p in points] == [(1, "checkpoint"), (9, "checkpoint"),
                                                   (10, "checkpoint")]
    assert not complete
    _final(run, 12)  # the last step was no save step: the final model is its own point
    points, complete = bench.model_points(run, tmp_path / "warm")
    assert [(p.step, p.source) for p in points] == [
        (0, "warm_start"), (1, "checkpoint"), (9, "checkpoint"), (10, "checkpoint"),
        (12, "final")]
    assert complete and points[-1].path == run and points[0].path == tmp_path / "warm"
    _final(run, 10)  # the last step's checkpoint holds the final weights: listed once
    points, complete = bench.model_points(run, None)
    assert [(p.step, p.source) for p in points] == [(1, "checkpoint"), (9, "checkpoint"),
                                                   (10, "checkpoint")] and complete
    newest = (run / "checkpoint-10").stat().st_mtime
    _final(run, 4, mtime=newest - 100)  # an earlier run's final model in a reused folder
    points, complete = bench.model_points(run, None)
    assert not complete and [p.step for p in points] == [1, 9, 10]


def _point(step: int, f1: float) -> dict[str, Any]:
    return {"step": step, "dev": {"f1": f1}}


def test_the_best_step_is_the_highest_f1_and_the_earliest_of_equal_ones(bench) -> None:
    assert bench.best_step([]) is None
    points = [_point(0, 0.30), _point(5, 0.42), _point(10, 0.40), _point(15, 0.42)]
    assert bench.best_step(points)["step"] == 5
    assert bench.best_step(list(reversed(points)))["step"] == 5
    assert bench.best_step([_point(0, 0.5), _point(5, 0.1)])["step"] == 0  # RL did not help


def test_the_paired_gain_over_step_0_by_hand(bench) -> None:
    step0 = {"a": 0.0, "b": 1.0, "c": 0.5}
    step5 = {"a": 1.0, "b": 1.0, "c": 0.0}  # diffs 1, 0, -0.5
    points = bench.with_gains([_point(0, 0.5), _point(5, 2 / 3)], {0: step0, 5: step5})
    assert points[0]["paired"] is None
    gain = points[1]["paired"]
    # mean 1/6; sample sd sqrt(((5/6)^2 + (1/6)^2 + (2/3)^2) / 2) over sqrt(3)
    assert gain["n"] == 3 and gain["gain"] == pytest.approx(1 / 6)
    sd = math.sqrt(((5 / 6) ** 2 + (1 / 6) ** 2 + (2 / 3) ** 2) / 2)
    assert gain["gain_se"] == pytest.approx(sd / math.sqrt(3))
    without_step0 = bench.with_gains([_point(5, 0.1)], {5: step5})
    assert without_step0[0]["paired"] is None


def test_follow_waits_for_checkpoints_and_stops_at_the_final_model(
        bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """A run that saves checkpoint-2 while the bench waits, then its final model at step 3:
    each is evaluated once, the bench says what it waits for and stops after the final."""
    run, warm = tmp_path / "run", _folder(tmp_path / "warm", b"warm")
    _folder(run / "checkpoint-1", b"one")
    (tmp_path / "dev.jsonl").write_text("{}\n")
    scores = {"warm": 0.25, "one": 0.75, "two": 0.5, "three": 0.5}
    evaluated: list[str] = []

    def fake_evaluate(model: Path, args: Any, out: Path, base: Any = None) -> dict[str, Any]:
        name = (model / "model.safetensors").read_text()
        evaluated.append(name)
        out.mkdir(parents=True)
        f1 = scores[name]
        (out / "predictions.jsonl").write_text(
            "".join(json.dumps({"id": q, "scores": {"f1": f1}}) + "\n" for q in ("q1", "q2")))
        return {"f1": f1, "f1_se": 0.0, "em": f1, "acc": f1, "num_questions": 2, "agents": {}}

    def training(seconds: float) -> None:  # the run goes on while the bench sleeps
        if not (run / "checkpoint-2").exists():
            _folder(run / "checkpoint-2", b"two")
        else:
            (run / "model.safetensors").write_text("three")
            (run / "config.json").write_text("{}")
            _final(run, 3)

    monkeypatch.setattr(bench.learning_signal, "evaluate", fake_evaluate)
    monkeypatch.setattr(bench.time, "sleep", training)
    bench.main(["--run-dir", str(run), "--eval-file", str(tmp_path / "dev.jsonl"),
                "--warm-start", str(warm), "--work-dir", str(tmp_path / "work"),
                "--follow", "--poll-seconds", "30", "--precision", "fp32"])
    assert evaluated == ["warm", "one", "two", "three"]
    out = capsys.readouterr().out
    assert out.count("[follow] waiting for new checkpoints") == 2
    assert "next look in 30 s" in out
    result = json.loads((tmp_path / "work" / "dev_curve.json").read_text())
    assert [(p["step"], p["source"]) for p in result["points"]] == [
        (0, "warm_start"), (1, "checkpoint"), (2, "checkpoint"), (3, "final")]
    assert result["final_model_evaluated"] and result["best"]["step"] == 1
    assert result["best"]["paired"]["gain"] == pytest.approx(0.5)


def test_a_work_folder_of_another_curve_is_refused(bench, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    _folder(run / "checkpoint-1")
    for name in ("dev.jsonl", "test.jsonl"):
        (tmp_path / name).write_text("{}\n")
    work = tmp_path / "work"
    argv = ["--run-dir", str(run), "--eval-file", str(tmp_path / "dev.jsonl"),
            "--work-dir", str(work), "--precision", "fp32"]
    args = bench.build_parser().parse_args(argv)
    bench.resolve(args)
    bench.Curve(args).check_settings()  # the curve of dev.jsonl
    assert sorted(p.name for p in work.iterdir()) == ["settings.json"]
    with pytest.raises(SystemExit) as stop:
        bench.main([*argv[:2], "--eval-file", str(tmp_path / "test.jsonl"), *argv[4:]])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "eval_file=" in err and "give another --work-dir" in err
    assert sorted(p.name for p in work.iterdir()) == ["settings.json"]


def test_lora_checkpoints_without_the_warm_start_are_refused(bench, tmp_path: Path,
                                                              capsys) -> None:
    (tmp_path / "run" / "checkpoint-1").mkdir(parents=True)
    (tmp_path / "run" / "checkpoint-1" / "adapter_config.json").write_text("{}")
    (tmp_path / "dev.jsonl").write_text("{}\n")
    with pytest.raises(SystemExit) as stop:
        bench.main(["--run-dir", str(tmp_path / "run"), "--eval-file",
                    str(tmp_path / "dev.jsonl"), "--work-dir", str(tmp_path / "work")])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "LoRA adapters" in err and "--warm-start" in err
    assert not (tmp_path / "work").exists()


def test_every_evaluates_a_coarse_curve_then_fills_it_in(
        bench, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Checkpoints 1-6, the final model at step 6 (its checkpoint): ``--every 4`` evaluates
    steps 0, 4 and 6 (the final one), ``--every 2`` then step 2 only, no ``--every`` the rest;
    nothing is evaluated twice and the curve holds every step."""
    run, warm = tmp_path / "run", _folder(tmp_path / "warm", b"0")
    for step in range(1, 7):
        _folder(run / f"checkpoint-{step}", str(step).encode())
    _final(run, 6)
    (tmp_path / "dev.jsonl").write_text("{}\n")
    evaluated: list[int] = []

    def fake_evaluate(model: Path, args: Any, out: Path, base: Any = None) -> dict[str, Any]:
        step = int((model / "model.safetensors").read_text())
        evaluated.append(step)
        out.mkdir(parents=True)
        (out / "predictions.jsonl").write_text(
            json.dumps({"id": "q1", "scores": {"f1": step / 10}}) + "\n")
        return {"f1": step / 10, "f1_se": 0.0, "em": 0.0, "acc": 0.0, "num_questions": 1,
                "agents": {}}

    monkeypatch.setattr(bench.learning_signal, "evaluate", fake_evaluate)
    argv = ["--run-dir", str(run), "--eval-file", str(tmp_path / "dev.jsonl"),
            "--warm-start", str(warm), "--work-dir", str(tmp_path / "work"),
            "--precision", "fp32"]
    steps_on_curve = []
    for every, expected in ((["--every", "4"], [0, 4, 6]), (["--every", "2"], [2]),
                            ([], [1, 3, 5])):
        evaluated.clear()
        bench.main([*argv, *every])
        assert evaluated == expected
        result = json.loads((tmp_path / "work" / "dev_curve.json").read_text())
        steps_on_curve.append([p["step"] for p in result["points"]])
    assert steps_on_curve == [[0, 4, 6], [0, 2, 4, 6], [0, 1, 2, 3, 4, 5, 6]]
    assert result["best"]["step"] == 6 and result["final_model_evaluated"]
    with pytest.raises(SystemExit) as stop:
        bench.main([*argv, "--every", "0"])
    assert stop.value.code == 2 and "--every 0" in capsys.readouterr().err
    # a run whose only checkpoint is no multiple of N is a run, not an empty folder
    short = tmp_path / "short"
    _folder(short / "checkpoint-3", b"3")
    evaluated.clear()
    bench.main(["--run-dir", str(short), "--eval-file", str(tmp_path / "dev.jsonl"),
                "--warm-start", str(warm), "--work-dir", str(tmp_path / "short_work"),
                "--precision", "fp32", "--every", "4"])
    assert evaluated == [0]


def test_thinned_keeps_step_0_the_final_model_and_the_multiples(bench, tmp_path: Path) -> None:
    def point(step: int, source: str = "checkpoint"):
        return bench.ModelPoint(step, source, tmp_path)

    points = [point(0, "warm_start"), *(point(s) for s in (3, 6, 9, 12, 13))]
    assert [p.step for p in bench.thinned(points, False, 6)] == [0, 6, 12]
    assert [p.step for p in bench.thinned(points, True, 6)] == [0, 6, 12, 13]  # 13: the last
    assert [p.step for p in bench.thinned([*points[:-1], point(14, "final")], False, 6)] == [
        0, 6, 12, 14]
    assert bench.thinned(points, True, None) == points
