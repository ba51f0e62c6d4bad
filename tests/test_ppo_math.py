"""Tests of mmoa.train.mappo.ppo_math against values worked out by hand (arithmetic in comments)."""

from __future__ import annotations

import math

import pytest
import torch

from mmoa.train.mappo.ppo_math import (
    AdaptiveKLController,
    FixedKLController,
    compute_gae,
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_var,
    masked_whiten,
    masked_whiten_by_group,
    per_token_kl,
    policy_loss,
    token_rewards,
    value_loss,
)

F64 = torch.float64


def t(rows: list[list[float]] | list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def close(actual: torch.Tensor | float, expected: list | float, tol: float = 1e-9) -> None:
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64),
        rtol=0, atol=tol,
    )


# Row 0: three real tokens; row 1: one real token and two padded positions holding garbage.
X = t([[1.0, 2.0, 3.0], [5.0, 100.0, -7.0]])
MASK = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)

# ---------------------------------------------------------------------------------------------
# Masked statistics
# ---------------------------------------------------------------------------------------------


def test_masked_mean_excludes_padding() -> None:
    # All: (1 + 2 + 3 + 5) / 4 = 2.75; per row: 6 / 3 = 2 and 5 / 1 = 5.
    close(masked_mean(X, MASK), 2.75)
    close(masked_mean(X, MASK, dim=1), [2.0, 5.0])
    # A float 0/1 mask is read the same way.
    close(masked_mean(X, MASK.double()), 2.75)


def test_masked_mean_ignores_inf_and_nan_in_padding() -> None:
    x = t([[1.0, math.inf], [3.0, math.nan]])
    mask = torch.tensor([[1, 0], [1, 0]], dtype=torch.bool)
    close(masked_mean(x, mask), 2.0)  # (1 + 3) / 2; a multiplication by the mask would give nan


def test_masked_mean_empty_row_is_nan_and_shape_mismatch_raises() -> None:
    out = masked_mean(X, torch.tensor([[1, 1, 1], [0, 0, 0]]), dim=1)
    close(out[0], 2.0)
    assert torch.isnan(out[1])
    with pytest.raises(ValueError, match="mask has shape"):
        masked_mean(X, MASK[:, 0])


def test_masked_var() -> None:
    # Elements 1, 2, 3, 5; mean 2.75; squared deviations 3.0625 + 0.5625 + 0.0625 + 5.0625 = 8.75.
    close(masked_var(X, MASK), 8.75 / 3)  # unbiased: / (n - 1)
    close(masked_var(X, MASK, unbiased=False), 8.75 / 4)
    with pytest.raises(ValueError, match="at least 2"):
        masked_var(X, torch.tensor([[1, 0, 0], [0, 0, 0]]))


def test_masked_whiten() -> None:
    std = math.sqrt(8.75 / 3 + 1e-8)
    # (x - 2.75) / std on real tokens, 0 on padding.
    expected = [[-1.75 / std, -0.75 / std, 0.25 / std], [2.25 / std, 0.0, 0.0]]
    out = masked_whiten(X, MASK)
    close(out, expected)
    # Whitened real tokens: mean 0, unbiased variance 1 (up to the 1e-8 epsilon).
    close(masked_mean(out, MASK), 0.0)
    close(masked_var(out, MASK), 1.0, tol=1e-7)
    # shift_mean=False scales only: the mean 2.75 is added back.
    kept = masked_whiten(X, MASK, shift_mean=False)
    close(kept, [[2.75 - 1.75 / std, 2.75 - 0.75 / std, 2.75 + 0.25 / std],
                 [2.75 + 2.25 / std, 0.0, 0.0]])


def test_whiten_pools_rows() -> None:
    # Pooled over the batch (all agents together), not per row: whitening the batch equals
    # whitening the concatenation of its real tokens.
    flat = t([1.0, 2.0, 3.0, 5.0])
    alone = masked_whiten(flat, torch.ones(4, dtype=torch.bool))
    close(masked_whiten(X, MASK)[MASK], alone)


