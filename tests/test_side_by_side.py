"""``bench/side_by_side.py``: one command, every method's row, resumable row by row.

The integration test runs the bench in-process (its trainings and evaluations are subprocesses,
as for a user) with the tiny model on a 13-question slice of
``../shared/data/hotpotqa_fullwiki_486`` (7 train, 3 dev, 3 test; the corpus from the slice's
own paragraphs, the real server on loopback): zero-shot, the warm start (SFT, 2 steps), MAPPO
(1 step) and a HARR row that fails (no ``--index``), run before the others. It checks the JSON,
that the failed row is recorded while the rows after it still run, that a rerun starts no
training or evaluation for the finished rows, and that ``--report`` prints the same table. The
bookkeeping tests need neither the data nor a model; one of them fails a row by a real
subprocess's exit status, as a failed training does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench_fixtures import SIDE_BY_SIDE_TINY_OVERRIDES, write_hotpotqa_slice

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "hotpotqa_fullwiki_486"
SLICE = {"train": 7, "dev": 3, "test": 3}
OVERRIDES = SIDE_BY_SIDE_TINY_OVERRIDES
ROW_KEYS = {"method", "label", "pipeline", "status", "key", "settings", "vs", "seconds",
            "finished", "code", "paired"}
OK_KEYS = {"model", "num_questions", "f1", "f1_se", "em", "em_se", "acc", "candidate_recall",
           "eval_dir", "per_question_f1"}


@pytest.fixture(scope="module")
def sbs():
    """The bench module (it imports its sibling benches as top-level modules)."""
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    import side_by_side

    return side_by_side


def test_overrides_split_by_method(sbs):
    common, per = sbs.split_overrides(["bf16=false", "mappo.max_steps=2", "harr.x=a=b"])
    assert common == ["bf16=false"]
    assert per["mappo"] == ["max_steps=2"] and per["harr"] == ["x=a=b"] and per["grpo"] == []
    with pytest.raises(SystemExit, match="'zero_shot' is not a trained method"):
        sbs.split_overrides(["zero_shot.max_steps=1"])
    with pytest.raises(SystemExit) as info:  # bench_runs.check_overrides: one line, exit 2
        sbs.split_overrides(["max_steps"])
    assert info.value.code == 2


def test_precision_reaches_the_llm_rows_and_overrides_every_row(sbs, tmp_path):
    """``--precision`` becomes the LLM trainings' keys, not HARR's (its encoder trains in fp32);
    ``key=value`` reaches every row, HARR's included, whose stage accepts the precision keys."""
    from mmoa.train.retriever_rl.args import parse_retriever_rl_args

    parser = sbs.build_parser()
    args = parser.parse_args(["--train-file", __file__, "--test-file", __file__, "--scoring",
                              "demo", "--work-dir", str(tmp_path), "--precision", "bf16",
                              "bf16=true", "use_cpu=true", "seed=3", "harr.max_steps=2"])
    sbs.resolve(args, parser)
    bench = sbs.SideBySide(args)
    harr = bench.training("harr")[1:]
    assert harr == ["bf16=true", "use_cpu=true", "seed=3", "max_steps=2"]
    mappo = bench.training("mappo")[1:]
    assert mappo[:len(args.train_precision)] == args.train_precision
    assert mappo[-3:] == ["bf16=true", "use_cpu=true", "seed=3"]
    config = dict(item.split("=", 1) for item in harr)
    parsed = parse_retriever_rl_args({"model_name_or_path": "m", "template": "smollm2",
                                      "dataset": "d", "output_dir": "o",
                                      "retriever_index": "i", **config,
                                      "use_cpu": True, "seed": 3, "max_steps": 2})
    assert parsed.use_cpu is True and parsed.max_steps == 2


def test_dependencies_run_first_in_the_order_given(sbs):
    assert sbs.with_dependencies(["grpo", "zero_shot", "mappo"]) == [
        "sft", "grpo", "zero_shot", "mappo"]
    assert sbs.with_dependencies(["search_rl", "harr"]) == [
        "search_sft", "search_rl", "sft", "harr"]


