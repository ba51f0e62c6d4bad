"""The commands users know from MMOA-RAG, run where users run them, on a fresh clone.

``cd LLaMA-Factory && bash run_sft.sh`` (and ``run_mappo.sh``), ``cd evaluate && python
evaluate_qr_s_g.py`` and ``bash run_demo.sh --help`` either do their job or say in two lines
per missing thing what is missing and the exact command that makes it: no traceback, no hub
lookup. The scripts run in a temporary copy of the repository's entry points (models/ and data/
hold only their README files), so no test touches the real data/ or models/ folders, and every
case fails before anything is loaded or trained.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mmoa.cli import build_parser, main
from mmoa.preflight import (
    CALLER_DIR_ENV,
    PreflightError,
    check_train_config,
    command_here,
    dataset_problems,
    model_problem,
)
from tests.retrieval_fixtures import free_port

ROOT = Path(__file__).resolve().parents[1]
#: What a fresh clone has of the entry points and of what they read (configs, READMEs).
CLONE_FILES = (
    "run_demo.sh", "LLaMA-Factory/run_sft.sh", "LLaMA-Factory/run_mappo.sh",
    "LLaMA-Factory/train_with_config.sh", "evaluate/evaluate_qr_s_g.py", "data/README.md",
    "models/README.md", "models/get_smollm2.py",
)
TIMEOUT = 120


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A fresh clone's entry points and example configs, without any model or dataset."""
    root = tmp_path / "repo"
    for name in CLONE_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, root / name)
    shutil.copytree(ROOT / "LLaMA-Factory" / "examples", root / "LLaMA-Factory" / "examples")
    return root


def _env() -> dict[str, str]:
    """The project's interpreter and ``mmoa-cli`` first on PATH; offline; no GPU."""
    bin_dir = Path(sys.executable).parent
    env = {key: value for key, value in os.environ.items() if key != CALLER_DIR_ENV}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
               VIRTUAL_ENV=str(bin_dir.parent), HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="",
               COLUMNS="100")
    return env


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


def _assert_short_error(result: subprocess.CompletedProcess[str], max_lines: int) -> list[str]:
    """Non-zero exit, no traceback, at most ``max_lines`` lines; returns the lines."""
    output = (result.stdout + result.stderr).strip()
    lines = output.splitlines()
    assert result.returncode != 0, output
    assert "Traceback" not in output and "huggingface.co" not in output, output
    assert 1 <= len(lines) <= max_lines, output
    return lines


# ---------------------------------------------------------------------------------------------
# run_sft.sh / run_mappo.sh (mmoa-cli train's pre-flight check)


def test_run_sft_on_a_fresh_clone_names_the_model_and_data_commands(clone: Path) -> None:
    before = _files(clone)
    result = _run(["bash", "run_sft.sh"], clone / "LLaMA-Factory")
    lines = _assert_short_error(result, max_lines=4)
    text = "\n".join(lines)
    assert "models/smollm2-135m-instruct" in text
    assert "make it with: cd .. && python models/get_smollm2.py" in text
    assert "'demo_sft'" in text and "dataset_info.json" in text
    assert "cd .. && bash run_demo.sh" in text and "qr_s_g_sft_data_alpaca.py" in text
    assert _files(clone) == before, "nothing is written before the checks pass"


def test_run_mappo_on_a_fresh_clone_names_the_warm_start_and_data_commands(clone: Path) -> None:
    """Reported as MAPPO's other start-up errors are; the demo server is named too unless one
    happens to answer on its port."""
    result = _run(["bash", "run_mappo.sh"], clone / "LLaMA-Factory")
    lines = _assert_short_error(result, max_lines=6)
    text = "\n".join(lines)
    assert result.returncode == 1 and lines[0].startswith("[mappo] error: model_name_or_path")
    assert "saves/smollm2-135m/full/sft" in text
    assert ("cd .. && bash LLaMA-Factory/run_sft.sh "
            "LLaMA-Factory/examples/demo/smollm2_full_sft.yaml") in text
    assert "'demo_mappo'" in text
    assert ("python data_builders/make_demo_world.py --out data/demo && "
            "python data_builders/get_ppo_data_alpaca.py") in text


def test_run_sft_with_the_model_but_no_dataset_names_only_the_dataset(clone: Path) -> None:
    """A config path relative to the user's folder works; the model check passes on a folder
    with config.json, so only the dataset is reported (before LLaMA-Factory is called)."""
    model = clone / "models" / "smollm2-135m-instruct"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (clone / "data" / "dataset_info.json").write_text(json.dumps({"other": {"file_name": "o"}}))
    result = _run(["bash", "run_sft.sh", "examples/demo/smollm2_full_sft.yaml"],
                  clone / "LLaMA-Factory")
    lines = _assert_short_error(result, max_lines=2)
    assert "dataset 'demo_sft' is not registered in data/dataset_info.json" in lines[0]
    assert "(registered: other)" in lines[0]
    assert lines[1].startswith("  make it with: cd .. && bash run_demo.sh")


