"""The counterfactual credit end to end: the tiny model's rollout against the live retrieval
server on loopback (the counterfactual pipelines, batched after the traces' own), a MAPPO run
whose trainer log carries the credit's statistics, under ppo and grpo, and two processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from mmoa.agents.candidates import merge_candidates
from mmoa.agents.prompts import generator_prompt
from mmoa.agents.render import PromptRenderer
from mmoa.data.loaders import load_qa
from mmoa.pipelines import get_pipeline
from mmoa.pipelines.counterfactual import (
    CF_GENERATOR_STAGE,
    default_selection,
    uses_default,
)
from mmoa.retrieval.client import RetrievalClient
from mmoa.train.mappo.agent_stats import counterfactual_log_keys
from mmoa.train.mappo.args import MappoArguments
from mmoa.train.mappo.rewards import compute_agent_rewards, shared_reward
from mmoa.train.mappo.workflow import run_mappo
from tests.mappo_fixtures import run_two_processes, tiny_mappo_config

K = 5
MAX_NEW_TOKENS = {"mappo_max_new_tokens_qr": 16, "mappo_max_new_tokens_selector": 12,
                  "mappo_max_new_tokens_generator": 8}


@pytest.fixture(scope="module")
def rollout_parts(tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str
                  ) -> dict[str, Any]:
    from mmoa.modeling import load_for_inference

    model, tokenizer = load_for_inference(tiny_model_dir, "llama3", use_cpu=True)
    return {"model": model, "tokenizer": tokenizer,
            "renderer": PromptRenderer(tokenizer, "llama3"),
            "client": RetrievalClient(tiny_server_url),
            "records": load_qa(tiny_world_dir / "train.jsonl", "demo")[:6]}


def _rollout(parts: dict[str, Any], args: MappoArguments) -> Any:
    torch.manual_seed(0)
    return get_pipeline("qr_s_g").rollout(
        parts["model"], parts["tokenizer"], parts["renderer"], parts["client"], args,
        [r.question for r in parts["records"]])


def _args(**extra: Any) -> MappoArguments:
    return MappoArguments(mappo_top_k=K, mappo_rollout_batch_size=4, **MAX_NEW_TOKENS, **extra)


def _own(trace: Any) -> tuple[Any, ...]:
    return (trace.subquestions, [c.id for c in trace.candidates], trace.selected, trace.answer,
            [trace.calls[a].response_ids for a in ("qr", "selector", "generator")])


@pytest.mark.parametrize("default", ["all", "top1"])
def test_the_rollout_runs_each_agents_default_beside_its_own_traces(
        rollout_parts: dict[str, Any], default: str) -> None:
    plain = _rollout(rollout_parts, _args())
    credited = _rollout(rollout_parts, _args(mappo_counterfactual_agents="qr,selector",
                                             mappo_counterfactual_selector_default=default))
    # the counterfactuals draw their random numbers after the traces' own sampling
    assert [_own(t) for t in credited.traces] == [_own(t) for t in plain.traces]
    assert CF_GENERATOR_STAGE not in plain.timings.stages
    client = rollout_parts["client"]
    made: set[str] = set()
    for trace in credited.traces:
        for agent in ("qr", "selector"):
            assert (agent in trace.counterfactuals) != uses_default(agent, trace, default)
        if "qr" in trace.counterfactuals:
            cf = trace.counterfactuals["qr"]
            assert cf.subquestions == [trace.question]
            question_top_k = merge_candidates(client.search_documents([trace.question], K), K)
            assert [c.id for c in cf.candidates] == [c.id for c in question_top_k]
            assert set(cf.calls) == {"selector", "generator"}, "its own Selector and Generator"
            assert cf.calls["selector"].sampling_logprobs is None
        if "selector" in trace.counterfactuals:
            cf = trace.counterfactuals["selector"]
            assert cf.candidates == trace.candidates and cf.subquestions == trace.subquestions
            assert cf.selected == default_selection(len(trace.candidates), default)
            assert set(cf.calls) == {"generator"}
            assert cf.calls["generator"].prompt == generator_prompt(
                trace.question, [c.text for c in cf.candidates][:len(cf.selected)])
        for agent, cf in trace.counterfactuals.items():
            assert cf.answer_parse is not None
            made.add(agent)
    assert made == {"qr", "selector"}, "the untrained tiny model writes other than the defaults"
    assert credited.timings.stages[CF_GENERATOR_STAGE] > 0

    records = rollout_parts["records"]
    args = _args(mappo_counterfactual_agents="qr,selector",
                 mappo_counterfactual_selector_default=default)
    samples, logs = get_pipeline("qr_s_g").samples(records, credited.traces, args)
    for agent in ("qr", "selector"):
        shares = [logs[f"cf_{kind}/{agent}"] for kind in ("beat", "tie", "lost")]
        assert sum(shares) == pytest.approx(1.0)
        assert logs[f"cf_tie/{agent}"] >= logs[f"cf_default/{agent}"]
        assert logs[f"cf_gain/{agent}"] == pytest.approx(
            logs["answer_f1"] - logs[f"cf_reward/{agent}"])
    assert set(counterfactual_log_keys(("qr", "selector"))) <= set(logs)
    # every sample's score is R - R_cf + its penalty, computed here from the traces
    scores = iter(samples)
    for record, trace in zip(records, credited.traces, strict=True):
        baselines = {agent: shared_reward(cf.answer, record.answers)
                     for agent, cf in trace.counterfactuals.items()}
        rewards = compute_agent_rewards(trace.qr_parse, trace.selection_parse,
                                        trace.answer_parse, trace.answer, record.answers)
        for agent in ("qr", "selector", "generator"):
            cf = baselines.get(agent, rewards.shared)
            expected = rewards.total(agent) - (cf if agent != "generator" else 0.0)
            assert next(scores).score == pytest.approx(expected)


def test_grouped_rollouts_get_a_counterfactual_each(rollout_parts: dict[str, Any]) -> None:
    args = _args(mappo_counterfactual_agents="selector", mappo_algorithm="grpo",
                 mappo_group_size=2)
    batch = _rollout(rollout_parts, args)
    assert len(batch.traces) == 2 * len(rollout_parts["records"])
    for trace in batch.traces:
        assert ("selector" in trace.counterfactuals) != uses_default("selector", trace, "all")
        assert "qr" not in trace.counterfactuals, "only the agents listed"
    samples, logs = get_pipeline("qr_s_g").samples(rollout_parts["records"], batch.traces, args)
    assert all(s.advantage is not None for s in samples)
    assert "cf_gain/selector" in logs and "cf_gain/qr" not in logs


def _log(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "trainer_log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_a_mappo_run_logs_the_credit_per_step(tiny_model_dir: Path, tiny_mappo_data_dir: Path,
                                              tiny_server_url: str, tmp_path: Path,
                                              algorithm: str) -> None:
    out = tmp_path / algorithm
    extra: dict[str, Any] = {"mappo_algorithm": "grpo", "mappo_group_size": 2,
                             "mappo_questions_per_rollout": 2} if algorithm == "grpo" else {}
    run_mappo(tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                                max_steps=2, save_steps=2, plot_loss=False, mappo_top_k=K,
                                mappo_counterfactual_agents=["qr", "selector"], **extra))
    log = _log(out)
    assert [entry["current_steps"] for entry in log] == [1, 2]
    for entry in log:  # the web UI's trainer log: each step's credit per agent
        for key in counterfactual_log_keys(("qr", "selector")):
            assert key in entry, key
        for agent in ("qr", "selector"):
            assert sum(entry[f"cf_{kind}/{agent}"] for kind in ("beat", "tie", "lost")) \
                == pytest.approx(1.0)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert all("cf_gain/selector" in step for step in history if "step" in step)


def test_two_processes_train_with_the_credit(tiny_model_dir: Path, tiny_mappo_data_dir: Path,
                                             unbatched_server_url: str, tmp_path: Path) -> None:
    """DDP (torchrun, gloo): each process runs its own questions' counterfactuals, and the
    logged statistics are the means over both."""
    out = tmp_path / "ddp"
    config = tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, unbatched_server_url, out,
                               max_steps=1, save_steps=1, plot_loss=False, mappo_top_k=K,
                               mappo_questions_per_rollout=2,
                               mappo_counterfactual_agents="qr,selector")
    result = run_two_processes(config, tmp_path / "ddp.yaml")
    assert result.returncode == 0, result.stderr[-3000:]
    (entry,) = _log(out)
    for key in counterfactual_log_keys(("qr", "selector")):
        assert key in entry, key
