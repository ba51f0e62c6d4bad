"""Issue #71: every registered algorithm is what its name says. Against values worked out by
hand: GSPO clips at its own range (3e-4 / 4e-4), DAPO's dynamic sampling refills the batch and
its overlong shaping and filter, a flat group of reward 0.1 under RLOO is found from the
rewards, a token mean over micro-batches of different lengths equals the one-batch mean, Dr.
GRPO's constant divisor, REINFORCE++ refuses the whitening keys, the log-ratio and k3 clamps,
dropout switched off in the update, and the truncated importance sampling weights. (The token
mean over two processes is in tests/test_mappo_loss_scope_multiprocess.py.)"""

from __future__ import annotations

import copy
import math
import types
from typing import Any

import pytest
import torch

from mmoa import defaults
from mmoa.train.mappo.algorithms import GROUP_ADVANTAGES, POLICY_LOSSES, LossSettings
from mmoa.train.mappo.args import split_mappo_args
from mmoa.train.mappo.grpo import OverlongShaping, PipelineOutcome, group_samples
from mmoa.train.mappo.learner import (
    PolicyWithValue,
    PPOConfig,
    PPOLearner,
    disable_dropout,
    nothing_to_learn,
    tis_stats,
)
from mmoa.train.mappo.ppo_math import (
    K3_CLAMP,
    LOG_RATIO_CLAMP,
    kl_loss,
    masked_average,
    per_token_kl,
    policy_loss,
    tis_weights,
    zero_variance_groups,
)
from mmoa.train.mappo.rewards import soft_overlong_punishment
from mmoa.train.mappo.samples import Sample
from mmoa.train.mappo.trainer import MappoTrainer
from tests.mappo_fixtures import EOS, tiny_policy

# -- GSPO: its own clip range --------------------------------------------------------------------


def test_gspo_takes_its_papers_clip_range_unless_the_config_sets_one() -> None:
    assert PPOConfig(algorithm="gspo").loss_settings() == LossSettings(3e-4, 4e-4, "sequence")
    args, _ = split_mappo_args({"mappo_algorithm": "gspo"})
    assert args.mappo_cliprange is None and args.mappo_cliprange_high is None
    assert args.algorithm.clip_notes(None, None) == [
        "mappo_algorithm: gspo: mappo_cliprange 0.0003 (its paper's)",
        "mappo_algorithm: gspo: mappo_cliprange_high 0.0004 (its paper's)"]
    # an explicit value wins, and says so; the upper range follows an explicit lower one
    assert PPOConfig(algorithm="gspo", cliprange=0.2).loss_settings().clip_high == 0.2
    assert PPOConfig(algorithm="gspo", cliprange_high=1e-3).loss_settings() \
        == LossSettings(3e-4, 1e-3, "sequence")
    assert args.algorithm.clip_notes(0.2, None)[0] == \
        "mappo_algorithm: gspo: mappo_cliprange 0.2 as configured (its paper's is 0.0003)"
    # the others keep PPO's 0.2 (dapo its clip-higher)
    assert PPOConfig(algorithm="grpo").loss_settings().clip_low == defaults.CLIPRANGE
    assert PPOConfig(algorithm="dapo").loss_settings() == LossSettings(0.2, 0.28, "token")