def test_overrides_after_methods_stay_overrides(sbs, tmp_path):
    parser = sbs.build_parser()
    args = parser.parse_args(["--train-file", __file__, "--test-file", __file__, "--scoring",
                              "demo", "--work-dir", str(tmp_path), "--precision", "fp32",
                              "bf16=false", "--methods", "mappo,zero_shot", "grpo",
                              "mappo.max_steps=1"])
    sbs.resolve(args, parser)
    assert args.methods == ["mappo", "zero_shot", "grpo"]
    assert args.overrides == ["bf16=false", "mappo.max_steps=1"]
    with pytest.raises(SystemExit):
        sbs.resolve(parser.parse_args(["--train-file", __file__, "--test-file", __file__,
                                       "--scoring", "demo", "--methods", "mapo"]), parser)


def _row(method: str, f1: dict[str, float], vs: str | None = None) -> dict[str, Any]:
    return {"method": method, "label": method, "pipeline": "qr_s_g", "status": "ok", "vs": vs,
            "f1": sum(f1.values()) / len(f1), "f1_se": 0.1, "em": 0.0, "seconds": 3.0,
            "num_questions": len(f1), "per_question_f1": f1}


def test_paired_gain_against_the_vs_row_and_the_table(sbs):
    result = {"table": {"model": "tiny", "eval_split": "test", "eval_file": "t.json",
                        "scoring": "hotpotqa"}, "order": ["sft", "mappo", "grpo"],
              "rows": {"sft": _row("sft", {"a": 0.0, "b": 0.5}, vs="zero_shot"),
                       "mappo": _row("mappo", {"a": 1.0, "b": 0.5}, vs="sft"),
                       "grpo": {"method": "grpo", "label": "grpo", "pipeline": "qr_s_g",
                                "status": "failed", "vs": "sft", "seconds": 1.0,
                                "error": "failed (1): mmoa-cli train\n  see train.log"}}}
    sbs.add_paired(result)
    assert result["rows"]["sft"]["paired"] is None  # zero_shot is not in the table
    assert result["rows"]["mappo"]["paired"]["gain"] == pytest.approx(0.5)
    assert result["rows"]["mappo"]["paired"]["vs"] == "sft"
    table = sbs.format_table(result)
    assert "+50.0 +- 50.0 vs sft" in table
    assert table.splitlines()[-1] == "grpo failed:   see train.log"
    markdown = sbs.format_markdown(result).splitlines()
    assert [line.split(" | ")[0] for line in markdown if line.startswith("|")] == [
        "| method", "| ---", "| sft", "| mappo", "| grpo"]


def test_the_readme_table_has_a_column_per_json(sbs, tmp_path):
    """``--report A B --readme`` writes one table between the markers, rows in method order,
    "not run" where a JSON lacks the row; the text around the markers is kept."""
    def result(world: str, rows: dict[str, Any]) -> dict[str, Any]:
        out = {"table": {"model": "smollm2", "eval_split": "test", "eval_file": f"{world}.json",
                         "scoring": "demo"}, "config": {"world": world},
               "order": list(rows), "rows": rows}
        sbs.add_paired(out)
        return out

    real = result("real", {"mappo": _row("mappo", {"a": 1.0, "b": 0.5}, vs="sft"),
                           "sft": _row("sft", {"a": 0.0, "b": 0.5})})
    demo = result("demo", {"sft": _row("sft", {"a": 0.5, "b": 0.5})})
    paths = []
    for name, value in (("real", real), ("demo", demo)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(value))
    readme = tmp_path / "README.md"
    readme.write_text("# title\n<!-- side-by-side:begin (from the bench) -->\nold\n"
                      "<!-- side-by-side:end -->\nafter\n")
    sbs.main(["--report", *map(str, paths), "--readme", str(readme)])
    lines = readme.read_text().splitlines()
    assert lines[:2] == ["# title", "<!-- side-by-side:begin (from the bench) -->"]
    assert lines[-2:] == ["<!-- side-by-side:end -->", "after"]
    assert lines[2] == ("| method (smollm2) | pipeline | real HotpotQA, test (2 q.) "
                        "| demo world, test (2 q.) |")
    assert lines[4] == "| three-agent SFT (warm start) | `qr_s_g` | 25.0 +- 10.0 | 50.0 +- 10.0 |"
    assert lines[5] == ("| three-agent MAPPO | `qr_s_g` | 75.0 +- 10.0 (+50.0 +- 50.0 vs sft) "
                        "| not run |")
    with pytest.raises(SystemExit, match="side-by-side:end"):
        sbs.replace_readme_block("<!-- side-by-side:end -->\n<!-- side-by-side:begin -->\n",
                                 "x\n")


