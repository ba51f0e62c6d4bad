"""The whole pipeline with the untrained tiny model against the live demo server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmoa.agents.modes import MODE_AGENTS, MODES
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
        # the Selector's opening record: greedy, it stops at once exactly when it selects nothing
        selector = trace.calls["selector"]
        assert 0.0 <= selector.opening_stop_probability <= 1.0
        assert selector.opening_greedy_stop == (selector.response_text == "")
        assert trace.calls["qr"].opening_stop_probability is None


def _behaviour_ratios(tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str,
                      *, constrained: bool, score_temperatures: tuple[float, ...],
                      agent_temperatures: dict[str, float] | None = None,
                      score_agent_temperatures: tuple[dict[str, float], ...] | None = None,
                      masked_scoring: bool = False) -> list[dict[str, float]]:
    """Roll out 4 questions with sampling at temperature 0.7 (``agent_temperatures`` for the
    agents it names; no top-p), recording each token's sampling log-prob, then score them as the
    MAPPO learner does at each temperature given (with the per-agent ones of
    ``score_agent_temperatures``, one per temperature; with ``masked_scoring`` over the
    supports the grammar mask allowed, as ``mappo_masked_scoring`` does)."""
    import copy

    import torch

    from mmoa.agents.pipeline import GenerationSettings, RagPipeline
    from mmoa.modeling import load_for_inference
    from mmoa.train.mappo.learner import (
        PolicyWithValue,
        PPOConfig,
        PPOLearner,
        behaviour_ratio_stats,
    )
    from mmoa.train.mappo.samples import Sample
    from mmoa.train.mappo.value_head import ValueHead

    model, tokenizer = load_for_inference(tiny_model_dir, "llama3")
    torch.manual_seed(0)
    settings = GenerationSettings(do_sample=True, temperature=0.7,
                                  agent_temperatures=dict(agent_temperatures or {}),
                                  top_p=1.0, top_k=0,
                                  max_new_tokens={"qr": 16, "selector": 12, "generator": 8},
                                  constrained_selector=constrained, record_logprobs=True,
                                  record_support=masked_scoring)
    pipeline = RagPipeline(model, tokenizer, "llama3", RetrievalClient(tiny_server_url), k=5,
                           settings=settings)
    records = load_qa(tiny_world_dir / "dev.jsonl", "demo")[:4]
    samples = [Sample(call.agent, call.prompt_ids, call.response_ids, 0.0,
                      call.sampling_logprobs, support=call.support)
               for trace in pipeline.run([r.question for r in records])
               for call in trace.calls.values()]
    assert all(len(s.sampling_logprobs or []) == len(s.response_ids) for s in samples)
    out = []
    per_agent = score_agent_temperatures or ({},) * len(score_temperatures)
    for temperature, by_agent in zip(score_temperatures, per_agent, strict=True):
        policy = PolicyWithValue(model, ValueHead(model.config.hidden_size),
                                 ref_model=copy.deepcopy(model), temperature=temperature,
                                 agent_temperatures=by_agent)
        learner = PPOLearner(policy, torch.optim.SGD(policy.parameters(), lr=0.0), PPOConfig(),
                             pad_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        out.append(behaviour_ratio_stats(learner.prepare(samples)))
    return out


def test_the_scored_policy_is_the_sampled_one(tiny_model_dir: Path, tiny_world_dir: Path,
                                              tiny_server_url: str) -> None:
    """Old log-probs taken at the sampling temperature equal the log-probs the tokens were drawn
    with (ratio 1 up to float noise); taken at temperature 1, as before, they do not."""
    at_sampling, at_one = _behaviour_ratios(tiny_model_dir, tiny_world_dir, tiny_server_url,
                                            constrained=False, score_temperatures=(0.7, 1.0))
    assert at_sampling["behaviour_ratio/mean"] == pytest.approx(1.0, abs=1e-4)
    assert 1 - 1e-3 < at_sampling["behaviour_ratio/min"] <= at_sampling[
        "behaviour_ratio/max"] < 1 + 1e-3
    assert abs(at_one["behaviour_ratio/mean"] - 1.0) > 0.05 or \
        at_one["behaviour_ratio/max"] - at_one["behaviour_ratio/min"] > 0.1


def test_an_agents_own_temperature_is_the_one_it_is_scored_at(tiny_model_dir: Path,
                                                               tiny_world_dir: Path,
                                                               tiny_server_url: str) -> None:
    """With the Selector sampling at 0.3 and the others at 0.7, scoring each row at its agent's
    temperature gives ratio 1 for every agent; scoring the Selector at the shared 0.7 does not."""
    own, shared = _behaviour_ratios(
        tiny_model_dir, tiny_world_dir, tiny_server_url, constrained=False,
        agent_temperatures={"selector": 0.3}, score_temperatures=(0.7, 0.7),
        score_agent_temperatures=({"selector": 0.3}, {}))
    for agent in ("qr", "selector", "generator"):
        assert own[f"behaviour_ratio/{agent}"] == pytest.approx(1.0, abs=1e-4)
        if agent != "selector":
            assert shared[f"behaviour_ratio/{agent}"] == pytest.approx(1.0, abs=1e-4)
    assert own["behaviour_ratio/max"] < 1 + 1e-3 and own["behaviour_ratio/min"] > 1 - 1e-3
    assert shared["behaviour_ratio/max"] - shared["behaviour_ratio/min"] > 0.05


def test_the_selector_grammar_only_narrows_the_sampler(tiny_model_dir: Path,
                                                       tiny_world_dir: Path,
                                                       tiny_server_url: str) -> None:
    """Under the grammar mask the sampler renormalises over the allowed tokens, so the scored
    probability (the model's own distribution) is at most the sampled one: ratio <= 1 for the
    Selector, still 1 for the unconstrained agents."""
    (stats,) = _behaviour_ratios(tiny_model_dir, tiny_world_dir, tiny_server_url,
                                 constrained=True, score_temperatures=(0.7,))
    assert stats["behaviour_ratio/selector"] < 1.0
    assert stats["behaviour_ratio/max"] < 1 + 1e-3
    for agent in ("qr", "generator"):
        assert stats[f"behaviour_ratio/{agent}"] == pytest.approx(1.0, abs=1e-4)


def test_masked_scoring_scores_the_selector_as_it_was_sampled(tiny_model_dir: Path,
                                                              tiny_world_dir: Path,
                                                              tiny_server_url: str) -> None:
    """Scored over the supports its grammar mask allowed, the Selector's tokens get the
    log-probs they were sampled with (ratio 1 up to float noise), as the unmasked agents do."""
    (stats,) = _behaviour_ratios(tiny_model_dir, tiny_world_dir, tiny_server_url,
                                 constrained=True, score_temperatures=(0.7,),
                                 masked_scoring=True)
    for agent in ("qr", "selector", "generator"):
        assert stats[f"behaviour_ratio/{agent}"] == pytest.approx(1.0, abs=1e-4)
    assert stats["behaviour_ratio/max"] < 1 + 1e-3 and stats["behaviour_ratio/min"] > 1 - 1e-3


def test_sampled_evaluation_is_seeded_and_labelled(tiny_model_dir: Path, tiny_world_dir: Path,
                                                   tmp_path: Path) -> None:
    """``do_sample`` decodes as the rollouts do: the same seed repeats a run, another seed
    samples other answers, and the table says the run was sampled. (Mode ``g``: no server.)"""
    def run(name: str, **sampling: object) -> list[str]:
        config = EvalConfig(
            model_name_or_path=str(tiny_model_dir), template="llama3",
            output_dir=str(tmp_path / name), data_file=str(tiny_world_dir / "dev.jsonl"),
            data_format="demo", mode="g", batch_size=8, max_samples=8,
            max_new_tokens_generator=8, precision="fp32", **sampling)  # type: ignore[arg-type]
        evaluate(config, progress=False)
        rows = (tmp_path / name / "predictions.jsonl").read_text().splitlines()
        return [json.loads(line)["raw_outputs"]["generator"] for line in rows]

    greedy = run("greedy")
    first = run("seed1", do_sample=True, seed=1)
    assert run("seed1-again", do_sample=True, seed=1) == first
    assert run("seed2", do_sample=True, seed=2) != first
    assert first != greedy
    metrics = load_metrics(tmp_path / "seed1")
    assert metrics["config"]["do_sample"] is True and metrics["config"]["seed"] == 1
    table = format_table([("greedy", load_metrics(tmp_path / "greedy")),
                          ("sampled", metrics)]).splitlines()
    assert table[2].split()[1] == "g" and table[3].split()[1:3] == ["g", "(sampled)"]
    with pytest.raises(ValueError, match="temperature"):
        EvalConfig(model_name_or_path="m", template="llama3", output_dir="o", data_file="f",
                   do_sample=True, temperature=0.0).validate()


def test_the_eval_command_reads_the_sampling_options() -> None:
    from mmoa.cli import build_parser

    args = build_parser().parse_args(["eval", "--do_sample", "--temperature", "0.7",
                                      "--seed", "3"])
    assert (args.do_sample, args.temperature, args.top_p, args.seed) == (True, 0.7, None, 3)
    assert build_parser().parse_args(["eval"]).do_sample is None  # EvalConfig's default