def test_gspo_clipping_is_active_at_its_own_range_by_hand() -> None:
    """Row 0: token log-ratios (1e-3, 1e-3), so s = exp(1e-3) = 1.0010005 > 1 + 4e-4 with
    A = +1: clipped, loss -(1 + 4e-4) and no gradient. Under PPO's 0.2 the same row would not
    be clipped (loss -1.0010005). Row 1: log-ratios (2e-4, 0): s = exp(1e-4), inside
    [1 - 3e-4, 1 + 4e-4], A = +1: unclipped, loss -s, gradient -s / 2 per token. Sequence mean
    over the two rows."""
    settings = PPOConfig(algorithm="gspo").loss_settings()
    log_ratio = torch.tensor([[1e-3, 1e-3], [2e-4, 0.0]], dtype=torch.float64,
                             requires_grad=True)
    old = torch.zeros(2, 2, dtype=torch.float64)
    advantages = torch.ones(2, 2, dtype=torch.float64)
    mask = torch.ones(2, 2)
    loss, stats = POLICY_LOSSES["gspo"](log_ratio, old, advantages, mask, settings, None)
    loss.backward()
    s1 = math.exp(1e-4)
    assert loss.item() == pytest.approx((-(1 + 4e-4) - s1) / 2, rel=1e-12)
    assert log_ratio.grad is not None
    assert log_ratio.grad[0].tolist() == [0.0, 0.0]
    assert log_ratio.grad[1].tolist() == pytest.approx([-s1 / 4, -s1 / 4], rel=1e-12)
    assert stats["clipfrac"].item() == pytest.approx(0.5)
    ppo_range, _ = POLICY_LOSSES["gspo"](log_ratio.detach(), old, advantages, mask,
                                         LossSettings(0.2, 0.2, "sequence"), None)
    assert ppo_range.item() == pytest.approx((-math.exp(1e-3) - s1) / 2, rel=1e-12)


# -- flat groups from the rewards ----------------------------------------------------------------


def test_a_flat_rloo_group_of_reward_point_one_is_found() -> None:
    """Four rollouts rewarded 0.1: RLOO's r - (0.3 / 3) is -1.4e-17, not 0, so a test on the
    advantage missed the group; the rewards' max - min (0) finds it, its advantage is exactly
    0, ``skip`` leaves its samples out and the step says there is nothing to learn."""
    rewards = torch.tensor([[0.1] * 4], dtype=torch.float64)
    assert GROUP_ADVANTAGES["rloo"](rewards)[0, 0].item() != 0.0  # the rounding
    assert zero_variance_groups(rewards).tolist() == [True]
    assert zero_variance_groups([[0.1, 0.1 + 1e-12, 0.1, 0.1]]).tolist() == [True]
    assert zero_variance_groups([[0.1, 0.1 + 1e-6, 0.1, 0.1]]).tolist() == [False]
    outcomes = [PipelineOutcome({"qr": ([2], [4, EOS], None)}, 0.1, {"qr": 0.0})
                for _ in range(4)]
    samples, logs = group_samples(outcomes, 4, ("qr",), "rloo")
    assert [s.advantage for s in samples] == [0.0] * 4
    assert all(s.group == 0 and s.group_flat for s in samples)
    assert logs["grpo/zero_variance_groups"] == 1.0
    skipped, logs = group_samples(outcomes, 4, ("qr",), "rloo", "skip")
    assert skipped == [] and logs["grpo/skipped_samples"] == 4.0
    model = PolicyWithValue(tiny_policy(seed=2), None)
    learner = PPOLearner(model, torch.optim.SGD(model.parameters(), lr=0.0),
                         PPOConfig(algorithm="rloo"), pad_id=0)
    rollout = learner.prepare(samples)
    reason = nothing_to_learn(rollout, {"updates": 1.0, "grad_norm": 1.0})
    assert reason is not None and "group advantage of 0" in reason


# -- token means over the whole batch ------------------------------------------------------------


def test_masked_average_shares_add_up_to_the_batch_mean_by_hand() -> None:
    """Micro-batch A: tokens (1, 2, 3) and (4); B: (10). Token mean over the batch: 20 / 5 = 4,
    where A's mean 2.5 and B's 10 averaged over the two micro-batches give 6.25. Rows: A's
    row means 2 and 4, B's 10: sequence mean 16 / 3."""
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    am = torch.tensor([[1, 1, 1], [1, 0, 0]])
    b = torch.tensor([[10.0]])
    bm = torch.tensor([[1]])
    assert (masked_average(a, am) + masked_average(b, bm)).item() / 2 == 6.25
    assert (masked_average(a, am, total=5) + masked_average(b, bm, total=5)).item() == 4.0
    assert (masked_average(a, am, "sequence", total=3)
            + masked_average(b, bm, "sequence", total=3)).item() == pytest.approx(16 / 3)
    assert (masked_average(a, am, "constant", norm_length=4, total=3)
            + masked_average(b, bm, "constant", norm_length=4, total=3)).item() \
        == pytest.approx(20 / 12)