def test_the_readme_table_is_the_committed_jsons_table(sbs):
    """The README's results table is the bench's output from the JSONs in bench/results/, not a
    hand copy: after a row is added to a JSON, ``--report ... --readme README.md`` rewrites it."""
    readme = (ROOT / "README.md").read_text()
    begin, end = readme.index(sbs.README_BEGIN), readme.index(sbs.README_END)
    shown = readme[begin:end].split("\n", 1)[1]
    results = [json.loads((ROOT / "bench" / "results" / name).read_text()) for name in
               ("side_by_side_real_smollm2.json", "side_by_side_demo_smollm2.json")]
    assert shown == sbs.format_combined(results)


def test_a_failed_stage_is_the_rows_error_not_the_tables(sbs, tmp_path, monkeypatch):
    """``run_logged`` exits (SystemExit) when a stage's process fails: the row records it."""
    from bench_runs import run_logged

    args = sbs.build_parser().parse_args(["--model", "tiny", "--scoring", "demo",
                                          "--work-dir", str(tmp_path)])
    args.train_precision = ["bf16=false"]
    bench = sbs.SideBySide(args)
    bench.rows = {}
    log = tmp_path / "stage.log"
    monkeypatch.setattr(bench, "run_zero_shot", lambda: run_logged(
        [sys.executable, "-c", "import sys; print('bad config'); sys.exit(3)"], log))
    row = bench.run_row("zero_shot")
    assert row["status"] == "failed" and row["key"] == bench.key("zero_shot")
    assert row["error"].startswith("failed (3): ") and str(log) in row["error"]
    assert "bad config" in log.read_text()
    row = bench.run_row("sft_rag")  # its warm start never ran
    assert row["status"] == "failed" and "needs the row 'sft', which did not run" in row["error"]
    with pytest.raises(pytest.fail.Exception):  # the test runner's own exits pass through
        monkeypatch.setattr(bench, "run_zero_shot", lambda: pytest.fail("timeout"))
        bench.run_row("zero_shot")


pytest_real = pytest.mark.skipif(
    not (DATA / "hotpot_fullwiki_train.json").is_file(),
    reason=f"the real HotpotQA files are absent ({DATA}); this test needs the shared data folder",
)


