"""The README's "Real-model workflow, step by step" run as a user runs it, on real HotpotQA files.

A 10-question slice (7 train, 3 test) of ``../shared/data/hotpotqa_fullwiki_486`` goes through the
README's commands, each as a subprocess from the repository root: the corpus from the records'
paragraphs (``build_corpus.py``), the index (``build_index.py``, the default MiniLM encoder), the
server (``run_server.sh``), the SFT data with Selector labels from ``supporting_facts`` and the
MAPPO prompt set, the LoRA warm start with the real recipe's config (``run_sft.sh``), the merge
(``mmoa-cli export``), MAPPO with the real recipe's config (``run_mappo.sh``) and the evaluation
with the official HotpotQA scoring. Only the model (the tiny one), the paths and the sizes are
overridden (``key=value`` after the config, as the scripts document), so a config or command
that stops fitting the real files fails here. Nothing of the data is copied into the repository:
the slice is written under pytest's tmp_path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mmoa.fileio import read_jsonl
from tests.bench_fixtures import write_hotpotqa_slice

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "hotpotqa_fullwiki_486"
N_TRAIN, N_TEST = 7, 3
REAL = "LLaMA-Factory/examples/real"
#: Sizes cut for 2 CPU cores: five candidates instead of ten, a few new tokens per agent.
EVAL_SIZES = ("--k", "5", "--max_new_tokens_qr", "16", "--max_new_tokens_selector", "8",
              "--max_new_tokens_generator", "8")

pytestmark = pytest.mark.skipif(
    not (DATA / "hotpot_fullwiki_train.json").is_file(),
    reason=f"the real HotpotQA files are absent ({DATA}); this test needs the shared data folder",
)


def _run(stage: str, args: list[str], env: dict[str, str], timings: dict[str, float],
         timeout: float = 300) -> str:
    started = time.perf_counter()
    result = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=timeout, check=False)
    timings[stage] = round(time.perf_counter() - started, 1)
    assert result.returncode == 0, (stage, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_real_workflow_runs_on_hotpotqa_files(tmp_path: Path, tiny_model_dir: Path) -> None:
    from tests.retrieval_fixtures import running_server

    files = write_hotpotqa_slice(DATA, "hotpot_fullwiki", {"train": N_TRAIN, "test": N_TEST},
                                 tmp_path / "hotpotqa")
    train, test = files["train"], files["test"]
    data, saves = tmp_path / "data", tmp_path / "saves"
    corpus, index = tmp_path / "corpus.jsonl", tmp_path / "index"
    env = {**os.environ,
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    py = sys.executable
    timings: dict[str, float] = {}

    # 1. the corpus from the records' own paragraphs, and its index
    out = _run("corpus", [py, "data_builders/build_corpus.py", "--data_file", str(train),
                          str(test), "--output", str(corpus)], env, timings)
    rows = read_jsonl(corpus)
    assert f"{len(rows)} paragraphs from {N_TRAIN + N_TEST} questions" in out
    assert "gold supporting titles in the corpus: all" in out
    assert len({r["id"] for r in rows}) == len(rows) > N_TRAIN + N_TEST
    _run("index", [py, "data_builders/build_index.py", "--corpus", str(corpus), "--output",
                   str(index), "--no-progress"], env, timings)

    # 2. the server, 3. the SFT data (Selector labels from supporting_facts) and prompt set
    started = time.perf_counter()
    with running_server(["--index", str(index)], log_path=tmp_path / "server.log") as server:
        timings["server start"] = round(time.perf_counter() - started, 1)
        url = ["--retriever_url", server.url]
        out = _run("sft data", [py, "data_builders/qr_s_g_sft_data_alpaca.py", "--data_file",
                                str(train), "--name", "hotpotqa_sft", "--label_source",
                                "supporting", "--dataset_dir", str(data), *url], env, timings)
        assert f"qr {N_TRAIN}, selector {N_TRAIN}, generator {N_TRAIN}" in out
        coverage = re.search(r"among the K candidates: all (\d+), some (\d+), none (\d+) of "
                             r"(\d+) records", out)
        assert coverage, out
        assert sum(map(int, coverage.groups()[:3])) == int(coverage[4]) == N_TRAIN
        _run("mappo data", [py, "data_builders/get_ppo_data_alpaca.py", "--data_file",
                            str(train), "--name", "hotpotqa_mappo", "--dataset_dir", str(data)],
             env, timings)
        assert len(read_jsonl(data / "hotpotqa_mappo.jsonl")) == N_TRAIN

        # 4. warm start (the real LoRA recipe) and merge
        sizes = ["bf16=false", "per_device_train_batch_size=2", "gradient_accumulation_steps=1"]
        _run("sft", ["bash", "LLaMA-Factory/run_sft.sh", f"{REAL}/llama3_lora_sft.yaml",
                     f"model_name_or_path={tiny_model_dir}", f"dataset_dir={data}",
                     f"output_dir={saves / 'sft'}", "max_steps=2", "logging_steps=1",
                     "cutoff_len=1024",
                     "preprocessing_num_workers=1", "dataloader_num_workers=0", *sizes],
             env, timings)
        merged = tmp_path / "models" / "tiny-mmoa-sft"
        _run("export", ["mmoa-cli", "export", f"{REAL}/llama3_lora_sft_merge.yaml",
                        f"model_name_or_path={tiny_model_dir}",
                        f"adapter_name_or_path={saves / 'sft'}", f"export_dir={merged}"],
             env, timings)
        assert (merged / "config.json").is_file()

        # 5. MAPPO (the real recipe: a new LoRA over the merged warm start)
        _run("mappo", ["bash", "LLaMA-Factory/run_mappo.sh", f"{REAL}/llama3_lora_mappo.yaml",
                       f"model_name_or_path={merged}", f"dataset_dir={data}",
                       f"output_dir={saves / 'mappo'}", f"mappo_retriever_url={server.url}",
                       "max_steps=1", "ppo_epochs=1", "mappo_questions_per_rollout=2",
                       "mappo_top_k=5",
                       "mappo_max_new_tokens_qr=16", "mappo_max_new_tokens_selector=8",
                       "mappo_max_new_tokens_generator=8", *sizes], env, timings)
        log = (saves / "mappo" / "trainer_log.jsonl").read_text().splitlines()
        assert len(log) == 1 and "reward" in json.loads(log[0])
        assert (saves / "mappo" / "adapter_config.json").is_file()

        # 6. evaluation with the official HotpotQA scoring
        out = _run("eval", [py, "evaluate/evaluate_qr_s_g.py", "--model_name_or_path",
                            str(merged), "--adapter_name_or_path", str(saves / "mappo"),
                            "--template", "llama3", "--data_file", str(test), "--mode",
                            "qr_s_g", "--scoring", "hotpotqa", "--output_dir",
                            str(tmp_path / "eval"), *url, *EVAL_SIZES], env, timings)
    metrics = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    assert metrics["num_questions"] == N_TEST
    assert metrics["scoring"]["profile"] == "hotpotqa"
    assert 0.0 <= metrics["f1"] <= 1.0 and "f1_se" in metrics
    assert len(read_jsonl(tmp_path / "eval" / "predictions.jsonl")) == N_TEST
    print("real workflow stage times (s):", json.dumps(timings))