def _scope_samples() -> list[Sample]:
    """Responses of 1, 4, 2 and 5 tokens (with the end token), advantages +-1."""
    return [Sample("qr", [2, 3], [EOS], 1.0, advantage=1.0),
            Sample("qr", [2, 4], [5, 6, 7, EOS], 0.0, advantage=-1.0),
            Sample("generator", [2, 8], [9, EOS], 1.0, advantage=1.0),
            Sample("generator", [2, 9], [10, 11, 12, 13, EOS], 0.0, advantage=-1.0)]


def _update_delta(algorithm: str, mini_batch_size: int, accumulation: int,
                  **config: Any) -> torch.Tensor:
    """The parameter change of one SGD step (lr 1, no clipping) of the tiny policy on
    :func:`_scope_samples`: minus the step's gradient."""
    policy = tiny_policy(seed=3)
    model = PolicyWithValue(policy, None)
    before = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
    learner = PPOLearner(model, torch.optim.SGD(model.parameters(), lr=1.0), PPOConfig(
        algorithm=algorithm, ppo_epochs=1, mini_batch_size=mini_batch_size,
        gradient_accumulation_steps=accumulation, max_grad_norm=1e9, **config), pad_id=0,
        generator=torch.Generator().manual_seed(0))
    learner.update(learner.prepare(_scope_samples()))
    return torch.cat([p.detach().flatten() for p in model.parameters()]) - before


@pytest.mark.parametrize(("algorithm", "config"), [("dapo", {}), ("dr_grpo", {}),
                                                   ("grpo", {"loss_scope": "batch"}),
                                                   ("grpo", {"loss_scope": "batch",
                                                             "loss_averaging": "sequence"})])
