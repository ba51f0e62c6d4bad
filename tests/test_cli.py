"""``mmoa-cli``: every sub-command's ``--help`` (with examples) and the wiring of ``serve``,
``index`` and ``webui`` to the code they run (the same parsers, checks and exit codes as
``flask_server.py`` / ``run_server.sh`` and ``data_builders/build_index.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from mmoa.cli import build_parser, main
from tests.retrieval_fixtures import free_port

ROOT = Path(__file__).resolve().parents[1]
SUB_COMMANDS = [
    ["version"], ["train"], ["export"], ["data"], ["data", "demo-world"], ["data", "sft"],
    ["data", "pretrain"], ["data", "mappo"], ["eval"], ["webui"], ["serve"], ["index"],
]


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_building_the_parser_loads_no_model_library() -> None:
    """``mmoa-cli --help`` and every sub-command's parser read their defaults from light
    modules: the data, serve and index commands, and the help, start without torch or
    transformers (about 7 of 8 seconds of a start on 2 cores)."""
    code = ("import sys; from mmoa.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('torch', 'transformers', 'llamafactory') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("argv", SUB_COMMANDS, ids=lambda a: " ".join(a))
def test_every_sub_command_has_help_with_an_example(argv: list[str],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(argv, capsys)
    assert text.startswith(f"usage: mmoa-cli {' '.join(argv)}")
    assert "example" in text
    assert f"mmoa-cli {argv[0]}" in text.split("example", 1)[1], "the example uses the command"


def test_top_level_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help([], capsys)
    for command in ("version", "train", "export", "data", "eval", "webui", "serve", "index"):
        assert f"    {command} " in text, command


def _option_strings(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings} - {"-h", "--help"}


def _sub_parser(name: str):
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    return commands.choices[name]


def test_serve_and_index_take_exactly_the_scripts_options() -> None:
    from mmoa.retrieval import builder, server

    assert _option_strings(_sub_parser("serve")) == _option_strings(server.build_arg_parser())
    assert _option_strings(_sub_parser("index")) == _option_strings(builder.build_arg_parser())


def test_serve_reports_a_missing_index_like_the_script(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from mmoa.retrieval.server import EXIT_INDEX_MISSING

    assert main(["serve", "--index", str(tmp_path / "nope")]) == EXIT_INDEX_MISSING
    assert "retrieval server: error" in capsys.readouterr().err


def test_serve_without_index_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["serve"])
    assert exit_info.value.code == 2


def test_index_builds_an_index_folder(tiny_world_dir: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "index"
    assert main(["index", "--corpus", str(tiny_world_dir / "corpus.jsonl"), "--output",
                 str(out), "--no-progress"]) == 0
    meta = json.loads((out / "meta.json").read_text())
    corpus_size = sum(1 for _ in (tiny_world_dir / "corpus.jsonl").open())
    assert meta["n_vectors"] == corpus_size
    assert (out / "index.faiss").is_file()
    assert f"wrote {out}: {corpus_size} passages" in capsys.readouterr().out
    # Same refusal as the script when the folder exists.
    assert main(["index", "--corpus", str(tiny_world_dir / "corpus.jsonl"), "--output",
                 str(out), "--no-progress"]) == 2


def test_index_with_a_missing_corpus_exits_2(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["index", "--corpus", str(tmp_path / "none.jsonl"), "--output",
                 str(tmp_path / "out")]) == 2
    assert "build_index: error" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_serve_serves_the_index(tiny_index_dir: Path, tmp_path: Path) -> None:
    """``mmoa-cli serve`` is the production server: /health and /search answer on loopback."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "LLaMA-Factory" / "src"), os.environ.get("PYTHONPATH", "")])}
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mmoa.cli", "serve", "--index",
                                 str(tiny_index_dir), "--port", str(port), "--threads", "4"],
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        health = None
        deadline = time.monotonic() + 120
        while health is None and time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            with contextlib.suppress(requests.RequestException):
                response = requests.get(url + "/health", timeout=2)
                if response.status_code == 200:
                    health = response.json()
            time.sleep(0.3)
        assert health is not None, (tmp_path / "serve.log").read_text()[-3000:]
        meta = json.loads((tiny_index_dir / "meta.json").read_text())
        assert health["corpus_size"] == meta["n_vectors"]
        found = requests.post(url + "/search", json={"questions": ["a sculptor"], "N": 3},
                              timeout=30)
        assert found.status_code == 200, found.text
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_webui_options_reach_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    import mmoa.webui.launch as launch_module

    seen = []
    monkeypatch.setattr(launch_module, "launch", seen.append)
    assert main(["webui", "--host", "0.0.0.0", "--port", "7999", "--inbrowser"]) == 0
    assert seen == [launch_module.WebUIConfig(host="0.0.0.0", port=7999, share=False,
                                              inbrowser=True)]
    seen.clear()
    assert main(["webui"]) == 0
    assert seen == [launch_module.WebUIConfig()]
    assert seen[0].host == "127.0.0.1", "loopback unless told otherwise"


