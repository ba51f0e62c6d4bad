"""MAPPO model pieces and the learning test: the same PPOLearner the trainer uses must raise
the reward of a tiny policy on a task whose best answer is known."""

from __future__ import annotations

import copy

import pytest
import torch

from mmoa.train.mappo.args import MappoArguments, split_mappo_args
from mmoa.train.mappo.learner import (
    PolicyWithValue,
    PPOConfig,
    PPOLearner,
    response_hidden_and_logits,
)
from mmoa.train.mappo.ppo_math import logprobs_from_logits
from mmoa.train.mappo.samples import Sample, collate, gather_positions, length_groups
from mmoa.train.mappo.value_head import ValueHead
from tests.mappo_fixtures import EOS, sample_responses, tiny_policy


def test_value_head_round_trip(tmp_path) -> None:
    head = ValueHead(32)
    torch.nn.init.normal_(head.summary.weight)
    head.save(tmp_path)
    from safetensors.torch import load_file

    assert set(load_file(str(tmp_path / "value_head.safetensors"))) == {
        "v_head.summary.weight", "v_head.summary.bias"}  # LLaMA-Factory's key names
    other = ValueHead(32)
    other.load(tmp_path)
    hidden = torch.randn(2, 5, 32)
    assert torch.equal(head(hidden), other(hidden))


def test_collate_masks_exclude_prompt_and_padding() -> None:
    samples = [Sample("qr", [5, 6, 7], [8, 9, EOS], 1.0), Sample("generator", [5, 6], [3], 0.0)]
    batch = collate(samples, pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, EOS], [5, 6, 3, 0, 0, 0]]
    assert batch.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    # logits at position p predict token p + 1: the response starts after the prompt
    assert batch.positions[0].tolist() == [2, 3, 4]
    assert batch.positions[1, 0].item() == 1
    assert batch.response_ids.tolist() == [[8, 9, EOS], [3, 0, 0]]


def test_length_groups_bound_the_padding_and_cover_every_row() -> None:
    lengths = [300, 80, 90, 310, 200, 85, 420]
    groups = length_groups(lengths, max_ratio=1.3)
    assert groups == [([1, 5, 2], 90), ([4], 200), ([0, 3], 310), ([6], 420)]
    assert sorted(row for rows, _ in groups for row in rows) == list(range(len(lengths)))
    assert length_groups([5, 5, 5]) == [([0, 1, 2], 5)]
    with pytest.raises(ValueError, match="max_ratio"):
        length_groups([1], max_ratio=0.5)


@pytest.mark.parametrize("lora", [False, True])
def test_response_logits_equal_the_full_forward_sliced(lora: bool) -> None:
    """Log-probs and hidden states from the LM head applied at the response positions only
    (rows of very different lengths in separate passes) equal those of the whole forward."""
    policy = tiny_policy(seed=3).eval()
    if lora:
        from peft import LoraConfig, get_peft_model

        policy = get_peft_model(policy, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(param, std=0.1)
    samples = [Sample("qr", [2, 5, 6], [7, 8, EOS], 1.0),
               Sample("selector", [2, *range(3, 15), 4, 5, 6, 7, 8, 9, 10, 11], [9, EOS], 0.0),
               Sample("generator", [2, 5, 6, 7], [3], 0.0)]
    batch = collate(samples, pad_id=0)
    with torch.no_grad():
        hidden, logits = response_hidden_and_logits(policy, batch)
        full = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      output_hidden_states=True, use_cache=False)
    expected = logprobs_from_logits(gather_positions(full.logits, batch.positions).float(),
                                    batch.response_ids)
    mask = batch.response_mask.bool()
    got = logprobs_from_logits(logits, batch.response_ids)
    assert torch.allclose(got[mask], expected[mask], atol=1e-5)
    expected_hidden = gather_positions(full.hidden_states[-1], batch.positions)
    assert torch.allclose(hidden[mask], expected_hidden[mask], atol=1e-5)


def test_kl_is_zero_when_policy_equals_reference() -> None:
    policy = tiny_policy()
    model = PolicyWithValue(policy, ValueHead(32), ref_model=copy.deepcopy(policy))
    batch = collate([Sample("qr", [2, 5, 6], [7, 8, EOS], 1.0)], pad_id=0)
    logprobs, _, _ = model(batch)
    assert torch.allclose(logprobs, model.reference_logprobs(batch), atol=0, rtol=0)