def test_a_mean_over_two_micro_batches_equals_the_one_batch_mean(algorithm: str,
                                                                 config: dict) -> None:
    """Two micro-batches of 2 samples (accumulated) against one of 4: the same step under the
    batch scope (dapo's and dr_grpo's default), whatever the micro-batches' token counts; under
    the micro-batch scope (the mean of each micro-batch's mean) it is another step."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        whole = _update_delta(algorithm, 4, 1, **config)
        split = _update_delta(algorithm, 2, 2, **config)
        assert whole.abs().max() > 1e-4
        assert torch.allclose(split, whole, rtol=1e-4, atol=1e-7)
        if algorithm == "dapo":
            old = _update_delta(algorithm, 2, 2, loss_scope="micro_batch")
            assert not torch.allclose(old, whole, rtol=1e-3, atol=1e-6)
    finally:
        torch.set_num_threads(threads)


def test_the_scopes_resolve_per_algorithm_and_the_key_overrides() -> None:
    assert {name: PPOConfig(algorithm=name).scope for name in
            ("ppo", "grpo", "dr_grpo", "rloo", "reinforce_plus_plus", "dapo", "gspo")} == {
        "ppo": "micro_batch", "grpo": "micro_batch", "dr_grpo": "batch",
        "rloo": "micro_batch", "reinforce_plus_plus": "micro_batch", "dapo": "batch",
        "gspo": "micro_batch"}
    args, _ = split_mappo_args({"mappo_loss_scope": "batch"})
    assert args.mappo_loss_scope == "batch"
    with pytest.raises(ValueError, match="mappo_loss_scope must be one of micro_batch, batch"):
        split_mappo_args({"mappo_loss_scope": "global"})


# -- Dr. GRPO: a constant divisor ----------------------------------------------------------------


def test_dr_grpo_divides_by_the_generation_budget_not_the_widest_response() -> None:
    """mappo_loss_norm_length unset: the largest budget of the optimised agents (QR 100,
    Selector 32, Generator 100 -> 100; Selector alone -> 32); the learner's settings keep it
    whatever the rollout's widest response. The loss of a row of 3 tokens of A = 1 at ratio 1
    is -3 / (1 row x 100)."""
    args, _ = split_mappo_args({"mappo_algorithm": "dr_grpo"})
    assert args.loss_norm_length == 100
    selector, _ = split_mappo_args({"mappo_algorithm": "dr_grpo", "mappo_agents": "selector"})
    assert selector.loss_norm_length == defaults.MAX_NEW_TOKENS["selector"]
    search, _ = split_mappo_args({"mappo_algorithm": "dr_grpo", "mappo_pipeline":
                                  "search_agent", "mappo_max_new_tokens_search": 50,
                                  "mappo_search_max_turns": 2})
    assert search.loss_norm_length == 150
    config = PPOConfig(algorithm="dr_grpo", norm_length=args.loss_norm_length)
    settings = config.loss_settings(norm_length=7)  # the rollout's widest: ignored
    assert settings.norm_length == 100 and settings.averaging == "constant"
    loss, _ = policy_loss(torch.zeros(1, 3), torch.zeros(1, 3), torch.ones(1, 3),
                          torch.ones(1, 3), 0.2, "constant", norm_length=settings.norm_length)
    assert loss.item() == pytest.approx(-3 / 100)
    assert split_mappo_args({"mappo_algorithm": "dr_grpo", "mappo_loss_norm_length": 64}
                            )[0].loss_norm_length == 64
    with pytest.raises(ValueError, match="mappo_loss_norm_length is the constant of "
                                         "mappo_loss_averaging: constant; mappo_algorithm: "
                                         "grpo averages by token"):
        split_mappo_args({"mappo_algorithm": "grpo", "mappo_loss_norm_length": 64})


# -- REINFORCE++ and the whitening keys ----------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["reinforce_plus_plus", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize(("key", "value", "shown"), [
    ("mappo_whiten_advantages", False, "mappo_whiten_advantages: false"),
    ("mappo_whiten_per_agent", True, "mappo_whiten_per_agent: true")])
def test_reinforce_plus_plus_refuses_the_whitening_keys(algorithm: str, key: str, value: bool,
                                                        shown: str) -> None:
    with pytest.raises(ValueError, match=f"^{shown}: mappo_algorithm: {algorithm} normalises "
                                         "its advantages over the whole batch by definition"):
        split_mappo_args({"mappo_algorithm": algorithm, key: value})
    split_mappo_args({"mappo_algorithm": "ppo", key: value})  # ppo's keys
    split_mappo_args({"mappo_algorithm": algorithm, "mappo_whiten_advantages": True})


# -- the clamps ----------------------------------------------------------------------------------


def test_the_log_ratio_and_k3_clamps_by_hand() -> None:
    """A log-ratio of 50 is clamped to 20 before exp: the ratio is e^20 (finite), A = -1 gives
    the loss e^20 (unclipped side, the pessimistic one), and its gradient is 0 (outside the
    clamp). Inside the clamps nothing changes. k3 of a token whose reference log-prob is 30
    above the policy's: log r clamped to 20, k3 = e^20 - 21 clamped to 10; 0.5 -> e^0.5 - 1.5."""
    logprobs = torch.tensor([[50.0, 0.1]], dtype=torch.float64, requires_grad=True)
    loss, stats = policy_loss(logprobs, torch.zeros(1, 2, dtype=torch.float64),
                              torch.tensor([[-1.0, 0.0]], dtype=torch.float64),
                              torch.ones(1, 2), 0.2)
    loss.backward()
    assert math.isfinite(loss.item())
    assert loss.item() == pytest.approx(math.exp(LOG_RATIO_CLAMP) / 2, rel=1e-12)
    assert logprobs.grad is not None and logprobs.grad[0, 0].item() == 0.0
    assert stats["approx_kl"].item() == pytest.approx(0.5 * (400 + 0.01) / 2)
    k3 = per_token_kl(torch.tensor([-30.0, -0.5, 0.0]), torch.zeros(3), "low_var_kl")
    assert k3.tolist() == pytest.approx([K3_CLAMP, math.exp(0.5) - 1.5, 0.0], rel=1e-6)
    # the other side: log r = -40 -> -20, k3 = e^-20 + 19 -> 10; log r = -5 -> e^-5 + 4
    assert per_token_kl(torch.tensor([40.0, 5.0]), torch.zeros(2), "low_var_kl").tolist() \
        == pytest.approx([K3_CLAMP, math.exp(-5) + 4], rel=1e-6)
    term = kl_loss(torch.tensor([[-30.0]], requires_grad=True), torch.zeros(1, 1),
                   torch.ones(1, 1))
    assert term.item() == K3_CLAMP and math.isfinite(term.item())


