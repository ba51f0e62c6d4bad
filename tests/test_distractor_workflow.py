"""The HotpotQA distractor workflow end to end, on a slice of the shared distractor files.

The chain a user runs on the second real set (docs/real_workflow.md), with the tiny model and a
few steps: the corpus from the slice's paragraphs (every gold paragraph present), its index,
the real server on loopback, Query Rewriter labels synthesised with the live retriever
(``mmoa-cli data qr-rewrites``, TOA against best-of-N), then ``bench/side_by_side.py`` with
those labels: the SFT data (Selector labels from ``supporting_facts``), the warm start, ``rag``
with K = 5 and K = 1, MAPPO, each evaluated with the official HotpotQA scoring. Nothing of the
data is copied into the repository: the slice is written under pytest's tmp_path.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.bench_fixtures import SIDE_BY_SIDE_TINY_OVERRIDES, write_hotpotqa_slice

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "hotpotqa_distractor_1k"
SLICE = {"train": 8, "dev": 3, "test": 3}
OVERRIDES = SIDE_BY_SIDE_TINY_OVERRIDES

pytestmark = pytest.mark.skipif(
    not (DATA / "hotpot_distractor_train.json").is_file(),
    reason=f"the HotpotQA distractor files are absent ({DATA}); this test needs the shared "
           "data folder")


def test_the_distractor_world_is_a_named_world() -> None:
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    import side_by_side

    world = side_by_side.WORLDS["distractor"]
    for key in ("train_file", "dev_file", "test_file"):
        assert Path(world[key]).is_file(), key
    assert world["scoring"] == "hotpotqa" and world["label_source"] == "supporting"
    assert side_by_side.WORLD_TITLES["distractor"] == "HotpotQA distractor"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_distractor_chain_on_a_slice(tmp_path: Path, tiny_model_dir: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    if str(ROOT / "bench") not in sys.path:
        sys.path.insert(0, str(ROOT / "bench"))
    import side_by_side

    from mmoa.cli import main as cli_main
    from mmoa.data.context_corpus import build_context_corpus
    from mmoa.retrieval.builder import BuildConfig, build_index
    from tests.retrieval_fixtures import running_server

    files = write_hotpotqa_slice(DATA, "hotpot_distractor", SLICE, tmp_path / "hotpotqa")
    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    report = build_context_corpus(list(files.values()), corpus)
    assert report.gold_all == sum(SLICE.values())  # every gold paragraph present
    build_index(BuildConfig(corpus=str(corpus), output=str(index), progress=False))
    rewrites = tmp_path / "qr_rewrites.json"
    out_json = tmp_path / "sbs.json"
    spec = f"path={tiny_model_dir},template=llama3"
    with running_server(["--index", str(index)], log_path=tmp_path / "server.log") as server:
        assert cli_main(["data", "qr-rewrites", "--data_file", str(files["train"]),
                         "--output", str(rewrites), "--retriever_url", server.url,
                         "--model", f"name=tiny,{spec}",
                         "--model", f"name=careful,{spec},variant=careful,temperature=0.7",
                         "--samples_per_model", "2", "--k", "5", "--compare",
                         "--max_new_tokens_qr", "16", "--no_progress"]) == 0
        labels = json.loads(rewrites.with_name("qr_rewrites_report.json").read_text())
        capsys.readouterr()
        side_by_side.main([
            "--world", "distractor", "--train-file", str(files["train"]),
            "--dev-file", str(files["dev"]), "--test-file", str(files["test"]),
            "--rewrites-file", str(rewrites), "--index", str(index),
            "--retriever-url", server.url, "--model", "tiny",
            "--base-model", str(tiny_model_dir), "--precision", "fp32",
            "--work-dir", str(tmp_path / "work"), "--json-out", str(out_json), "--no-plot",
            "--methods", "sft", "sft_rag", "sft_rag1", "mappo", *OVERRIDES])
        printed = capsys.readouterr().out
    summary = labels["summaries"]["toa"]
    assert summary["questions"] == SLICE["train"] and summary["budget_per_question"] == 4
    assert set(labels["summaries"]) == {"toa", "best_of_n"}

    result = json.loads(out_json.read_text())
    assert result["config"]["world"] == "distractor"
    assert result["config"]["rewrites_file"] == side_by_side.portable(str(rewrites))
    rows = result["rows"]
    for name in ("sft", "sft_rag", "sft_rag1", "mappo"):
        row = rows[name]
        assert row["status"] == "ok", row.get("error")
        assert row["num_questions"] == SLICE["test"] and row["scoring_profile"] == "hotpotqa"
    assert rows["sft_rag1"]["paired"]["vs"] == "sft_rag"
    assert rows["mappo"]["paired"]["vs"] == "sft"
    # one candidate holds at most half of a two-paragraph question's gold
    assert rows["sft_rag1"]["candidate_recall"] <= 0.5 + 1e-9
    assert rows["sft_rag1"]["candidate_recall"] <= rows["sft_rag"]["candidate_recall"]
    # the SFT data took the synthesised QR labels: as many as there are improved questions
    log = next((tmp_path / "work").glob("data-*/sft.log")).read_text()
    sources = re.search(r"QR targets from: (.*)", log)
    assert sources, log
    improved = summary["improved"]
    counts = {"rewrites": improved, "question": SLICE["train"] - improved}
    assert sorted(sources[1].split(", ")) == sorted(f"{k} {n}" for k, n in counts.items() if n)
    assert "rag K = 1, warm start" in printed  # the table names the K = 1 baseline
