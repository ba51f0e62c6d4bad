"""Result files that say where they come from (issue #71, item 5).

Every JSON under ``bench/results/`` is committed and read on other machines: it must name the
commit it was measured at (a figure is comparable, or reproducible, only with the code that
made it) and hold no path of the machine it ran on (meaningless elsewhere, and it says who ran
it where). ``bench_runs.write_result`` does both for every bench; these tests check the
committed files and the writer's rules on hand-made values.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
#: What a commit looks like in a result: code_version's short hash, "+dirty" where the code
#: had uncommitted changes.
COMMIT = re.compile(r"[0-9a-f]{7,40}(\+dirty)?")
#: Absolute paths of a machine, anywhere in a string (a whole path, or inside a command or an
#: error message): one of these folders where a path begins, not inside a relative path
#: (``<tmp>/tp6/work/index`` is a folder ``work`` of a scratch folder, no machine's).
MACHINE_PATH = re.compile(r"(?<![\w.~<>/-])(/work/|/home/|/tmp/|/root/|/Users/)"
                          r"|(?<![\w])[A-Za-z]:\\")

if str(ROOT / "bench") not in sys.path:
    sys.path.insert(0, str(ROOT / "bench"))
import bench_runs  # noqa: E402

RESULT_FILES = sorted(RESULTS.rglob("*.json"))


def strings(value: Any) -> Iterator[str]:
    """Every string of a JSON value, the keys of its objects included."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)
    elif isinstance(value, str):
        yield value


def test_there_are_result_files() -> None:
    assert len(RESULT_FILES) > 50  # the walk below found the committed files
    assert any(p.parent != RESULTS for p in RESULT_FILES)  # subfolders too


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_result_json_names_its_commit(path: Path) -> None:
    commit = bench_runs.result_commit(json.loads(path.read_text()))
    assert commit is not None, f"{path} names no commit (write it with bench_runs.write_result)"
    assert COMMIT.fullmatch(commit), f"{path}: {commit!r} is not a commit"


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_no_result_json_holds_a_path_of_a_machine(path: Path) -> None:
    text = path.read_text()
    found = [s for s in strings(json.loads(text)) if MACHINE_PATH.search(s)]
    assert not found, f"{path} holds paths of a machine: {found[:3]}"
    # and nothing the writer's rules would still rewrite (/opt/..., another sibling ...)
    assert bench_runs.portable_json_text(text) == text, path


def test_no_bench_writes_its_json_around_the_writer() -> None:
    """The benches write their JSON out through ``write_result``, never directly."""
    scripts = [*ROOT.glob("bench/*.py"), *ROOT.glob("bench/gpu_check/*.py")]
    direct = [f"{p.relative_to(ROOT)}: {line.strip()}" for p in scripts
              for line in p.read_text().splitlines()
              if re.search(r"atomic_write_json\([^)]*(json_out|json_path)", line)]
    assert not direct


# -- the writer's rules -------------------------------------------------------------------


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    """A checkout at a path of its own (under the temporary folder: the checkout rule comes
    first), beside its ``shared`` folder."""
    (tmp_path / "shared").mkdir()
    (root := tmp_path / "main").mkdir()
    return root


@pytest.mark.parametrize(("text", "expected"), [
    ("{root}", "."),
    ("{root}/", "."),
    ("{root}/saves/sft/model", "saves/sft/model"),
    ("{shared}", "../shared"),
    ("{shared}/data/hotpot_train.json", "../shared/data/hotpot_train.json"),
    ("/tmp/probe_k3j2/fifo", "<tmp>/probe_k3j2/fifo"),
    ("/var/tmp/x", "<tmp>/x"),
    ("/home/alice/models/m", "~/models/m"),
    ("/Users/bob/x.json", "~/x.json"),
    ("/root/.cache/hf", "~/.cache/hf"),
    ("/opt/torch/.venv/bin/python3", "<elsewhere>/python3"),
    ("/work/runs/prev_joint52.json", "<elsewhere>/prev_joint52.json"),
    # the same on every machine, or not a path at all: unchanged
    ("/usr/bin/python3", "/usr/bin/python3"),
    ("/dev/null", "/dev/null"),
    ("tokens /s", "tokens /s"),
    ("POST /admin/reload_encoder", "POST /admin/reload_encoder"),
    ("POST /../../etc/passwd", "POST /../../etc/passwd"),
    ("http://127.0.0.1:8000/retrieve", "http://127.0.0.1:8000/retrieve"),
    ("saves/x and ../shared/y", "saves/x and ../shared/y"),
    ("1/2 and/or 3 / 4", "1/2 and/or 3 / 4"),
    ("", ""),
])
def test_a_path_by_the_rules(checkout: Path, text: str, expected: str) -> None:
    text = text.format(root=checkout, shared=checkout.parent / "shared")
    assert bench_runs.portable_text(text, checkout) == expected


