"""The PPO learner on two CPU processes (gloo, DDP): the decisions every process must share.

A non-finite loss on one process must skip that update on both (a process that skips its
backward alone leaves the other waiting in the gradient all-reduce, or pairs its all-reduces
with the wrong micro-batches), and the adaptive KL controller must see the KL of all processes'
samples, so that beta is one value that one checkpoint can hold.

One pair of workers of this module runs every scenario (``tests/two_processes.py``: spawning
costs more than the scenarios); a worker that hangs fails the test instead of blocking the
suite.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mmoa.train.mappo.learner import PolicyWithValue, PPOConfig, PPOLearner, Rollout
from mmoa.train.mappo.ppo_math import AdaptiveKLController
from mmoa.train.mappo.samples import Sample, collate
from mmoa.train.mappo.value_head import ValueHead
from tests.two_processes import EOS, VOCAB, all_reduce_sum, run_on_two_processes
from tests.two_processes import ddp_tiny_policy as _tiny_policy


def _ddp_learner(rank: int, **config: Any) -> tuple[PPOLearner, torch.nn.Module]:
    from torch.nn.parallel import DistributedDataParallel

    policy = PolicyWithValue(_tiny_policy(), ValueHead(16),
                             ref_model=_tiny_policy().requires_grad_(False).eval())
    torch.manual_seed(1)
    torch.nn.init.normal_(policy.v_head.summary.weight, std=0.1)
    model = DistributedDataParallel(policy)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    learner = PPOLearner(
        model, optimizer, PPOConfig(**config), pad_id=0,
        unwrap=lambda m: m.module, generator=torch.Generator().manual_seed(3),
        all_reduce=all_reduce_sum, no_sync=lambda m: m.no_sync())
    return learner, policy


def _samples(rank: int, n: int = 8) -> list[Sample]:
    generator = torch.Generator().manual_seed(100 + rank)  # each process its own questions
    return [Sample("qr", torch.randint(2, VOCAB, (4,), generator=generator).tolist(),
                   [*torch.randint(2, VOCAB, (3,), generator=generator).tolist(), EOS],
                   float(i % 2)) for i in range(n)]


def _nan_on_one_process(rank: int) -> dict[str, Any]:
    """Rank 1's first micro-batch has a NaN loss; rank 0's are all finite."""
    learner, policy = _ddp_learner(rank, ppo_epochs=1, mini_batch_size=2,
                                   gradient_accumulation_steps=2, adaptive_kl=False)
    rollout = learner.prepare(_samples(rank))
    original = learner._loss
    calls = {"n": 0}

    def loss_with_a_nan(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, dict[str, float]]:
        loss, stats = original(*args, **kwargs)
        calls["n"] += 1
        if rank == 1 and calls["n"] == 1:
            loss = loss * float("nan")
        return loss, stats

    learner._loss = loss_with_a_nan  # type: ignore[method-assign]
    stats = learner.update(rollout)
    return {"stats": stats,
            "params": {k: v.detach().clone() for k, v in policy.state_dict().items()}}


def _kl_of_all_processes(rank: int) -> dict[str, Any]:
    """Per-sample KL 5.4 on rank 0 (2 samples) and 7.0 on rank 1 (2 samples): below and above
    the target 6, inside the controller's clipping, so local KLs would move beta apart."""
    learner, _ = _ddp_learner(rank, adaptive_kl=True, init_kl_coef=0.2, kl_target=6.0,
                              kl_horizon=100.0)
    samples = [Sample("qr", [3, 4], [5, EOS], 0.0), Sample("qr", [3], [6, 7, EOS], 0.0)]
    batch = collate(samples, 0)
    mask = batch.response_mask
    per_token = (5.4 if rank == 0 else 7.0) / mask.sum(1, keepdim=True)
    ref = torch.zeros_like(mask)
    old = per_token * mask  # k1: sum over tokens of (old - ref) = 5.4 or 7.0 per sample
    rollout = Rollout(samples, batch, old, ref, torch.zeros_like(mask), torch.zeros_like(mask),
                      old - ref, torch.zeros_like(mask), torch.zeros_like(mask))
    kl = learner.update_kl(rollout)
    return {"kl": kl, "beta": learner.kl_ctl.value, "state": learner.kl_ctl.state_dict()}


SCENARIOS = {"nan": _nan_on_one_process, "kl": _kl_of_all_processes}


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Every scenario's result on each rank: ``{name: [rank 0, rank 1]}``."""
    return run_on_two_processes(SCENARIOS, tmp_path_factory.mktemp("two_processes"))


@pytest.mark.timeout(400)
def test_a_nan_on_one_process_skips_the_update_on_both(scenarios) -> None:
    ranks = scenarios["nan"]
    # two accumulation groups of two micro-batches: the first is skipped everywhere, the
    # second updates everywhere, and the weights stay identical
    for result in ranks:
        assert result["stats"]["skipped_updates"] == 1.0
        assert result["stats"]["updates"] == 2.0
    first, second = (r["params"] for r in ranks)
    assert first.keys() == second.keys()
    for key in first:
        assert torch.equal(first[key], second[key]), key
    fresh = PolicyWithValue(_tiny_policy(), ValueHead(16)).state_dict()
    assert any(not torch.equal(first[k], fresh[k]) for k in fresh if "v_head" not in k), \
        "the second group must still have updated the policy"


@pytest.mark.timeout(400)
def test_the_kl_controller_sees_every_process(scenarios) -> None:
    ranks = scenarios["kl"]
    expected = AdaptiveKLController(0.2, 6.0, 100.0, 0.06)
    expected.update(6.2, 4)  # mean per-sample KL of the 4 samples of both processes
    assert expected.value == pytest.approx(0.2 * (1 + (6.2 / 6 - 1) * 4 / 100))  # by hand
    for result in ranks:
        assert result["kl"] == pytest.approx(6.2)
        assert result["beta"] == pytest.approx(expected.value, rel=1e-6)  # float32 KLs
    assert ranks[0]["state"] == ranks[1]["state"]
