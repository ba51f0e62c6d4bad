"""How the KL-to-warm-start reward is paid over a response (``mappo_kl_reward``): per token
(PPO's) or the response's mean once (length-neutral), against hand-computed values, with the
key's checks and the learner's use of it."""

from __future__ import annotations

import pytest
import torch

from mmoa.train.mappo.args import split_mappo_args
from mmoa.train.mappo.learner import PPOConfig
from mmoa.train.mappo.ppo_math import compute_gae, token_rewards
from tests.mappo_fixtures import three_agent_learner


def test_the_mean_shape_pays_the_mean_kl_once_on_the_last_token() -> None:
    logp = torch.tensor([[-1.0, -2.0, -1.0], [-1.0, -1.0, 0.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -1.8], [-1.2, -1.5, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    rewards, non_score, kl = token_rewards([1.0, 0.5], logp, ref, mask,
                                           kl_coef=torch.tensor([0.2, 0.4]), kl_shape="mean")
    # kl: row 0 [0.5, -1.0, 0.8], mean 0.1, x 0.2 -> -0.02 on token 3;
    #     row 1 [0.2, 0.5], mean 0.35, x 0.4 -> -0.14 on token 2 (token 3 is padding)
    torch.testing.assert_close(kl, torch.tensor([[0.5, -1.0, 0.8], [0.2, 0.5, 0.0]],
                                                dtype=torch.float64))
    torch.testing.assert_close(non_score, torch.tensor([[0.0, 0.0, -0.02], [0.0, -0.14, 0.0]],
                                                       dtype=torch.float64))
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 0.0, 0.98], [0.0, 0.36, 0.0]],
                                                     dtype=torch.float64))


def test_the_token_shape_is_the_default_and_unchanged() -> None:
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    default, _, _ = token_rewards([1.0], logp, ref, mask, kl_coef=0.1)
    token, non_score, _ = token_rewards([1.0], logp, ref, mask, kl_coef=0.1, kl_shape="token")
    # kl [0.5, -1.0] -> [-0.05, 0.1]
    torch.testing.assert_close(non_score, torch.tensor([[-0.05, 0.1]], dtype=torch.float64))
    torch.testing.assert_close(default, token)


