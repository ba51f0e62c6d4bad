"""The search agent's tags and the retrieved-token loss mask.

Tag parsing on well-formed and malformed turns (every malformed turn ends the trajectory with a
typed reason); packing a holed mask for rewards and GAE; and, with the tiny model and the real
learner, that a retrieved ``<information>`` token changes no gradient: the mask is 0 there, the
policy-loss gradient with respect to those positions is 0, and perturbing the advantages and old
log-probs at those positions leaves every parameter's gradient exactly as it was (while without
the mask the same perturbation does change it, so the check can fail).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from mmoa.agents.search_tags import (
    StopReason,
    format_information,
    format_turn,
    parse_turn,
    search_prompt,
    split_queries,
)
from mmoa.data.records import QARecord
from mmoa.data.search_agent_sft import plan_searches
from mmoa.train.mappo.args import split_mappo_args
from mmoa.train.mappo.ppo_math import compute_gae, pack_masked, policy_loss, unpack_masked

# -- tags ---------------------------------------------------------------------------------------


def test_well_formed_turns_parse() -> None:
    search = parse_turn("<think> two hops </think>\n<search> who directed X ; when was Y born "
                        "</search>")
    assert (search.action, search.queries, search.has_think) == (
        "search", ["who directed X", "when was Y born"], True)
    answer = parse_turn("<think>done</think><answer>  Ada   Brel </answer>")
    assert (answer.action, answer.answer, answer.ok) == ("answer", "Ada Brel", True)
    # tolerant reading: case, spaces inside tags, new lines between queries, repeats, a tail
    loose = parse_turn("<THINK>x</ THINK> < search >a\nb;A; </search > trailing text")
    assert (loose.action, loose.queries) == ("search", ["a", "b"])
    assert parse_turn("<search>q</search>").has_think is False


@pytest.mark.parametrize(("text", "reason"), [
    ("", StopReason.NO_ACTION),
    ("The answer is Paris.", StopReason.NO_ACTION),
    ("<think> I wonder", StopReason.NO_ACTION),
    ("<think>x</think><search> who is", StopReason.TRUNCATED),
    ("<think>x</think><answer> Par", StopReason.TRUNCATED),
    ("<think>x</think><search> ; \n </search>", StopReason.EMPTY_SEARCH),
    ("<search>a;b;c;d</search>", StopReason.TOO_MANY_QUERIES),
    ("<think>x</think><answer>   </answer>", StopReason.EMPTY_ANSWER),
    ("<think>x</think><information>made up</information><answer>a</answer>",
     StopReason.WROTE_INFORMATION),
    ("<search>q <information> doc </search>", StopReason.WROTE_INFORMATION),
    ("</search> <answer>", StopReason.TRUNCATED),
])
def test_malformed_turns_end_with_a_reason(text: str, reason: StopReason) -> None:
    parsed = parse_turn(text, max_queries=3)
    assert parsed.action is None and parsed.error == reason and not parsed.ok
    assert not reason.well_formed


def test_the_first_action_wins_and_the_forced_turn_reads_only_an_answer() -> None:
    first = parse_turn("<answer>yes</answer><search>q</search>")
    assert (first.action, first.answer) == ("answer", "yes")
    assert parse_turn("Rome </answer>", forced_answer=True).answer == "Rome"
    assert parse_turn("<search>q</search>", forced_answer=True).error \
        == StopReason.NO_ANSWER_AT_LIMIT
    assert parse_turn(" </answer>", forced_answer=True).error == StopReason.EMPTY_ANSWER
    with pytest.raises(ValueError, match="max_queries"):
        parse_turn("x", max_queries=0)


def test_one_definition_round_trips() -> None:
    turn = format_turn("need two facts", queries=["q one", "q two"])
    assert parse_turn(turn).queries == ["q one", "q two"]
    assert parse_turn(format_turn("ok", answer="1987")).answer == "1987"
    block = format_information(["q one"], [["Title A\nText a.", "Title B\nText b."]])
    assert block.startswith("<information>\nQuery: q one\n(1) Title A: Text a.\n(2) Title B")
    assert block.endswith("</information>")
    assert format_information(["q"], [[]], force_answer=True).endswith("Give the answer now.")
    assert "up to 2 short search queries" in search_prompt("Q?", max_queries=2).user
    assert split_queries(" a ;; b\nA ") == ["a", "b"]


def test_pipeline_key_alias_and_ranges() -> None:
    args, rest = split_mappo_args({"mmoa_pipeline": "search_agent", "template": "llama3",
                                   "mappo_search_max_queries": "2"})
    assert args.is_search_agent and args.mappo_search_max_queries == 2
    assert rest == {"template": "llama3"}
    assert split_mappo_args({})[0].mappo_pipeline == "qr_s_g"
    for bad, match in (({"mappo_pipeline": "react"}, "mappo_pipeline must be one of"),
                       ({"mappo_search_max_turns": 0}, "mappo_search_max_turns"),
                       ({"mappo_search_format_penalty": 0.5}, "<= 0"),
                       ({"mmoa_pipeline": "search_agent", "mappo_pipeline": "qr_s_g"},
                        "another name")):
        with pytest.raises(ValueError, match=match):
            split_mappo_args(bad)


# -- the SFT data's search plan ------------------------------------------------------------------


def test_search_plan_asks_dependent_hops_in_turns_and_independent_ones_at_once() -> None:
    bridge = QARecord(id="b", question="Where was the director of Nox born?", answers=["Tal"],
                      decomposition=["Who directed Nox?", "Where was the director of Nox born?"],
                      resolved_decomposition=["Who directed Nox?", "Where was Ada Brel born?"],
                      type="bridge")
    assert plan_searches(bridge) == [["Who directed Nox?"], ["Where was Ada Brel born?"]]
    unresolved = dataclasses.replace(bridge, resolved_decomposition=None)
    assert plan_searches(unresolved) == [["Who directed Nox?"],
                                         ["Where was the director of Nox born?"]]
    comparison = QARecord(id="c", question="Who was born first, A or B?", answers=["A"],
                          decomposition=["When was A born?", "When was B born?"],
                          type="comparison")
    assert plan_searches(comparison) == [["When was A born?", "When was B born?"]]
    assert plan_searches(comparison, query_mode="single") == [["When was A born?"],
                                                              ["When was B born?"]]
    assert plan_searches(comparison, max_queries=1) == [["When was A born?"],
                                                        ["When was B born?"]]
    titles = QARecord(id="t", question="?", answers=["x"], supporting_titles=["T1", "T2", "T1"])
    assert plan_searches(titles) == [["T1", "T2"]]
    assert plan_searches(QARecord(id="n", question="?", answers=["x"])) is None


# -- packing a holed mask -----------------------------------------------------------------------


def test_pack_and_unpack_a_holed_mask() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [6.0, 7.0, 8.0, 9.0, 10.0]])
    mask = torch.tensor([[1, 0, 0, 1, 1], [1, 1, 1, 0, 0]])
    packed, packed_mask = pack_masked(x, mask)
    assert packed[0, :3].tolist() == [1.0, 4.0, 5.0] and packed[1, :3].tolist() == [6, 7, 8]
    assert packed_mask.tolist() == [[True, True, True, False, False]] * 2
    back = unpack_masked(packed * 10, mask)
    assert back.tolist() == [[10.0, 0, 0, 40.0, 50.0], [60.0, 70.0, 80.0, 0, 0]]
    # GAE over the model's tokens of a holed row equals GAE over those tokens alone
    rewards = torch.tensor([[0.1, 9.0, 9.0, 0.2, 1.0]])
    values = torch.tensor([[0.5, 7.0, 7.0, 0.3, 0.4]])
    holed = torch.tensor([[1, 0, 0, 1, 1]])
    adv, ret = compute_gae(pack_masked(rewards, holed)[0], pack_masked(values, holed)[0],
                           pack_masked(holed, holed)[1], 1.0, 0.95)
    alone, alone_ret = compute_gae(torch.tensor([[0.1, 0.2, 1.0]]),
                                   torch.tensor([[0.5, 0.3, 0.4]]), torch.ones(1, 3), 1.0, 0.95)
    got = unpack_masked(adv, holed)
    assert torch.allclose(got[0, [0, 3, 4]], alone[0]) and got[0, 1:3].abs().sum() == 0
    assert torch.allclose(unpack_masked(ret, holed)[0, [0, 3, 4]], alone_ret[0])


# -- the loss mask with the real learner ----------------------------------------------------------


def _multi_turn_samples(tiny_model_dir: Path) -> tuple[list, object, object]:
    """Two search-agent samples built from the real renderer: prompt, a search turn, the
    observation turn (mask 0), an answer turn."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mmoa.agents.render import PromptRenderer
    from mmoa.train.mappo.samples import Sample

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    renderer = PromptRenderer(tokenizer, "llama3")
    samples = []
    for i, (question, answer) in enumerate([("Who directed Nox?", "Ada Brel"),
                                            ("When was Ada Brel born?", "1950")]):
        prompt = renderer.prompt_ids(search_prompt(question))
        turn1 = tokenizer.encode(format_turn("look", queries=[question]),
                                 add_special_tokens=False)
        info = renderer.observation_ids(format_information(
            [question], [[f"Nox\nNox is a film by {answer}.", "Other\nUnrelated text."]]))
        tail = renderer.assistant_suffix_ids()
        turn2 = tokenizer.encode(format_turn("found", answer=answer), add_special_tokens=False)
        response = turn1 + tail + info + turn2
        mask = [1] * len(turn1) + [0] * (len(tail) + len(info)) + [1] * len(turn2)
        samples.append(Sample("search", prompt, response, float(i), None,
                              advantage=1.0 - 2 * i, loss_mask=mask))
    policy = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return samples, policy, tokenizer


