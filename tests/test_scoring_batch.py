"""How many samples one scoring forward takes (``mappo_forward_batch_size``): the default, the
key's check, and that the rollout's tensors do not depend on it (chunks of other widths are
padded back to one width)."""

from __future__ import annotations

import pytest
import torch

from mmoa.train.mappo.args import split_mappo_args
from mmoa.train.mappo.learner import PPOConfig, scoring_batch_size
from tests.mappo_fixtures import three_agent_learner


def test_the_default_is_the_device_batch_but_at_least_eight() -> None:
    assert scoring_batch_size(None, 2) == 8
    assert scoring_batch_size(None, 8) == 8
    assert scoring_batch_size(None, 12) == 12
    assert scoring_batch_size(48, 8) == 48
    assert scoring_batch_size(1, 8) == 1


def test_the_key_is_checked_before_anything_loads() -> None:
    assert split_mappo_args({})[0].mappo_forward_batch_size is None
    assert split_mappo_args({"mappo_forward_batch_size": 32})[0].mappo_forward_batch_size == 32
    with pytest.raises(ValueError, match="mappo_forward_batch_size must be at least 1, got 0"):
        split_mappo_args({"mappo_forward_batch_size": 0})


def test_the_rollout_is_the_same_whatever_the_forward_batch() -> None:
    """Three samples of three lengths scored one at a time, two then one, and all three at
    once: the same old and reference log-probs, values, KL and advantages on every response
    token (what lies past a response's end is padding, which nothing reads)."""
    rollouts = []
    for size in (1, 2, 3):
        learner, samples = three_agent_learner(PPOConfig(
            algorithm="ppo", adaptive_kl=False, init_kl_coef=0.2, forward_batch_size=size))
        rollouts.append(learner.prepare(samples))
    first = rollouts[0]
    mask = first.batch.response_mask.bool()
    assert first.old_logprobs.shape == (3, 3) and int(mask.sum()) == 8
    for other in rollouts[1:]:
        assert torch.equal(other.batch.response_mask.bool(), mask)
        for name in ("old_logprobs", "ref_logprobs", "values", "kl", "advantages", "returns"):
            torch.testing.assert_close(getattr(other, name)[mask], getattr(first, name)[mask],
                                       atol=1e-6, rtol=0, msg=name)
