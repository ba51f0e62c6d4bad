"""GRPO maths and learner against values worked out by hand: the group advantage (G = 1, equal
rewards, one outlier, penalties, mean vs mean/std), token vs sequence averaging, the k3 KL loss,
no value head under grpo, and the learning test (training raises the reward on a task whose
best answer is known)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import yaml

from mmoa.train.mappo.args import split_mappo_args
from mmoa.train.mappo.grpo import PipelineOutcome, group_samples
from mmoa.train.mappo.learner import PolicyWithValue, PPOConfig, PPOLearner
from mmoa.train.mappo.ppo_math import (
    GROUP_STD_EPS,
    group_relative_advantages,
    grpo_advantages,
    kl_loss,
    masked_average,
    policy_loss,
    zero_variance_groups,
)
from mmoa.train.mappo.samples import Sample
from tests.mappo_fixtures import EOS, ToyTask, tiny_policy

# -- the group advantage -------------------------------------------------------------------------


@pytest.mark.parametrize("normalise", ["mean_std", "mean"])
def test_a_group_of_one_and_a_group_of_equal_rewards_have_no_advantage(normalise: str) -> None:
    assert group_relative_advantages([[0.7], [0.0]], normalise).tolist() == [[0.0], [0.0]]
    equal = group_relative_advantages([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], normalise)
    assert equal.tolist() == [[0.0] * 3, [0.0] * 3]
    assert zero_variance_groups([[1.0, 1.0, 1.0], [0.0, 0.5, 0.0]]).tolist() == [True, False]
    assert zero_variance_groups([[0.3], [0.0]]).tolist() == [True, True]


def test_one_outlier_by_hand() -> None:
    """Rewards 1, 0, 0, 0: mean 0.25; sample std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5."""
    rewards = [[1.0, 0.0, 0.0, 0.0]]
    mean_only = group_relative_advantages(rewards, "mean")
    assert mean_only.tolist() == [[0.75, -0.25, -0.25, -0.25]]
    scaled = group_relative_advantages(rewards, "mean_std")
    expected = [0.75 / (0.5 + GROUP_STD_EPS)] + [-0.25 / (0.5 + GROUP_STD_EPS)] * 3
    assert scaled[0].tolist() == pytest.approx(expected, rel=1e-12)
    # two rollouts 0.2 and 0.6: +-0.2 around 0.4, sample std sqrt(0.08) = 0.2828...
    two = group_relative_advantages([[0.2, 0.6]], "mean_std")[0].tolist()
    assert two == pytest.approx([-0.2 / (math.sqrt(0.08) + GROUP_STD_EPS),
                                 0.2 / (math.sqrt(0.08) + GROUP_STD_EPS)], rel=1e-12)
    # groups are normalised independently: a second question does not move the first
    both = group_relative_advantages([[1.0, 0.0, 0.0, 0.0], [0.9, 0.1, 0.5, 0.5]], "mean")
    assert both[0].tolist() == [0.75, -0.25, -0.25, -0.25]


def test_each_agent_gets_the_normalised_shared_reward_plus_its_own_penalty() -> None:
    """Two pipelines (shared F1 1 and 0), agents (qr, selector, generator); the first
    pipeline's Selector and the second's QR are penalised. Mean-only: base +0.5 / -0.5."""
    shared = [[1.0, 0.0]]
    penalties = [[[0.0, -1.0, 0.0], [-0.5, 0.0, 0.0]]]
    got = grpo_advantages(shared, penalties, "mean")
    assert got.tolist() == [[[0.5, -0.5, 0.5], [-1.0, -0.5, -0.5]]]
    # under mean_std the penalty is still added as is, after the normalisation
    std = math.sqrt(0.5)
    scaled = grpo_advantages(shared, penalties, "mean_std")[0]
    assert scaled[0].tolist() == pytest.approx([0.5 / (std + GROUP_STD_EPS),
                                                0.5 / (std + GROUP_STD_EPS) - 1.0,
                                                0.5 / (std + GROUP_STD_EPS)])
    # a zero-variance group: only the penalties are left
    flat = grpo_advantages([[0.0, 0.0]], [[[0.0, -1.0], [0.0, 0.0]]], "mean_std")
    assert flat.tolist() == [[[0.0, -1.0], [0.0, 0.0]]]
    with pytest.raises(ValueError, match="penalties must be"):
        grpo_advantages(shared, [[0.0, 0.0]], "mean")
    with pytest.raises(ValueError, match="unknown group normalisation"):
        group_relative_advantages(shared, "std")


def _outcome(shared: float, penalties: dict[str, float]) -> PipelineOutcome:
    calls = {agent: ([2, 3], [4, EOS], None) for agent in penalties}
    return PipelineOutcome(calls=calls, shared=shared, penalties=penalties)


def test_group_samples_count_and_skip_the_zero_variance_groups() -> None:
    """Question 1: both pipelines scored 1 (no signal), but its second pipeline's Selector was
    penalised; question 2: 1 vs 0. ``skip`` leaves out only the advantage-0 samples of q1."""
    agents = ("selector", "generator")
    outcomes = [_outcome(1.0, {"selector": 0.0, "generator": 0.0}),
                _outcome(1.0, {"selector": -1.0, "generator": 0.0}),
                _outcome(1.0, {"selector": 0.0, "generator": 0.0}),
                _outcome(0.0, {"selector": 0.0, "generator": -0.5})]
    samples, logs = group_samples(outcomes, 2, agents, "mean", "none")
    assert [(s.agent, s.score, s.advantage) for s in samples] == [
        ("selector", 1.0, 0.0), ("generator", 1.0, 0.0),
        ("selector", 0.0, -1.0), ("generator", 1.0, 0.0),
        ("selector", 1.0, 0.5), ("generator", 1.0, 0.5),
        ("selector", 0.0, -0.5), ("generator", -0.5, -1.0)]
    assert logs["grpo/groups"] == 2.0 and logs["grpo/zero_variance_groups"] == 1.0
    assert logs["grpo/zero_variance_fraction"] == 0.5 and logs["grpo/skipped_samples"] == 0.0
    assert logs["grpo/reward_std"] == pytest.approx((0.0 + 0.5) / 2)
    kept, logs = group_samples(outcomes, 2, agents, "mean", "skip")
    assert [(s.agent, s.advantage) for s in kept] == [
        ("selector", -1.0), ("selector", 0.5), ("generator", 0.5), ("selector", -0.5),
        ("generator", -1.0)]
    assert logs["grpo/skipped_samples"] == 3.0
    with pytest.raises(ValueError, match="groups of 3"):
        group_samples(outcomes, 3, agents)


# -- loss averaging and the k3 KL term -----------------------------------------------------------


def test_token_and_sequence_averaging_by_hand() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("inf"), float("nan")]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert masked_average(x, mask, "token").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert masked_average(x, mask, "sequence").item() == pytest.approx((2 + 4) / 2)
    with pytest.raises(ValueError, match="unknown loss averaging"):
        masked_average(x, mask, "sample")


def test_the_policy_loss_under_each_averaging_by_hand() -> None:
    """At ratio 1 the loss is -mean(A): row 0 has 3 tokens with A = 1, row 1 one with A = -2:
    token -(3 - 2) / 4 = -0.25; sequence -(1 + (-2)) / 2 = +0.5."""
    logprobs = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.25, 0.1, 0.1]]))
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    token, _ = policy_loss(logprobs, logprobs.clone(), advantages, mask, 0.2, "token")
    sequence, _ = policy_loss(logprobs, logprobs.clone(), advantages, mask, 0.2, "sequence")
    assert token.item() == pytest.approx(-0.25)
    assert sequence.item() == pytest.approx(0.5)


def test_the_k3_kl_loss_by_hand() -> None:
    """p = 0.5, p_ref = 0.25: log r = log(p_ref / p) = -log 2; k3 = r - 1 - log r =
    0.5 - 1 + log 2 = 0.1931...; d k3 / d logp = 1 - r = 0.5. Padding holding -inf is ignored
    and leaks no nan into the gradient."""
    logprobs = torch.tensor([[math.log(0.5), -math.inf], [math.log(0.5), math.log(0.5)]],
                            requires_grad=True)
    ref = torch.tensor([[math.log(0.25), 0.0], [math.log(0.5), math.log(0.25)]])
    mask = torch.tensor([[1, 0], [1, 1]])
    k3 = 0.5 - 1 + math.log(2)
    loss = kl_loss(logprobs, ref, mask, "token")
    assert loss.item() == pytest.approx((k3 + 0.0 + k3) / 3)
    loss.backward()
    assert logprobs.grad is not None
    assert logprobs.grad.flatten().tolist() == pytest.approx([0.5 / 3, 0.0, 0.0, 0.5 / 3])
    sequence = kl_loss(logprobs.detach(), ref, mask, "sequence")
    assert sequence.item() == pytest.approx((k3 + k3 / 2) / 2)
    assert kl_loss(ref, ref, mask).item() == 0.0


# -- arguments -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("config", "message"), [
    ({"mappo_algorithm": "a2c"}, "mappo_algorithm must be one of ppo, grpo"),
    ({"mappo_algorithm": "grpo", "mappo_group_size": 0}, "mappo_group_size must be at least 1"),
    ({"mappo_grpo_normalise": "std"}, "mappo_grpo_normalise must be one of mean_std, mean"),
    ({"mappo_grpo_filter": "resample"}, "mappo_grpo_filter must be one of none, skip"),
    ({"mappo_loss_averaging": "sample"}, "mappo_loss_averaging must be one of token, sequence"),
    ({"mappo_algorithm": "grpo", "mappo_kl_loss_coef": -0.1},
     "mappo_kl_loss_coef must be a finite number >= 0"),
    ({"mappo_kl_loss_coef": 0.04}, "mappo_kl_loss_coef is the KL loss of mappo_algorithm"),
    ({"mappo_group_size": "four"}, "mappo_group_size must be an integer"),
])
def test_grpo_keys_are_typed_and_range_checked(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_mappo_args(config)


def test_grpo_keys_are_read_as_the_others() -> None:
    args, rest = split_mappo_args({"mappo_algorithm": "grpo", "mappo_group_size": "8",
                                   "mappo_kl_loss_coef": "0.04", "ppo_epochs": 1})
    assert args.algorithm.grouped and args.rollouts_per_question == 8 \
        and args.mappo_kl_loss_coef == 0.04
    assert rest == {"ppo_epochs": 1}
    ppo, _ = split_mappo_args({"mappo_group_size": 8})
    assert not ppo.algorithm.grouped and ppo.rollouts_per_question == 1


# -- the learner without a value head ------------------------------------------------------------


def _grpo_learner(kl_loss_coef: float = 0.0, ref: bool = True, **config: object
                  ) -> tuple[PPOLearner, PolicyWithValue]:
    policy = tiny_policy(seed=4)
    reference = copy.deepcopy(policy).eval() if ref else None
    model = PolicyWithValue(policy, None, ref_model=reference)
    settings = PPOConfig(algorithm="grpo", kl_loss_coef=kl_loss_coef, ppo_epochs=1,
                         mini_batch_size=4, **config)  # type: ignore[arg-type]
    learner = PPOLearner(model, torch.optim.SGD(model.parameters(), lr=0.1), settings,
                         pad_id=0, generator=torch.Generator().manual_seed(0))
    return learner, model


def _samples() -> list[Sample]:
    return [Sample("qr", [2, 3, 4], [5, 6, EOS], 1.0, advantage=0.75),
            Sample("qr", [2, 3], [7, EOS], 0.0, advantage=-0.25),
            Sample("generator", [2, 8], [9, EOS], 0.5, advantage=-1.5),
            Sample("selector", [2], [4, EOS], 0.0, advantage=0.0)]


def test_no_value_head_exists_under_grpo() -> None:
    """The GRPO learner runs with no critic: no v_head parameters, no values, no returns, and
    without the KL loss not even a reference (a full-FT policy without ref_model would raise
    if the reference were asked for)."""
    learner, model = _grpo_learner(ref=False)
    assert model.v_head is None
    assert not [name for name, _ in model.named_parameters() if "v_head" in name]
    rollout = learner.prepare(_samples())
    assert rollout.values is None and rollout.returns is None and rollout.rewards is None
    assert rollout.ref_logprobs is None and learner.update_kl(rollout) is None
    # the sample's advantage on each of its response tokens, 0 at padding, not whitened
    assert rollout.advantages.tolist() == [[0.75, 0.75, 0.75], [-0.25, -0.25, 0.0],
                                           [-1.5, -1.5, 0.0], [0.0, 0.0, 0.0]]
    before = [p.clone() for p in model.parameters()]
    stats = learner.update(rollout)
    assert "value_loss" not in stats and "kl_loss" not in stats
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with pytest.raises(ValueError, match="group advantage"):
        learner.prepare([Sample("qr", [2], [4, EOS], 1.0)])


def test_the_kl_loss_term_enters_the_grpo_loss() -> None:
    """With a KL coefficient the loss is the policy loss plus coef * k3; at the first update
    the policy equals the reference, so k3 is 0 and the loss is the policy loss alone."""
    learner, _ = _grpo_learner(kl_loss_coef=0.5)
    rollout = learner.prepare(_samples())
    assert rollout.ref_logprobs is not None and learner.update_kl(rollout) == 0.0
    stats = learner.update(rollout)
    assert stats["kl_loss"] == pytest.approx(0.0, abs=1e-7)
    assert stats["loss"] == pytest.approx(stats["policy_loss"], abs=1e-7)
    # after the update the policy moved: the next rollout's k3 term is > 0
    stats = learner.update(learner.prepare(_samples()))
    assert stats["kl_loss"] > 0 and stats["loss"] == pytest.approx(
        stats["policy_loss"] + 0.5 * stats["kl_loss"], rel=1e-5)


# -- learning ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("normalise", "averaging"), [("mean_std", "token"),
                                                      ("mean", "sequence")])
def test_grpo_raises_the_reward_on_a_known_task(normalise: str, averaging: str) -> None:
    """Two "questions" (prompts) of two agents on one tiny policy, each rewarded 1 for its own
    target token (best mean reward 1.0); G = 16 rollouts per question, group advantages and the
    clipped loss through PPOLearner with no value head. The mean reward must rise clearly above
    the untrained policy's."""
    config = PPOConfig(algorithm="grpo", ppo_epochs=4, mini_batch_size=16,
                       loss_averaging=averaging, kl_loss_coef=0.01)
    task = ToyTask(config)
    learner = task.learner

    def grouped(agent: str, prompt: list[int], responses: list[list[int]],
                scores: list[float]) -> list[Sample]:
        outcomes = [PipelineOutcome({agent: (prompt, r, None)}, s, {agent: 0.0})
                    for r, s in zip(responses, scores, strict=True)]
        return group_samples(outcomes, task.group, (agent,), normalise)[0]

    def rollout() -> tuple[list[Sample], float]:
        return task.rollout(grouped)

    _, before = rollout()
    history = []
    for _ in range(15):
        samples, mean_reward = rollout()
        history.append(mean_reward)
        stats = learner.update(learner.prepare(samples))
        assert stats["skipped_updates"] == 0
    _, after = rollout()
    assert before < 0.25, before
    assert after > 0.6, (before, history, after)


