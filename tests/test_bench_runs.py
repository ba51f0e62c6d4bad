"""The training benches' shared bookkeeping (bench/bench_runs.py): what a run's last steps are
summarised by, which checkpoint a run resumes from, and that a finished stage is not run
again."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from tests.bench_fixtures import HandClock, import_bench, load_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def runs():
    return import_bench("bench_runs")


def test_training_tail_reads_every_logged_key_of_the_last_steps(runs, tmp_path: Path) -> None:
    history = [
        {"step": 1, "reward": 0.1, "search/turns": 1.0, "loss": 0.5},
        {"step": 2, "reward": 0.3, "search/turns": 2.0, "loss": 0.4},
        {"step": 3, "reward": 0.5, "search/turns": 4.0},
        {"train_runtime": 12.0, "train_loss": 0.45},  # the end-of-training summary
    ]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    # the web UI's progress log has only the reward: the tail must not be read from it
    (tmp_path / "trainer_log.jsonl").write_text('{"reward": 9.0}\n')
    tail = runs.training_tail(tmp_path, lambda k: k == "reward" or k.startswith("search/"),
                              last=2)
    assert tail == pytest.approx({"reward": 0.4, "search/turns": 3.0})
    assert runs.training_tail(tmp_path / "missing", lambda k: True) == {}


def test_training_series_is_each_key_at_every_rl_step(runs, tmp_path: Path) -> None:
    history = [
        {"step": 1, "reward": 0.1, "grpo/zero_variance_fraction": 0.5},
        {"step": 2, "reward": 0.3},  # this step did not log the fraction
        {"step": 3, "reward": 0.5, "grpo/zero_variance_fraction": 0.25},
        {"train_runtime": 12.0, "train_loss": 0.45},  # the end-of-training summary
    ]
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    series = runs.training_series(tmp_path, ("reward", "grpo/zero_variance_fraction", "kl"))
    assert series == {"reward": [0.1, 0.3, 0.5],
                      "grpo/zero_variance_fraction": [0.5, None, 0.25]}  # "kl": never logged
    assert runs.training_series(tmp_path / "missing", ("reward",)) == {}


def test_a_finished_stage_is_read_back_not_run_again(runs, tmp_path: Path) -> None:
    calls = []

    def produce() -> dict:
        calls.append(1)
        return {"f1": 0.5}

    first = runs.stage(tmp_path, "sft", produce, "bench/search_agent.py")
    second = runs.stage(tmp_path, "sft", produce, "bench/search_agent.py")
    assert calls == [1]
    assert first == second and first["f1"] == 0.5 and "seconds" in first and "code" in first
    assert json.loads((tmp_path / "sft" / "result.json").read_text()) == first


def test_a_stage_resumed_after_a_kill_counts_every_attempt(runs, tmp_path: Path,
                                                            monkeypatch) -> None:
    """A failed attempt (30 s) and one killed after its last heartbeat (recorded: 100 s, as the
    heartbeat thread writes it) are added to the attempt that finishes (5 s)."""
    clock = HandClock()
    real = runs.AttemptClock
    monkeypatch.setattr(runs, "AttemptClock",
                        lambda folder: real(folder, heartbeat_s=3600.0, clock=clock))

    def fail() -> dict:
        clock.now += 30.0
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        runs.stage(tmp_path, "rl", fail, "bench/search_agent.py")
    attempt = tmp_path / "rl" / "attempt.json"
    assert json.loads(attempt.read_text()) == {"attempts": 1, "earlier_seconds": 0.0,
                                               "seconds": 30.0}
    # the second attempt is SIGKILLed: what is on disk is its last heartbeat
    runs.atomic_write_json(attempt, {"attempts": 2, "earlier_seconds": 30.0, "seconds": 100.0})

    def succeed() -> dict:
        clock.now += 5.0
        return {"f1": 0.25}

    result = runs.stage(tmp_path, "rl", succeed, "bench/search_agent.py")
    assert result["seconds"] == 135.0 and result["attempts"] == 3 and result["f1"] == 0.25
    assert not attempt.exists()


def test_the_attempt_clock_heartbeat_writes_while_the_stage_runs(runs, tmp_path: Path) -> None:
    """The thread keeps the attempt's seconds on disk without waiting for the stage's end."""
    clock = HandClock()
    path = tmp_path / "attempt.json"
    with runs.AttemptClock(tmp_path, heartbeat_s=0.01, clock=clock):
        clock.now += 42.0
        for _ in range(500):
            if path.is_file() and json.loads(path.read_text())["seconds"] == 42.0:
                break
            threading.Event().wait(0.01)
        assert json.loads(path.read_text())["seconds"] == 42.0


def test_archived_stages_resume_a_fresh_checkout(runs, tmp_path: Path) -> None:
    work, archive = tmp_path / "work", tmp_path / "archive"
    runs.stage(work, "data", lambda: {"rows": 3}, "bench/toa_data.py")
    (work / "sft-seed1").mkdir(parents=True)  # a stage still running: nothing to keep yet
    runs.archive_stages(work, archive)
    assert sorted(p.parent.name for p in archive.glob("*/result.json")) == ["data"]

    fresh = tmp_path / "fresh"  # the work folder of a new checkout: gone
    assert runs.restore_archived_stages(fresh, archive) == ["data"]
    calls = []
    kept = runs.stage(fresh, "data", lambda: calls.append(1) or {"rows": 0}, "bench/toa_data.py")
    assert kept["rows"] == 3 and not calls
    # a stage the work folder already has is never overwritten by the archive
    (archive / "data" / "result.json").write_text('{"rows": 99}')
    assert runs.restore_archived_stages(fresh, archive) == []
    assert json.loads((fresh / "data" / "result.json").read_text())["rows"] == 3


def test_paired_gain_by_hand(runs) -> None:
    before = {"a": 0.0, "b": 1.0, "c": 0.5}
    after = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0}  # d: not in before, left out
    gain = runs.paired_gain(before, after)
    # diffs 1, 0, -0.5: mean 1/6, sample sd sqrt(((5/6)^2 + (1/6)^2 + (2/3)^2) / 2) = 0.7638
    assert gain["gain"] == pytest.approx(1 / 6)
    assert gain["gain_se"] == pytest.approx(0.76376 / 3 ** 0.5, rel=1e-4)
    assert gain["n"] == 3


def test_rollout_limits_are_the_mappo_configs_own(runs, tmp_path: Path) -> None:
    config = tmp_path / "mappo.yaml"
    config.write_text("mappo_max_new_tokens_qr: 48\nmappo_max_new_tokens_selector: 24\n"
                      "mappo_max_new_tokens_generator: 16\n")
    assert runs.rollout_limits(str(config)) == [
        "--max_new_tokens_qr", "48", "--max_new_tokens_selector", "24",
        "--max_new_tokens_generator", "16"]


def test_decision_bench_repeats_only_the_known_questions() -> None:
    bench = load_bench("decision_agent")
    rows = [{"id": "w1", "group": "world"}, {"id": "k1", "group": "known"},
            {"id": "w2", "group": "world"}]
    weighted = bench.known_weighted_rows(rows, 3)
    assert [row["id"] for row in weighted] == ["w1", "k1", "k1-r2", "k1-r3", "w2"]
    assert all(row["group"] == "known" for row in weighted[1:4])
    assert bench.known_weighted_rows(rows, 1) == rows


def test_decision_bench_reports_the_sampled_evaluations_apart() -> None:
    bench = load_bench("decision_agent")
    group = {"num_questions": 2, "em": 0.5, "f1": 0.5, "retrieval_rate": 0.5,
             "mean_searches": 0.5}
    sft = {"summary": {"num_questions": 2, "em": 0.5, "f1": 0.5, "retrieval_rate": 0.5,
                       "mean_searches": 0.5, "by_group": {"known": group}},
           "per_question_f1": [1.0, 0.0]}
    result = {"config": {"cost": 0.2, "sampled_eval": "known", "sampled_repeats": 3},
              "runs": {"sft": sft},
              "sampled": {"sft": {"f1": 0.75, "em": 0.5, "retrieval_rate": 0.25,
                                  "mean_searches": 0.5, "num_questions": 39, "repeats": 3}}}
    public = bench.public(result)
    assert public["sampled"]["group"] == "known" and public["sampled"]["repeats"] == 3
    assert "per_question_f1" not in public["runs"]["sft"]
    table = bench.format_table(public).splitlines()
    assert table[-4] == "sampled decoding, test group known, 3 repeats:"
    assert table[-1] == "| sft | 39 | 75.0 | 50.0 | 25 | 0.50 |"


def test_search_bench_names_runs_by_variant_and_counts_its_target(runs) -> None:
    import argparse

    bench = load_bench("search_agent")
    args = argparse.Namespace(seeds=[1, 2], nomask_seeds=[1], single_seeds=[3], variant="mean")
    assert bench.plan(args) == [
        ("grpo-seed1-mean", "multi", 1, []),
        ("grpo-seed2-mean", "multi", 2, []),
        ("grpo-nomask-seed1-mean", "multi", 1, ["mappo_search_mask_information=false"]),
        ("grpo-single-seed3-mean", "single", 3, ["mappo_search_max_queries=1"]),
    ]
    assert bench.plan(argparse.Namespace(seeds=[1], nomask_seeds=[], single_seeds=[],
                                         variant=""))[0][0] == "grpo-seed1"

    def run(arm: str, seed: int | None, f1: list[float]) -> dict:
        return {"arm": arm, "seed": seed, "summary": {},
                "per_question_f1": {"q1": f1[0], "q2": f1[1]}}

    result = {"config": {"variant": "mean"}, "runs": {
        "sft-multi": run("multi", None, [0.5, 0.5]),
        "grpo-seed1-mean": run("multi", 1, [1.0, 0.5]),   # +0.25: above
        "grpo-seed2-mean": run("multi", 2, [0.5, 0.0]),   # -0.25: below
        "grpo-nomask-seed1-mean": run("multi", 1, [1.0, 1.0]),  # a comparison, not the target
    }}
    public = bench.public(result)
    assert public["target_met"] == "1 of 2 seeds"
    assert public["runs"]["grpo-seed1-mean"]["above_sft"] is True
    assert public["runs"]["grpo-seed2-mean"]["gain_f1"]["gain"] == pytest.approx(-0.25)
    assert "above_sft" not in public["runs"]["grpo-nomask-seed1-mean"]
    assert all("per_question_f1" not in r for r in public["runs"].values())


def test_toa_bench_datasets_round_trip_through_the_archive(runs, tmp_path: Path,
                                                           monkeypatch) -> None:
    import argparse

    import toa_data

    from mmoa.data.registry import read_dataset_info, register_datasets

    data, archive = tmp_path / "data", tmp_path / "archive"
    monkeypatch.setattr(toa_data, "DATASET_DIR", data)
    args = argparse.Namespace(name="toa_bench")
    entries = {}
    for dataset in toa_data.DATASETS:
        name = toa_data.dataset_name(args, dataset)
        data.mkdir(exist_ok=True)
        (data / f"{name}.json").write_text(json.dumps([{"instruction": dataset}]))
        entries[name] = {"file_name": f"{name}.json", "formatting": "alpaca"}
    register_datasets(data, {**entries, "other": {"file_name": "other.json"}})
    toa_data.archive_datasets(args, archive)

    monkeypatch.setattr(toa_data, "DATASET_DIR", tmp_path / "fresh")
    toa_data.restore_datasets(args, archive)
    assert read_dataset_info(tmp_path / "fresh") == entries  # only the bench's three
    for name in entries:
        assert (tmp_path / "fresh" / f"{name}.json").read_text() == \
            (data / f"{name}.json").read_text()


def test_a_killed_stage_names_its_signal(runs, tmp_path: Path) -> None:
    """A stage the kernel killed (SIGKILL, as the out-of-memory killer does) says so, where
    the bare exit status -9 read like the stage's own failure."""
    assert runs.exit_reason(3) == "3"
    assert runs.exit_reason(-15) == "-15, SIGTERM"
    log = tmp_path / "stage.log"
    with pytest.raises(SystemExit) as raised:
        runs.run_logged([sys.executable, "-c",
                         "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], log)
    message = str(raised.value)
    assert message.startswith("failed (-9, SIGKILL, out of memory? see dmesg): ")
    assert message.endswith(f"see {log}")