def test_train_with_a_missing_config_is_a_clear_error(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_train_override_without_a_value_is_a_clear_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``mmoa-cli train run.yaml max_steps`` was read as ``max_steps: null`` and crashed with a
    TypeError traceback once training began (found by bench/trainer_probe.py)."""
    config = tmp_path / "run.yaml"
    config.write_text("stage: mappo\nmax_steps: 3\n")
    assert main(["train", str(config), "max_steps"]) == 2
    err = capsys.readouterr().err
    assert "override 'max_steps': expected key=value" in err and len(err.splitlines()) == 1


def test_train_with_a_yaml_syntax_error_is_one_line(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("stage: mappo\nmax_steps: [1\n")
    assert main(["train", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{config}: cannot read the config (" in err and "line 2" in err


def test_eval_compare_with_a_missing_or_broken_metrics_file_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "metrics.json").write_text("{not json")
    for entry, names in ((f"run={tmp_path / 'missing'}", "no metrics file"),
                         (f"run={broken}", "metrics.json: not a metrics file")):
        assert main(["eval", "--compare", entry]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("mmoa-cli eval: error: --compare: ") and names in err
        assert len(err.splitlines()) == 1


def test_eval_compare_prints_the_f1_standard_error_and_paired_gains(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three runs on questions a, b, c; MAPPO's paired gains over the other two by hand."""
    f1 = {"sft": [0.0, 1.0, 0.5], "rag": [0.5, 0.5, 0.5], "mappo": [1.0, 1.0, 0.0]}
    entries = []
    for name, scores in f1.items():
        run = tmp_path / name
        run.mkdir()
        mean = sum(scores) / 3
        sd = (sum((x - mean) ** 2 for x in scores) / 2) ** 0.5
        (run / "metrics.json").write_text(json.dumps(
            {"mode": "qr_s_g", "num_questions": 3, "f1": mean, "f1_se": sd / 3 ** 0.5}))
        (run / "predictions.jsonl").write_text("".join(
            json.dumps({"id": q, "scores": {"f1": x}}) + "\n"
            for q, x in zip("abc", scores, strict=True)))
        entries.append(f"{name}={run}")
    assert main(["eval", "--compare", *entries, "--paired", "sft"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = out[0].split()
    assert header[header.index("F1") + 1] == "+-F1"
    mappo = next(line for line in out if line.startswith("mappo ")).split()
    # F1 2/3, sd sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = 0.5774, SE 0.3333
    assert mappo[header.index("F1")] == "66.7" and mappo[header.index("+-F1")] == "33.3"
    start = out.index("paired F1 gain of sft (same questions, +- standard error):")
    # sft - rag: -0.5, +0.5, 0 -> mean 0, sd 0.5, SE 0.2887; sft - mappo: -1, 0, +0.5 ->
    # mean -1/6, SE 0.7638 / sqrt(3) = 0.4410
    assert out[start + 1:] == ["  over rag: +0.0 +- 28.9 (n=3)",
                               "  over mappo: -16.7 +- 44.1 (n=3)"]
    assert main(["eval", "--compare", *entries, "--paired", "nope"]) == 2
    assert "--paired 'nope': no such run" in capsys.readouterr().err
