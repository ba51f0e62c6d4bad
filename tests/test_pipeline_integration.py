"""The whole pipeline with the untrained tiny model against the live demo server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmoa.agents.pipeline import MODE_AGENTS, MODES
from mmoa.agents.prompts import generator_prompt, qr_prompt, selector_prompt
from mmoa.data.loaders import load_qa
from mmoa.evaluation import EvalConfig, evaluate, format_table, load_metrics
from mmoa.retrieval.client import RetrievalClient

N_QUESTIONS = 20


@pytest.fixture(scope="module")
def eval_runs(tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One evaluation per pipeline mode on 20 dev questions (greedy, untrained model)."""
    base = tmp_path_factory.mktemp("eval")
    outputs = {}
    for mode in MODES:
        config = EvalConfig(
            model_name_or_path=str(tiny_model_dir), template="llama3",
            output_dir=str(base / mode), data_file=str(tiny_world_dir / "dev.jsonl"),
            data_format="demo", retriever_url=tiny_server_url, mode=mode, batch_size=8,
            max_samples=N_QUESTIONS, max_new_tokens_qr=24, max_new_tokens_selector=16,
            max_new_tokens_generator=12,
        )
        evaluate(config, progress=False)
        outputs[mode] = base / mode
    return outputs


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_writes_predictions_and_metrics(eval_runs: dict[str, Path], mode: str) -> None:
    out = eval_runs[mode]
    rows = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    metrics = load_metrics(out)
    assert len(rows) == N_QUESTIONS and metrics["num_questions"] == N_QUESTIONS
    assert metrics["mode"] == mode
    for key in ("acc", "em", "f1"):
        assert 0.0 <= metrics[key] <= 1.0
    for row in rows:
        assert {"question", "subquestions", "candidates", "selected_ids", "prediction",
                "answers", "scores"} <= set(row)
        assert set(row["raw_outputs"]) == set(MODE_AGENTS[mode])
        if mode == "g":
            assert row["candidates"] == []
        else:
            assert 1 <= len(row["candidates"]) <= 10
            ids = [c["id"] for c in row["candidates"]]
            assert len(set(ids)) == len(ids), "candidates must be de-duplicated"
            assert all(0 <= i < len(ids) for i in row["selected_ids"])
        if mode in ("rag", "s_g"):
            assert row["subquestions"] == [row["question"]]
    if "selector" in MODE_AGENTS[mode]:
        assert metrics["agents"]["selector"]["well_formed_rate"] == 1.0, "constrained decoding"
    if mode in ("rag", "s_g"):  # the question itself as query: the real encoder finds support
        assert metrics["agents"]["retrieval"]["candidate_support_recall"] > 0.3


def test_compare_prints_one_table(eval_runs: dict[str, Path]) -> None:
    table = format_table([(mode, load_metrics(path)) for mode, path in eval_runs.items()])
    assert len(table.splitlines()) == 2 + len(MODES)
    assert "F1" in table.splitlines()[0]


def test_trace_prompts_are_the_one_prompt_definition(tiny_model_dir: Path,
                                                     tiny_world_dir: Path,
                                                     tiny_server_url: str) -> None:
    """Each agent call in a trace carries exactly the prompt the shared definitions build from
    the trace's own inputs, encoded exactly as LLaMA-Factory's SFT stage encodes a record."""
    from mmoa.agents.candidates import merge_candidates
    from mmoa.agents.pipeline import GenerationSettings, RagPipeline
    from mmoa.modeling import load_for_inference

    model, tokenizer = load_for_inference(tiny_model_dir, "llama3")
    client = RetrievalClient(tiny_server_url)
    settings = GenerationSettings(max_new_tokens={"qr": 24, "selector": 16, "generator": 12})
    pipeline = RagPipeline(model, tokenizer, "llama3", client, settings=settings)
    records = load_qa(tiny_world_dir / "dev.jsonl", "demo")[:4]
    traces = pipeline.run([r.question for r in records])
    for record, trace in zip(records, traces, strict=True):
        merged = merge_candidates(client.search_documents(trace.subquestions, 10), 10)
        assert [c.id for c in merged] == [c.id for c in trace.candidates]
        texts = [c.text for c in merged]
        expected = {
            "qr": qr_prompt(record.question),
            "selector": selector_prompt(record.question, texts),
            "generator": generator_prompt(record.question, [texts[i] for i in trace.selected]),
        }
        for agent, prompt in expected.items():
            call = trace.calls[agent]
            assert call.prompt == prompt
            sft_prompt_ids, _ = pipeline.renderer.sft_ids(prompt, call.response_text)
            assert call.prompt_ids == sft_prompt_ids