def _grads(learner, rollout) -> list[torch.Tensor]:
    learner.model.zero_grad(set_to_none=True)
    loss, _ = learner._loss(rollout, list(range(len(rollout.samples))), 1)
    loss.backward()
    return [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
            for p in learner.model.parameters()]


def _perturb_masked_positions(rollout) -> None:
    holes = rollout.batch.response_mask == 0
    generator = torch.Generator().manual_seed(0)
    noise = torch.randn(rollout.old_logprobs.shape, generator=generator)
    rollout.old_logprobs[holes] += 3.0 * noise[holes]
    rollout.advantages[holes] = 50.0 * noise[holes]


def test_a_retrieved_token_changes_no_gradient(tiny_model_dir: Path) -> None:
    from mmoa.train.mappo.learner import PolicyWithValue, PPOConfig, PPOLearner

    samples, policy, tokenizer = _multi_turn_samples(tiny_model_dir)
    model = PolicyWithValue(policy, None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    learner = PPOLearner(model, optimizer, PPOConfig(algorithm="grpo", ppo_epochs=1),
                         tokenizer.pad_token_id)
    rollout = learner.prepare(samples)
    mask = rollout.batch.response_mask
    want = [s.loss_mask for s in samples]
    assert [mask[i, : len(m)].int().tolist() for i, m in enumerate(want)] == want
    assert (mask == 0).any() and (rollout.advantages[mask == 0] == 0).all()

    # the policy loss has no gradient at a masked position, whatever is there
    logprobs = rollout.old_logprobs.clone().requires_grad_(True)
    loss, _ = policy_loss(logprobs, rollout.old_logprobs + 0.1, rollout.advantages + 1.0, mask,
                          0.2)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert (grad[mask == 0] == 0).all() and (grad[mask == 1] != 0).any()

    before = _grads(learner, rollout)
    assert any(g.abs().sum() > 0 for g in before), "the model's own tokens do carry a gradient"
    _perturb_masked_positions(rollout)
    after = _grads(learner, rollout)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))

    # the same perturbation without the mask moves the gradient: the check above can fail
    for sample in samples:
        sample.loss_mask = None
    unmasked = learner.prepare(samples)
    before = _grads(learner, unmasked)
    _perturb_masked_positions_like(unmasked, mask)
    after = _grads(learner, unmasked)
    assert not all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def _perturb_masked_positions_like(rollout, mask: torch.Tensor) -> None:
    holes = torch.zeros_like(rollout.batch.response_mask, dtype=torch.bool)
    holes[:, : mask.shape[1]] = mask == 0
    holes &= rollout.batch.response_mask == 1
    rollout.advantages[holes] = 50.0


