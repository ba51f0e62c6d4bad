"""``bench/side_by_side.py``: one command, every method's row, resumable row by row.

The bookkeeping tests here need neither the data nor a model; one of them fails a row by a real
subprocess's exit status, as a failed training does. The integration test (the bench in-process
on a real HotpotQA slice with the tiny model: zero-shot, the warm start, rag, MAPPO and a HARR
row that fails, the JSON, the rerun that starts nothing, ``--report``) is
``test_side_by_side_on_a_real_slice`` in tests/test_distractor_workflow.py, where it shares the
distractor chain's bench run instead of training and evaluating the same warm start again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bench_fixtures import import_bench

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sbs():
    """The bench module (it imports its sibling benches as top-level modules)."""
    return import_bench("side_by_side")


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
    # overrides between and after options too (the command line's parser is intermixed)
    args = parser.parse_intermixed_args([
        "--scoring", "demo", "a=1", "--methods", "mappo", "mappo.x=2", "--json-out", "j.json",
        "mappo.y=3", "--seed", "2", "b=4"])
    args.train_file = args.test_file = __file__
    sbs.resolve(args, parser)
    assert args.methods == ["mappo"] and args.seed == 2
    assert sorted(args.overrides) == ["a=1", "b=4", "mappo.x=2", "mappo.y=3"]
    with pytest.raises(SystemExit, match="given twice"):  # so their order cannot matter
        sbs.split_overrides(["mappo.x=2", "a=1", "mappo.x=3"])


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


def test_a_failed_row_of_this_run_makes_the_command_exit_1_after_writing(sbs, tmp_path,
                                                                         monkeypatch, capsys):
    """A chain of commands (``cmd && next``) must stop at a table with a failed row: the table
    is still printed and its outputs written, then the exit status is 1 and names the rows.
    Rows of an earlier run that this one did not plan do not count."""
    result = {"table": {"model": "tiny", "eval_split": "dev", "eval_file": "d.json",
                        "scoring": "hotpotqa"}, "order": ["zero_shot", "sft", "grpo"],
              "rows": {"zero_shot": _row("zero_shot", {"a": 0.0}),
                       "sft": {"method": "sft", "label": "sft", "pipeline": "qr_s_g",
                               "status": "failed", "vs": "zero_shot", "seconds": 1.0,
                               "error": "failed (-15): mmoa-cli train"},
                       "grpo": {"method": "grpo", "label": "grpo", "pipeline": "qr_s_g",
                                "status": "failed", "vs": "sft", "seconds": 1.0,
                                "error": "an earlier run's"}}}
    assert sbs.failed_rows(result, ["zero_shot", "sft"]) == ["sft"]
    assert sbs.failed_rows(result, ["zero_shot"]) == []
    written: list[Path] = []
    monkeypatch.setattr(sbs.SideBySide, "run", lambda self: result)
    monkeypatch.setattr(sbs, "write_outputs", lambda res, args, path: written.append(path))
    argv = ["--model", "tiny", "--scoring", "demo", "--train-file", __file__, "--test-file",
            __file__, "--work-dir", str(tmp_path), "--no-plot"]
    with pytest.raises(SystemExit) as info:
        sbs.main([*argv, "--methods", "sft"])
    assert "1 row(s) failed (sft)" in str(info.value.code) and written
    assert "sft failed" in capsys.readouterr().out  # the table came first
    sbs.main([*argv, "--methods", "zero_shot"])  # only an unplanned row failed: exit 0
    assert len(written) == 2


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


def test_only_the_seeded_rows_depend_on_the_seed(sbs, tmp_path):
    """A table of another ``--seed`` in the same work folder retrains the RL rows and HARR and
    shares the SFT rows and the baselines evaluated from them (bench/seed_table.py pools the
    seeds against those shared rows)."""
    def bench(seed: int):
        args = sbs.build_parser().parse_args(["--model", "tiny", "--scoring", "demo",
                                              "--work-dir", str(tmp_path), "--seed", str(seed)])
        args.precision, args.train_precision = "fp32", ["bf16=false"]
        return sbs.SideBySide(args)

    one, two = bench(1), bench(2)
    assert set(sbs.SEEDED) == {"mappo", "grpo", "search_rl", "decision_rl", "harr"}
    for name in sbs.METHODS:
        same = name not in sbs.SEEDED
        assert (one.key(name) == two.key(name)) is same, name
        if name in sbs.TRAINED:
            assert (one.training_folder(name) == two.training_folder(name)) is same, name


def _tiny_table(sbs, tmp_path: Path, *extra: str):
    """A table of the tiny model on ``train.json`` in ``tmp_path`` (nothing is run), fp32."""
    args = sbs.build_parser().parse_args(["--model", "tiny", "--scoring", "demo",
                                          "--train-file", "train.json",
                                          "--work-dir", str(tmp_path), *extra])
    args.precision, args.train_precision = "fp32", ["bf16=false"]
    return sbs.SideBySide(args)


def test_ranked_candidates_are_another_warm_start(sbs, tmp_path):
    """``--candidate-order ranked`` builds its own SFT data (another data folder, so another
    warm start); the default keeps the folders of tables run before the option existed."""
    def bench(*extra: str):
        return _tiny_table(sbs, tmp_path, *extra)

    default, ranked = bench(), bench("--candidate-order", "ranked")
    sources = ["train.json", default.args.label_source, default.k]
    assert default.data_dir.name == f"data-{sbs.digest(sources)}"
    assert ranked.data_dir != default.data_dir
    assert ranked.key("sft") != default.key("sft")


def test_the_qr_labels_are_in_the_warm_starts_key(sbs, tmp_path):
    """Another rewrites file (the Query Rewriter's SFT labels) is another warm start, and so
    another key for every row built on it."""
    def bench(content: str):
        rewrites = tmp_path / f"rewrites-{len(content)}.json"
        rewrites.write_text(content)
        args = sbs.build_parser().parse_args(["--model", "tiny", "--scoring", "demo",
                                              "--work-dir", str(tmp_path),
                                              "--rewrites-file", str(rewrites)])
        args.precision, args.train_precision = "fp32", ["bf16=false"]
        return sbs.SideBySide(args)

    one, two = bench("[]"), bench('[{"source": "q", "target": "a; b"}]')
    for name in ("sft", "sft_rag", "mappo"):
        assert one.key(name) != two.key(name), name


def test_another_k_is_another_table_with_its_own_warm_start(sbs, tmp_path):
    """``--k 10``: its own SFT data (records and labels of ten candidates), so its own warm
    start and a key for every row; the rollouts and the evaluations read the same K; the
    config's K given as ``--k`` keeps the keys of the tables run without it; a
    ``mappo_top_k`` override, which would move the rollouts' K alone, is refused."""
    def bench(*extra: str):
        return _tiny_table(sbs, tmp_path, *extra)

    default, five, ten = bench(), bench("--k", "5"), bench("--k", "10")
    assert default.k == five.k == 5 and ten.k == 10
    for name in sbs.METHODS:
        assert five.key(name) == default.key(name), name
        assert ten.key(name) != default.key(name), name
    assert five.data_dir == default.data_dir != ten.data_dir
    assert ten.data_dir.name == f"data-{sbs.digest(['train.json', ten.args.label_source, 10])}"
    assert ten.three_agent().k == 10  # train_rl's mappo_top_k and the evaluations' --k
    assert ten.table["k"] == 10 and "k" not in default.table
    def caption(table: dict[str, Any]) -> str:
        return sbs._caption({"table": {**table, "eval_file": "test.json"}, "rows": {}})

    assert caption(ten.table).endswith(", K = 10 candidates")
    assert "K = " not in caption(default.table)
    for override in ("mappo_top_k=10", "mappo.mappo_top_k=10"):
        with pytest.raises(SystemExit, match="give the candidates with --k"):
            bench(override)
    with pytest.raises(SystemExit):
        bench("--k", "0")
