"""GRPO end to end: the tiny model against the live demo server. A group's rollouts share the
QR prompt's encoding and one retrieval call per step; 3 grpo steps write checkpoints with no
value head and the group logs; a run resumed from step 2 matches the uninterrupted one; a grpo
checkpoint is refused by a ppo run with one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, ClassVar

import pytest

from mmoa.data.loaders import load_qa
from mmoa.retrieval.client import RetrievalClient
from mmoa.train.mappo.workflow import run_mappo, run_mappo_from_config
from tests.mappo_fixtures import tiny_mappo_config

GRPO = {"mappo_algorithm": "grpo", "mappo_group_size": 2, "mappo_questions_per_rollout": 2,
        "mappo_rollout_batch_size": 3, "mappo_kl_loss_coef": 0.1,
        "mappo_loss_averaging": "sequence"}


def _config(model: Path, data: Path, url: str, out: Path, **extra: Any) -> dict[str, Any]:
    return tiny_mappo_config(model, data, url, out, **{**GRPO, **extra})


class CountingClient(RetrievalClient):
    """The real client, recording the queries of every ``search_documents`` call."""

    calls: ClassVar[list[list[str]]] = []

    def search_documents(self, queries: Any, k: int) -> list[list[dict[str, Any]]]:
        CountingClient.calls.append(list(queries))
        return super().search_documents(queries, k)


def test_a_group_shares_the_qr_encoding_and_one_retrieval_call(
        tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str) -> None:
    import torch

    from mmoa.agents.pipeline import GenerationSettings, RagPipeline
    from mmoa.modeling import load_for_inference

    model, tokenizer = load_for_inference(tiny_model_dir, "llama3")
    torch.manual_seed(0)
    settings = GenerationSettings(do_sample=True, max_new_tokens={"qr": 16, "selector": 12,
                                                                  "generator": 8})
    client = CountingClient(tiny_server_url)
    CountingClient.calls = []
    pipeline = RagPipeline(model, tokenizer, "llama3", client, k=5, settings=settings,
                           batch_size=4)
    encoded: list[int] = []
    batch_prompt_ids = pipeline.renderer.batch_prompt_ids
    pipeline.renderer.batch_prompt_ids = lambda prompts: (  # type: ignore[method-assign]
        encoded.append(len(prompts)) or batch_prompt_ids(prompts))
    rows: list[int] = []
    generate = model.generate
    model.generate = lambda **kw: (  # type: ignore[method-assign]
        rows.append(kw["input_ids"].shape[0]) or generate(**kw))
    questions = [r.question for r in load_qa(tiny_world_dir / "dev.jsonl", "demo")[:3]]
    traces = pipeline.run(questions, group_size=3)

    assert [t.question for t in traces] == [q for q in questions for _ in range(3)]
    assert encoded[0] == 3, "the QR prompts: one encoding per question, not per rollout"
    for q in range(3):
        group = traces[3 * q: 3 * q + 3]
        assert len({tuple(t.calls["qr"].prompt_ids) for t in group}) == 1
    # calls of at most 4 rows holding whole groups: QR 3 + 3 + 3 rows (4 // 3 = 1 question)
    assert rows[:3] == [3, 3, 3] and max(rows) <= 4 and sum(rows) == 3 * 9
    unique = list(dict.fromkeys(s for t in traces for s in t.subquestions))
    assert CountingClient.calls == [unique], "one retrieval call for all 9 pipelines"


@pytest.fixture(scope="module")
def grpo_run(tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    import mmoa.retrieval.client as client_module

    out = tmp_path_factory.mktemp("grpo") / "run"
    original = client_module.RetrievalClient
    client_module.RetrievalClient = CountingClient  # type: ignore[misc]
    CountingClient.calls = []
    try:
        run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out))
    finally:
        client_module.RetrievalClient = original  # type: ignore[misc]
    RETRIEVAL_CALLS[:] = CountingClient.calls
    return out


#: The queries of each retrieval call ``grpo_run`` made.
RETRIEVAL_CALLS: list[list[str]] = []


def _history(folder: Path) -> list[dict[str, Any]]:
    return json.loads((folder / "trainer_state.json").read_text())["log_history"]


def test_grpo_steps_save_no_value_head_and_log_the_groups(grpo_run: Path) -> None:
    for step in (1, 2, 3):
        checkpoint = grpo_run / f"checkpoint-{step}"
        for name in ("model.safetensors", "optimizer.pt", "mappo_state.json",
                     "mappo_manifest.json", "rng_state.pth"):
            assert (checkpoint / name).is_file(), f"{checkpoint.name}/{name}"
        assert not (checkpoint / "value_head.safetensors").exists()
        state = json.loads((checkpoint / "mappo_state.json").read_text())
        assert (state["algorithm"], state["group_size"]) == ("grpo", 2)
    assert (grpo_run / "model.safetensors").is_file()
    assert not (grpo_run / "value_head.safetensors").exists()
    assert (grpo_run / "training_loss.png").is_file()
    history = _history(grpo_run)
    assert [h["step"] for h in history] == [1, 2, 3]
    for entry in history:
        for key in ("reward", "answer_f1", "loss", "policy_loss", "kl_loss", "kl",
                    "grpo/groups", "grpo/zero_variance_groups", "grpo/skipped_samples"):
            assert key in entry, key
        assert "value_loss" not in entry
        assert entry["grpo/groups"] == 2.0
        assert 0 <= entry["grpo/zero_variance_groups"] <= 2
    assert history[0]["kl"] == pytest.approx(0.0, abs=1e-6), "policy == reference at step 1"
    # one retrieval call per step, for the sub-questions of all 2 x 2 pipelines
    assert len(RETRIEVAL_CALLS) == 3


def test_a_resumed_grpo_run_matches_the_uninterrupted_one(
        grpo_run: Path, tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
        tmp_path: Path) -> None:
    out = tmp_path / "resumed"
    shutil.copytree(grpo_run, out, ignore=shutil.ignore_patterns("checkpoint-3"))
    run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                      resume_from_checkpoint=str(out / "checkpoint-2")))
    full, resumed = _history(grpo_run), _history(out)
    assert [h["step"] for h in resumed] == [1, 2, 3]
    assert not (out / "value_head.safetensors").exists()
    for key in ("reward", "answer_f1", "loss", "policy_loss", "kl_loss",
                "grpo/zero_variance_groups", "response_length/qr"):
        assert resumed[-1][key] == pytest.approx(full[-1][key], rel=1e-4, abs=1e-5), key


def test_a_grpo_checkpoint_is_refused_by_a_ppo_run(grpo_run: Path, tiny_model_dir: Path,
                                                  tiny_mappo_data_dir: Path,
                                                  tiny_server_url: str, tmp_path: Path,
                                                  capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ppo"
    shutil.copytree(grpo_run / "checkpoint-2", out / "checkpoint-2")
    config = _config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                     mappo_algorithm="ppo", mappo_kl_loss_coef=0.0,
                     resume_from_checkpoint=str(out / "checkpoint-2"))
    assert run_mappo_from_config(config) == 1
    err = capfd.readouterr().err
    assert "saved by mappo_algorithm: grpo but this run uses ppo" in err
    assert "resume with mappo_algorithm: grpo" in err


def test_skip_leaves_out_the_zero_variance_groups(tiny_model_dir: Path,
                                                  tiny_mappo_data_dir: Path,
                                                  tiny_server_url: str, tmp_path: Path,
                                                  recwarn: pytest.WarningsRecorder) -> None:
    """The untrained tiny model answers nothing right, so every group's answer F1 is 0: with
    ``skip`` only the samples whose own penalty fired are trained on, and a step left with
    none logs no update instead of stopping (and the schedule's step without an optimiser
    step raises no torch warning)."""
    out = tmp_path / "skip"
    run_mappo(_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out,
                      mappo_grpo_filter="skip", max_steps=2, save_steps=0))
    history = _history(out)
    assert [h["step"] for h in history] == [1, 2]
    for entry in history:
        assert entry["grpo/zero_variance_groups"] == 2.0 and entry["answer_f1"] == 0.0
        kept = sum(v for k, v in entry.items() if k.startswith("samples/"))
        assert kept + entry["grpo/skipped_samples"] == 2 * 2 * 3  # questions x G x agents
        if kept == 0:
            assert entry["updates"] == 0.0 and "loss" not in entry
        else:
            assert "loss" in entry
    assert any(entry["grpo/skipped_samples"] > 0 for entry in history)
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]


@pytest.mark.parametrize(("algorithm", "kl_loss_coef", "reference", "value_head"),
                         [("grpo", 0.0, False, False), ("grpo", 0.1, True, False),
                          ("ppo", 0.0, True, True)])
def test_what_each_algorithm_loads(tiny_model_dir: Path, tiny_mappo_data_dir: Path,
                                   tiny_server_url: str, tmp_path: Path, algorithm: str,
                                   kl_loss_coef: float, reference: bool,
                                   value_head: bool) -> None:
    """Full fine-tuning: grpo without the KL loss loads no frozen reference copy (its memory is
    saved, not just its pass), with it one; neither has a value head; ppo has both."""
    from mmoa.train.mappo.workflow import build_mappo_trainer

    config = tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url,
                               tmp_path / "run", mappo_algorithm=algorithm)
    if algorithm == "grpo":
        config.update(mappo_group_size=2, mappo_questions_per_rollout=2,
                      mappo_kl_loss_coef=kl_loss_coef)
    trainer, _, _ = build_mappo_trainer(config)
    assert (trainer.model.reference_model is not None) is reference
    assert (trainer.model.v_head is not None) is value_head
