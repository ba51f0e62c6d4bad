"""Issue 72, item 4: a bench given a JSON it cannot use says so in one line and exits 2.

The probe: ``side_by_side.py --report`` / ``--readme`` / resume and ``learning_signal.py
--report`` / resume with a corrupt, missing, list or ``{}`` JSON gave 11 tracebacks (the files
were kept); an override ``=x`` was accepted; ``gpu_check/pack.py --machine-packages
/nonexistent`` exited 0. One check reads every such JSON (``bench_runs.read_json_object``);
each case here: exit status 2, one line on stderr naming the file and what is wrong, the file's
bytes unchanged and nothing else written.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.bench_fixtures import BENCH, load_bench

bench_runs = load_bench("bench_runs")

#: name -> (bytes of the file or None for no file, words the one line must hold)
BAD_JSONS: dict[str, tuple[bytes | None, str]] = {
    "missing": (None, "no such file"),
    "corrupt": (b'{"rows": {"rag": ', "not valid JSON"),
    "list": (b"[1, 2, 3]", "holds a JSON list"),
    "empty object": (b"{}", "the file is an empty object"),
    "not UTF-8": (b'{"rows": "\xff\xfe"}', "not UTF-8"),
}


def _bad_file(tmp_path: Path, case: str) -> Path:
    content, _ = BAD_JSONS[case]
    path = tmp_path / f"{case.replace(' ', '_')}.json"
    if content is not None:
        path.write_bytes(content)
    return path


def _exits_2_in_one_line(call: Callable[[], Any], capsys: pytest.CaptureFixture[str],
                         *words: str) -> str:
    with pytest.raises(SystemExit) as info:
        call()
    assert info.value.code == 2, info.value.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    for word in words:
        assert word in err[0], (word, err[0])
    return err[0]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


# ------------------------------------------------------------------------------ the helper


def test_read_json_object_names_the_file_and_the_fault(tmp_path: Path) -> None:
    required = {"rows": dict, "table.model": str, "count": int}
    for case, (_, words) in BAD_JSONS.items():
        path = _bad_file(tmp_path, case)
        with pytest.raises(bench_runs.BenchInputError) as info:
            bench_runs.read_json_object(path, "a test result", required)
        assert str(path) in str(info.value) and words in str(info.value), case
        assert "\n" not in str(info.value)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    for path, content, words in (
            (folder, None, "not a regular file"),
            (tmp_path / "type.json", {"rows": [], "table": {"model": "m"}, "count": 1},
             "'rows' is a JSON list, expected a JSON object"),
            (tmp_path / "nested.json", {"rows": {}, "table": {}, "count": 1},
             "no 'table.model'"),
            (tmp_path / "bool.json", {"rows": {}, "table": {"model": "m"}, "count": True},
             "'count' is a JSON true/false, expected a JSON integer")):
        if content is not None:
            path.write_text(json.dumps(content))
        with pytest.raises(bench_runs.BenchInputError, match=words):
            bench_runs.read_json_object(path, "a test result", required)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"rows": {}, "table": {"model": "m"}, "count": 3}))
    assert bench_runs.read_json_object(good, "a test result", required)["count"] == 3


def test_overrides_need_a_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_runs.check_overrides(["max_steps=4", "mappo.max_steps=4", "a=", "x=y=z"]) \
        == ["max_steps=4", "mappo.max_steps=4", "a=", "x=y=z"]
    for item in ("=x", "x", ".a=1", "mappo.=1", "a b=1", "=", "a..b=1"):
        _exits_2_in_one_line(lambda item=item: bench_runs.check_overrides([item]), capsys,
                             repr(item), "KEY=VALUE")


def test_a_corrupt_stage_result_or_attempt_record_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "result.json").write_text("[]")

    def produce() -> dict[str, Any]:
        raise AssertionError("ran again")

    _exits_2_in_one_line(lambda: bench_runs.stage(tmp_path, "sft", produce, "bench/x.py"),
                         capsys, "sft/result.json", "holds a JSON list", "remove it")
    (tmp_path / "sft" / "attempt.json").write_text('{"attempts": "two"}')
    _exits_2_in_one_line(lambda: bench_runs.AttemptClock(tmp_path / "sft"), capsys,
                         "attempt.json", "'attempts' is a JSON string")


# --------------------------------------------------------------------------- side_by_side


@pytest.fixture(scope="module")
def side_by_side() -> Any:
    return load_bench("side_by_side")


@pytest.mark.parametrize("case", list(BAD_JSONS))
def test_side_by_side_report_and_readme_refuse_a_bad_json(
        side_by_side: Any, case: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = _bad_file(tmp_path, case)
    readme = tmp_path / "README.md"
    readme.write_text("intro\n" + side_by_side.README_BEGIN + "\nold\n"
                      + side_by_side.README_END + "\n")
    before = _snapshot(tmp_path)
    for argv in (["--report", str(path)], ["--report", str(path), "--readme", str(readme)]):
        _exits_2_in_one_line(lambda argv=argv: side_by_side.main(argv), capsys, str(path),
                             BAD_JSONS[case][1])
    assert _snapshot(tmp_path) == before  # nothing written, nothing changed


def test_side_by_side_readme_that_is_missing_writes_nothing(
        side_by_side: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    real = BENCH / "results" / "side_by_side_demo_smollm2.json"
    report = tmp_path / "table.json"
    report.write_bytes(real.read_bytes())
    before = _snapshot(tmp_path)
    _exits_2_in_one_line(lambda: side_by_side.main(
        ["--report", str(report), "--readme", str(tmp_path / "NOPE.md")]), capsys,
        "--readme", "no such file")
    assert _snapshot(tmp_path) == before  # no plot beside the JSON either


@pytest.mark.parametrize("case", ["corrupt", "list", "empty object", "not UTF-8"])
def test_side_by_side_resume_refuses_a_bad_json(side_by_side: Any, case: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    bench = object.__new__(side_by_side.SideBySide)  # load() reads only these two
    bench.json_path = _bad_file(tmp_path, case)
    bench.table = {"model": "smollm2"}
    before = bench.json_path.read_bytes()
    _exits_2_in_one_line(bench.load, capsys, str(bench.json_path), BAD_JSONS[case][1],
                         "to resume")
    assert bench.json_path.read_bytes() == before


def test_side_by_side_refuses_an_override_without_a_key(
        side_by_side: Any, capsys: pytest.CaptureFixture[str]) -> None:
    for item in ("=x", "mappo.=4"):
        _exits_2_in_one_line(lambda item=item: side_by_side.split_overrides([item]), capsys,
                             repr(item))
    common, per_method = side_by_side.split_overrides(["seed=3", "mappo.max_steps=4"])
    assert common == ["seed=3"] and per_method["mappo"] == ["max_steps=4"]


# ------------------------------------------------------------------------- learning_signal


@pytest.fixture(scope="module")
def learning_signal() -> Any:
    return load_bench("learning_signal")


@pytest.mark.parametrize("case", list(BAD_JSONS))
def test_learning_signal_report_refuses_a_bad_json(
        learning_signal: Any, case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = _bad_file(tmp_path, case)
    before = _snapshot(tmp_path)
    monkeypatch.setattr(sys, "argv", ["learning_signal.py", "--report", str(path)])
    _exits_2_in_one_line(learning_signal.main, capsys, str(path), BAD_JSONS[case][1])
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("case", ["corrupt", "list", "empty object", "not UTF-8"])
def test_learning_signal_resume_refuses_a_bad_json(
        learning_signal: Any, case: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = _bad_file(tmp_path, case)
    before = path.read_bytes()
    _exits_2_in_one_line(lambda: learning_signal.load_previous(str(path)), capsys, str(path),
                         BAD_JSONS[case][1], "--previous none")
    run_dir = tmp_path / "mappo_seed1"
    run_dir.mkdir()
    (run_dir / "result.json").write_bytes(before)
    _exits_2_in_one_line(lambda: learning_signal._done(run_dir), capsys, "result.json",
                         "remove it")
    assert path.read_bytes() == before


def test_learning_signal_refuses_overrides_without_a_key(
        learning_signal: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["=x"], ["--sft", "=x"], ["--mappo", "lr"]):
        monkeypatch.setattr(sys, "argv", ["learning_signal.py", *argv])
        _exits_2_in_one_line(learning_signal.main, capsys, "KEY=VALUE")


def test_learning_signal_report_of_a_real_result_still_prints(
        learning_signal: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["learning_signal.py", "--report",
                                      str(BENCH / "results" / "learning_signal.json")])
    learning_signal.main()
    assert "warm start (SFT)" in capsys.readouterr().out


# ------------------------------------------------------------------------------- pack.py


def test_pack_refuses_machine_packages_that_are_not_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sys.path.insert(0, str(BENCH / "gpu_check"))
    import pack

    out = tmp_path / "bundle"
    for argv, words in ((["--machine-packages", "/nonexistent"], "no such file"),
                        (["--from-probes", str(tmp_path / "none")], "no such folder")):
        _exits_2_in_one_line(lambda argv=argv: pack.main(
            ["--no-wheels", "--out", str(out), *argv]), capsys, words)
    binary = tmp_path / "freeze.txt"
    binary.write_bytes(b"\xff\xfe torch")
    _exits_2_in_one_line(lambda: pack.main(["--no-wheels", "--out", str(out),
                                            "--machine-packages", str(binary)]), capsys,
                         "cannot be read")
    assert not out.exists()
