"""MAPPO under DeepSpeed ZeRO-2 and ZeRO-3 on two CPU processes (gloo): the same losses,
gradient norms and weights as DDP on the same questions, checkpoints with each process's
optimiser partition and RNG state, and a ZeRO-2 run resumed from step 1 that continues exactly.

ZeRO partitions optimiser state (2) and weights (3) but computes the same update as DDP, so any
difference beyond float noise is a bug in how the stage drives the engine (loss scaling over
gradient accumulation, boundaries, the reference model, gathering for generation or saving)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mappo_fixtures import launch_compared_run

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (MMOA_DEEPSPEED=0)")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def launch(tiny_model_dir: Path, tiny_mappo_data_dir: Path, unbatched_server_url: str,
           tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("ds_runs")

    def run(name: str, deepspeed: str | None, **extra) -> Path:
        return launch_compared_run(root, name, tiny_model_dir, tiny_mappo_data_dir,
                                   unbatched_server_url, deepspeed, **extra)

    return run


@pytest.fixture(scope="module")
def zero2(launch) -> Path:
    return launch("zero2", "ds_z2_config.json")


def _history(folder: Path) -> list[dict]:
    state = json.loads((folder / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "policy_loss" in entry]


PPO_KEYS = ("loss", "policy_loss", "value_loss", "kl", "grad_norm")
PPO_FILES = ("model.safetensors", "value_head.safetensors")


def _assert_same_run(run: Path, reference: Path, keys: tuple[str, ...] = PPO_KEYS,
                     files: tuple[str, ...] = PPO_FILES) -> None:
    ours, theirs = _history(run), _history(reference)
    assert [e["step"] for e in ours] == [e["step"] for e in theirs] == [1, 2]
    for a, b in zip(ours, theirs, strict=True):
        assert a["reward"] == b["reward"]  # the same samples were drawn
        for key in keys:
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-5), (a["step"], key)
    _assert_same_weights(run, reference, files)


def _assert_same_weights(run: Path, reference: Path,
                         files: tuple[str, ...] = PPO_FILES) -> None:
    from safetensors.torch import load_file

    for name in files:
        ours, theirs = load_file(str(run / name)), load_file(str(reference / name))
        assert ours.keys() == theirs.keys(), name
        for key in ours:
            assert (ours[key].float() - theirs[key].float()).abs().max() < 1e-4, (name, key)


def test_zero2_matches_ddp_and_checkpoints_every_partition(zero2: Path, ddp_run: Path) -> None:
    _assert_same_run(zero2, ddp_run)
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


def test_zero3_full_matches_ddp(launch, ddp_run: Path) -> None:
    """ZeRO-3 partitions the weights: generation runs on gathered weights, the frozen
    reference gets an inference engine, and saving gathers the full model."""
    _assert_same_run(launch("zero3", "ds_z3_config.json"), ddp_run)


def test_grpo_zero3_matches_ddp_without_a_value_head(launch) -> None:
    """GRPO under ZeRO-3: no value head in the partitioned model, its checkpoints or the
    gathered save; the same losses (k3 KL term included) and weights as DDP.

    The untrained tiny model answers nothing right (every group's F1 is 0), and with the
    policy equal to its reference the k3 gradient is float noise, which Adam scales up to
    full-size steps that differ between DDP and ZeRO: tight format limits make the penalties
    fire, so the agents' advantages, and the gradients compared, are real."""
    grpo = {"mappo_algorithm": "grpo", "mappo_group_size": 2, "mappo_questions_per_rollout": 2,
            "mappo_kl_loss_coef": 0.1, "mappo_generator_max_words": 1, "mappo_qr_max_chars": 20}
    ddp_grpo = launch("ddp_grpo", None, **grpo)
    zero3_grpo = launch("zero3_grpo", "ds_z3_config.json", **grpo)
    _assert_same_run(zero3_grpo, ddp_grpo, ("loss", "policy_loss", "kl_loss", "kl", "grad_norm"),
                     ("model.safetensors",))
    assert any(entry["policy_loss"] != 0 for entry in _history(ddp_grpo)), "a real signal"
    for run in (ddp_grpo, zero3_grpo):
        assert not list(run.rglob("value_head.safetensors")), run
        assert "grpo/zero_variance_groups" in _history(run)[0]