# ---------------------------------------------------------------------------------------------
# Log-probabilities, entropy, KL
# ---------------------------------------------------------------------------------------------


def test_logprobs_from_logits_hand_values_and_fp32() -> None:
    # logits [0, ln 3]: softmax = [1/4, 3/4].
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]], dtype=torch.bfloat16)
    labels = torch.tensor([[1, 0]])
    out = logprobs_from_logits(logits, labels)
    assert out.dtype == torch.float32
    assert out.shape == (1, 2)
    # bf16 rounds ln 3; 3/4 and 1/2 within bf16 precision.
    close(out.double(), [[math.log(0.75), math.log(0.5)]], tol=5e-3)


def test_logprobs_from_logits_matches_log_softmax_with_grad() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen, requires_grad=True)
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    ours = logprobs_from_logits(logits, labels)
    ref = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(ours, ref)
    (g_ours,) = torch.autograd.grad(ours.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(g_ours, g_ref)
    # [T, V] input works too.
    torch.testing.assert_close(logprobs_from_logits(logits[0], labels[0]), ref[0])
    with pytest.raises(ValueError, match="labels have shape"):
        logprobs_from_logits(logits, labels[:, :4])


def test_entropy_from_logits() -> None:
    # Uniform over 8: ln 8. logits [0, ln 3]: p = [1/4, 3/4],
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623351446...
    logits = torch.tensor([[[0.0] * 8], [[0.0, math.log(3.0)] + [-math.inf] * 6]])
    out = entropy_from_logits(logits)
    assert out.shape == (2, 1)
    close(out.double(), [[math.log(8.0)], [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]],
          tol=1e-6)
    # Random logits: the textbook -sum p log p.
    z = torch.randn(2, 3, 13, generator=torch.Generator().manual_seed(2))
    expected = -(torch.softmax(z, -1) * torch.log_softmax(z, -1)).sum(-1)
    torch.testing.assert_close(entropy_from_logits(z), expected)


def test_per_token_kl_hand_values() -> None:
    # logp = ln 1/2, ref = ln 1/4: d = logp - ref = ln 2.
    logp, ref = t([math.log(0.5)]), t([math.log(0.25)])
    close(per_token_kl(logp, ref, "kl"), [math.log(2.0)])
    close(per_token_kl(logp, ref, "abs"), [math.log(2.0)])
    close(per_token_kl(ref, logp, "abs"), [math.log(2.0)])  # |-ln 2|
    close(per_token_kl(logp, ref, "mse"), [0.5 * math.log(2.0) ** 2])  # 0.2402265...
    # k3: r = p_ref / p = 1/2; (r - 1) - ln r = -0.5 + ln 2 = 0.1931471...
    close(per_token_kl(logp, ref, "low_var_kl"), [-0.5 + math.log(2.0)])
    with pytest.raises(ValueError, match="unknown KL estimator"):
        per_token_kl(logp, ref, "full")


@pytest.mark.parametrize("kind", ["kl", "abs", "mse", "low_var_kl"])
def test_kl_is_exactly_zero_when_policy_equals_reference(kind: str) -> None:
    logp = torch.randn(4, 7, generator=torch.Generator().manual_seed(1)) - 3.0
    assert torch.equal(per_token_kl(logp, logp.clone(), kind), torch.zeros(4, 7))


# ---------------------------------------------------------------------------------------------
# Rewards
# ---------------------------------------------------------------------------------------------


def test_token_rewards_hand_values() -> None:
    logp = t([[-1.0, -2.0, -0.5], [-1.0, -1.0, 123.0], [9.0, 9.0, 9.0]])
    ref = t([[-1.5, -1.0, -0.5], [-1.2, -1.0, -50.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    scores = [0.8, -0.5, 1.0]
    rewards, non_score, kl = token_rewards(scores, logp, ref, mask, kl_coef=0.1)
    # Row 0: kl = [0.5, -1.0, 0.0]; -0.1 * kl = [-0.05, 0.1, 0]; + 0.8 on the last token.
    # Row 1: kl = [0.2, 0.0, pad]; -0.1 * kl = [-0.02, 0, 0]; + (-0.5) on token 1, the last real.
    # Row 2: no response token: nothing anywhere, its score is dropped.
    close(kl, [[0.5, -1.0, 0.0], [0.2, 0.0, 0.0], [0.0, 0.0, 0.0]])
    close(non_score, [[-0.05, 0.1, 0.0], [-0.02, 0.0, 0.0], [0.0, 0.0, 0.0]])
    close(rewards, [[-0.05, 0.1, 0.8], [-0.02, -0.5, 0.0], [0.0, 0.0, 0.0]])
    assert rewards.dtype == F64


def test_token_rewards_score_only_when_policy_is_reference_and_bf16_upcast() -> None:
    logp = torch.tensor([[-1.0, -2.0], [-3.0, 0.0]], dtype=torch.bfloat16)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    rewards, non_score, kl = token_rewards(torch.tensor([0.5, 0.25]), logp, logp, mask, 0.2)
    assert rewards.dtype == torch.float32
    assert torch.equal(kl, torch.zeros(2, 2)) and torch.equal(non_score, torch.zeros(2, 2))
    close(rewards.double(), [[0.0, 0.5], [0.25, 0.0]])


def test_token_rewards_rejects_bad_input() -> None:
    logp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="not right-padded"):
        token_rewards([1.0, 1.0], logp, logp, torch.tensor([[0, 1, 1], [1, 1, 1]]), 0.1)
    with pytest.raises(ValueError, match="one score per row"):
        token_rewards([1.0], logp, logp, torch.ones(2, 3), 0.1)


# ---------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------


def test_gae_full_row_gamma1_lambda095() -> None:
    rewards, values = t([[0.0, 0.0, 1.0]]), t([[0.5, 0.6, 0.7]])
    adv, ret = compute_gae(rewards, values, torch.ones(1, 3, dtype=torch.bool), 1.0, 0.95)
    # t=2: delta = 1 + 1 * 0 (terminal) - 0.7 = 0.3;               A2 = 0.3
    # t=1: delta = 0 + 0.7 - 0.6 = 0.1;  A1 = 0.1 + 0.95 * 0.3   = 0.385
    # t=0: delta = 0 + 0.6 - 0.5 = 0.1;  A0 = 0.1 + 0.95 * 0.385 = 0.46575
    close(adv, [[0.46575, 0.385, 0.3]])
    # returns = A + V = [0.96575, 0.985, 1.0]
    close(ret, [[0.96575, 0.985, 1.0]])


def test_gae_padded_rows() -> None:
    rewards = t([[0.0, 2.0, 9.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    values = t([[0.2, 0.4, 5.0], [0.0, 0.0, 0.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    adv, ret = compute_gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # Row 0 (padding reward 9 and value 5 are ignored; V after token 1 is 0, terminal):
    #   t=1: delta = 2 + 0.9 * 0 - 0.4 = 1.6;      A1 = 1.6
    #   t=0: delta = 0 + 0.9 * 0.4 - 0.2 = 0.16;   A0 = 0.16 + 0.9 * 0.5 * 1.6 = 0.88
    #   returns = [0.88 + 0.2, 1.6 + 0.4, 0] = [1.08, 2.0, 0]
    # Row 1: empty, all 0. Row 2: one token: A0 = 1 + 0 - 3 = -2, return 1.
    close(adv, [[0.88, 1.6, 0.0], [0.0, 0.0, 0.0], [-2.0, 0.0, 0.0]])
    close(ret, [[1.08, 2.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])


def test_gae_lambda_one_is_monte_carlo_and_no_grad() -> None:
    # gamma = lam = 1: A_t = sum of rewards from t on - V_t.
    rewards = t([[0.5, -1.0, 2.0, 0.25]])
    values = torch.tensor([[0.1, 0.2, 0.3, 0.4]], dtype=F64, requires_grad=True)
    adv, ret = compute_gae(rewards, values, torch.ones(1, 4), 1.0, 1.0)
    close(adv, [[1.75 - 0.1, 1.25 - 0.2, 2.25 - 0.3, 0.25 - 0.4]])
    close(ret, [[1.75, 1.25, 2.25, 0.25]])
    assert not adv.requires_grad and not ret.requires_grad


# ---------------------------------------------------------------------------------------------
# Policy loss
# ---------------------------------------------------------------------------------------------


def test_policy_loss_clipping_hand_values() -> None:
    eps = 0.2
    ratios = [1.5, 0.5, 1.5, 0.5, 1.1]
    advantages = t([[1.0, 1.0, -2.0, -2.0, 1.0, 0.0]])
    old = t([[-1.0] * 6])
    logp = (old + t([[math.log(r) for r in ratios] + [50.0]])).requires_grad_()
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)  # the 6th is padding (ratio e^50)
    loss, stats = policy_loss(logp, old, advantages, mask, eps)
    # per token max(-A r, -A clip(r, 0.8, 1.2)):
    #   A=+1, r=1.5: max(-1.5, -1.2) = -1.2  clipped
    #   A=+1, r=0.5: max(-0.5, -0.8) = -0.5  unclipped (pessimistic side)
    #   A=-2, r=1.5: max( 3.0,  2.4) =  3.0  unclipped
    #   A=-2, r=0.5: max( 1.0,  1.6) =  1.6  clipped
    #   A=+1, r=1.1: -1.1 both, inside the range, not counted as clipped
    # loss = (-1.2 - 0.5 + 3.0 + 1.6 - 1.1) / 5 = 1.8 / 5 = 0.36
    close(loss, 0.36)
    close(stats["clipfrac"], 2 / 5)
    close(stats["ratio_mean"], (1.5 + 0.5 + 1.5 + 0.5 + 1.1) / 5)  # 1.02
    logs = [math.log(r) for r in ratios]
    close(stats["approx_kl"], 0.5 * sum(x * x for x in logs) / 5)  # 0.1298794...
    close(stats["policy_kl"], -sum(logs) / 5)
    # Gradient: 0 where clipped; d(-A r)/dlogp = -A r on the others, divided by 5 tokens.
    loss.backward()
    close(logp.grad, [[0.0, -0.5 / 5, 3.0 / 5, 0.0, -1.1 / 5, 0.0]])
    assert all(not v.requires_grad for v in stats.values())


def test_policy_loss_is_minus_mean_advantage_on_policy() -> None:
    # ratio 1 everywhere: loss = -mean(A) = -(0.5 - 1.5 + 2.0) / 3 = -1/3; nothing clipped.
    logp = t([[-0.3, -2.0, -1.0]])
    loss, stats = policy_loss(logp, logp, t([[0.5, -1.5, 2.0]]), torch.ones(1, 3), 0.2)
    close(loss, -1.0 / 3)
    close(stats["clipfrac"], 0.0)
    close(stats["approx_kl"], 0.0)
    close(stats["ratio_mean"], 1.0)


# ---------------------------------------------------------------------------------------------
# Value loss
# ---------------------------------------------------------------------------------------------


def test_value_loss_clipping_hand_values() -> None:
    values = t([[1.0, 0.6, 0.0, 1.0, 77.0]]).requires_grad_()
    old = t([[0.5, 0.5, 0.5, 0.5, 0.0]])
    returns = t([[1.2, 0.0, 0.1, 0.0, -9.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)
    loss, stats = value_loss(values, old, returns, mask, 0.2)
    # clip(v, old - 0.2, old + 0.2) with old 0.5: [0.7, 0.6, 0.3, 0.7]
    #   v=1.0, R=1.2: (v-R)^2 = 0.04, (0.7-1.2)^2 = 0.25 -> 0.25  clipped
    #   v=0.6, R=0.0: 0.36 both (inside the range)      -> 0.36
    #   v=0.0, R=0.1: 0.01, (0.3-0.1)^2 = 0.04          -> 0.04  clipped
    #   v=1.0, R=0.0: 1.0,  (0.7)^2 = 0.49              -> 1.0
    # loss = 0.5 * (0.25 + 0.36 + 0.04 + 1.0) / 4 = 0.20625
    close(loss, 0.20625)
    close(stats["vf_clipfrac"], 0.5)
    close(stats["value_mean"], (1.0 + 0.6 + 0.0 + 1.0) / 4)  # 0.65
    close(stats["return_mean"], (1.2 + 0.0 + 0.1 + 0.0) / 4)  # 0.325
    # Var(R): deviations from 0.325: 0.875, -0.325, -0.225, -0.325 -> squares sum 1.0275.
    # R - v = [0.2, -0.6, 0.1, -1.0], mean -0.325: deviations 0.525, -0.275, 0.425, -0.675
    #   -> squares sum 0.9875. EV = 1 - 0.9875 / 1.0275 = 0.04 / 1.0275.
    close(stats["explained_variance"], 0.04 / 1.0275)
    # Gradient: clipped tokens 0; others 0.5 * 2 (v - R) / 4: token 1: 0.6 / 4, token 3: 1.0 / 4.
    loss.backward()
    close(values.grad, [[0.0, 0.15, 0.0, 0.25, 0.0]])


def test_value_loss_perfect_prediction() -> None:
    v = t([[0.3, -0.2]])
    loss, stats = value_loss(v, v, v, torch.ones(1, 2), 0.2)
    close(loss, 0.0)
    close(stats["explained_variance"], 1.0)
    close(stats["vf_clipfrac"], 0.0)
    _, stats = value_loss(v, v, t([[1.0, 1.0]]), torch.ones(1, 2), 0.2)
    assert torch.isnan(stats["explained_variance"])  # constant returns


# ---------------------------------------------------------------------------------------------
# Padding never matters (property test)
# ---------------------------------------------------------------------------------------------


def _random_batch(gen: torch.Generator) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    batch, length = 6, 9
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0], lengths[1] = length, 2  # at least one full row and enough tokens to whiten
    mask = torch.arange(length)[None, :] < lengths[:, None]
    names = ("logp", "old", "ref", "values", "old_values", "scores")
    data = {n: torch.randn(batch, length, generator=gen, dtype=F64) for n in names}
    data["logp"], data["old"], data["ref"] = data["logp"] - 2, data["old"] - 2, data["ref"] - 2
    data["scores"] = data["scores"][:, 0]
    return mask, data


def _run_all(mask: torch.Tensor, d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    logp = d["logp"].clone().requires_grad_()
    values = d["values"].clone().requires_grad_()
    rewards, non_score, kl = token_rewards(d["scores"], d["old"], d["ref"], mask, 0.15)
    adv, ret = compute_gae(rewards, d["old_values"], mask, 1.0, 0.95)
    white = masked_whiten(adv, mask)
    pg, pg_stats = policy_loss(logp, d["old"], white, mask, 0.2)
    vf, vf_stats = value_loss(values, d["old_values"], ret, mask, 0.2)
    (pg + 0.1 * vf).backward()
    return {
        "rewards": rewards, "non_score": non_score, "kl": kl, "adv": adv, "ret": ret,
        "white": white, "pg": pg.detach(), "vf": vf.detach(), "logp_grad": logp.grad,
        "values_grad": values.grad,
        **{f"pg_{k}": v for k, v in pg_stats.items()},
        **{f"vf_{k}": v for k, v in vf_stats.items()},
    }


@pytest.mark.parametrize("seed", range(5))
def test_values_at_padded_positions_never_change_any_output(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    mask, data = _random_batch(gen)
    base = _run_all(mask, data)
    garbled = {}
    for name, x in data.items():
        if x.dim() == 1:
            garbled[name] = x
            continue
        noise = torch.randn(x.shape, generator=gen, dtype=F64) * 1e3
        noise[:, 0] = math.inf if name != "values" else math.nan  # even inf / nan in padding
        garbled[name] = torch.where(mask, x, noise)
    other = _run_all(mask, garbled)
    for key, value in base.items():
        torch.testing.assert_close(other[key], value, rtol=0, atol=0, equal_nan=True, msg=key)
    # and every per-token output is exactly 0 at padding
    for key in ("rewards", "non_score", "kl", "adv", "ret", "white", "logp_grad", "values_grad"):
        assert torch.all(base[key][~mask] == 0), key


# ---------------------------------------------------------------------------------------------
# KL controllers
# ---------------------------------------------------------------------------------------------


def test_adaptive_kl_update_clip_and_proportional() -> None:
    ctl = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000, min_kl_coef=0.06)
    close(ctl.value, 0.2)
    # KL 9: 9/6 - 1 = 0.5, clipped to 0.2; mult = 1 + 0.2 * 96 / 10000 = 1.00192 -> 0.200384
    close(ctl.update(9.0, n_steps=96), 0.200384, tol=1e-12)
    # KL 6.3: 6.3/6 - 1 = 0.05 (inside); mult = 1 + 0.05 * 0.0096 = 1.00048
    #   -> 0.200384 * 1.00048 = 0.20048018432
    close(ctl.update(torch.tensor(6.3, dtype=F64), n_steps=96), 0.20048018432, tol=1e-12)
    # KL 0: -1 clipped to -0.2; mult = 1 - 0.00192 = 0.99808 -> 0.2000952623661056
    close(ctl.update(0.0, n_steps=96), 0.20048018432 * 0.99808, tol=1e-12)
    # KL on target: unchanged.
    close(ctl.update(6.0, n_steps=96), 0.20048018432 * 0.99808, tol=1e-12)
    close(ctl.value, 0.20048018432 * 0.99808, tol=1e-12)


def test_adaptive_kl_floor() -> None:
    ctl = AdaptiveKLController(init_kl_coef=0.07, target=6.0, horizon=100, min_kl_coef=0.06)
    # KL 0 each step: mult = 1 - 0.2 * 10 / 100 = 0.98, value 0.07 * 0.98^k:
    #   k=7: 0.0607688 (above the floor); k=8: 0.0595534 < 0.06 -> floored at 0.06.
    for _ in range(7):
        ctl.update(0.0, n_steps=10)
    close(ctl.value, 0.07 * 0.98**7, tol=1e-12)
    ctl.update(0.0, n_steps=10)
    close(ctl.value, 0.06)
    ctl.update(0.0, n_steps=10)
    close(ctl.value, 0.06)
    # It climbs again from the floor: KL 12 -> +0.2 -> 0.06 * 1.02 = 0.0612.
    close(ctl.update(12.0, n_steps=10), 0.0612, tol=1e-12)
    # The default floor is the paper's beta_min.
    assert AdaptiveKLController().min_kl_coef == 0.06


def test_adaptive_kl_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="target"):
        AdaptiveKLController(target=0.0)
    with pytest.raises(ValueError, match="current_kl"):
        AdaptiveKLController().update(float("nan"), 96)


def test_kl_controller_state_round_trip() -> None:
    ctl = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000, min_kl_coef=0.06)
    for kl in (9.0, 1.0, 7.0):
        ctl.update(kl, n_steps=96)
    state = ctl.state_dict()
    assert state["type"] == "adaptive"
    resumed = AdaptiveKLController(init_kl_coef=0.2, target=6.0, horizon=10000, min_kl_coef=0.06)
    resumed.load_state_dict(state)
    assert resumed.value == ctl.value
    assert resumed.update(3.0, 96) == ctl.update(3.0, 96)
    # A resumed run with a higher floor applies it to the restored value.
    higher = AdaptiveKLController(min_kl_coef=0.5)
    higher.load_state_dict(state)
    assert higher.value == 0.5

    fixed = FixedKLController(0.1)
    assert fixed.update(100.0, 96) == 0.1
    again = FixedKLController(0.1)
    again.load_state_dict(fixed.state_dict())
    assert again.value == fixed.value == 0.1
    with pytest.raises(ValueError, match="expected 'adaptive'"):
        resumed.load_state_dict(fixed.state_dict())
    with pytest.raises(ValueError, match="expected 'fixed'"):
        fixed.load_state_dict(state)


def test_masked_whiten_by_group_whitens_each_agent_on_its_own() -> None:
    # rows 0 and 2 are agent "a" (tokens 1, 3 | 5), row 1 is agent "b" (tokens 10, 30);
    # row 1's third position and row 0's third are padding
    x = torch.tensor([[1.0, 3.0, 99.0], [10.0, 30.0, 99.0], [5.0, 99.0, 99.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0], [1, 0, 0]])
    out = masked_whiten_by_group(x, mask, ["a", "b", "a"])
    # agent a: mean 3, unbiased variance ((1-3)^2 + 0 + (5-3)^2) / 2 = 4, std 2
    assert out[0, :2].tolist() == pytest.approx([-1.0, 0.0], abs=1e-6)
    assert out[2, 0].item() == pytest.approx(1.0, abs=1e-6)
    # agent b: mean 20, unbiased variance (100 + 100) / 1 = 200
    b = 10.0 / math.sqrt(200.0)
    assert out[1, :2].tolist() == pytest.approx([-b, b], abs=1e-6)
    # padding stays 0
    assert out[0, 2].item() == 0.0 and out[1, 2].item() == 0.0 and out[2, 1:].tolist() == [0, 0]
    # pooled whitening of the same batch gives agent b's tokens large positive advantages
    pooled = masked_whiten(x, mask)
    assert pooled[1, 1].item() > 1.5 and out[1, 1].item() < 1.0


def test_masked_whiten_by_group_single_token_group_is_zero() -> None:
    x = torch.tensor([[2.0, 4.0], [7.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    out = masked_whiten_by_group(x, mask, ["a", "b"])
    assert out[1].tolist() == [0.0, 0.0]
    assert out[0].tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)], abs=1e-6)
    with pytest.raises(ValueError, match="2 group names for 3 rows"):
        masked_whiten_by_group(torch.zeros(3, 2), torch.ones(3, 2), ["a", "b"])


def test_gae_lambda_below_one_with_a_zero_critic_favours_stopping() -> None:
    """The Selector's collapse (docs/mappo.md, *Why the Selector collapsed*): with the critic
    still at its zero initialisation and the reward R on the last token, lambda < 1 gives a
    stop token at position t the whole R but a continuation lam^k R (k = tokens still to come),
    so for the same outcome stopping is reinforced more; lambda = 1 gives every token R."""
    reward = 0.8
    # "Document0" then stop (2 tokens) vs "Document0" "," "Document1" stop (4 tokens), same R
    short = torch.tensor([[0.0, reward, 0.0, 0.0]])
    long = torch.tensor([[0.0, 0.0, 0.0, reward]])
    masks = (torch.tensor([[1, 1, 0, 0]]), torch.ones(1, 4))
    values = torch.zeros(1, 4)
    adv_short, _ = compute_gae(short, values, masks[0], 1.0, 0.95)
    adv_long, _ = compute_gae(long, values, masks[1], 1.0, 0.95)
    # position 1: the stop token gets R, the "," of the longer selection 0.95^2 R
    assert adv_short[0, 1].item() == pytest.approx(reward)
    assert adv_long[0, 1].item() == pytest.approx(0.95 ** 2 * reward)
    for rewards, mask in ((short, masks[0]), (long, masks[1])):
        adv, _ = compute_gae(rewards, values, mask, 1.0, 1.0)
        assert adv[mask.bool()].tolist() == pytest.approx([reward] * int(mask.sum()))