def test_without_the_environment_the_entry_points_name_setup_env(clone: Path) -> None:
    """A fresh clone before ``bash setup_env.sh``: no mmoa-cli on PATH, no importable mmoa."""
    result = subprocess.run(["bash", "run_sft.sh"], cwd=clone / "LLaMA-Factory",
                            env={"PATH": "/usr/bin:/bin", "HOME": str(clone)},
                            capture_output=True, text=True, timeout=TIMEOUT, check=False)
    lines = _assert_short_error(result, max_lines=2)
    assert result.returncode == 2 and lines[1] == f"  make it with: cd {clone} && bash setup_env.sh"
    result = _run([sys.executable, "-S", "evaluate_qr_s_g.py"], clone / "evaluate")
    lines = _assert_short_error(result, max_lines=2)
    assert "bash setup_env.sh && source .venv/bin/activate" in lines[1]


def test_run_sft_and_run_mappo_help(clone: Path) -> None:
    for script, config in (("run_sft.sh", "smollm2_full_sft.yaml"),
                           ("run_mappo.sh", "smollm2_full_mappo.yaml")):
        result = _run(["bash", script, "--help"], clone / "LLaMA-Factory")
        assert result.returncode == 0, result.stderr
        assert f"bash LLaMA-Factory/{script} CONFIG.yaml" in result.stdout
        assert f"Default CONFIG: LLaMA-Factory/examples/demo/{config}" in result.stdout
        assert "FORCE_TORCHRUN" in result.stdout


# ---------------------------------------------------------------------------------------------
# evaluate/evaluate_qr_s_g.py (mmoa-cli eval)


def test_evaluate_without_arguments_prints_a_runnable_example(clone: Path) -> None:
    result = _run([sys.executable, "evaluate_qr_s_g.py"], clone / "evaluate")
    lines = _assert_short_error(result, max_lines=2)
    assert lines[0].startswith("evaluate_qr_s_g.py: error: --model_name_or_path and "
                               "--output_dir are required")
    assert "cd .. && python evaluate/evaluate_qr_s_g.py --model_name_or_path" in lines[1]


def test_evaluate_with_a_missing_model_and_data_file_names_their_commands(clone: Path) -> None:
    result = _run([sys.executable, "evaluate_qr_s_g.py", "--model_name_or_path",
                   "../saves/smollm2-135m/full/mappo", "--data_file", "../data/demo/test.jsonl",
                   "--output_dir", "../outputs/eval"], clone / "evaluate")
    text = "\n".join(_assert_short_error(result, max_lines=4))
    assert ("cd .. && bash LLaMA-Factory/run_mappo.sh "
            "LLaMA-Factory/examples/demo/smollm2_full_mappo.yaml") in text
    assert "cd .. && python data_builders/make_demo_world.py --out data/demo" in text
    assert not (clone / "outputs").exists()


def test_evaluate_help_shows_the_required_options_and_explains_every_option(clone: Path) -> None:
    result = _run([sys.executable, "evaluate/evaluate_qr_s_g.py", "--help"], clone)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith("usage: evaluate_qr_s_g.py --model_name_or_path MODEL --output_dir DIR")
    assert "  python evaluate/evaluate_qr_s_g.py --model_name_or_path" in text, "its own examples"
    required = text.split("required (unless --compare):", 1)[1].split("\n\n", 1)[0]
    assert "--model_name_or_path" in required and "--output_dir" in required
    for option in ("--retriever_url", "--mode", "--k", "--batch_size"):
        assert re.search(rf"^  {option}\b.*\S", text, re.MULTILINE), option


def test_every_eval_option_has_help_text() -> None:
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    for action in commands.choices["eval"]._actions:
        assert action.help, action.option_strings


# ---------------------------------------------------------------------------------------------
# run_demo.sh --help