# -- dropout -------------------------------------------------------------------------------------


def _dropout_policy() -> torch.nn.Module:
    """The tiny Llama with attention dropout 0.5 and a LoRA adapter with lora_dropout 0.5."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=64, eos_token_id=EOS, pad_token_id=0,
                         attention_dropout=0.5)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.5, target_modules=["q_proj", "v_proj"],
                      init_lora_weights=False)
    return get_peft_model(LlamaForCausalLM(config), lora)


@pytest.mark.parametrize("disabled", [True, False])
def test_dropout_is_off_during_the_update(disabled: bool, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    """Learning rate 0: the policy does not move, so every ratio of the first epoch must be 1
    (approx_kl 0). With the model's dropouts on in train mode it is noise; the learner switches
    them off (every nn.Dropout's p and the attention's dropout rate 0)."""
    if not disabled:
        monkeypatch.setattr("mmoa.train.mappo.learner.disable_dropout", lambda model: 0)
    policy = _dropout_policy()
    model = PolicyWithValue(policy, None)
    learner = PPOLearner(model, torch.optim.SGD(model.parameters(), lr=0.0),
                         PPOConfig(algorithm="grpo", ppo_epochs=1, mini_batch_size=4),
                         pad_id=0)
    torch.manual_seed(1)
    stats = learner.update(learner.prepare(_scope_samples()))
    if disabled:
        assert stats["approx_kl"] == 0.0 and stats["clipfrac"] == 0.0
        assert all(m.p == 0 for m in policy.modules() if isinstance(m, torch.nn.Dropout))
        assert policy.config.attention_dropout == 0.0
        assert disable_dropout(policy) == 0  # idempotent: nothing left on
    else:
        assert stats["approx_kl"] > 1e-6


# -- truncated importance sampling ---------------------------------------------------------------


def test_tis_weights_by_hand() -> None:
    """Cap 1.5. Token 1: scored p 0.5, sampled at 0.25 (top-p renormalised): ratio 2 -> 1.5.
    Token 2: 0.2 vs 0.4 -> 0.5. Token 3: nothing recorded -> 1. Token 4: padding -> 0."""
    old = torch.tensor([[math.log(0.5), math.log(0.2), -1.0, 0.0]])
    sampled = torch.tensor([[math.log(0.25), math.log(0.4), math.nan, math.nan]])
    weights = tis_weights(old, sampled, torch.tensor([[1, 1, 1, 0]]), 1.5)
    assert weights[0].tolist() == pytest.approx([1.5, 0.5, 1.0, 0.0], rel=1e-6)
    # the loss of each token is multiplied by its weight: A = 1 at ratio 1, token mean
    loss, _ = policy_loss(torch.zeros(1, 4), torch.zeros(1, 4), torch.ones(1, 4),
                          torch.tensor([[1, 1, 1, 0]]), 0.2, weights=weights)
    assert loss.item() == pytest.approx(-(1.5 + 0.5 + 1.0) / 3, rel=1e-6)
    with pytest.raises(ValueError, match="the TIS cap must be a finite number > 0"):
        tis_weights(old, sampled, torch.ones(1, 4), 0.0)


def test_the_learner_weights_the_loss_by_the_rollouts_log_probs() -> None:
    """prepare turns each sample's recorded sampling log-probs into the rollout's TIS weights
    (the policy's own log-probs minus log 2 as the sampler's: every ratio 2, capped to 1.5),
    which the update's loss uses; tis_stats logs them."""
    policy = tiny_policy(seed=6)
    model = PolicyWithValue(policy, None)
    plain = PPOLearner(model, torch.optim.SGD(model.parameters(), lr=0.0),
                       PPOConfig(algorithm="grpo", ppo_epochs=1), pad_id=0)
    scored = plain.prepare(_scope_samples()).old_logprobs
    assert plain.prepare(_scope_samples()).tis_weights is None
    samples = []
    for row, sample in enumerate(_scope_samples()):
        n = len(sample.response_ids)
        samples.append(Sample(sample.agent, sample.prompt_ids, sample.response_ids,
                              sample.score, (scored[row, :n] + math.log(0.5)).tolist(),
                              advantage=sample.advantage))
    learner = PPOLearner(model, torch.optim.SGD(model.parameters(), lr=0.0),
                         PPOConfig(algorithm="grpo", ppo_epochs=1, tis_cap=1.5), pad_id=0)
    rollout = learner.prepare(samples)
    assert rollout.tis_weights is not None
    mask = rollout.batch.response_mask.bool()
    assert rollout.tis_weights[mask].tolist() == pytest.approx([1.5] * int(mask.sum()))
    assert tis_stats(rollout) == pytest.approx({"tis/weight_mean": 1.5, "tis/weight_min": 1.5,
                                                "tis/capped_fraction": 1.0})
    weighted = learner.update(rollout)["policy_loss"]
    unweighted = plain.update(plain.prepare(samples))["policy_loss"]
    assert weighted == pytest.approx(1.5 * unweighted, rel=1e-5)