@pytest_real
@pytest.mark.slow
@pytest.mark.timeout(1500)  # about 2 min of CPU; 2 shared cores stretch the wall time
def test_side_by_side_on_a_real_slice(sbs, tmp_path: Path, tiny_model_dir: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from mmoa.data.context_corpus import build_context_corpus
    from mmoa.retrieval.builder import BuildConfig, build_index
    from tests.retrieval_fixtures import running_server

    files = write_hotpotqa_slice(DATA, "hotpot_fullwiki", SLICE, tmp_path / "hotpotqa")
    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    build_context_corpus(list(files.values()), corpus)
    build_index(BuildConfig(corpus=str(corpus), output=str(index), progress=False))

    commands: list[str] = []  # every training and evaluation the bench starts, in order
    real_run = subprocess.run

    def counting_run(command: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(command, list) and any("evaluate_qr_s_g" in str(c) or c == "mmoa.cli"
                                             for c in command):
            commands.append(" ".join(map(str, command)))
        return real_run(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counting_run)
    out_json, markdown = tmp_path / "sbs.json", tmp_path / "sbs.md"
    with running_server(["--index", str(index)], log_path=tmp_path / "server.log") as server:
        common = ["--train-file", str(files["train"]), "--dev-file", str(files["dev"]),
                  "--test-file", str(files["test"]), "--scoring", "hotpotqa",
                  "--retriever-url", server.url, "--model", "tiny",
                  "--base-model", str(tiny_model_dir), "--precision", "fp32",
                  "--work-dir", str(tmp_path / "work"), "--json-out", str(out_json),
                  "--markdown", str(markdown), *OVERRIDES]
        # HARR first: it fails (no --index) after its warm start, the rows after it still run
        sbs.main([*common, "--methods", "harr", "zero_shot", "mappo"])
        first = json.loads(out_json.read_text())
        first_commands = list(commands)
        capsys.readouterr()

        # the rerun: every finished row is skipped, nothing is trained or evaluated
        sbs.main([*common, "--methods", "zero_shot", "mappo"])
        rerun_out = capsys.readouterr().out
    second = json.loads(out_json.read_text())

    # the JSON: the table, the rows in the table's order, each with its columns
    assert first["bench"] == "side_by_side" and first["schema"] == 1
    # written by bench_runs.write_result: no path of this machine (here <tmp>/...)
    from bench_runs import portable

    assert first["table"]["eval_file"] == portable(str(files["test"].resolve()))
    assert first["table"]["scoring"] == "hotpotqa"
    assert first["order"] == ["zero_shot", "sft", "mappo", "harr"]
    rows = first["rows"]
    for name, row in rows.items():
        assert set(row) >= ROW_KEYS, name
    for name in ("zero_shot", "sft", "mappo"):
        row = rows[name]
        assert row["status"] == "ok", row.get("error")
        assert set(row) >= OK_KEYS
        assert row["num_questions"] == SLICE["test"] and len(row["per_question_f1"]) == 3
        assert 0.0 <= row["f1"] <= 1.0 and row["f1_se"] is not None
        assert row["candidate_recall"] is not None  # qr_s_g retrieves a candidate list
        assert row["scoring_profile"] == "hotpotqa"
        assert row["seconds"] > 0
    assert rows["mappo"]["paired"]["vs"] == "sft" and rows["mappo"]["paired"]["n"] == 3
    assert rows["sft"]["paired"]["vs"] == "zero_shot"
    assert rows["zero_shot"]["paired"] is None
    assert rows["mappo"]["settings"]["needs"] == {"sft": rows["sft"]["key"]}

    # the failed row is recorded, and the rows after it still ran: the warm start's training
    # and evaluation came before it, zero-shot's evaluation and MAPPO after
    assert rows["harr"]["status"] == "failed" and rows["harr"]["paired"] is None
    assert "harr needs --index" in rows["harr"]["error"]
    def kind(command: str) -> str:
        words = command.split()
        return words[words.index("mmoa.cli") + 1] if "mmoa.cli" in words else "eval"

    assert [kind(c) for c in first_commands] == [
        "data", "train", "eval", "eval", "data", "train", "eval"]
    assert str(tiny_model_dir) in first_commands[3]  # the zero-shot row: the base model

    # the rerun skipped every finished row: no subprocess, the same rows
    assert commands == first_commands
    assert rerun_out.count("finished before") == 3  # zero_shot, sft (mappo's), mappo
    assert {n: r["finished"] for n, r in second["rows"].items()} == \
        {n: r["finished"] for n, r in rows.items()}

    # the outputs: the printed table, the markdown, the plot, and --report's table
    table = sbs.format_table(second)
    assert rerun_out.rstrip().endswith(table)
    assert markdown.read_text() == sbs.format_markdown(second)
    assert out_json.with_suffix(".png").stat().st_size > 0
    sbs.main(["--report", str(out_json), "--no-plot"])
    assert capsys.readouterr().out.rstrip() == table
    assert "harr failed: harr needs --index" in table
    print("row seconds:", {n: r["seconds"] for n, r in rows.items()})