def test_ppo_puts_no_reward_value_or_kl_on_retrieved_tokens(tiny_model_dir: Path) -> None:
    from mmoa.train.mappo.learner import PolicyWithValue, PPOConfig, PPOLearner
    from mmoa.train.mappo.value_head import ValueHead

    samples, policy, tokenizer = _multi_turn_samples(tiny_model_dir)
    for sample in samples:
        sample.advantage = None
    reference = copy.deepcopy(policy).requires_grad_(False)
    torch.manual_seed(0)
    model = PolicyWithValue(policy, ValueHead(policy.config.hidden_size), reference)
    torch.nn.init.normal_(model.v_head.summary.weight, std=0.5)
    learner = PPOLearner(model, torch.optim.SGD(model.parameters(), lr=0.0),
                         PPOConfig(ppo_epochs=1), tokenizer.pad_token_id)
    rollout = learner.prepare(samples)
    mask = rollout.batch.response_mask.bool()
    for name in ("rewards", "kl", "advantages", "returns"):
        tensor = getattr(rollout, name)
        assert (tensor[~mask] == 0).all(), name
    assert (rollout.advantages[mask] != 0).any()
    # the score sits on each row's last model-written token
    for row, sample in enumerate(samples):
        last = max(i for i, m in enumerate(sample.loss_mask) if m)
        kl_part = -learner.kl_ctl.value * rollout.kl[row, last]
        assert float(rollout.rewards[row, last] - kl_part) == pytest.approx(sample.score,
                                                                            abs=1e-5)
    before = _grads(learner, rollout)
    _perturb_masked_positions(rollout)
    rollout.returns[~mask] = 99.0
    after = _grads(learner, rollout)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))
