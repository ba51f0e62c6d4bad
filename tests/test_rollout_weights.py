"""The rollouts' weights: when MAPPO generates with a copy of the policy in the compute dtype, that
the copy follows the policy, and that the static KV cache works through it where it cannot work
on fp32 weights under bf16 autocast (the failure first seen on an H200)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mmoa.agents.generation_cache import cache_kwargs, weights_in_compute_dtype
from mmoa.train.mappo.rollout_weights import RolloutWeights, rollout_weights_dtype
from tests.mappo_fixtures import tiny_mappo_config, tiny_policy

BF16, FP32 = torch.bfloat16, torch.float32


def test_a_copy_only_under_autocast_over_other_weights_on_a_gpu_or_for_the_static_cache() -> None:
    assert rollout_weights_dtype(FP32, None, "cuda", "static") is None  # no autocast: fp32
    assert rollout_weights_dtype(BF16, BF16, "cuda", "static") is None  # already bf16 (LoRA)
    assert rollout_weights_dtype(FP32, BF16, "cuda", "dynamic") == BF16  # the inference rule
    assert rollout_weights_dtype(FP32, BF16, "cuda", "auto") == BF16
    assert rollout_weights_dtype(FP32, BF16, "cpu", "dynamic") is None  # as every CPU figure
    assert rollout_weights_dtype(FP32, BF16, "cpu", "auto") is None  # auto: dynamic on a CPU
    assert rollout_weights_dtype(FP32, BF16, "cpu", "static") == BF16  # the cache needs it


def test_the_copy_follows_the_policy_and_leaves_its_gradients_alone() -> None:
    policy = tiny_policy(3)
    policy(input_ids=torch.tensor([[3, 4, 5]])).logits.sum().backward()
    grads = {name: p.grad.clone() for name, p in policy.named_parameters()}
    holder = RolloutWeights(BF16)
    copy = holder.policy_for_rollout(policy)
    assert copy is not policy and not copy.training
    for (name, master), mirror in zip(policy.named_parameters(), copy.parameters(), strict=True):
        assert mirror.dtype == BF16 and not mirror.requires_grad and mirror.grad is None
        assert torch.equal(mirror, master.detach().to(BF16)), name
        assert torch.equal(master.grad, grads[name]), name  # the policy's own, untouched
    with torch.no_grad():  # an update of the policy ...
        for param in policy.parameters():
            param.add_(0.25)
    assert holder.policy_for_rollout(policy) is copy  # ... is copied into the same copy
    for master, mirror in zip(policy.parameters(), copy.parameters(), strict=True):
        assert torch.equal(mirror, master.detach().to(BF16))
    assert RolloutWeights(None).policy_for_rollout(policy) is policy


def test_static_cache_is_refused_where_the_weights_are_not_in_the_compute_dtype() -> None:
    policy = tiny_policy(0)
    assert weights_in_compute_dtype(policy)
    assert cache_kwargs("static", policy) == {"cache_implementation": "static"}
    with torch.autocast("cpu", dtype=BF16):
        assert not weights_in_compute_dtype(policy)
        with pytest.raises(ValueError, match="static needs the weights in the compute dtype"):
            cache_kwargs("static", policy)
        assert cache_kwargs("auto", policy) == {}  # on a CPU auto is dynamic anyway
        assert weights_in_compute_dtype(policy.to(BF16))
        assert cache_kwargs("static", policy) == {"cache_implementation": "static"}


def test_mappo_under_bf16_autocast_rolls_out_with_the_static_cache_through_a_copy(
        tiny_model_dir: Path, tiny_mappo_data_dir: Path, tiny_server_url: str,
        tmp_path: Path) -> None:
    """Two MAPPO steps on the CPU at bf16 (autocast over fp32 master weights): with the static
    cache the rollouts generate with a bf16 copy that holds the static cache and follows the
    update; with the dynamic cache, on a CPU, the trainer would use the policy itself."""
    from transformers import StaticCache

    from mmoa.train.mappo.learner import PPOLearner
    from mmoa.train.mappo.workflow import build_mappo_trainer

    config = tiny_mappo_config(tiny_model_dir, tiny_mappo_data_dir, tiny_server_url,
                               tmp_path / "run", bf16=True, use_cpu=True, max_steps=2,
                               save_steps=100, mappo_questions_per_rollout=2,
                               mappo_rollout_batch_size=2, mappo_generation_cache="static")
    trainer, _, _ = build_mappo_trainer(config)
    learner = PPOLearner(trainer.model, trainer.optimizer, trainer.ppo_config,
                         trainer._pad_id(), generator=torch.Generator().manual_seed(0))
    for step in range(2):
        logs = trainer._train_step(step, learner)
        assert logs["time/generate"] > 0
    policy = trainer.accelerator.unwrap_model(trainer.model).policy
    assert policy.get_input_embeddings().weight.dtype == FP32
    rollout_model = trainer.rollout_policy(policy)
    assert rollout_model is not policy and trainer._rollout_weights.dtype == BF16
    # the policy itself could not have served: under the trainer's autocast its keys and
    # values reach a static cache in two dtypes
    ids = torch.tensor([[5, 6, 7, 8]])
    with trainer.accelerator.autocast(), torch.no_grad():
        with pytest.raises(ValueError, match="compute dtype"):
            cache_kwargs("static", policy)
        with pytest.raises(RuntimeError, match="same dtype"):
            policy.generate(input_ids=ids, max_new_tokens=2, do_sample=False,
                            cache_implementation="static", pad_token_id=0)
    trainer.mappo_args.mappo_generation_cache = "dynamic"  # on a CPU: no copy then
    assert trainer.rollout_policy(policy) is policy and not trainer._rollout_weights.copies
    assert isinstance(getattr(rollout_model, "_cache", None), StaticCache)
    for master, mirror in zip(policy.parameters(), rollout_model.parameters(), strict=True):
        assert torch.equal(mirror, master.detach().to(BF16))
