"""Per-agent KL coefficients (``mappo_agent_kl_scale``): the parsed key, the per-row KL reward
against hand-computed values, and the learner's coefficients by sample."""

from __future__ import annotations

import pytest
import torch

from mmoa.train.mappo.args import parse_agent_kl_scale, split_mappo_args
from mmoa.train.mappo.learner import PPOConfig
from mmoa.train.mappo.ppo_math import token_rewards
from tests.mappo_fixtures import three_agent_learner


def test_the_key_parses_agent_multipliers() -> None:
    assert parse_agent_kl_scale("") == {}
    assert parse_agent_kl_scale(" qr=2 , selector=4.5 ") == {"qr": 2.0, "selector": 4.5}
    assert parse_agent_kl_scale("generator=0") == {"generator": 0.0}


@pytest.mark.parametrize("text", ["selector", "retriever=2", "qr=1,qr=2", "qr=-1", "qr=inf",
                                  "qr=abc"])
def test_bad_values_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="mappo_agent_kl_scale"):
        parse_agent_kl_scale(text)


def test_the_stage_refuses_it_where_the_kl_is_a_loss() -> None:
    args, _ = split_mappo_args({"mappo_agent_kl_scale": "selector=4"})
    assert args.agent_kl_scales == {"selector": 4.0}
    with pytest.raises(ValueError, match="scales the KL in the reward"):
        split_mappo_args({"mappo_agent_kl_scale": "selector=4", "mappo_algorithm": "grpo"})


def test_token_rewards_take_one_coefficient_per_row() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-1.0, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0], [-1.2, -1.5]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    rewards, non_score, kl = token_rewards([1.0, 0.0], logp, ref, mask,
                                           kl_coef=torch.tensor([0.1, 0.4]))
    # kl = [[0.5, -1.0], [0.2, 0.5]]; row 0 at 0.1: [-0.05, 0.1]; row 1 at 0.4: [-0.08, -0.2]
    torch.testing.assert_close(kl, torch.tensor([[0.5, -1.0], [0.2, 0.5]], dtype=torch.float64))
    torch.testing.assert_close(non_score, torch.tensor([[-0.05, 0.1], [-0.08, -0.2]],
                                                       dtype=torch.float64))
    torch.testing.assert_close(rewards, torch.tensor([[-0.05, 1.1], [-0.08, -0.2]],
                                                     dtype=torch.float64))
    same, _, _ = token_rewards([1.0, 0.0], logp, ref, mask, kl_coef=torch.tensor([0.1, 0.1]))
    scalar, _, _ = token_rewards([1.0, 0.0], logp, ref, mask, kl_coef=0.1)
    torch.testing.assert_close(same, scalar)
    with pytest.raises(ValueError, match="one per row"):
        token_rewards([1.0, 0.0], logp, ref, mask, kl_coef=torch.tensor([0.1, 0.2, 0.3]))


def test_the_learner_scales_each_agents_kl_reward() -> None:
    rollouts = {}
    for scales in ({}, {"selector": 4.0, "generator": 0.0}):
        learner, samples = three_agent_learner(PPOConfig(
            algorithm="ppo", adaptive_kl=False, init_kl_coef=0.2, agent_kl_scales=scales))
        coef = learner.kl_coefficients(samples)
        rollouts[bool(scales)] = (coef, learner.prepare(samples))
    assert rollouts[False][0] == pytest.approx(0.2)
    torch.testing.assert_close(rollouts[True][0], torch.tensor([0.2, 0.8, 0.0]))
    plain, scaled = rollouts[False][1], rollouts[True][1]
    mask = plain.batch.response_mask.bool()
    kl = plain.kl
    # the same policy, reference and scores: only each row's KL reward changes, by its scale
    expected = plain.rewards.clone()
    for row, factor in enumerate((1.0, 4.0, 0.0)):
        expected[row] = plain.rewards[row] - (factor - 1.0) * 0.2 * kl[row] * mask[row]
    torch.testing.assert_close(scaled.rewards, expected, atol=1e-6, rtol=0)