def test_a_folder_named_like_the_checkout_is_not_in_it(checkout: Path) -> None:
    beside = bench_runs.portable_text(f"{checkout}2/x", checkout)
    assert beside.startswith("<tmp>/") and beside.endswith("/main2/x")  # the tmp rule's


def test_paths_inside_longer_strings(checkout: Path) -> None:
    shared = checkout.parent / "shared"
    command = (f"{checkout}/.venv/bin/python -m mmoa.cli train cfg.yaml "
               f"output_dir={checkout}/saves/x --data {shared}/d.json --log /tmp/run/log.txt")
    assert bench_runs.portable_text(command, checkout) == (
        ".venv/bin/python -m mmoa.cli train cfg.yaml output_dir=saves/x "
        "--data ../shared/d.json --log <tmp>/run/log.txt")
    error = (f"cannot load '/tmp/sp2/fifo': /tmp/sp2/fifo/x.bin: is a FIFO; "
             f"see {checkout}/saves/log.txt.")
    assert bench_runs.portable_text(error, checkout) == (
        "cannot load '<tmp>/sp2/fifo': <tmp>/sp2/fifo/x.bin: is a FIFO; see saves/log.txt.")
    assert bench_runs.portable_text(f"PosixPath('{checkout}/m')", checkout) == "PosixPath('m')"


def test_rewriting_is_idempotent(checkout: Path) -> None:
    text = (f"{checkout}/a {checkout.parent}/shared/b /tmp/c/d /home/u/e "
            f"/opt/f/g POST /admin/h")
    once = bench_runs.portable_text(text, checkout)
    assert bench_runs.portable_text(once, checkout) == once
    assert not MACHINE_PATH.search(once)


@pytest.mark.parametrize(("text", "machine"), [
    ("/work/main/x", True), ("python /tmp/a/b", True), ("see '/home/u/x'", True),
    ("/root/.cache", True), ("/Users/bob/x", True), ("C:\\Users\\bob", True),
    ("<tmp>/tp6/work/index", False), ("saves/work/x", False), ("~/x", False),
    ("../shared/x", False),
])
def test_the_check_finds_machine_paths(text: str, machine: bool) -> None:
    assert bool(MACHINE_PATH.search(text)) is machine


def test_nested_values_keys_included(checkout: Path) -> None:
    value = {"model": str(checkout / "saves" / "m"),
             "runs": [{"eval_dir": f"{checkout}/saves/e", "f1": 0.5, "n": 3, "ok": True,
                       "note": None},
                      ["/tmp/x/y", 1.25, {"deep": [f"{checkout.parent}/shared/z"]}]],
             f"{checkout}/as/key": 1,
             "path_object": checkout / "p"}
    portable = bench_runs.portable(value, checkout)
    assert portable == {"model": "saves/m",
                        "runs": [{"eval_dir": "saves/e", "f1": 0.5, "n": 3, "ok": True,
                                  "note": None},
                                 ["<tmp>/x/y", 1.25, {"deep": ["../shared/z"]}]],
                        "as/key": 1,
                        "path_object": "p"}
    assert value["model"] == str(checkout / "saves" / "m")  # the bench's own value is kept


def test_the_json_text_keeps_its_layout_and_figures(checkout: Path) -> None:
    text = ('{\n "f1": 1.50,\n "lr": 1e-05,\n "big": 12345678901234567890,\n'
            f' "model": "{checkout}/m",\n "u": "caf\\u00e9",\n'
            ' "esc": "a \\"quoted\\" /tmp/q/r"\n}')
    assert bench_runs.portable_json_text(text, checkout) == (
        '{\n "f1": 1.50,\n "lr": 1e-05,\n "big": 12345678901234567890,\n'
        ' "model": "m",\n "u": "caf\\u00e9",\n'
        ' "esc": "a \\"quoted\\" <tmp>/q/r"\n}')


