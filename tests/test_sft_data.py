"""Warm-start data: builders on the demo world, token identity with LLaMA-Factory's SFT
encoding, registry safety, bad input, and the demo SFT config training for a few steps."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mmoa.agents.candidates import merge_candidates
from mmoa.agents.parsers import parse_answer, parse_selection, parse_subquestions
from mmoa.agents.prompts import AgentPrompt
from mmoa.cli import main as cli_main
from mmoa.data.loaders import load_qa
from mmoa.data.registry import read_dataset_info
from mmoa.data.sft_builder import (
    SFTBuildConfig,
    agent_records,
    build_sft_records,
    is_heuristic_positive,
    label_words,
)
from mmoa.retrieval.client import RetrievalClient

ROOT = Path(__file__).resolve().parents[1]
FOREIGN = {"someone_elses_data": {"file_name": "other.json", "formatting": "sharegpt"}}


def test_label_words_follow_the_original_heuristic() -> None:
    assert label_words(["The Amber Lantern"], "Who?") == {"amber", "lantern"}
    assert label_words(["1987"], "When?") == {"1987"}
    # yes/no answers: the question's content words label the documents
    assert label_words(["yes"], "Were Ada Brel and Bo Crane born in the same city?") == {
        "ada", "brel", "bo", "crane", "born", "city"
    }
    assert is_heuristic_positive("Ada Brel (born 1950 in Tronford).", {"tronford"})
    assert not is_heuristic_positive("Ada Brel was born in Orvale.", {"tronford"})


@pytest.fixture(scope="module")
def built(tiny_world_dir: Path, tiny_server_url: str):
    records = load_qa(tiny_world_dir / "train.jsonl", "demo")
    client = RetrievalClient(tiny_server_url)
    alpaca, report = build_sft_records(records, client, SFTBuildConfig())
    return records, alpaca, report


def test_builder_counts_and_record_validity(built) -> None:
    records, alpaca, report = built
    n = len(records)
    assert len(alpaca) == 3 * n
    assert report.records == {"qr": n, "selector": n, "generator": n}
    assert report.qr_target_sources == {"decomposition": n}
    assert 0.0 <= report.empty_selection_rate < 0.6
    assert report.supporting_recall is not None and report.supporting_recall > 0.3
    for record in alpaca:
        assert set(record) == {"instruction", "input", "output", "system"}
        assert all(isinstance(v, str) for v in record.values())
    for i, qa in enumerate(records):
        qr, sel, gen = alpaca[3 * i: 3 * i + 3]
        assert parse_subquestions(qr["output"], qa.question).subquestions == qa.decomposition
        selection = parse_selection(sel["output"], 10)
        assert selection.well_formed and selection.ids == sorted(selection.ids)
        assert sel["input"].count("\n\nDocument") == 10
        assert parse_answer(gen["output"]).answer == qa.answers[0]
        assert gen["input"].count("Document") == len(selection.ids)


def test_supporting_labels_select_exactly_the_gold_passages(tiny_world_dir: Path,
                                                            tiny_server_url: str) -> None:
    records = load_qa(tiny_world_dir / "train.jsonl", "demo")[:20]
    alpaca, report = build_sft_records(records, RetrievalClient(tiny_server_url),
                                       SFTBuildConfig(label_source="supporting"))
    assert report.supporting_precision == 1.0
    for i, qa in enumerate(records):
        sel = alpaca[3 * i + 1]
        chosen = parse_selection(sel["output"], 10).ids
        titles = [block.split("\n", 1)[0].split(": ", 1)[1]
                  for block in sel["input"].split("\n\n") if block.startswith("Document")]
        assert len(chosen) <= len(qa.supporting_ids or [])
        assert all(0 <= c < len(titles) for c in chosen)


def test_rendered_sft_tokens_equal_llamafactory_encoding(built, tiny_model_dir: Path,
                                                         tmp_path: Path) -> None:
    """LLaMA-Factory's SFT preprocessing of our records gives exactly the ids the pipeline
    prompts with (+ the response): one prompt definition, one encoding."""
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    from mmoa.agents.render import PromptRenderer
    from mmoa.data.sft_builder import ALPACA_COLUMNS

    _, alpaca, _ = built
    sample = alpaca[:30]
    (tmp_path / "sft.json").write_text(json.dumps(sample))
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"sft": {"file_name": "sft.json", "columns": ALPACA_COLUMNS}}))
    model_args, data_args, training_args, _, _ = get_train_args({
        "model_name_or_path": str(tiny_model_dir), "stage": "sft", "do_train": True,
        "finetuning_type": "full", "dataset": "sft", "dataset_dir": str(tmp_path),
        "template": "llama3", "cutoff_len": 4096, "output_dir": str(tmp_path / "out"),
        "overwrite_cache": True, "report_to": "none", "preprocessing_num_workers": 1,
    })
    tokenizer_module = load_tokenizer(model_args)
    tokenizer = tokenizer_module["tokenizer"]
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    dataset = get_dataset(template, model_args, data_args, training_args, "sft",
                          **tokenizer_module)["train_dataset"]
    renderer = PromptRenderer(tokenizer, "llama3")
    for row, record in zip(dataset, sample, strict=True):
        prompt = AgentPrompt("qr", record["system"], record["instruction"], record["input"])
        prompt_ids, response_ids = renderer.sft_ids(prompt, record["output"])
        assert prompt_ids == renderer.prompt_ids(prompt)
        assert row["input_ids"] == prompt_ids + response_ids
        assert row["labels"][len(prompt_ids):] == response_ids


def _sft_args(world: Path, out: Path, url: str, *extra: str) -> list[str]:
    return ["data", "sft", "--data_file", str(world / "train.jsonl"), "--dataset_dir", str(out),
            "--name", "tiny_sft", "--retriever_url", url, *extra]


def test_cli_registers_without_clobbering_foreign_entries(tiny_world_dir: Path,
                                                          tiny_server_url: str,
                                                          tmp_path: Path) -> None:
    (tmp_path / "dataset_info.json").write_text(json.dumps(FOREIGN))
    assert cli_main(_sft_args(tiny_world_dir, tmp_path, tiny_server_url)) == 0
    assert cli_main(["data", "mappo", "--data_file", str(tiny_world_dir / "train.jsonl"),
                     "--dataset_dir", str(tmp_path), "--name", "tiny_mappo"]) == 0
    info = read_dataset_info(tmp_path)
    assert info["someone_elses_data"] == FOREIGN["someone_elses_data"]
    assert info["tiny_sft"]["formatting"] == "alpaca"
    assert info["tiny_mappo"]["mmoa_format"] == "demo"
    mappo = load_qa(tmp_path / "tiny_mappo.jsonl", "demo")
    source = load_qa(tiny_world_dir / "train.jsonl", "demo")
    assert [r.answers for r in mappo] == [r.answers for r in source], "every alias is kept"
    assert len(json.loads((tmp_path / "tiny_sft.json").read_text())) == 3 * len(source)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--retriever_url", "http://127.0.0.1:9"], "127.0.0.1:9"),
        (["--rewrites_file", "BAD"], "Rewrite-Retrieve-Read"),
        (["--rewrites_file", "MISSING"], "rewrites file not found"),
    ],
)
def test_bad_input_writes_nothing(tiny_world_dir: Path, tiny_server_url: str, tmp_path: Path,
                                  capsys, extra: list[str], message: str) -> None:
    (tmp_path / "dataset_info.json").write_text(json.dumps(FOREIGN))
    bad = tmp_path / "bad_rewrites.json"
    bad.write_text(json.dumps([{"question": "q", "rewrite": "a; b"}]))
    extra = [str(bad) if e == "BAD" else str(tmp_path / "none.json") if e == "MISSING" else e
             for e in extra]
    args = _sft_args(tiny_world_dir, tmp_path, tiny_server_url) + extra
    assert cli_main(args) == 2
    assert message in capsys.readouterr().err
    assert json.loads((tmp_path / "dataset_info.json").read_text()) == FOREIGN
    assert not (tmp_path / "tiny_sft.json").exists()


def test_unknown_dataset_and_missing_file(tmp_path: Path, capsys) -> None:
    assert cli_main(["data", "mappo", "--dataset", "nope", "--dataset_dir", str(tmp_path)]) == 2
    assert "'nope' is not registered" in capsys.readouterr().err
    assert cli_main(["data", "mappo", "--data_file", str(tmp_path / "x.jsonl"),
                     "--dataset_dir", str(tmp_path)]) == 2
    assert "x.jsonl" in capsys.readouterr().err
    assert not (tmp_path / "dataset_info.json").exists()


def test_ranked_candidates_keep_the_pipelines_order(tiny_world_dir: Path,
                                                     tiny_server_url: str) -> None:
    """``candidate_order="ranked"``: the Selector's record shows the candidates in the order
    the pipeline merges them (its rollouts and evaluation see that order); the default
    shuffles them, with the same labels by content."""
    records = load_qa(tiny_world_dir / "train.jsonl", "demo")[:8]
    client = RetrievalClient(tiny_server_url)
    config = SFTBuildConfig(label_source="supporting", k=5)
    ranked, report = build_sft_records(records, client, replace(config, candidate_order="ranked"))
    shuffled, _ = build_sft_records(records, client, config)
    assert report.candidate_order == "ranked" and "candidates ranked" in report.lines()[3]
    moved = 0
    for i, qa in enumerate(records):
        merged = merge_candidates([client.search_documents([q], 5)[0]
                                   for q in qa.decomposition], 5)
        expected = agent_records(qa.question, qa.decomposition, [c.text for c in merged], [],
                                 None)[1]
        assert ranked[3 * i + 1]["input"] == expected["input"]
        moved += ranked[3 * i + 1]["input"] != shuffled[3 * i + 1]["input"]
        assert ranked[3 * i + 2]["output"] == shuffled[3 * i + 2]["output"]
    assert moved > 0
    with pytest.raises(ValueError, match="candidate_order"):
        SFTBuildConfig(candidate_order="sorted")  # type: ignore[arg-type]


def test_rewrites_file_feeds_the_qr_targets(tiny_world_dir: Path, tiny_server_url: str,
                                            tmp_path: Path) -> None:
    records = load_qa(tiny_world_dir / "train.jsonl", "demo")[:6]
    rewrites = tmp_path / "rrr.json"
    rewrites.write_text(json.dumps([{"source": records[0].question,
                                     "target": "first query; second query"}]))
    from mmoa.data.sft_builder import load_rewrites

    alpaca, report = build_sft_records(records, RetrievalClient(tiny_server_url),
                                       SFTBuildConfig(), load_rewrites(rewrites))
    assert alpaca[0]["output"] == "first query\nsecond query"
    assert report.qr_target_sources == {"rewrites": 1, "decomposition": 5}


@pytest.mark.slow
def test_demo_sft_config_trains(tiny_world_dir: Path, tiny_server_url: str,
                                tiny_model_dir: Path, tmp_path: Path) -> None:
    """run_sft.sh with the demo config (shortened by overrides) trains and writes its files."""
    assert cli_main(_sft_args(tiny_world_dir, tmp_path, tiny_server_url,
                              "--max_samples", "16")) == 0
    out = tmp_path / "sft_out"
    result = subprocess.run(
        ["bash", str(ROOT / "LLaMA-Factory/run_sft.sh"),
         str(ROOT / "LLaMA-Factory/examples/demo/tiny_full_sft.yaml"),
         f"model_name_or_path={tiny_model_dir}", f"dataset_dir={tmp_path}",
         "dataset=tiny_sft", f"output_dir={out}", "max_steps=3", "logging_steps=1",
         "per_device_train_batch_size=4", "gradient_accumulation_steps=1",
         "preprocessing_num_workers=1"],
        capture_output=True, text=True, timeout=600, check=False,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("model.safetensors", "trainer_log.jsonl", "trainer_state.json",
                 "training_loss.png", "all_results.json"):
        assert (out / name).is_file(), name
    log = [json.loads(line) for line in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert len(log) >= 3 and all("loss" in entry for entry in log[:3])