def test_only_the_mean_shape_does_not_charge_a_longer_response_more() -> None:
    """Two responses drifting by the same 0.5 nats a token, of 2 and 4 tokens, same score: with
    GAE's lambda = 1 and a zero critic the first token's advantage is the whole return. Paid per
    token the longer one loses 0.2 x 0.5 x 4 = 0.4 against 0.2; paid as the mean, both lose 0.1."""
    logp = torch.full((2, 4), -1.0, dtype=torch.float64)
    ref = torch.full((2, 4), -1.5, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    first = {}
    for shape in ("token", "mean"):
        rewards, _, _ = token_rewards([1.0, 1.0], logp, ref, mask, kl_coef=0.2, kl_shape=shape)
        advantages, _ = compute_gae(rewards, torch.zeros_like(rewards), mask, 1.0, 1.0)
        first[shape] = advantages[:, 0]
    torch.testing.assert_close(first["token"], torch.tensor([0.8, 0.6], dtype=torch.float64))
    torch.testing.assert_close(first["mean"], torch.tensor([0.9, 0.9], dtype=torch.float64))


def test_an_empty_response_gets_nothing_and_a_bad_shape_is_refused() -> None:
    logp = torch.tensor([[-1.0, -2.0], [0.0, 0.0]])
    mask = torch.tensor([[True, True], [False, False]])
    rewards, non_score, _ = token_rewards([1.0, 1.0], logp, logp - 0.5, mask, kl_coef=0.2,
                                          kl_shape="mean")
    assert rewards[1].abs().sum() == 0 and non_score[1].abs().sum() == 0
    with pytest.raises(ValueError, match="kl_shape must be one of token, mean"):
        token_rewards([1.0, 1.0], logp, logp, mask, kl_coef=0.2, kl_shape="sum")


def test_the_key_is_checked_before_anything_loads() -> None:
    args, _ = split_mappo_args({"mappo_kl_reward": "mean"})
    assert args.mappo_kl_reward == "mean"
    assert split_mappo_args({})[0].mappo_kl_reward == "token"
    with pytest.raises(ValueError, match="mappo_kl_reward must be one of token, mean"):
        split_mappo_args({"mappo_kl_reward": "sequence"})
    with pytest.raises(ValueError, match="shapes the KL in the reward"):
        split_mappo_args({"mappo_kl_reward": "mean", "mappo_algorithm": "grpo"})


def test_the_learner_pays_the_mean_kl_on_each_samples_last_token() -> None:
    rollouts = {}
    for shape in ("token", "mean"):
        learner, samples = three_agent_learner(PPOConfig(
            algorithm="ppo", adaptive_kl=False, init_kl_coef=0.2,
            agent_kl_scales={"selector": 4.0}, kl_shape=shape))
        rollouts[shape] = learner.prepare(samples)
    token, mean = rollouts["token"], rollouts["mean"]
    torch.testing.assert_close(mean.kl, token.kl)  # the same KL, paid differently
    mask = token.batch.response_mask.bool()
    for row, (sample, coef) in enumerate(zip(samples, (0.2, 0.8, 0.2), strict=True)):
        n = int(mask[row].sum())
        expected = torch.zeros_like(mean.rewards[row])
        expected[n - 1] = sample.score - coef * token.kl[row, :n].mean()
        torch.testing.assert_close(mean.rewards[row], expected, atol=1e-6, rtol=0)


def test_the_k3_estimator_pays_a_non_negative_kl_per_token_and_in_the_mean() -> None:
    """k3 = exp(-d) + d - 1 with d = logp - logp_ref: for d = 0.5, -1.0, 0.8 that is
    0.106531, 0.718282, 0.249329 (where k1 pays 0.5, -1.0, 0.8); paid as the mean with beta 0.2:
    -0.2 x 0.358047 = -0.071609 on the last token."""
    logp = torch.tensor([[-1.0, -2.0, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -1.0, -1.8]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    k3 = torch.tensor([[0.106531, 0.718282, 0.249329]], dtype=torch.float64)
    _, token, kl = token_rewards([0.0], logp, ref, mask, kl_coef=0.2, kl_estimator="low_var_kl")
    torch.testing.assert_close(kl, k3, atol=1e-6, rtol=0)
    torch.testing.assert_close(token, -0.2 * k3, atol=1e-6, rtol=0)
    rewards, _, _ = token_rewards([1.0], logp, ref, mask, kl_coef=0.2, kl_shape="mean",
                                  kl_estimator="low_var_kl")
    torch.testing.assert_close(rewards, torch.tensor([[0.0, 0.0, 1.0 - 0.071609]],
                                                     dtype=torch.float64), atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="unknown KL estimator 'k2'"):
        token_rewards([1.0], logp, ref, mask, kl_coef=0.2, kl_estimator="k2")


def test_the_estimator_key_is_checked_and_reaches_the_learner() -> None:
    assert split_mappo_args({})[0].mappo_kl_estimator == "kl"
    assert split_mappo_args({"mappo_kl_estimator": "low_var_kl"})[0].mappo_kl_estimator \
        == "low_var_kl"
    with pytest.raises(ValueError, match="mappo_kl_estimator must be one of kl, abs, mse"):
        split_mappo_args({"mappo_kl_estimator": "k3"})
    with pytest.raises(ValueError, match="mappo_kl_estimator shapes the KL in the reward"):
        split_mappo_args({"mappo_kl_estimator": "low_var_kl", "mappo_algorithm": "grpo"})
    kls = {}
    for estimator in ("kl", "low_var_kl"):
        learner, samples = three_agent_learner(PPOConfig(
            algorithm="ppo", adaptive_kl=False, init_kl_coef=0.2, kl_estimator=estimator))
        kls[estimator] = learner.prepare(samples).kl
    mask = kls["kl"] != 0
    d = kls["kl"][mask]
    torch.testing.assert_close(kls["low_var_kl"][mask], torch.expm1(-d) + d, atol=1e-6, rtol=0)
    assert (kls["low_var_kl"] >= 0).all()