@pytest.mark.parametrize(("result", "named"), [
    ({"code": "abc1234"}, "abc1234"),
    ({"commit": "de20b0e"}, "de20b0e"),
    ({"config": {"code": "6adc5c2+dirty"}}, "6adc5c2+dirty"),
    ({"code": "unknown"}, None),
    ({"config": {"code": "unknown"}, "rows": {"a": {"code": "abc1234"}}}, None),
    ({"mappo": {"1": {"code_version": "abc1234"}}}, None),
])
def test_result_commit(result: dict[str, Any], named: str | None) -> None:
    assert bench_runs.result_commit(result) == named


def test_write_result_stamps_the_commit_where_none_is_named(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr(bench_runs, "code_version", lambda script: f"1234567+dirty ({script})")
    out = tmp_path / "r.json"
    result = {"f1": 0.25, "model": str(bench_runs.ROOT / "saves" / "m")}
    written = bench_runs.write_result(out, result, "bench/x.py")
    assert json.loads(out.read_text()) == written == {
        "f1": 0.25, "model": "saves/m", "code": "1234567+dirty (bench/x.py)"}
    assert "code" not in result  # not changed

    # a commit given, with where it comes from; indent as asked
    bench_runs.write_result(out, {"f1": 0.25}, "bench/x.py", code="abcdef0",
                            code_source="the bundle's manifest.json", indent=1)
    assert out.read_text() == ('{\n "f1": 0.25,\n "code": "abcdef0",\n'
                               ' "code_source": "the bundle\'s manifest.json"\n}\n')

    # a result that names its commit keeps it; "unknown" is replaced
    kept = bench_runs.write_result(out, {"config": {"code": "fffeac5"}}, "bench/x.py")
    assert kept == {"config": {"code": "fffeac5"}}
    assert bench_runs.write_result(out, {"code": "unknown"}, "bench/x.py")["code"] == \
        "1234567+dirty (bench/x.py)"


def test_code_version_is_dirty_for_changed_or_uncommitted_code(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    import subprocess

    def git(*argv: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=tmp_path,
                       check=True, capture_output=True)

    (tmp_path / "LLaMA-Factory").mkdir()
    (tmp_path / "bench").mkdir()
    (tmp_path / "LLaMA-Factory" / "lib.py").write_text("x = 1\n")
    (tmp_path / "bench" / "old.py").write_text("")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, check=True,
                            capture_output=True, text=True).stdout.strip()
    monkeypatch.setattr(bench_runs, "ROOT", tmp_path)
    assert bench_runs.code_version("bench/old.py") == commit
    # a new script, never committed: not the commit's code
    (tmp_path / "bench" / "new.py").write_text("")
    assert bench_runs.code_version("bench/new.py") == f"{commit}+dirty"
    assert bench_runs.code_version("bench/old.py") == commit  # other untracked files aside
    # a library module never committed
    (tmp_path / "LLaMA-Factory" / "new_module.py").write_text("")
    assert bench_runs.code_version("bench/old.py") == f"{commit}+dirty"
    (tmp_path / "LLaMA-Factory" / "new_module.py").unlink()
    # the library changed
    (tmp_path / "LLaMA-Factory" / "lib.py").write_text("x = 2\n")
    assert bench_runs.code_version("bench/old.py") == f"{commit}+dirty"


def test_a_merged_result_is_stamped_anew() -> None:
    earlier = {"a": 1, "code": "1111111", "code_source": "git log of this file"}
    assert bench_runs.without_commit(earlier) == {"a": 1}
    assert earlier["code"] == "1111111"


def test_archived_stages_are_portable(tmp_path: Path) -> None:
    """The stage results a bench archives under bench/results go through the writer."""
    work, archive = tmp_path / "work", tmp_path / "archive"
    (work / "sft").mkdir(parents=True)
    (work / "sft" / "result.json").write_text(json.dumps(
        {"model": str(bench_runs.ROOT / "saves" / "sft"), "f1": 0.5, "code": "abc1234"}))
    bench_runs.archive_stages(work, archive)
    assert json.loads((archive / "sft" / "result.json").read_text()) == {
        "model": "saves/sft", "f1": 0.5, "code": "abc1234"}