def test_lora_reference_is_the_adapter_disabled_model() -> None:
    from peft import LoraConfig, get_peft_model

    policy = get_peft_model(tiny_policy(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model = PolicyWithValue(policy, ValueHead(32))
    batch = collate([Sample("qr", [2, 5, 6], [7, 8, EOS], 1.0)], pad_id=0)
    assert torch.equal(model(batch)[0], model.reference_logprobs(batch))  # B starts at 0
    for name, param in policy.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param)
    assert not torch.equal(model(batch)[0], model.reference_logprobs(batch))


def test_mappo_arguments_are_split_and_validated() -> None:
    args, rest = split_mappo_args({"stage": "mappo", "mappo_agents": "qr,generator",
                                   "mappo_top_k": 5, "learning_rate": 1e-5})
    assert args.optimized_agents == ("qr", "generator") and args.mappo_top_k == 5
    assert rest == {"stage": "mappo", "learning_rate": 1e-5}
    with pytest.raises(ValueError, match="unknown MAPPO keys: mappo_tpo_k"):
        split_mappo_args({"mappo_tpo_k": 3})
    with pytest.raises(ValueError, match="mappo_agents"):
        MappoArguments(mappo_agents="qr,critic")


@pytest.mark.parametrize(("key", "value", "message"), [
    ("mappo_top_k", "ten", "mappo_top_k must be an integer, got 'ten'"),
    ("mappo_top_k", 2.5, "mappo_top_k must be an integer"),
    ("mappo_adaptive_kl", "maybe", "mappo_adaptive_kl must be true or false"),
    ("mappo_qr_penalty", "high", "mappo_qr_penalty must be a number"),
    ("mappo_agents", True, "mappo_agents must be a string"),
    ("mappo_cliprange", -0.2, "mappo_cliprange must be a finite number > 0"),
    ("mappo_gamma", 1.5, r"mappo_gamma must be in \[0, 1\]"),
    ("mappo_lam", -0.1, r"mappo_lam must be in \[0, 1\]"),
    ("mappo_vf_coef", -1, "mappo_vf_coef must be a finite number >= 0"),
    ("mappo_retriever_timeout", 0, "mappo_retriever_timeout must be"),
    ("mappo_retriever_retries", -1, "mappo_retriever_retries must be >= 0"),
    ("mappo_questions_per_rollout", -2, "mappo_questions_per_rollout must be at least 1"),
    ("mappo_max_nonfinite_steps", 0, "mappo_max_nonfinite_steps must be at least 1"),
])
def test_mappo_arguments_of_a_wrong_type_or_range_name_the_key(key: str, value: object,
                                                                 message: str) -> None:
    """Found by bench/trainer_probe.py: a string for an integer was a TypeError traceback, a
    non-empty string for a boolean was silently true, a negative clip range or gamma 1.5
    trained."""
    with pytest.raises(ValueError, match=message):
        split_mappo_args({key: value})


def test_mappo_arguments_read_strings_as_llamafactory_does() -> None:
    args, _ = split_mappo_args({"mappo_top_k": "5", "mappo_cliprange": "1e-1",
                                "mappo_adaptive_kl": "false", "mappo_retriever_token": 1234,
                                "mappo_questions_per_rollout": None})
    assert args.mappo_top_k == 5 and args.mappo_cliprange == 0.1
    assert args.mappo_adaptive_kl is False and args.mappo_retriever_token == "1234"
    assert args.mappo_questions_per_rollout is None
    assert split_mappo_args({"mappo_questions_per_rollout": 0})[0] \
        .mappo_questions_per_rollout == 0, "0: automatic, as the web UI writes it"


def test_ppo_learner_raises_the_reward_on_a_known_task() -> None:
    """Two "agents" share one tiny policy; each is rewarded for answering its own prompt
    with its own target token (best possible mean reward: 1.0). After a few PPO steps through
    PPOLearner, the mean reward must rise clearly above the untrained policy's."""
    torch.manual_seed(0)
    policy = tiny_policy(seed=1)
    model = PolicyWithValue(policy, ValueHead(32), ref_model=copy.deepcopy(policy).eval())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    config = PPOConfig(ppo_epochs=4, mini_batch_size=16, gradient_accumulation_steps=1,
                       init_kl_coef=0.01, min_kl_coef=0.0, adaptive_kl=False)
    learner = PPOLearner(model, optimizer, config, pad_id=0,
                         generator=torch.Generator().manual_seed(0))
    tasks = {"qr": ([2, 10, 11], 7), "generator": ([2, 12, 13], 9)}
    sampler = torch.Generator().manual_seed(0)

    def rollout() -> tuple[list[Sample], float]:
        samples = []
        for agent, (prompt, target) in tasks.items():
            for response in sample_responses(model, prompt, 16, 2, sampler):
                samples.append(Sample(agent, prompt, response, float(response[0] == target)))
        return samples, sum(s.score for s in samples) / len(samples)

    _, before = rollout()
    history = []
    for _ in range(15):
        samples, mean_reward = rollout()
        history.append(mean_reward)
        learned = learner.prepare(samples)
        stats = learner.update(learned)
        learner.update_kl(learned)
        assert stats["skipped_updates"] == 0
    _, after = rollout()
    assert before < 0.25, before
    assert after > 0.6, (before, history, after)


def _learner(threshold: float) -> tuple[PPOLearner, PolicyWithValue]:
    policy = tiny_policy(seed=4)
    model = PolicyWithValue(policy, ValueHead(32), ref_model=copy.deepcopy(policy).eval())
    config = PPOConfig(ppo_epochs=2, mini_batch_size=2, ratio_threshold=threshold)
    return PPOLearner(model, torch.optim.SGD(model.parameters(), lr=0.5), config, pad_id=0,
                      generator=torch.Generator().manual_seed(0)), model


def _four_samples() -> list[Sample]:
    return [Sample("qr", [2, 3, 4], [5, 6, EOS], 1.0), Sample("qr", [2, 3], [7, EOS], 0.0),
            Sample("generator", [2, 8], [9, EOS], 1.0), Sample("selector", [2], [4, EOS], 0.0)]


def test_a_mean_ratio_above_the_threshold_skips_the_mini_batch() -> None:
    """At the first mini-batch the ratio is 1; a threshold below 1 must skip every update and
    leave the weights as they were, and the default (10) must skip none."""
    learner, model = _learner(threshold=0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = learner.update(learner.prepare(_four_samples()))
    assert stats["ratio_skips"] == stats["updates"] == 4.0
    assert stats["skipped_updates"] == 0.0  # not reported as a non-finite loss
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    learner, model = _learner(threshold=PPOConfig().ratio_threshold)
    stats = learner.update(learner.prepare(_four_samples()))
    assert stats["ratio_skips"] == 0.0 and PPOConfig().ratio_threshold == 10.0


def test_empty_responses_are_dropped_not_fatal() -> None:
    learner, _ = _learner(threshold=10.0)
    samples = [*_four_samples(), Sample("generator", [2, 5], [], 1.0)]
    rollout = learner.prepare(samples)
    assert len(rollout.samples) == 4 and learner.dropped_empty == 1
    assert rollout.old_logprobs.shape[0] == 4
    learner.update(rollout)
    with pytest.raises(ValueError, match="empty responses"):
        learner.prepare([Sample("qr", [2], [], 0.0)])


def test_fp16_and_a_resumed_sft_adapter_are_refused() -> None:
    """fp16 would clip scaled gradients; resuming the SFT LoRA adapter would make the KL
    reference (adapter disabled) the pre-SFT base model."""
    from types import SimpleNamespace

    from mmoa.train.mappo.workflow import check_training_setup

    def training(fp16: bool) -> SimpleNamespace:
        return SimpleNamespace(fp16=fp16, per_device_train_batch_size=4,
                               gradient_accumulation_steps=1)

    model_args = SimpleNamespace(adapter_name_or_path=None)
    lora = SimpleNamespace(finetuning_type="lora", create_new_adapter=False, ppo_epochs=1)
    with pytest.raises(ValueError, match="fp16"):
        check_training_setup(model_args, training(True), lora)
    sft_adapter = SimpleNamespace(adapter_name_or_path=["saves/x/lora/sft"])
    with pytest.raises(ValueError, match="create_new_adapter: true"):
        check_training_setup(sft_adapter, training(False), lora)
    check_training_setup(sft_adapter, training(False),
                         SimpleNamespace(finetuning_type="lora", create_new_adapter=True,
                                         ppo_epochs=1))
    check_training_setup(model_args, training(False), lora)


@pytest.mark.parametrize("key", ["per_device_train_batch_size", "gradient_accumulation_steps",
                                 "ppo_epochs"])
def test_a_batch_size_or_epoch_count_of_zero_is_refused(key: str) -> None:
    """LLaMA-Factory accepts 0 for these; the run then trained with no update (ppo_epochs) or
    an empty mini-batch and exited 0 (found by bench/trainer_probe.py)."""
    from types import SimpleNamespace

    from mmoa.train.mappo.workflow import check_training_setup

    values = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
              "ppo_epochs": 1, key: 0}
    training = SimpleNamespace(fp16=False, **{k: v for k, v in values.items()
                                             if k != "ppo_epochs"})
    finetuning = SimpleNamespace(finetuning_type="full", ppo_epochs=values["ppo_epochs"])
    with pytest.raises(ValueError, match=f"{key} must be at least 1, got 0"):
        check_training_setup(SimpleNamespace(adapter_name_or_path=None), training, finetuning)


def test_the_logged_entropy_builds_no_graph() -> None:
    """The entropy is only logged: it must not keep a [B, T, vocab] softmax for backward."""
    _, model = _learner(threshold=10.0)
    logprobs, _, entropy = model(collate(_four_samples(), 0), with_entropy=True)
    assert logprobs.requires_grad and entropy is not None and not entropy.requires_grad


def test_a_step_with_nothing_to_learn_says_why() -> None:
    from mmoa.train.mappo.learner import nothing_to_learn, rollout_diagnostics

    learner, _ = _learner(threshold=10.0)
    rollout = learner.prepare(_four_samples())
    assert rollout_diagnostics(rollout) == {"samples/qr": 2.0, "samples/generator": 1.0,
                                            "samples/selector": 1.0, "score_std": 0.5}
    assert nothing_to_learn(rollout, learner.update(rollout)) is None
    same = [Sample(s.agent, s.prompt_ids, s.response_ids, 1.0) for s in _four_samples()]
    rollout = learner.prepare(same)
    assert rollout_diagnostics(rollout)["score_std"] == 0.0
    assert "all 4 samples scored 1" in nothing_to_learn(rollout, learner.update(rollout))
    skipping, _ = _learner(threshold=0.5)
    rollout = skipping.prepare(_four_samples())
    assert nothing_to_learn(rollout, skipping.update(rollout)) == \
        "every mini-batch update was skipped"
