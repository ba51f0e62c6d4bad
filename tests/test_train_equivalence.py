"""``mmoa-cli train`` with an SFT config is ``llamafactory-cli train``: the demo SFT recipe with
the same ``key=value`` overrides, run by each CLI into its own folder, gives the same files, the
same losses and the same weights."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SFT_YAML = ROOT / "LLaMA-Factory" / "examples" / "demo" / "tiny_full_sft.yaml"
#: Content that depends on the wall clock or the output folder, not on what was trained.
TIMING_KEYS = {"elapsed_time", "remaining_time", "throughput", "train_runtime",
               "train_samples_per_second", "train_steps_per_second", "total_flos"}
#: Binary or path-bearing files compared by presence only.
PRESENCE_ONLY = {"training_args.bin", "training_loss.png", "rng_state.pth", "optimizer.pt",
                 "scheduler.pt"}
#: What only ``mmoa-cli`` writes: the libraries' INFO lines, kept off the console (mmoa.console).
OURS_ONLY = {"library.log"}

pytestmark = pytest.mark.slow


def _write_alpaca(world_dir: Path, out: Path) -> None:
    """A tiny Alpaca set (question -> answer) from the demo world, registered as ``tiny_qa``."""
    from mmoa.fileio import atomic_write_json, read_jsonl

    rows = [{"instruction": r["question"], "input": "", "output": r["answers"][0]}
            for r in read_jsonl(world_dir / "train.jsonl")[:24]]
    atomic_write_json(out / "tiny_qa.json", rows)
    atomic_write_json(out / "dataset_info.json", {"tiny_qa": {"file_name": "tiny_qa.json"}})


def _llamafactory_cli() -> list[str]:
    found = shutil.which("llamafactory-cli") or str(Path(sys.executable).parent
                                                    / "llamafactory-cli")
    return [found] if os.access(found, os.X_OK) else [sys.executable, "-m", "llamafactory.cli"]


def _run(command: list[str], cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "LLaMA-Factory" / "src"), os.environ.get("PYTHONPATH", "")]),
        "CUDA_VISIBLE_DEVICES": "", "LLAMAFACTORY_VERBOSITY": "WARN"}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, f"{command}:\n{result.stderr[-4000:]}"


@pytest.fixture(scope="module")
def two_runs(tiny_model_dir: Path, tiny_world_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("train_equivalence")
    data = base / "data"
    data.mkdir()
    _write_alpaca(tiny_world_dir, data)

    def overrides(out: Path) -> list[str]:
        return [f"model_name_or_path={tiny_model_dir}", "dataset=tiny_qa",
                f"dataset_dir={data}", f"output_dir={out}", "max_steps=3", "logging_steps=1",
                "save_strategy=steps", "save_steps=2", "save_only_model=false",
                "per_device_train_batch_size=2",
                "gradient_accumulation_steps=1", "cutoff_len=128",
                "preprocessing_num_workers=1", "warmup_ratio=0.0", "report_to=none"]

    # The same folder name in both: it is written into README.md (the model card).
    ours, theirs = base / "mmoa" / "out", base / "llamafactory" / "out"
    _run([sys.executable, "-m", "mmoa.cli", "train", str(SFT_YAML), *overrides(ours)], base)
    _run([*_llamafactory_cli(), "train", str(SFT_YAML), *overrides(theirs)], base)
    return ours, theirs


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def _result_files(folder: Path) -> set[str]:
    """The training's own files, without the console log that only our CLI writes."""
    return {name for name in _files(folder) if name not in OURS_ONLY}


def _without_timing(value):
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def _close(a, b, path: str = "") -> None:
    """Equal structures, numbers within a float tolerance."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6), path
    else:
        assert a == b, path


def test_the_same_result_files(two_runs: tuple[Path, Path]) -> None:
    ours, theirs = two_runs
    assert _files(ours) >= OURS_ONLY, "mmoa-cli keeps the libraries' INFO lines in library.log"
    files = _result_files(ours)
    assert files == _result_files(theirs)
    for expected in ("model.safetensors", "config.json", "tokenizer.json", "trainer_log.jsonl",
                     "trainer_state.json", "all_results.json", "train_results.json",
                     "training_loss.png", "checkpoint-2/model.safetensors"):
        assert expected in files, expected


def test_the_same_logs_and_losses(two_runs: tuple[Path, Path]) -> None:
    ours, theirs = two_runs
    for name in ("all_results.json", "train_results.json", "trainer_state.json"):
        _close(_without_timing(json.loads((ours / name).read_text())),
               _without_timing(json.loads((theirs / name).read_text())), name)
    logs = [[_without_timing(json.loads(line)) for line in
             (folder / "trainer_log.jsonl").read_text().splitlines()] for folder in two_runs]
    assert [e["current_steps"] for e in logs[0]][:3] == [1, 2, 3]
    _close(logs[0], logs[1], "trainer_log.jsonl")
    final = json.loads((ours / "all_results.json").read_text())["train_loss"]
    assert final == pytest.approx(json.loads((theirs / "all_results.json").read_text())
                                  ["train_loss"], rel=1e-5)


def test_the_same_weights_and_configs(two_runs: tuple[Path, Path], tiny_model_dir: Path) -> None:
    from safetensors.torch import load_file

    ours, theirs = two_runs
    start = load_file(tiny_model_dir / "model.safetensors")
    trained = load_file(ours / "model.safetensors")
    assert any(not trained[k].equal(start[k]) for k in start), "the runs must train something"
    for name in sorted(_result_files(ours)):
        if Path(name).name in PRESENCE_ONLY:
            continue
        if name.endswith(".safetensors"):
            a, b = load_file(ours / name), load_file(theirs / name)
            assert a.keys() == b.keys(), name
            for key in a:
                assert a[key].allclose(b[key], rtol=1e-5, atol=1e-6), f"{name}:{key}"
        elif name.endswith((".json", ".jsonl", ".png")):
            continue  # JSON compared above (timing aside); plots drawn from the same numbers
        else:
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
