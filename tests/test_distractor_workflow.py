"""The HotpotQA distractor workflow end to end on a slice of the shared distractor files, and
``bench/side_by_side.py``'s bookkeeping on the same run.

The chain a user runs on the second real set (docs/real_workflow.md), with the tiny model and a
few steps: the corpus from the slice's paragraphs (every gold paragraph present), its index,
the real server on loopback, Query Rewriter labels synthesised with the live retriever
(``mmoa-cli data qr-rewrites``, TOA against best-of-N), then ``bench/side_by_side.py`` with
those labels, in-process (its trainings and evaluations are subprocesses, as for a user): the
SFT data (Selector labels from ``supporting_facts``), the warm start (SFT, 2 steps), zero-shot,
``rag`` with K = 5 and K = 1, MAPPO (1 step), each evaluated with the official HotpotQA scoring,
and a HARR row that fails (no index given), run before the others. Then the same command again,
which must start no training or evaluation for the finished rows, and a dev table in the same
work folder, which must evaluate the test table's trainings (MAPPO at a chosen checkpoint)
and train nothing. Nothing of the data is copied
into the repository: the slice is written under pytest's tmp_path.

One run (the module fixture ``chain``) serves two tests: what is the distractor world's own (the
named world, the synthesised QR labels in the SFT data, one candidate against five), and what
the bench keeps (the JSON's rows and columns, a failed row that the rows after it outlive, the
rerun that runs nothing, the table, markdown, plot and ``--report``). The bench's checks ran
on a slice of the fullwiki files before, with a second index, server, warm start and its
evaluation; the bench reads both sets with the same loader and scoring, and the fullwiki files
go through the README's commands in tests/test_real_workflow.py.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.bench_fixtures import (
    SIDE_BY_SIDE_TINY_OVERRIDES,
    import_bench,
    write_hotpotqa_slice,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "hotpotqa_distractor_1k"
SLICE = {"train": 8, "dev": 3, "test": 3}
OVERRIDES = SIDE_BY_SIDE_TINY_OVERRIDES
#: The rows of the first run, in the table's order (``sft`` is the others' warm start).
ROWS = ["zero_shot", "sft", "sft_rag", "sft_rag1", "mappo", "harr"]
ROW_KEYS = {"method", "label", "pipeline", "status", "key", "settings", "vs", "seconds",
            "finished", "code", "paired"}
OK_KEYS = {"model", "num_questions", "f1", "f1_se", "em", "em_se", "acc", "candidate_recall",
           "eval_dir", "per_question_f1"}

pytestmark = pytest.mark.skipif(
    not (DATA / "hotpot_distractor_train.json").is_file(),
    reason=f"the HotpotQA distractor files are absent ({DATA}); this test needs the shared "
           "data folder")


def _bench():
    """``bench/side_by_side.py`` (it imports its sibling benches as top-level modules)."""
    return import_bench("side_by_side")


def test_the_distractor_world_is_a_named_world() -> None:
    side_by_side = _bench()
    world = side_by_side.WORLDS["distractor"]
    for key in ("train_file", "dev_file", "test_file"):
        assert Path(world[key]).is_file(), key
    assert world["scoring"] == "hotpotqa" and world["label_source"] == "supporting"
    assert side_by_side.WORLD_TITLES["distractor"] == "HotpotQA distractor"


def test_the_distractor_world_ships_its_query_rewriter_labels() -> None:
    """The committed labels are the report's run: one line per improved training question, a
    real rewrite each (not the question), read by the SFT builder's own loader."""
    from mmoa.data.sft_builder import load_rewrites

    side_by_side = _bench()
    path = Path(side_by_side.WORLDS["distractor"]["rewrites_file"])
    assert path == ROOT / side_by_side.DISTRACTOR_REWRITES and path.is_file()
    report = json.loads((ROOT / "bench/results/qr_labels_distractor.json").read_text())
    run = report["labels_committed"]
    assert run["rewrites_file"] == side_by_side.DISTRACTOR_REWRITES
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    rewrites = load_rewrites(path)
    assert len(lines) == len(rewrites) == run["summary"]["improved"] > 0
    train = {" ".join(r["question"].split()).lower()
             for r in json.loads((DATA / "hotpot_distractor_train.json").read_text())}
    assert set(rewrites) <= train and len(train) == run["summary"]["questions"]
    assert all(subquestions != [line["source"]]
               for line, subquestions in zip(lines, rewrites.values(), strict=True))


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> dict[str, Any]:
    """The slice, its labels and the bench run twice (the second over finished rows), with
    every training and evaluation command the bench started and what each run printed."""
    side_by_side = _bench()

    from mmoa.cli import main as cli_main
    from mmoa.data.context_corpus import build_context_corpus
    from mmoa.retrieval.builder import BuildConfig, build_index
    from tests.retrieval_fixtures import running_server

    tmp_path = tmp_path_factory.mktemp("distractor_chain")
    files = write_hotpotqa_slice(DATA, "hotpot_distractor", SLICE, tmp_path / "hotpotqa")
    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    corpus_report = build_context_corpus(list(files.values()), corpus)
    build_index(BuildConfig(corpus=str(corpus), output=str(index), progress=False))
    rewrites = tmp_path / "qr_rewrites.json"
    out_json, markdown = tmp_path / "sbs.json", tmp_path / "sbs.md"
    spec = f"path={tiny_model_dir},template=llama3"

    commands: list[str] = []  # every training and evaluation the bench starts, in order
    real_run = subprocess.run

    def counting_run(command: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(command, list) and any("evaluate_qr_s_g" in str(c) or c == "mmoa.cli"
                                             for c in command):
            commands.append(" ".join(map(str, command)))
        return real_run(command, *args, **kwargs)

    def bench(*methods: str, options: tuple[str, ...] = (
            "--json-out", str(out_json), "--markdown", str(markdown)),
              failed: str = "") -> str:
        """The bench with ``methods`` (and ``options``); what it printed. ``failed``: the
        rows expected to fail, for which the command exits 1 after writing its table."""
        printed = io.StringIO()
        exits = pytest.raises(SystemExit, match=rf"row\(s\) failed \({failed}\)") if failed \
            else contextlib.nullcontext()
        with contextlib.redirect_stdout(printed), exits:
            side_by_side.main([*options,
                "--world", "distractor", "--train-file", str(files["train"]),
                "--dev-file", str(files["dev"]), "--test-file", str(files["test"]),
                "--rewrites-file", str(rewrites), "--index", "",  # no index: HARR's row fails
                "--retriever-url", server.url, "--model", "tiny",
                "--base-model", str(tiny_model_dir), "--precision", "fp32",
                "--work-dir", str(tmp_path / "work"), "--keep-checkpoints", *OVERRIDES,
                "--methods", *methods])
        return printed.getvalue()

    with running_server(["--index", str(index)], log_path=tmp_path / "server.log") as server:
        assert cli_main(["data", "qr-rewrites", "--data_file", str(files["train"]),
                         "--output", str(rewrites), "--retriever_url", server.url,
                         "--model", f"name=tiny,{spec}",
                         "--model", f"name=careful,{spec},variant=careful,temperature=0.7",
                         "--samples_per_model", "2", "--k", "5", "--compare",
                         "--max_new_tokens_qr", "16", "--no_progress"]) == 0
        with pytest.MonkeyPatch.context() as monkeypatch:
            monkeypatch.setattr(subprocess, "run", counting_run)
            # HARR first: it fails after its warm start, the rows after it still run
            first_out = bench("harr", "zero_shot", "sft_rag", "sft_rag1", "mappo",
                              failed="harr")
            first = json.loads(out_json.read_text())
            first_commands = list(commands)
            # the rerun: every finished row is skipped, nothing is trained or evaluated
            rerun_out = bench("zero_shot", "mappo")
            rerun_commands = list(commands)
            # a dev table in the same work folder evaluates the test table's trainings (MAPPO
            # at its checkpoint of step 1) and trains nothing
            bench("mappo", options=("--json-out", str(tmp_path / "dev.json"), "--eval-split",
                                    "dev", "--rl-step", "1", "--no-plot"))
    return {"files": files, "corpus_report": corpus_report, "rewrites": rewrites,
            "labels": json.loads(rewrites.with_name("qr_rewrites_report.json").read_text()),
            "work": tmp_path / "work", "out_json": out_json, "markdown": markdown,
            "first": first, "first_out": first_out, "first_commands": first_commands,
            "second": json.loads(out_json.read_text()), "rerun_out": rerun_out,
            "commands": rerun_commands, "dev": json.loads((tmp_path / "dev.json").read_text()),
            "dev_commands": commands[len(rerun_commands):]}


@pytest.mark.slow
@pytest.mark.timeout(1500)  # with the fixture: about 2.5 min of CPU; shared cores stretch it
def test_distractor_chain_on_a_slice(chain: dict[str, Any]) -> None:
    side_by_side = _bench()
    assert chain["corpus_report"].gold_all == sum(SLICE.values())  # every gold paragraph
    labels = chain["labels"]
    summary = labels["summaries"]["toa"]
    assert summary["questions"] == SLICE["train"] and summary["budget_per_question"] == 4
    assert set(labels["summaries"]) == {"toa", "best_of_n"}

    result = chain["first"]
    assert result["config"]["world"] == "distractor"
    assert result["config"]["rewrites_file"] == side_by_side.portable(str(chain["rewrites"]))
    rows = result["rows"]
    for name in ("sft", "sft_rag", "sft_rag1"):
        row = rows[name]
        assert row["status"] == "ok", row.get("error")
        assert row["num_questions"] == SLICE["test"] and row["scoring_profile"] == "hotpotqa"
    assert rows["sft_rag1"]["paired"]["vs"] == "sft_rag"
    # one candidate holds at most half of a two-paragraph question's gold
    assert rows["sft_rag1"]["candidate_recall"] <= 0.5 + 1e-9
    assert rows["sft_rag1"]["candidate_recall"] <= rows["sft_rag"]["candidate_recall"]
    # the SFT data took the synthesised QR labels: as many as there are improved questions
    log = next(chain["work"].glob("data-*/sft.log")).read_text()
    sources = re.search(r"QR targets from: (.*)", log)
    assert sources, log
    improved = summary["improved"]
    counts = {"rewrites": improved, "question": SLICE["train"] - improved}
    assert sorted(sources[1].split(", ")) == sorted(f"{k} {n}" for k, n in counts.items() if n)
    assert "rag K = 1, warm start" in chain["first_out"]  # the table names the K = 1 baseline
    # the evaluation reports how the Selector chose, not only how many it kept
    metrics = json.loads(next(chain["work"].glob("sft-[0-9a-f]*/eval/metrics.json")).read_text())
    choices = metrics["agents"]["selector"]["choices"]
    assert sum(choices["num_selected_share"].values()) == pytest.approx(1.0)
    assert 1 <= choices["distinct_choices"] <= SLICE["test"]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_side_by_side_on_a_real_slice(chain: dict[str, Any], tiny_model_dir: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    side_by_side = _bench()
    first, second = chain["first"], chain["second"]
    first_commands, out_json = chain["first_commands"], chain["out_json"]

    # the JSON: the table, the rows in the table's order, each with its columns
    assert first["bench"] == "side_by_side" and first["schema"] == 1
    # written by bench_runs.write_result: no path of this machine (here <tmp>/...)
    assert first["table"]["eval_file"] == side_by_side.portable(
        str(chain["files"]["test"].resolve()))
    assert first["table"]["scoring"] == "hotpotqa"
    assert first["order"] == ROWS
    rows = first["rows"]
    for name, row in rows.items():
        assert set(row) >= ROW_KEYS, name
    for name in ROWS[:-1]:
        row = rows[name]
        assert row["status"] == "ok", row.get("error")
        assert set(row) >= OK_KEYS
        assert row["num_questions"] == SLICE["test"]
        assert len(row["per_question_f1"]) == SLICE["test"]
        assert 0.0 <= row["f1"] <= 1.0 and row["f1_se"] is not None
        assert row["candidate_recall"] is not None  # each pipeline retrieves candidates
        assert row["scoring_profile"] == "hotpotqa"
        assert row["seconds"] > 0
    assert rows["mappo"]["paired"]["vs"] == "sft"
    assert rows["mappo"]["paired"]["n"] == SLICE["test"]
    assert rows["sft"]["paired"]["vs"] == "zero_shot"
    assert rows["zero_shot"]["paired"] is None
    assert rows["mappo"]["settings"]["needs"] == {"sft": rows["sft"]["key"]}
    training = rows["mappo"]["training"]  # its one step, as its trainer logged it
    assert len(training["reward"]) == len(training["time/step"]) == 1

    # the failed row is recorded, and the rows after it still ran: the warm start's training
    # and evaluation came before it, zero-shot's and the rag rows' evaluations and MAPPO after
    assert rows["harr"]["status"] == "failed" and rows["harr"]["paired"] is None
    assert "harr needs --index" in rows["harr"]["error"]

    def kind(command: str) -> str:
        words = command.split()
        return words[words.index("mmoa.cli") + 1] if "mmoa.cli" in words else "eval"

    assert [kind(c) for c in first_commands] == [
        "data", "train", "eval", "eval", "eval", "eval", "data", "train", "eval"]
    assert str(tiny_model_dir) in first_commands[3]  # the zero-shot row: the base model

    # the rerun skipped every finished row: no subprocess, the same rows
    rerun_out = chain["rerun_out"]
    assert chain["commands"] == first_commands
    assert rerun_out.count("finished before") == 3  # zero_shot, sft (mappo's), mappo
    assert {n: r["finished"] for n, r in second["rows"].items()} == \
        {n: r["finished"] for n, r in rows.items()}

    # the outputs: the printed table, the markdown, the plot, and --report's table
    table = side_by_side.format_table(second)
    assert rerun_out.rstrip().endswith(table)
    assert chain["markdown"].read_text() == side_by_side.format_markdown(second)
    assert out_json.with_suffix(".png").stat().st_size > 0
    capsys.readouterr()
    side_by_side.main(["--report", str(out_json), "--no-plot"])
    assert capsys.readouterr().out.rstrip() == table
    assert "harr failed: harr needs --index" in table
    print("row seconds:", {n: r["seconds"] for n, r in rows.items()})

    # the dev table in the same work folder: its two rows evaluated the test table's trainings
    # (the warm start, MAPPO at its checkpoint of step 1) on the dev split, and trained nothing
    dev = chain["dev"]
    assert dev["table"]["eval_split"] == "dev" and dev["order"] == ["sft", "mappo"]
    assert [kind(c) for c in chain["dev_commands"]] == ["eval", "eval"]
    assert all(str(chain["files"]["dev"]) in c for c in chain["dev_commands"])
    for name in ("sft", "mappo"):
        row = dev["rows"][name]
        assert row["status"] == "ok", row.get("error")
        assert row["num_questions"] == SLICE["dev"]
        assert row["key"] != rows[name]["key"]  # another table: its own evaluation
    assert dev["rows"]["sft"]["model"] == rows["sft"]["model"]
    assert dev["rows"]["mappo"]["model"] == str(Path(rows["mappo"]["model"]) / "checkpoint-1")
    assert dev["rows"]["mappo"]["settings"]["rl_step"] == 1
    assert "rl_step" not in rows["mappo"]["settings"]
    # a row's seconds hold its training's: the dev row's are at least the training's
    trainings = list(chain["work"].glob("mappo-train-*/training/result.json"))
    assert len(trainings) == 1  # one MAPPO training for both tables
    training = json.loads(trainings[0].read_text())
    assert dev["rows"]["mappo"]["seconds"] >= training["seconds"] > 0
