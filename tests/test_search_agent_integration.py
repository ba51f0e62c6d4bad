"""The search agent end to end against the real retrieval server and the tiny model.

The tiny model is randomly initialised and never writes a tag by itself, so the multi-turn
tests script its turns with a logits processor (every other part is real: generation with stop
strings, the chat template, the HTTP server and its request counter). Then: the SFT data builder
on the tiny demo world, tokenised by LLaMA-Factory itself; two RL steps of ``stage: mappo`` with
``mappo_pipeline: search_agent`` and a resume; and ``evaluate --mode search_agent``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from transformers import LogitsProcessor

from mmoa.agents.search_agent import SearchAgentPipeline, SearchTrajectory
from mmoa.agents.search_tags import StopReason, format_information
from mmoa.data.loaders import load_qa
from mmoa.retrieval.client import RetrievalClient


class ScriptedTurns(LogitsProcessor):
    """Forces each row to write ``script[question][turn]`` then end its turn."""

    def __init__(self, tokenizer: Any, rows: list[SearchTrajectory], width: int,
                 script: dict[str, list[str]]) -> None:
        self.width = width
        self.eos = tokenizer.convert_tokens_to_ids("<|eot_id|>")
        self.ids = [tokenizer.encode(script[t.question][len(t.turns)], add_special_tokens=False)
                    for t in rows]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - self.width
        forced = torch.full_like(scores, float("-inf"))
        for row, ids in enumerate(self.ids):
            forced[row, ids[step] if step < len(ids) else self.eos] = 0.0
        return forced


def _requests_served(client: RetrievalClient) -> int:
    return int(client.health()["requests_served"])


@pytest.fixture(scope="module")
def inference(tiny_model_dir: Path) -> tuple[Any, Any]:
    from mmoa.modeling import load_for_inference

    return load_for_inference(tiny_model_dir, "llama3")


def test_one_batched_request_per_round_and_a_forced_answer_at_the_limit(
        inference: tuple[Any, Any], tiny_server_url: str) -> None:
    model, tokenizer = inference
    script = {
        "Q parallel": ["<think> two facts </think><search> Nox film ; Ada Brel </search>",
                       "<think> known </think><answer> Ada Brel </answer>"],
        "Q stubborn": ["<think> a </think><search> Ada Brel </search>",
                       "<think> b </think><search> Tronford city </search>",
                       " 1950 </answer>"],
        "Q broken": ["I will not use tags."],
    }
    client = RetrievalClient(tiny_server_url)
    pipeline = SearchAgentPipeline(
        model, tokenizer, "llama3", client, max_turns=2, top_k=2, max_new_tokens=48,
        logits_processor_for=lambda rows, width: ScriptedTurns(tokenizer, rows, width, script))
    before = _requests_served(client)
    parallel, stubborn, broken = pipeline.run(list(script))
    # round 1: the queries of 2 trajectories in one request ("Ada Brel" asked by both is sent
    # once); round 2: 1 query; round 3: the forced answer, no request
    assert _requests_served(client) - before == 2, "one request per search round"
    assert pipeline.last_requests == [2, 1]

    assert (parallel.stop_reason, parallel.answer) == (StopReason.ANSWERED, "Ada Brel")
    assert (parallel.num_searches, parallel.num_queries) == (1, 2)
    assert len(parallel.retrieved_passages) == 4
    assert (stubborn.stop_reason, stubborn.answer) == (StopReason.FORCED_ANSWER, "1950")
    assert stubborn.num_searches == 2 and stubborn.turns[-1].forced
    assert stubborn.turns[-2].information.endswith("Give the answer now.")
    assert broken.stop_reason == StopReason.NO_ACTION and not broken.well_formed
    assert broken.num_searches == 0 and broken.answer == ""

    renderer = pipeline.renderer
    for trajectory in (parallel, stubborn):
        assert len(trajectory.loss_mask) == len(trajectory.response_ids)
        # the response is: model turn, tail + information (mask 0), model turn, ...
        pos = 0
        for turn in trajectory.turns:
            if turn.forced:
                prefix = pipeline.forced_prefix
                assert trajectory.response_ids[pos: pos + len(prefix)] == prefix
                assert set(trajectory.loss_mask[pos: pos + len(prefix)]) == {0}
                pos += len(prefix)
            start = pos
            while pos < len(trajectory.loss_mask) and trajectory.loss_mask[pos] == 1:
                pos += 1
            text = tokenizer.decode(trajectory.response_ids[start:pos],
                                    skip_special_tokens=True)
            assert text.strip() == turn.text.strip()
            if turn.information is not None:
                observation = renderer.observation_ids(turn.information)
                appended = pipeline._turn_tail(trajectory.response_ids[:pos]) + observation
                assert trajectory.response_ids[pos: pos + len(appended)] == appended
                assert set(trajectory.loss_mask[pos: pos + len(appended)]) == {0}
                assert turn.retrieved_tokens == len(observation)
                pos += len(appended)
        assert pos == len(trajectory.response_ids)
    docs = client.search_documents(["Nox film", "Ada Brel"], 2)
    assert parallel.turns[0].information == format_information(
        ["Nox film", "Ada Brel"], [[d["contents"] for d in ranked] for ranked in docs])


def test_sft_data_from_known_hops_is_masked_by_llamafactory(
        tiny_world_dir: Path, tiny_server_url: str, tiny_model_dir: Path,
        tmp_path: Path) -> None:
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.extras.constants import IGNORE_INDEX
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    from mmoa.agents.render import PromptRenderer
    from mmoa.agents.search_tags import parse_turn, search_prompt
    from mmoa.cli import main as cli_main
    from mmoa.data.registry import read_dataset_info

    records = load_qa(tiny_world_dir / "train.jsonl", "demo")[:40]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    assert cli_main(["data", "search-sft", "--data_file", str(data), "--dataset_dir",
                     str(tmp_path), "--name", "tiny_search_sft", "--retriever_url",
                     tiny_server_url]) == 0
    samples = json.loads((tmp_path / "tiny_search_sft.json").read_text())
    assert read_dataset_info(tmp_path)["tiny_search_sft"]["formatting"] == "sharegpt"
    by_question = {search_prompt(r.question).user: r for r in records}
    kinds = {s["kind"] for s in samples}
    assert {"search_first", "answer_after_search"} <= kinds
    for sample in samples:
        turns = sample["conversations"]
        record = by_question[turns[0]["value"]]
        assert [m["from"] for m in turns[1:]] == ["gpt", "observation"] * (len(turns) // 2 - 1) \
            + ["gpt"]
        last = parse_turn(turns[-1]["value"])
        assert last.ok and last.has_think
        if last.action == "answer":
            assert last.answer == record.answers[0]
        elif record.type in ("comparison", "yes_no"):
            assert last.queries == record.decomposition, "independent hops in one search"
        else:
            assert len(last.queries) == 1
            if sample["kind"] == "search_again":  # names what the first search found
                assert last.queries == record.resolved_decomposition[1:], record
    # bridge questions search twice, in sequence
    assert any(s["kind"] == "search_again" for s in samples)

    model_args, data_args, training_args, _, _ = get_train_args({
        "model_name_or_path": str(tiny_model_dir), "stage": "sft", "do_train": True,
        "finetuning_type": "full", "dataset": "tiny_search_sft", "dataset_dir": str(tmp_path),
        "template": "llama3", "cutoff_len": 4096, "output_dir": str(tmp_path / "out"),
        "overwrite_cache": True, "report_to": "none", "preprocessing_num_workers": 1,
        "mask_history": True,
    })
    module = load_tokenizer(model_args)
    tokenizer = module["tokenizer"]
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    dataset = get_dataset(template, model_args, data_args, training_args, "sft",
                          **module)["train_dataset"]
    renderer = PromptRenderer(tokenizer, "llama3")
    checked = 0
    for row, sample in zip(dataset, samples, strict=True):
        turns = sample["conversations"]
        prompt = renderer.prompt_ids(search_prompt(by_question[turns[0]["value"]].question))
        expected = list(prompt)
        for message in turns[1:-1]:
            if message["from"] == "gpt":
                expected += tokenizer.encode(message["value"], add_special_tokens=False) \
                    + renderer.assistant_suffix_ids()
            else:  # the observation, exactly as the RL pipeline appends it
                expected += renderer.observation_ids(message["value"])
        trained = tokenizer.encode(turns[-1]["value"], add_special_tokens=False) \
            + renderer.assistant_suffix_ids()
        assert row["input_ids"] == expected + trained
        assert row["labels"] == [IGNORE_INDEX] * len(expected) + trained, \
            "only the last model turn is trained; information never"
        checked += 1
    assert checked == len(samples) > 0


EXAMPLE = Path(__file__).resolve().parents[1] / "LLaMA-Factory" / "examples" / "demo" \
    / "tiny_search_agent_grpo.yaml"
_TINY = yaml.safe_load(EXAMPLE.read_text())
#: The tiny example's RL keys (the tests give their own model, data, server and output).
RL = {**{k: v for k, v in _TINY.items() if k.startswith("mappo_") and k != "mappo_retriever_url"},
      "max_steps": _TINY["max_steps"]}


def _history(folder: Path) -> list[dict[str, Any]]:
    return json.loads((folder / "trainer_state.json").read_text())["log_history"]


def test_rl_steps_save_and_resume(tiny_model_dir: Path, tiny_mappo_data_dir: Path,
                                  tiny_server_url: str, tmp_path: Path) -> None:
    from mmoa.train.mappo.workflow import run_mappo
    from tests.mappo_fixtures import tiny_mappo_config

    assert (RL["mappo_pipeline"], RL["mappo_algorithm"], RL["max_steps"]) \
        == ("search_agent", "grpo", 2)
    assert RL["mappo_search_format_penalty"] == -0.1

    out = tmp_path / "run"
    run_mappo(tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                                **RL))
    for step in (1, 2):
        state = json.loads((out / f"checkpoint-{step}" / "mappo_state.json").read_text())
        assert (state["pipeline"], state["algorithm"]) == ("search_agent", "grpo")
    history = _history(out)
    assert [h["step"] for h in history] == [1, 2]
    for entry in history:
        for key in ("reward", "answer_f1", "loss", "kl_loss", "search/turns",
                    "search/retrieved_tokens", "search/well_formed", "search/stop/no_action",
                    "response_length/search", "grpo/groups"):
            assert key in entry, key
        assert entry["samples/search"] == 4.0
        # the untrained model writes no tag: every trajectory is malformed and penalised
        assert entry["reward"] == pytest.approx(entry["answer_f1"] - 0.1 *
                                                (1 - entry["search/well_formed"]))

    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed, ignore=shutil.ignore_patterns("checkpoint-2"))
    run_mappo(tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, resumed,
                                resume_from_checkpoint=str(resumed / "checkpoint-1"), **RL))
    full, again = history[-1], _history(resumed)[-1]
    assert again["step"] == 2
    for key in ("reward", "loss", "kl_loss", "response_length/search", "entropy"):
        assert again[key] == pytest.approx(full[key], rel=1e-4, abs=1e-5), key

    with pytest.raises(ValueError, match="mappo_pipeline: search_agent"):
        run_mappo(tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url,
                                    tmp_path / "other", max_steps=2,
                                    resume_from_checkpoint=str(out / "checkpoint-1"),
                                    **{k: v for k, v in RL.items()
                                       if k not in ("mappo_pipeline", "max_steps")}))


def test_evaluate_search_agent_mode_in_the_common_table(
        tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str,
        tmp_path: Path) -> None:
    from mmoa.evaluation import EvalConfig, evaluate, format_table, load_metrics

    config = EvalConfig(model_name_or_path=str(tiny_model_dir), template="llama3",
                        output_dir=str(tmp_path / "sa"), data_file=str(tiny_world_dir /
                                                                        "dev.jsonl"),
                        retriever_url=tiny_server_url, mode="search_agent", max_samples=4,
                        batch_size=2, max_new_tokens_search=8, precision="fp32")
    metrics = evaluate(config, progress=False)
    search = metrics["agents"]["search"]
    assert set(search) >= {"mean_turns", "mean_searches", "mean_queries",
                           "mean_retrieved_tokens", "well_formed_rate"}
    assert metrics["seconds_per_question"] > 0
    rows = [json.loads(line) for line in (tmp_path / "sa" / "predictions.jsonl").open()]
    assert len(rows) == 4
    for row in rows:
        assert row["stop_reason"] in {r.value for r in StopReason}
        stats = row["agent_stats"]["search"]
        assert stats["turns"] == row["num_turns"] >= 1 and stats["seconds"] > 0
    table = format_table([("search agent", load_metrics(tmp_path / "sa"))]).splitlines()
    assert "rounds" in table[0] and "ret tok" in table[0] and table[0].endswith("s/q")
    assert table[2].startswith("search agent  search_agent")