def test_the_tis_key_records_the_sampling_log_probs_and_is_refused_where_none_are() -> None:
    args, _ = split_mappo_args({"mappo_tis_cap": 2.0})
    assert args.record_sampling_logprobs and not split_mappo_args({})[0].record_sampling_logprobs
    with pytest.raises(ValueError, match="mappo_tis_cap needs each token's sampling log-prob"):
        split_mappo_args({"mappo_tis_cap": 2.0, "mappo_pipeline": "search_agent"})
    with pytest.raises(ValueError, match="mappo_tis_cap must be a finite number > 0"):
        split_mappo_args({"mappo_tis_cap": -1.0})


# -- DAPO: overlong shaping and filter -----------------------------------------------------------


def test_the_soft_overlong_punishment_by_hand() -> None:
    """L_max 10, L_cache 4: no punishment up to 6 tokens, then (6 - |y|) / 4, -1 at 10."""
    assert [soft_overlong_punishment(n, 10, 4) for n in (3, 6, 7, 8, 10, 11)] == \
        [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert soft_overlong_punishment(8, 10, 4, factor=0.5) == -0.25
    assert OverlongShaping({"generator": 10}, buffer=0.4).reward("generator", 8) == -0.5
    assert OverlongShaping({"generator": 10}, buffer=0.4).reward("qr", 8) == 0.0


def test_the_overlong_reward_enters_the_group_and_the_filter_drops_truncated_responses() -> None:
    """Three pipelines, answer reward 1 in all (the shared group is flat), the Generator's
    responses 2, 8 and 10 tokens under L_max 10 with L_cache 4: length rewards 0, -0.5, -1, so
    the Generator's own group is not flat (mean -0.5: advantages 0.5, 0, -0.5) while the QR's
    is; with the filter on the 10-token response is left out of the loss."""
    def call(n: int) -> tuple[list[int], list[int], None]:
        return [2], [5] * (n - 1) + [EOS], None

    outcomes = [PipelineOutcome({"qr": call(2), "generator": call(n)}, 1.0,
                                {"qr": 0.0, "generator": 0.0}) for n in (2, 8, 10)]
    shaping = OverlongShaping({"qr": 10, "generator": 10}, buffer=0.4)
    samples, logs = group_samples(outcomes, 3, ("qr", "generator"), "mean", "skip", shaping)
    assert [(s.agent, s.advantage, s.score) for s in samples] == [
        ("generator", 0.5, 1.0), ("generator", 0.0, 0.5), ("generator", -0.5, 0.0)]
    assert logs["overlong/reward"] == pytest.approx(-1.5 / 6)
    assert logs["overlong/truncated"] == pytest.approx(1 / 6)
    filtering = OverlongShaping({"qr": 10, "generator": 10}, buffer=0.4, filter=True)
    kept, logs = group_samples(outcomes, 3, ("qr", "generator"), "mean", "skip", filtering)
    assert [s.advantage for s in kept] == [0.5, 0.0] and logs["overlong/filtered"] == 1.0


def test_the_dapo_keys_are_refused_where_they_mean_nothing() -> None:
    args, _ = split_mappo_args({"mappo_algorithm": "dapo", "mappo_overlong_buffer": 0.2,
                                "mappo_overlong_filter": True})
    shaping = OverlongShaping.from_args(args)
    assert shaping is not None and shaping.limits == dict(defaults.MAX_NEW_TOKENS)
    assert OverlongShaping.from_args(split_mappo_args({"mappo_algorithm": "dapo"})[0]) is None
    for config, message in (
            ({"mappo_overlong_buffer": 0.2}, "mappo_algorithm: ppo has no groups"),
            ({"mappo_algorithm": "grpo", "mappo_dapo_max_rounds": 2},
             "mappo_dapo_max_rounds refills the batch of the dynamic sampling of "
             "mappo_algorithm: dapo; grpo has none"),
            ({"mappo_algorithm": "dapo", "mappo_overlong_buffer": 1.5},
             "mappo_overlong_buffer must be a share in \\[0, 1\\]"),
            ({"mappo_algorithm": "dapo", "mappo_overlong_filter": True,
              "mappo_pipeline": "search_agent"}, "has turns")):
        with pytest.raises(ValueError, match=message):
            split_mappo_args(config)


# -- DAPO: dynamic sampling refills the batch ----------------------------------------------------


class _Record:
    def __init__(self, index: int) -> None:
        self.index = index
        self.question = f"q{index}"


def _refiller(signal: set[int], records: list[_Record], max_rounds: int = 4,
              questions: int = 4) -> Any:
    """A stand-in for the trainer with a deterministic reward source: question i's G = 2
    rollouts score (1, 0) when i is in ``signal`` and (0, 0) otherwise; the refill hands out
    the dataset's next unused questions in order (the real one is a seeded permutation)."""
    fake = types.SimpleNamespace(
        questions_per_step=questions, records=records,
        args=types.SimpleNamespace(seed=0),
        mappo_args=split_mappo_args({"mappo_algorithm": "dapo", "mappo_group_size": 2,
                                     "mappo_dapo_max_rounds": max_rounds})[0],
        rollouts=[])

    def refill(step: int, round_: int, count: int, taken: list[_Record]) -> list[_Record]:
        used = {r.index for r in taken}
        return [r for r in records if r.index not in used][:count]

    def rollout(step: int, learner: Any, chosen: list[_Record], rng: Any) -> tuple[list, Any]:
        from mmoa.pipelines import Timings

        fake.rollouts.append([r.index for r in chosen])
        return list(chosen), Timings({"generator": 1.0})

    def make_samples(chosen: list[_Record], traces: list[_Record]
                     ) -> tuple[list[Sample], dict[str, float]]:
        outcomes = [PipelineOutcome({"qr": ([2], [4, EOS], None)}, reward, {"qr": 0.0})
                    for r in chosen for reward in ((1.0, 0.0) if r.index in signal
                                                   else (0.0, 0.0))]
        samples, logs = group_samples(outcomes, 2, ("qr",), "mean_std", "skip")
        logs["answer_f1"] = sum(o.shared for o in outcomes) / len(outcomes)
        return samples, logs

    fake.refill_records = refill
    fake._checked_rollout = rollout
    fake.make_samples = make_samples
    fake.is_world_process_zero = lambda: True
    return fake


def _dynamic(fake: Any, first: list[_Record]) -> tuple[list[Sample], dict[str, float]]:
    samples, logs = fake.make_samples(first, first)
    from mmoa.pipelines import Timings

    samples, logs, timings = MappoTrainer._dynamic_sampling(
        fake, 0, None, first, samples, logs, Timings({"generator": 1.0}), {})
    logs["time/generate"] = timings.generate
    return samples, logs


def test_dapo_refills_the_batch_to_its_size_by_hand() -> None:
    """Every fourth question has differing rewards (4, 8, 12, 16, ...). The step's questions
    1-4 hold one group with a signal, of 4 wanted: 1/4 kept, 3 missing -> 12 questions, at most
    a step's 4 a round: 5-8 (one more), then 2 of 8 kept, 2 missing -> 4: 9-12, then 13-16:
    the 4th group. 3 extra rounds, 16 questions rolled out, 4 groups kept, 8 samples."""
    records = [_Record(i) for i in range(1, 41)]
    fake = _refiller({i for i in range(1, 41) if i % 4 == 0}, records)
    samples, logs = _dynamic(fake, records[:4])
    assert fake.rollouts == [[5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]
    assert (logs["dapo/rounds"], logs["dapo/groups_sampled"], logs["dapo/groups_kept"],
            logs["dapo/groups_dropped"]) == (3.0, 16.0, 4.0, 0.0)
    assert len(samples) == 8 and all(not s.group_flat for s in samples)
    assert logs["grpo/groups"] == 16.0 and logs["grpo/zero_variance_groups"] == 12.0
    assert logs["grpo/zero_variance_fraction"] == 0.75
    assert logs["answer_f1"] == pytest.approx(0.125)  # 4 of 32 rollouts scored 1
    assert logs["time/generate"] == 4.0  # the first rollout and three refills


def test_dapo_stops_at_its_round_limit_and_drops_surplus_groups() -> None:
    """With mappo_dapo_max_rounds 1 the step above keeps 2 groups of 4 (one refill). When a
    refill finds more groups than missing (5-8 all with a signal, 3 missing), the surplus is
    dropped whole, in order: groups of questions 4, 5, 6, 7 kept, 8 dropped."""
    records = [_Record(i) for i in range(1, 41)]
    fake = _refiller({i for i in range(1, 41) if i % 4 == 0}, records, max_rounds=1)
    _, logs = _dynamic(fake, records[:4])
    assert (logs["dapo/rounds"], logs["dapo/groups_kept"]) == (1.0, 2.0)
    fake = _refiller({4, 5, 6, 7, 8}, records)
    samples, logs = _dynamic(fake, records[:4])
    assert fake.rollouts == [[5, 6, 7, 8]]
    assert (logs["dapo/groups_kept"], logs["dapo/groups_dropped"]) == (4.0, 1.0)
    assert len(samples) == 8


def test_the_refill_questions_are_a_pure_function_of_seed_step_and_round() -> None:
    records = [_Record(i) for i in range(10)]
    fake = types.SimpleNamespace(records=records, args=types.SimpleNamespace(seed=7))
    pick = MappoTrainer.refill_records
    first = pick(fake, 3, 1, 4, records[:2])
    assert [r.index for r in first] == [r.index for r in pick(fake, 3, 1, 4, records[:2])]
    assert not {r.index for r in first} & {0, 1} and len({r.index for r in first}) == 4
    assert [r.index for r in pick(fake, 3, 2, 4, records[:2])] != [r.index for r in first]
    assert len(pick(fake, 0, 1, 12, records)) == 12  # more than the dataset: repeats


def test_dapo_keeps_its_papers_defaults() -> None:
    config = PPOConfig(algorithm="dapo")
    assert config.loss_settings() == LossSettings(0.2, 0.28, "token")
    assert config.scope == "batch" and config.spec.dynamic_sampling
    args, _ = split_mappo_args({"mappo_algorithm": "dapo"})
    assert args.group_filter == "skip" and args.mappo_dapo_max_rounds == defaults.DAPO_MAX_ROUNDS


def test_disable_dropout_touches_only_the_model_it_is_given() -> None:
    """disable_dropout changes only the model it is given (the learner calls it on the
    policy; a frozen reference copy keeps its own modules, already in eval mode)."""
    policy = _dropout_policy()
    reference = copy.deepcopy(policy)
    disable_dropout(policy)
    assert any(m.p > 0 for m in reference.modules() if isinstance(m, torch.nn.Dropout))
