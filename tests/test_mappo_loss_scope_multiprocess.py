"""The token mean over the whole batch on two CPU processes (gloo, DDP): issue #71.

Each process holds two samples of its own lengths (3 and 7 response tokens in all on rank 0
and 1). Under ``loss_scope: batch`` (dapo's default) each process divides its token sum by the
10 tokens of both, counted with one all-reduce, and DDP's average of the two gradients is then
the gradient of the token mean over all four samples: the step equals one process's step on
the four samples in one micro-batch. Under ``micro_batch`` each process takes its own mean and
DDP averages the two means, which weighs a token of rank 0 7/3 times one of rank 1.

One pair of workers runs both scopes (``tests/two_processes.py``, as for
tests/test_mappo_multiprocess.py); a worker that hangs fails the test instead of blocking it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from mmoa.train.mappo.learner import PolicyWithValue, PPOConfig, PPOLearner
from mmoa.train.mappo.samples import Sample
from tests.two_processes import EOS, all_reduce_sum, run_on_two_processes
from tests.two_processes import ddp_tiny_policy as _tiny_policy

SCOPES = ("batch", "micro_batch")


def _samples(rank: int) -> list[Sample]:
    """Rank 0: responses of 1 and 2 tokens; rank 1: 3 and 4; advantages +1 and -1."""
    if rank == 0:
        return [Sample("qr", [2, 3], [EOS], 1.0, advantage=1.0),
                Sample("qr", [2, 4], [5, EOS], 0.0, advantage=-1.0)]
    return [Sample("generator", [2, 8], [9, 10, EOS], 1.0, advantage=1.0),
            Sample("generator", [2, 9], [11, 12, 13, EOS], 0.0, advantage=-1.0)]


def _config(scope: str) -> PPOConfig:
    return PPOConfig(algorithm="dapo", ppo_epochs=1, mini_batch_size=2,
                     gradient_accumulation_steps=1, max_grad_norm=1e9, loss_scope=scope)


def _step(model: torch.nn.Module, policy: PolicyWithValue, samples: list[Sample], scope: str,
          **drive: Any) -> dict[str, torch.Tensor]:
    """One SGD step (lr 1) of ``policy`` on ``samples``; its state afterwards."""
    learner = PPOLearner(model, torch.optim.SGD(model.parameters(), lr=1.0), _config(scope),
                         pad_id=0, generator=torch.Generator().manual_seed(3), **drive)
    learner.update(learner.prepare(samples))
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def _ddp_step(scope: str, rank: int) -> dict[str, torch.Tensor]:
    """One process's DDP step on its own two samples under ``scope``."""
    from torch.nn.parallel import DistributedDataParallel

    policy = PolicyWithValue(_tiny_policy(), None)
    model = DistributedDataParallel(policy)
    return _step(model, policy, _samples(rank), scope, unwrap=lambda m: m.module,
                 all_reduce=all_reduce_sum, no_sync=lambda m: m.no_sync())


@pytest.fixture(scope="module")
def states(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each scope's weights after the step, on each rank: ``{scope: [rank 0, rank 1]}``."""
    out: Path = tmp_path_factory.mktemp("loss_scope_two_processes")
    return run_on_two_processes({scope: partial(_ddp_step, scope) for scope in SCOPES}, out)


def _one_process(scope: str) -> dict[str, torch.Tensor]:
    """The step of one process on all four samples in one micro-batch."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy = PolicyWithValue(_tiny_policy(), None)
        config = _config(scope)
        config.mini_batch_size = 4
        learner = PPOLearner(policy, torch.optim.SGD(policy.parameters(), lr=1.0), config,
                             pad_id=0, generator=torch.Generator().manual_seed(3))
        learner.update(learner.prepare(_samples(0) + _samples(1)))
        return {k: v.detach().clone() for k, v in policy.state_dict().items()}
    finally:
        torch.set_num_threads(threads)


def _close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.allclose(a[k], b[k], rtol=1e-5, atol=1e-7) for k in a)


@pytest.mark.timeout(400)
def test_the_token_mean_over_two_processes_is_the_one_batch_mean(states) -> None:
    first, second = states["batch"]
    assert all(torch.equal(first[k], second[k]) for k in first)  # DDP kept them equal
    whole = _one_process("batch")
    start = PolicyWithValue(_tiny_policy(), None).state_dict()
    assert not _close(whole, start), "the step must move the weights"
    assert _close(first, whole)
    # each process's own mean, averaged by DDP, is another step
    assert not _close(states["micro_batch"][0], whole)
