"""MAPPO under DeepSpeed ZeRO-2 and ZeRO-3 on two CPU processes (gloo): the same losses,
gradient norms and weights as DDP on the same questions, checkpoints with each process's
optimiser partition and RNG state, and a ZeRO-2 run resumed from step 1 that continues exactly.

ZeRO partitions optimiser state (2) and weights (3) but computes the same update as DDP, so any
difference beyond float noise is a bug in how the stage drives the engine (loss scaling over
gradient accumulation, boundaries, the reference model, gathering for generation or saving)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mmoa.data.loaders import load_qa
from mmoa.data.sft_builder import write_mappo_dataset

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (MMOA_DEEPSPEED=0)")

ROOT = Path(__file__).resolve().parents[1]
DS_CONFIGS = ROOT / "LLaMA-Factory" / "examples" / "deepspeed"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mappo_data(tiny_world_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ds_mappo_data")
    write_mappo_dataset(load_qa(tiny_world_dir / "train.jsonl", "demo"), out, "tiny_mappo")
    return out


@pytest.fixture(scope="module")
def launch(tiny_model_dir: Path, mappo_data: Path, tiny_server_url: str,
           tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("ds_runs")

    def run(name: str, deepspeed: str | None, **extra) -> Path:
        out = root / name
        config = {
            "stage": "mappo", "do_train": True, "model_name_or_path": str(tiny_model_dir),
            "finetuning_type": "full", "template": "llama3", "dataset": "tiny_mappo",
            "dataset_dir": str(mappo_data), "output_dir": str(out),
            "overwrite_output_dir": True, "disable_gradient_checkpointing": True,
            "report_to": "none", "plot_loss": False,
            # two micro-batches per update: the engine's accumulation boundary is exercised
            "per_device_train_batch_size": 4, "gradient_accumulation_steps": 2,
            "learning_rate": 1e-4, "max_steps": 2, "logging_steps": 1, "save_steps": 1,
            "ppo_epochs": 1, "seed": 7, "lr_scheduler_type": "constant", "bf16": False,
            "mappo_retriever_url": tiny_server_url, "mappo_questions_per_rollout": 4,
            "mappo_rollout_batch_size": 4, "mappo_max_new_tokens_qr": 16,
            "mappo_max_new_tokens_selector": 12, "mappo_max_new_tokens_generator": 8,
        }
        if deepspeed:
            config["deepspeed"] = str(DS_CONFIGS / deepspeed)
        config.update(extra)
        path = root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(config))
        env = {**os.environ, "FORCE_TORCHRUN": "1", "NPROC_PER_NODE": "2"}
        result = subprocess.run([sys.executable, "-m", "mmoa.cli", "train", str(path)],
                                env=env, capture_output=True, text=True, timeout=600,
                                check=False)
        assert result.returncode == 0, (result.stdout[-2000:], result.stderr[-4000:])
        return out

    return run


@pytest.fixture(scope="module")
def ddp(launch) -> Path:
    return launch("ddp", None)


@pytest.fixture(scope="module")
def zero2(launch) -> Path:
    return launch("zero2", "ds_z2_config.json")


def _history(folder: Path) -> list[dict]:
    state = json.loads((folder / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "policy_loss" in entry]


def _assert_same_run(run: Path, reference: Path) -> None:
    ours, theirs = _history(run), _history(reference)
    assert [e["step"] for e in ours] == [e["step"] for e in theirs] == [1, 2]
    for a, b in zip(ours, theirs, strict=True):
        assert a["reward"] == b["reward"]  # the same samples were drawn
        for key in ("loss", "policy_loss", "value_loss", "kl", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-5), (a["step"], key)
    _assert_same_weights(run, reference)


def _assert_same_weights(run: Path, reference: Path) -> None:
    from safetensors.torch import load_file

    for name in ("model.safetensors", "value_head.safetensors"):
        ours, theirs = load_file(str(run / name)), load_file(str(reference / name))
        assert ours.keys() == theirs.keys(), name
        for key in ours:
            assert (ours[key].float() - theirs[key].float()).abs().max() < 1e-4, (name, key)


def test_zero2_matches_ddp_and_checkpoints_every_partition(zero2: Path, ddp: Path) -> None:
    _assert_same_run(zero2, ddp)
    checkpoint = zero2 / "checkpoint-1"
    for name in ("model.safetensors", "value_head.safetensors", "scheduler.pt",
                 "mappo_state.json", "rng_state_0.pth", "rng_state_1.pth"):
        assert (checkpoint / name).is_file(), name
    assert not (checkpoint / "optimizer.pt").exists()  # partitioned: one file per process
    shards = sorted(p.name for p in (checkpoint / "deepspeed").rglob("*optim_states.pt"))
    assert len(shards) == 2, shards
    assert not list(zero2.glob(".checkpoint-*"))  # no staging folder left behind


def test_zero2_resume_continues_exactly(zero2: Path, launch) -> None:
    resumed = launch("zero2_resumed", "ds_z2_config.json",
                     resume_from_checkpoint=str(zero2 / "checkpoint-1"))
    last, reference = _history(resumed)[-1], _history(zero2)[-1]
    assert last["step"] == reference["step"] == 2
    for key in ("reward", "loss", "policy_loss", "value_loss", "kl", "grad_norm"):
        assert last[key] == pytest.approx(reference[key], rel=1e-3, abs=1e-5), key
    _assert_same_weights(resumed, zero2)


def test_zero3_full_matches_ddp(launch, ddp: Path) -> None:
    """ZeRO-3 partitions the weights: generation runs on gathered weights, the frozen
    reference gets an inference engine, and saving gathers the full model."""
    _assert_same_run(launch("zero3", "ds_z3_config.json"), ddp)