# -- the example configs -------------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[1] / "LLaMA-Factory" / "examples"
GRPO_ONLY = {"mappo_algorithm", "mappo_group_size", "mappo_grpo_normalise", "mappo_grpo_filter",
             "mappo_loss_averaging", "mappo_kl_loss_coef", "mappo_questions_per_rollout",
             "output_dir", "ppo_target"}


@pytest.mark.parametrize(("grpo", "ppo"), [("demo/smollm2_full_grpo.yaml",
                                            "demo/smollm2_full_mappo.yaml"),
                                           ("demo/tiny_full_grpo.yaml",
                                            "demo/tiny_full_mappo.yaml"),
                                           ("real/llama3_lora_grpo.yaml",
                                            "real/llama3_lora_mappo.yaml")])
def test_the_grpo_examples_parse_and_match_their_ppo_configs(grpo: str, ppo: str) -> None:
    """Each grpo example is its mappo sibling with the grpo keys, and rolls out as many
    pipelines per step (questions x group size) as the PPO config has questions."""
    grpo_config = yaml.safe_load((EXAMPLES / grpo).read_text())
    ppo_config = yaml.safe_load((EXAMPLES / ppo).read_text())
    args, _ = split_mappo_args(grpo_config)
    ppo_args, _ = split_mappo_args(ppo_config)
    assert args.mappo_algorithm == "grpo" and ppo_args.mappo_algorithm == "ppo"
    assert args.mappo_questions_per_rollout * args.mappo_group_size \
        == ppo_args.mappo_questions_per_rollout
    ppo_only = {"mappo_init_kl_coef", "mappo_min_kl_coef", "mappo_cliprange_value",
                "mappo_vf_coef", "mappo_gamma", "mappo_lam", "mappo_whiten_per_agent",
                "mappo_qr_retrieval_reward"}
    for key in (set(grpo_config) | set(ppo_config)) - GRPO_ONLY - ppo_only:
        assert grpo_config.get(key) == ppo_config.get(key), key