def test_run_demo_help_lists_every_knob_and_writes_nothing(tmp_path: Path) -> None:
    shutil.copy2(ROOT / "run_demo.sh", tmp_path / "run_demo.sh")
    before = _files(tmp_path)
    result = _run(["bash", "run_demo.sh", "--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert _files(tmp_path) == before
    assert "== [1/11]" not in result.stdout, "no stage started"
    knobs = set(re.findall(r"\$\{([A-Z_]+):-", (ROOT / "run_demo.sh").read_text()))
    assert {"MODEL", "DEMO_SCALE", "PRECISION", "PORT", "SEED"} <= knobs
    for knob in knobs:
        assert re.search(rf"^  {knob}\s+\S", result.stdout, re.MULTILINE), knob
    rejected = _run(["bash", "run_demo.sh", "--model", "tiny"], tmp_path)
    assert rejected.returncode == 2 and "bash run_demo.sh --help" in rejected.stderr
    for knob, message in (("DEMO_SCALE", "DEMO_SCALE must be full, quick or small"),
                          ("EVAL_SPLIT", "EVAL_SPLIT must be test or dev")):
        bad = subprocess.run(["bash", "run_demo.sh"], cwd=tmp_path, env={**_env(), knob: "x"},
                             capture_output=True, text=True, timeout=TIMEOUT, check=False)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
    assert _files(tmp_path) == before


def test_run_demo_says_the_precision_and_each_scales_time_before_it_starts(
        tmp_path: Path) -> None:
    """With PRECISION=fp32 (the CPU without bf16) the first lines say so and give every scale's
    measured time; the copy stops at its first real stage (no project files beside it)."""
    shutil.copy2(ROOT / "run_demo.sh", tmp_path / "run_demo.sh")
    env = {**_env(), "MODEL": "smollm2", "PRECISION": "fp32", "DEMO_SCALE": "quick",
           "MMOA_SETUP": "0", "OUT": str(tmp_path / "out")}
    result = subprocess.run(["bash", "run_demo.sh"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=TIMEOUT, check=False)
    head = result.stdout.split("== [1/11]")[0]
    assert "no native bf16 here" in head and "fp32" in head
    for scale in ("full", "quick", "small"):
        assert f"DEMO_SCALE={scale} " in head, scale
    assert re.search(r"DEMO_SCALE=quick .* fp32 \d+ min", head), head
    assert "this run: DEMO_SCALE=quick" in head


# ---------------------------------------------------------------------------------------------
# mmoa-cli export, and the pre-flight check itself (in process)


def test_export_help_keeps_its_example_path_on_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exit_info:
        main(["export", "--help"])
    assert exit_info.value.code == 0
    assert ("  mmoa-cli export LLaMA-Factory/examples/real/llama3_lora_sft_merge.yaml\n"
            in capsys.readouterr().out)


def test_export_with_missing_folders_is_a_short_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CALLER_DIR_ENV, raising=False)
    config = tmp_path / "merge.yaml"
    config.write_text("model_name_or_path: models/base\nadapter_name_or_path: saves/lora\n"
                      "export_dir: models/merged\n")
    assert main(["export", str(config)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4
    assert err[0] == ("mmoa-cli export: error: model_name_or_path: no model folder models/base "
                      "(models are local folders; nothing is downloaded)")
    assert err[2].startswith("mmoa-cli export: error: adapter_name_or_path: no adapter folder")


def test_model_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "half"
    folder.mkdir()
    assert "has no config.json" in model_problem(str(folder)).what
    (folder / "config.json").write_text("{}")
    assert model_problem(str(folder)) is None
    assert "adapter_config.json" in model_problem(str(folder), adapter=True).what
    assert model_problem("nobody-xyz/not-a-cached-model") is not None, "hub ids are not fetched"
    assert "add model_name_or_path" in model_problem(None).hint


def test_dataset_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "dataset_info.json").write_text(json.dumps({
        "local": {"file_name": "local.json"}, "hub": {"hf_hub_url": "org/set"},
        "here": {"file_name": "here.json"}}))
    (tmp_path / "d" / "here.json").write_text("[]")
    problems = dataset_problems("local, hub,here,absent", "d", "mappo")
    assert [p.what for p in problems] == [
        "dataset 'local': its file d/local.json is missing",
        "dataset 'absent' is not registered in d/dataset_info.json (registered: here, hub, "
        "local)",
    ]
    assert "get_ppo_data_alpaca.py --data_file QA_FILE --name local --dataset_dir d" in (
        problems[0].hint)
    assert dataset_problems("anything", "ONLINE") == []


def test_train_check_reports_every_problem_at_once(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PreflightError) as error:
        check_train_config({"stage": "sft", "model_name_or_path": "models/m",
                            "dataset": "a,b", "dataset_dir": "data"})
    report = error.value.report("mmoa-cli train: error:").splitlines()
    assert len(report) == 6 and all(line.startswith(("mmoa-cli train: error: ", "  "))
                                    for line in report)


def test_mappo_check_names_a_missing_server_only_when_the_run_cannot_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    config = {"stage": "mappo", "model_name_or_path": "saves/sft", "mappo_retriever_url": url,
              "mappo_retriever_retries": 5}
    with pytest.raises(PreflightError) as error:
        check_train_config(config)
    whats = [p.what for p in error.value.problems]
    assert whats[1] == f"mappo_retriever_url: no retrieval server answers at {url}"
    assert f"bash run_server.sh --index INDEX_DIR --port {url.rsplit(':', 1)[1]}" in (
        error.value.problems[1].hint)
    model = tmp_path / "saves" / "sft"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    check_train_config(config)  # the workflow itself checks the server, with its retries


def test_hint_commands_start_from_the_users_folder(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "LLaMA-Factory").mkdir()
    monkeypatch.setenv(CALLER_DIR_ENV, str(tmp_path / "LLaMA-Factory"))
    assert command_here("bash run_demo.sh", tmp_path) == "cd .. && bash run_demo.sh"
    monkeypatch.setenv(CALLER_DIR_ENV, str(tmp_path))
    assert command_here("bash run_demo.sh", tmp_path) == "bash run_demo.sh"
