"""The decision agent end to end against the real retrieval server and the tiny model.

The tiny model is randomly initialised and never writes a tag by itself, so the pipeline tests
script its turns with the search agent tests' logits processor (everything else is real:
generation, the chat template, the HTTP server and its request counter). Then the always- and
never-retrieve baselines, ``evaluate --mode decision_agent`` with groups in the common table,
the SFT data builder, and two RL steps of ``stage: mappo`` with ``mappo_pipeline:
decision_agent`` under PPO and GRPO with their log keys.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmoa.agents.decision_agent import DecisionAgentPipeline, retrieval_rate
from mmoa.agents.decision_tags import DecisionStop, decision_prompt, format_documents
from mmoa.data.loaders import load_qa
from mmoa.retrieval.client import RetrievalClient
from tests.test_search_agent_integration import ScriptedTurns


def _requests_served(client: RetrievalClient) -> int:
    return int(client.health()["requests_served"])


@pytest.fixture(scope="module")
def inference(tiny_model_dir: Path) -> tuple[Any, Any]:
    from mmoa.modeling import load_for_inference

    return load_for_inference(tiny_model_dir, "llama3")


def _pipeline(inference: tuple[Any, Any], client: RetrievalClient | None,
              script: dict[str, list[str]], **kwargs: Any) -> DecisionAgentPipeline:
    model, tokenizer = inference
    return DecisionAgentPipeline(
        model, tokenizer, "llama3", client, top_k=2, max_new_tokens=24,
        logits_processor_for=lambda rows, width: ScriptedTurns(tokenizer, rows, width, script),
        **kwargs)


def test_decisions_one_request_per_round_and_the_quota_forces_an_answer(
        inference: tuple[Any, Any], tiny_server_url: str) -> None:
    _, tokenizer = inference
    script = {
        "Q known": ["[Answer] Paris"],
        "Q search": ["[Search] Nox film", "[Answer] Ada Brel"],
        "Q stubborn": ["[Search] Ada Brel", "[Search] Tronford city", " 1950"],
        "Q broken": ["I will not use tags."],
        "Q double": ["[Search] Nox [Answer] Ada"],
    }
    client = RetrievalClient(tiny_server_url)
    pipeline = _pipeline(inference, client, script, max_searches=2)
    before = _requests_served(client)
    known, search, stubborn, broken, double = pipeline.run(list(script))
    # round 1: two queries of two trajectories in one request; round 2: one; round 3: forced
    assert _requests_served(client) - before == 2, "one request per decision round"
    assert pipeline.last_requests == [2, 1]

    assert (known.stop_reason, known.answer, known.num_searches) \
        == (DecisionStop.ANSWERED, "Paris", 0)
    assert (search.stop_reason, search.answer, search.num_searches) \
        == (DecisionStop.ANSWERED, "Ada Brel", 1)
    assert (stubborn.stop_reason, stubborn.answer, stubborn.num_searches) \
        == (DecisionStop.FORCED_ANSWER, "1950", 2)
    assert stubborn.turns[-1].forced and stubborn.turns[-2].information.endswith(
        "Give the answer now.")
    assert broken.stop_reason == DecisionStop.NO_ACTION and not broken.well_formed
    assert double.stop_reason == DecisionStop.TWO_ACTIONS and double.num_searches == 0
    assert retrieval_rate([known, search, stubborn, broken, double]) == pytest.approx(2 / 5)
    docs = client.search_documents(["Nox film"], 2)
    assert search.turns[0].information == format_documents(
        ["Nox film"], [[d["contents"] for d in docs[0]]])

    # the loss mask: 1 on the model's turns only; documents, tails and "[Answer]" are 0
    renderer = pipeline.renderer
    pos = 0
    for turn in stubborn.turns:
        if turn.forced:
            prefix = pipeline.forced_prefix
            assert stubborn.response_ids[pos: pos + len(prefix)] == prefix
            assert set(stubborn.loss_mask[pos: pos + len(prefix)]) == {0}
            pos += len(prefix)
        start = pos
        while pos < len(stubborn.loss_mask) and stubborn.loss_mask[pos] == 1:
            pos += 1
        assert tokenizer.decode(stubborn.response_ids[start:pos],
                                skip_special_tokens=True).strip() == turn.text.strip()
        if turn.information is not None:
            appended = pipeline._turn_tail(stubborn.response_ids[:pos]) \
                + renderer.observation_ids(turn.information)
            assert stubborn.response_ids[pos: pos + len(appended)] == appended
            assert set(stubborn.loss_mask[pos: pos + len(appended)]) == {0}
            pos += len(appended)
    assert pos == len(stubborn.response_ids)
    assert known.prompt_ids == renderer.prompt_ids(decision_prompt("Q known"))


def test_the_always_and_never_baselines(inference: tuple[Any, Any],
                                        tiny_server_url: str) -> None:
    client = RetrievalClient(tiny_server_url)
    # never: the first turn is the forced answer, no request, no server needed
    never = _pipeline(inference, None, {"Q a": [" Paris"], "Q b": [" [Search] x"]},
                      policy="never")
    a, b = never.run(["Q a", "Q b"])
    assert (a.stop_reason, a.answer, a.num_searches) == (DecisionStop.FORCED_ANSWER, "Paris", 0)
    assert b.stop_reason == DecisionStop.SEARCH_AT_LIMIT
    assert never.last_requests == []
    # always: the pipeline searches the question itself (masked), then the answer is forced
    script = {"Who directed Nox?": ["(scripted by the pipeline)", " Ada Brel"]}
    always = _pipeline(inference, client, script, policy="always", max_searches=3)
    before = _requests_served(client)
    (t,) = always.run(list(script))
    assert _requests_served(client) - before == 1 and always.last_requests == [1]
    assert (t.stop_reason, t.answer, t.num_searches) \
        == (DecisionStop.FORCED_ANSWER, "Ada Brel", 1)
    assert t.turns[0].parse.queries == ["Who directed Nox?"] and t.turns[0].forced
    assert t.turns[0].information.endswith("Give the answer now.")
    answer_ids = always.tokenizer.encode(" Ada Brel", add_special_tokens=False)
    assert sum(t.loss_mask) == len(answer_ids) + 1, "only the answer and its end are sampled"
    with pytest.raises(ValueError, match="policy"):
        _pipeline(inference, client, script, policy="sometimes")
    with pytest.raises(ValueError, match="retriever"):
        _pipeline(inference, None, script, policy="always")


def _grouped_dev(tiny_world_dir: Path, out: Path, n: int = 4) -> Path:
    records = load_qa(tiny_world_dir / "dev.jsonl", "demo")[:n]
    rows = [{**r.to_dict(), "group": "known" if i % 2 == 0 else "world"}
            for i, r in enumerate(records)]
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return out


def test_evaluate_decision_agent_per_group_with_baselines(
        tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str,
        tmp_path: Path) -> None:
    from mmoa.evaluation import EvalConfig, evaluate, format_table, load_metrics

    data = _grouped_dev(tiny_world_dir, tmp_path / "dev.jsonl")
    runs = []
    for policy in ("model", "always", "never"):
        config = EvalConfig(model_name_or_path=str(tiny_model_dir), template="llama3",
                            output_dir=str(tmp_path / policy), data_file=str(data),
                            retriever_url=tiny_server_url, mode="decision_agent",
                            decision_policy=policy, batch_size=2,
                            max_new_tokens_decision=6, precision="fp32")
        metrics = evaluate(config, progress=False)
        decision = metrics["agents"]["decision"]
        assert set(decision) >= {"retrieval_rate", "mean_searches", "well_formed_rate"}
        assert set(metrics["by_group"]) == {"known", "world"}
        for group in metrics["by_group"].values():
            assert group["num_questions"] == 2
            assert set(group) >= {"em", "f1", "retrieval_rate", "mean_searches"}
        runs.append((policy, load_metrics(tmp_path / policy)))
        rows = [json.loads(line) for line in (tmp_path / policy / "predictions.jsonl").open()]
        assert [r["group"] for r in rows] == ["known", "world", "known", "world"]
        assert all(r["stop_reason"] in {s.value for s in DecisionStop} for r in rows)
    by_policy = dict(runs)
    assert by_policy["always"]["agents"]["decision"]["retrieval_rate"] == 1.0
    assert by_policy["always"]["agents"]["decision"]["mean_searches"] == 1.0
    assert by_policy["never"]["agents"]["decision"]["retrieval_rate"] == 0.0
    # the untrained model writes no tag: it never gets to search
    assert by_policy["model"]["agents"]["decision"]["retrieval_rate"] == 0.0
    table = format_table(runs).splitlines()
    assert table[0].split()[-2:] == ["ret%", "s/q"]
    assert len(table) == 2 + 3 * 3, "a row per run and one per group"
    assert table[2].startswith("model ") and table[3].startswith("model / known")
    assert table[5].split()[1] == "decision_agent/always"
    always_known = table[6].split()
    assert always_known[:3] == ["always", "/", "known"] and always_known[-2] == "100.0"


def test_sft_data_labels_follow_the_group(tiny_world_dir: Path, tiny_server_url: str,
                                         tmp_path: Path) -> None:
    from mmoa.agents.decision_tags import parse_decision
    from mmoa.cli import main as cli_main
    from mmoa.data.decision_agent_sft import decision_queries
    from mmoa.data.registry import read_dataset_info

    data = _grouped_dev(tiny_world_dir, tmp_path / "train.jsonl", n=6)
    command = ["data", "decision-sft", "--data_file", str(data), "--dataset_dir",
               str(tmp_path), "--name", "tiny_decision_sft", "--retriever_url", tiny_server_url]
    # by default a world trajectory whose documents miss a gold passage is left out
    assert cli_main(command) == 0
    samples = json.loads((tmp_path / "tiny_decision_sft.json").read_text())
    kinds = [s["kind"] for s in samples]
    assert kinds.count("answer_direct") == 3 and kinds.count("search_first") <= 3
    assert cli_main([*command, "--keep_unsupported"]) == 0
    samples = json.loads((tmp_path / "tiny_decision_sft.json").read_text())
    assert read_dataset_info(tmp_path)["tiny_decision_sft"]["formatting"] == "sharegpt"
    records = {r.question: r for r in load_qa(data, "auto")}
    kinds = [s["kind"] for s in samples]
    assert kinds.count("answer_direct") == 3 and kinds.count("search_first") == 3
    for sample in samples:
        turns = sample["conversations"]
        question = turns[0]["value"].rsplit("Question: ", 1)[1]
        record = records[question]
        last = parse_decision(turns[-1]["value"])
        if record.group == "known":
            assert sample["kind"] == "answer_direct" and len(turns) == 2
            assert last.answer == record.answers[0]
        elif sample["kind"] == "search_first":  # the first hop, one query per search
            assert last.queries == [decision_queries(record)[0]]
        elif sample["kind"] == "answer_after_search":
            assert [m["from"] for m in turns[1::2]] == ["gpt"] * (len(turns) // 2)
            assert all(m["value"].startswith("[Documents]") for m in turns[2::2])
            assert last.answer == record.answers[0]
        else:
            assert sample["kind"] == "search_again"


EXAMPLE = Path(__file__).resolve().parents[1] / "LLaMA-Factory" / "examples" / "demo" \
    / "tiny_decision_agent_grpo.yaml"
_TINY = yaml.safe_load(EXAMPLE.read_text())
#: The tiny example's RL keys (the tests give their own model, data, server and output).
RL = {**{k: v for k, v in _TINY.items() if k.startswith("mappo_") and k != "mappo_retriever_url"},
      "max_steps": _TINY["max_steps"]}


@pytest.mark.parametrize("algorithm", ["grpo", "ppo"])
def test_rl_steps_log_the_decisions_and_reward_parts(
        algorithm: str, tiny_model_dir: Path, tiny_mappo_data_dir: Path,
        tiny_server_url: str, tmp_path: Path) -> None:
    from mmoa.train.mappo.workflow import run_mappo
    from tests.mappo_fixtures import tiny_mappo_config

    assert (RL["mappo_pipeline"], RL["mappo_algorithm"], RL["max_steps"]) \
        == ("decision_agent", "grpo", 2)
    keys = {**RL, "mappo_algorithm": algorithm}
    if algorithm == "ppo":
        keys = {k: v for k, v in keys.items() if k not in ("mappo_group_size",
                                                            "mappo_kl_loss_coef")}
    out = tmp_path / algorithm
    run_mappo(tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                                **keys))
    state = json.loads((out / "checkpoint-2" / "mappo_state.json").read_text())
    assert (state["pipeline"], state["algorithm"]) == ("decision_agent", algorithm)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in history] == [1, 2]
    penalty = RL["mappo_decision_malformed_penalty"]
    for entry in history:
        for key in ("reward", "answer_f1", "loss", "decision/answer_reward",
                    "decision/retrieval_cost", "decision/malformed_penalty",
                    "decision/retrieval_rate", "decision/searches", "decision/well_formed",
                    "decision/stop/truncated", "decision/stop/no_action",
                    "response_length/decision"):
            assert key in entry, key
        assert entry["samples/decision"] == (4.0 if algorithm == "grpo" else 2.0)
        assert entry["reward"] == pytest.approx(
            entry["decision/answer_reward"] - entry["decision/retrieval_cost"]
            - entry["decision/malformed_penalty"])
        # the untrained model writes no tag: every trajectory is malformed and penalised
        assert entry["decision/malformed_penalty"] == pytest.approx(
            penalty * (1 - entry["decision/well_formed"]))
        assert entry["decision/retrieval_cost"] == pytest.approx(
            RL["mappo_decision_retrieval_cost"] * entry["decision/searches"])
        if algorithm == "grpo":
            assert "grpo/groups" in entry
        else:
            assert "value_loss" in entry
