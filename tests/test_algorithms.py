"""The algorithm registry (mmoa.train.mappo.algorithms): every group advantage, advantage
estimator and policy loss against values worked out by hand on tiny tensors, the properties the
trainer asks for, the keys that select and contradict them, PPO and GRPO updates unchanged to
the last digit against values recorded before the registry existed, and one learning test per
new algorithm on the toy task of tests/test_grpo.py (best mean reward 1.0)."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch

from mmoa.train.mappo.algorithms import (
    ADVANTAGE_ESTIMATORS,
    ALGORITHMS,
    GROUP_ADVANTAGES,
    POLICY_LOSSES,
    AdvantageInputs,
    Algorithm,
    LossSettings,
    algorithm_names,
    get_algorithm,
    register_algorithm,
)
from mmoa.train.mappo.args import split_mappo_args
from mmoa.train.mappo.grpo import PipelineOutcome, group_samples
from mmoa.train.mappo.learner import PolicyWithValue, PPOConfig, PPOLearner
from mmoa.train.mappo.ppo_math import WHITEN_EPS, masked_average
from mmoa.train.mappo.samples import Sample
from mmoa.train.mappo.value_head import ValueHead
from tests.mappo_fixtures import EOS, ToyTask, tiny_policy

NEW = ("dr_grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "dapo", "gspo")

# -- the registry --------------------------------------------------------------------------------


def test_every_algorithm_is_registered_with_its_properties() -> None:
    assert algorithm_names() == ("ppo", "grpo", *NEW)
    table = {name: (a.value_head, a.grouped, a.kl, a.advantage, a.policy_loss)
             for name, a in ALGORITHMS.items()}
    assert table == {
        "ppo": (True, False, "reward", "gae", "clipped"),
        "grpo": (False, True, "loss", "group", "clipped"),
        "dr_grpo": (False, True, "loss", "group", "clipped"),
        "rloo": (False, True, "loss", "group", "clipped"),
        "reinforce_plus_plus": (False, False, "reward", "reinforce_plus_plus", "clipped"),
        "reinforce_plus_plus_baseline": (False, True, "loss", "group_whitened", "clipped"),
        "dapo": (False, True, "loss", "group", "clipped"),
        "gspo": (False, True, "loss", "group", "gspo"),
    }
    assert set(GROUP_ADVANTAGES) == {"mean_std", "mean", "rloo"}
    assert set(ADVANTAGE_ESTIMATORS) == {"gae", "reinforce_plus_plus", "group", "group_whitened"}
    assert set(POLICY_LOSSES) == {"clipped", "gspo"}
    for algorithm in ALGORITHMS.values():  # the docs and the UI show them
        assert "arXiv:" in algorithm.paper and algorithm.summary
    for fn in (*GROUP_ADVANTAGES.values(), *ADVANTAGE_ESTIMATORS.values(),
               *POLICY_LOSSES.values()):
        assert "arXiv:" in (fn.__doc__ or ""), fn


def test_the_registry_refuses_unknown_names_and_duplicates() -> None:
    with pytest.raises(ValueError, match="mappo_algorithm must be one of ppo, grpo, dr_grpo"):
        get_algorithm("a2c")
    with pytest.raises(ValueError, match="already registered"):
        register_algorithm(Algorithm("ppo", "arXiv:0", advantage="gae"))
    with pytest.raises(ValueError, match="unknown policy loss"):
        register_algorithm(Algorithm("x", "arXiv:0", advantage="group", policy_loss="nope"))
    with pytest.raises(ValueError, match="no value head"):
        register_algorithm(Algorithm("x", "arXiv:0", advantage="gae", value_head=True,
                                     group_advantages=("mean",)))
    assert "x" not in ALGORITHMS


def test_the_web_ui_lists_the_registered_algorithms() -> None:
    from mmoa.webui.mappo_fields import MAPPO_FIELDS

    field = next(f for f in MAPPO_FIELDS if f.key == "mappo_algorithm")
    assert tuple(field.choices) == algorithm_names()


# -- group advantages by hand --------------------------------------------------------------------


def test_the_group_advantages_by_hand() -> None:
    """Rewards 1, 0, 0, 0: mean 0.25, sample std 0.5. RLOO: each baseline is the mean of the
    other three: 1 - 0 = 1, 0 - 1/3 = -1/3 (= 4/3 * (r - mean))."""
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    assert GROUP_ADVANTAGES["mean"](rewards).tolist() == [[0.75, -0.25, -0.25, -0.25]]
    assert GROUP_ADVANTAGES["mean_std"](rewards)[0].tolist() == pytest.approx(
        [0.75 / (0.5 + 1e-4)] + [-0.25 / (0.5 + 1e-4)] * 3, rel=1e-12)
    assert GROUP_ADVANTAGES["rloo"](rewards)[0].tolist() == pytest.approx(
        [1.0, -1 / 3, -1 / 3, -1 / 3], rel=1e-12)
    two = GROUP_ADVANTAGES["rloo"](torch.tensor([[0.2, 0.6], [0.5, 0.5]], dtype=torch.float64))
    assert two.flatten().tolist() == pytest.approx([-0.4, 0.4, 0.0, 0.0])
    assert GROUP_ADVANTAGES["rloo"](torch.tensor([[0.7]])).tolist() == [[0.0]]


def test_group_samples_use_the_named_group_advantage_and_add_the_penalty() -> None:
    outcomes = [PipelineOutcome({"qr": ([2], [4, EOS], None)}, shared, {"qr": penalty})
                for shared, penalty in ((1.0, 0.0), (0.0, -0.5), (0.0, 0.0))]
    samples, _ = group_samples(outcomes, 3, ("qr",), "rloo")
    assert [s.advantage for s in samples] == pytest.approx([1.0, -0.5 - 0.5, -0.5])
    with pytest.raises(ValueError, match="unknown group advantage 'std'"):
        group_samples(outcomes, 3, ("qr",), "std")


# -- advantage estimators by hand ----------------------------------------------------------------


def _inputs(samples: list[Sample], width: int, **extra: object) -> AdvantageInputs:
    mask = torch.tensor([[1] * len(s.response_ids) + [0] * (width - len(s.response_ids))
                         for s in samples])
    zeros = torch.zeros(mask.shape)
    base: dict = {"old_logprobs": zeros, "ref_logprobs": zeros, "values": None,
                  "kl_coef": 0.0}
    base.update(extra)
    return AdvantageInputs(samples, mask, **base)  # type: ignore[arg-type]


def test_gae_by_hand() -> None:
    """Score 1, no KL, V = (0.5, 0.25), gamma 1, lambda 0.5: rewards (0, 1);
    delta_1 = 1 - 0.25 = 0.75, delta_0 = 0.25 - 0.5 = -0.25; A = (-0.25 + 0.5 * 0.75, 0.75)
    = (0.125, 0.75); returns A + V = (0.625, 1.0)."""
    out = ADVANTAGE_ESTIMATORS["gae"](_inputs(
        [Sample("qr", [2], [5, EOS], 1.0)], 2, values=torch.tensor([[0.5, 0.25]]), lam=0.5,
        whiten_advantages=False))
    assert out.advantages.tolist() == [[0.125, 0.75]]
    assert out.returns is not None and out.returns.tolist() == [[0.625, 1.0]]
    assert out.rewards is not None and out.rewards.tolist() == [[0.0, 1.0]]


def test_reinforce_plus_plus_by_hand() -> None:
    """beta 0.5; sample A: logp - logp_ref = (0.1, 0.2), score 1: rewards (-0.05, 1 - 0.1),
    return to go (0.85, 0.9); sample B: one token, KL 0, score 0: return 0. Then whitened over
    the batch's three tokens (unbiased variance, as masked_whiten)."""
    samples = [Sample("qr", [2], [5, EOS], 1.0), Sample("qr", [2], [EOS], 0.0)]
    old = torch.tensor([[0.1, 0.2], [0.0, 0.0]])
    out = ADVANTAGE_ESTIMATORS["reinforce_plus_plus"](_inputs(
        samples, 2, old_logprobs=old, ref_logprobs=torch.zeros(2, 2), kl_coef=0.5))
    returns = [0.85, 0.9, 0.0]
    mean = sum(returns) / 3
    std = math.sqrt(sum((r - mean) ** 2 for r in returns) / 2 + WHITEN_EPS)
    expected = [(r - mean) / std for r in returns]
    got = out.advantages
    assert [got[0, 0].item(), got[0, 1].item(), got[1, 0].item()] == pytest.approx(expected,
                                                                                   rel=1e-5)
    assert got[1, 1].item() == 0.0 and out.returns is None
    assert out.rewards is not None and out.rewards[0].tolist() == pytest.approx([-0.05, 0.9])


def test_group_and_group_whitened_by_hand() -> None:
    """Advantages +1 (two tokens) and -1 (one token): ``group`` repeats them; ``group_whitened``
    whitens the tokens (1, 1, -1): mean 1/3, unbiased var ((2/3)^2 * 2 + (4/3)^2) / 2 = 4/3."""
    samples = [Sample("qr", [2], [5, EOS], 1.0, advantage=1.0),
               Sample("qr", [2], [EOS], 0.0, advantage=-1.0)]
    out = ADVANTAGE_ESTIMATORS["group"](_inputs(samples, 2))
    assert out.advantages.tolist() == [[1.0, 1.0], [-1.0, 0.0]]
    assert out.kl is not None and out.kl.abs().sum() == 0
    whitened = ADVANTAGE_ESTIMATORS["group_whitened"](_inputs(samples, 2, ref_logprobs=None))
    scale = math.sqrt(4 / 3 + WHITEN_EPS)
    assert whitened.advantages.flatten().tolist() == pytest.approx(
        [(2 / 3) / scale, (2 / 3) / scale, (-4 / 3) / scale, 0.0], rel=1e-6)
    assert whitened.kl is None


# -- policy losses by hand -----------------------------------------------------------------------


def _losses(name: str, log_ratio: list[list[float]], advantages: list[list[float]],
            mask: list[list[int]], settings: LossSettings
            ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    old = torch.zeros(len(log_ratio), len(log_ratio[0]))
    logprobs = torch.tensor(log_ratio, requires_grad=True)
    loss, stats = POLICY_LOSSES[name](logprobs, old, torch.tensor(advantages),
                                      torch.tensor(mask), settings)
    loss.backward()
    assert logprobs.grad is not None
    return loss, logprobs.grad, stats


def test_the_clipped_loss_with_clip_higher_by_hand() -> None:
    """Token 1: ratio 1.5, A = +1: clipped at 1 + eps_high (1.2 symmetric, 1.28 with DAPO's
    clip-higher). Token 2: ratio 0.5, A = -1: clipped at 1 - eps_low = 0.8. Token mean."""
    ratios = [[math.log(1.5), math.log(0.5)]]
    symmetric, grad, stats = _losses("clipped", ratios, [[1.0, -1.0]], [[1, 1]],
                                     LossSettings(0.2, 0.2))
    assert symmetric.item() == pytest.approx((-1.2 + 0.8) / 2)
    assert grad.tolist() == [[0.0, 0.0]] and stats["clipfrac"].item() == 1.0
    higher, _, _ = _losses("clipped", ratios, [[1.0, -1.0]], [[1, 1]], LossSettings(0.2, 0.28))
    assert higher.item() == pytest.approx((-1.28 + 0.8) / 2)
    # inside [0.8, 1.28] nothing is clipped: ratio 1.25 with A = 2 gives -2.5
    inside, grad, _ = _losses("clipped", [[math.log(1.25)]], [[2.0]], [[1]],
                              LossSettings(0.2, 0.28))
    assert inside.item() == pytest.approx(-2.5) and grad.item() == pytest.approx(-2.5)


def test_the_constant_averaging_of_dr_grpo_by_hand() -> None:
    """Rows of 3 and 1 tokens at ratio 1, A = 1 and -2: the sum -(3 - 2) = -1 divided by
    rows x tokens per row, 2 x 4 (norm_length) = 8, whatever the rows' own lengths."""
    ratios = [[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    advantages = [[1.0, 1.0, 1.0, 0.0], [-2.0, 0.0, 0.0, 0.0]]
    mask = [[1, 1, 1, 0], [1, 0, 0, 0]]
    loss, grad, _ = _losses("clipped", ratios, advantages, mask,
                            LossSettings(0.2, 0.2, "constant", norm_length=4))
    assert loss.item() == pytest.approx(-1 / 8)
    assert grad[0].tolist() == pytest.approx([-1 / 8] * 3 + [0.0])
    x = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 0.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_average(x, m, "constant").item() == pytest.approx(7 / 6)
    assert masked_average(x, m, "constant", norm_length=10).item() == pytest.approx(7 / 20)


def test_the_gspo_loss_by_hand() -> None:
    """Row 0: log-ratios (log 2, 0), so s = exp(log 2 / 2) = sqrt 2 > 1.28: A = 1 is clipped,
    -1.28 and no gradient. Row 1: log-ratio log 0.5, s = 0.5 < 0.8 with A = -1: clipped, 0.8.
    Sequence mean (-1.28 + 0.8) / 2. A row inside the range has GSPO's gradient
    -A s / |y| per token, over the rows."""
    loss, grad, stats = _losses("gspo", [[math.log(2), 0.0], [math.log(0.5), 0.0]],
                                [[1.0, 1.0], [-1.0, 0.0]], [[1, 1], [1, 0]],
                                LossSettings(0.2, 0.28, "sequence"))
    assert loss.item() == pytest.approx((-1.28 + 0.8) / 2)
    assert grad.abs().sum().item() == 0.0
    assert stats["ratio_mean"].item() == pytest.approx((2 * math.sqrt(2) + 0.5) / 3)
    # log-ratios (0.1, -0.1): s = 1, unclipped; A = 2 over 2 tokens, 2 rows
    loss, grad, _ = _losses("gspo", [[0.1, -0.1], [0.0, 0.0]], [[2.0, 2.0], [0.0, 0.0]],
                            [[1, 1], [1, 1]], LossSettings(0.2, 0.28, "sequence"))
    assert loss.item() == pytest.approx(-2.0 / 2)
    assert grad.flatten().tolist() == pytest.approx([-0.5, -0.5, 0.0, 0.0])


# -- keys ------------------------------------------------------------------------------------------


def test_the_keys_resolve_to_each_algorithms_settings() -> None:
    dapo, _ = split_mappo_args({"mappo_algorithm": "dapo"})
    assert dapo.group_filter == "skip" and dapo.rollouts_per_question == dapo.mappo_group_size
    config = PPOConfig(algorithm="dapo", loss_averaging="token")
    assert config.loss_settings() == LossSettings(0.2, 0.28, "token")
    assert PPOConfig(algorithm="dapo", cliprange_high=0.3).loss_settings().clip_high == 0.3
    assert PPOConfig(algorithm="gspo").loss_settings().averaging == "sequence"
    assert PPOConfig(algorithm="dr_grpo").loss_settings().averaging == "constant"
    assert PPOConfig(algorithm="grpo", loss_averaging="sequence").loss_settings() \
        == LossSettings(0.2, 0.2, "sequence")
    rpp, _ = split_mappo_args({"mappo_algorithm": "reinforce_plus_plus", "mappo_group_size": 8})
    assert rpp.rollouts_per_question == 1 and rpp.algorithm.needs_reference(0.0)
    grpo, _ = split_mappo_args({"mappo_algorithm": "grpo", "mappo_grpo_normalise": "mean"})
    assert grpo.group_advantage == "mean" and grpo.group_filter == "none"
    assert split_mappo_args({"mappo_algorithm": "rloo"})[0].group_advantage == "rloo"
    assert split_mappo_args({"mappo_algorithm": "dr_grpo", "mappo_grpo_normalise": "mean"}
                            )[0].group_advantage == "mean"


@pytest.mark.parametrize(("config", "message"), [
    ({"mappo_algorithm": "rloo", "mappo_grpo_normalise": "mean"},
     "mappo_grpo_normalise: mean does not apply to mappo_algorithm: rloo, whose group "
     "advantage is rloo; set mappo_grpo_normalise to mean_std "
     "\\(the default mean_std selects rloo\\)"),
    ({"mappo_algorithm": "dapo", "mappo_loss_averaging": "sequence"},
     "mappo_algorithm: dapo averages its loss by token; remove"),
    ({"mappo_algorithm": "reinforce_plus_plus", "mappo_kl_loss_coef": 0.1},
     "mappo_kl_loss_coef is the KL loss of mappo_algorithm: grpo, dr_grpo"),
    ({"mappo_algorithm": "rloo", "mappo_group_size": 1},
     "mappo_group_size must be at least 2 under mappo_algorithm: rloo"),
    ({"mappo_cliprange_high": -0.1}, "mappo_cliprange_high must be a finite number > 0"),
    ({"mappo_cliprange_high": "high"}, "mappo_cliprange_high must be a number"),
])
def test_keys_that_contradict_the_algorithm_are_refused(config: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_mappo_args(config)


# -- behaviour unchanged -------------------------------------------------------------------------

GOLDEN = json.loads((Path(__file__).with_name("algorithm_golden.json")).read_text())
GOLDEN_KEYS = ("loss", "policy_loss", "value_loss", "kl_loss", "clipfrac", "approx_kl",
               "grad_norm", "entropy")
# Float32 kernels round differently on different instruction sets (AVX2, AVX-512), so a CPU
# other than the recording one moves these values by up to 6e-5 relative (the KL, a difference
# of log-probabilities) and a whitened advantage sum near zero by 1.4e-6. Any change to the
# algorithm itself moves them by percents.
GOLDEN_REL, GOLDEN_ABS = 2e-4, 1e-5


def _assert_matches_golden(got: list[dict], want: list[dict]) -> None:
    for step, (row, golden) in enumerate(zip(got, want, strict=True)):
        assert row.keys() == golden.keys(), f"step {step}"
        for key, value in golden.items():
            if value is None:
                assert row[key] is None, f"step {step} {key}"
            else:
                assert row[key] == pytest.approx(value, rel=GOLDEN_REL, abs=GOLDEN_ABS), \
                    f"step {step} {key}"


def _golden_samples() -> list[Sample]:
    return [Sample("qr", [2, 3, 4], [5, 6, EOS], 1.0), Sample("qr", [2, 3], [7, EOS], 0.0),
            Sample("generator", [2, 8], [9, 10, 11, EOS], 0.5),
            Sample("selector", [2], [4, EOS], -1.0), Sample("generator", [2, 9], [12, EOS], 0.25),
            Sample("selector", [2, 5], [3, 3, EOS], 0.0)]


def _golden_run(kind: str, normalise: str = "mean_std", **settings: object) -> list[dict]:
    """3 steps of prepare / update / update_kl on a fixed toy batch, exactly as recorded in
    algorithm_golden.json before the registry (PPO with a value head; GRPO with two groups of
    three, one penalised sample)."""
    policy = tiny_policy(seed=5)
    head = ValueHead(32) if kind == "ppo" else None
    if head is not None:
        torch.manual_seed(11)
        torch.nn.init.normal_(head.summary.weight, std=0.1)
    model = PolicyWithValue(policy, head, ref_model=copy.deepcopy(policy).eval(),
                            temperature=0.9)
    config = PPOConfig(algorithm=kind, ppo_epochs=2, mini_batch_size=2,
                       gradient_accumulation_steps=2, **settings)  # type: ignore[arg-type]
    learner = PPOLearner(model, torch.optim.Adam(model.parameters(), lr=1e-2), config, pad_id=0,
                         generator=torch.Generator().manual_seed(3))
    out: list[dict] = []
    for _ in range(3):
        if kind == "ppo":
            batch = _golden_samples()
        else:
            batch = []
            for q, agent in enumerate(("qr", "generator")):
                group = _golden_samples()[3 * q: 3 * q + 3]
                outs = [PipelineOutcome({agent: (s.prompt_ids, s.response_ids, None)}, s.score,
                                        {agent: -0.5 if (q, i) == (1, 0) else 0.0})
                        for i, s in enumerate(group)]
                batch += group_samples(outs, 3, (agent,), normalise)[0]
        rollout = learner.prepare(batch)
        stats = learner.update(rollout)
        kl = learner.update_kl(rollout)
        row = {k: stats.get(k) for k in GOLDEN_KEYS if k in stats}
        row["kl"] = kl
        row["kl_coef"] = learner.kl_ctl.value
        row["adv_sum"] = float(rollout.advantages.double().sum())
        out.append(row)
    with torch.no_grad():
        out.append({"param_sum": float(sum(p.double().sum() for p in model.parameters()))})
    return out


@pytest.mark.parametrize(("name", "kind", "normalise", "settings"), [
    ("ppo", "ppo", "mean_std", {}),
    ("ppo_per_agent_seq", "ppo", "mean_std",
     {"whiten_per_agent": True, "loss_averaging": "sequence", "adaptive_kl": True,
      "init_kl_coef": 0.1}),
    ("grpo_mean_std", "grpo", "mean_std", {"kl_loss_coef": 0.1}),
    ("grpo_mean_seq", "grpo", "mean", {"kl_loss_coef": 0.0, "loss_averaging": "sequence"}),
])
def test_ppo_and_grpo_updates_are_unchanged_from_the_recording(
        name: str, kind: str, normalise: str, settings: dict) -> None:
    """Losses, KL, advantages and the weights after three updates equal, to float32 rounding,
    the values recorded on main before the algorithms moved behind the registry (commit
    707fa5c). On one CPU thread, so the thread count does not change the reductions' order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _assert_matches_golden(_golden_run(kind, normalise, **settings), GOLDEN[name])
    finally:
        torch.set_num_threads(threads)


# -- learning ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NEW)
def test_each_new_algorithm_raises_the_reward_on_a_known_task(name: str) -> None:
    """The toy task of tests/test_grpo.py: two "questions" of two agents on one tiny policy,
    each rewarded 1 for its own target token (best mean reward 1.0, untrained < 0.25). Grouped
    algorithms roll out G = 16 per question and take their registered group advantage (and
    dapo skips its zero-variance groups); reinforce_plus_plus gets plain scores and its KL
    reward. After 15 updates through PPOLearner the mean reward must be above 0.6."""
    algorithm = get_algorithm(name)
    config = PPOConfig(algorithm=name, ppo_epochs=4, mini_batch_size=16,
                       kl_loss_coef=0.01 if algorithm.kl == "loss" else 0.0,
                       adaptive_kl=False, init_kl_coef=0.01, min_kl_coef=0.0)
    task = ToyTask(config)
    learner = task.learner

    def as_samples(agent: str, prompt: list[int], responses: list[list[int]],
                   scores: list[float]) -> list[Sample]:
        if not algorithm.grouped:
            return [Sample(agent, prompt, r, s) for r, s in zip(responses, scores, strict=True)]
        outcomes = [PipelineOutcome({agent: (prompt, r, None)}, s, {agent: 0.0})
                    for r, s in zip(responses, scores, strict=True)]
        return group_samples(outcomes, task.group, (agent,), algorithm.group_advantage(),
                             algorithm.group_filter("none"))[0]

    def rollout() -> tuple[list[Sample], float]:
        return task.rollout(as_samples)

    _, before = rollout()
    history = []
    for _ in range(15):
        samples, mean_reward = rollout()
        history.append(mean_reward)
        if not samples:  # dapo: every group had equal rewards
            continue
        rollout_tensors = learner.prepare(samples)
        stats = learner.update(rollout_tensors)
        learner.update_kl(rollout_tensors)
        assert stats["skipped_updates"] == 0
        assert ("value_loss" in stats) is algorithm.value_head
    _, after = rollout()
    assert before < 0.25, before
    assert after > 0.6, (name, before, history, after)
