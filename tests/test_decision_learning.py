"""The decision agent's learning test: with a cost per search, GRPO on the real reward teaches a
tiny policy to answer what it knows and to search what it does not.

A two-layer policy of 16 tokens plays the decision step of two questions: token 3 is
``[Answer]``, token 4 is ``[Search]``, any other token is a malformed output. The "known"
question is answered right without documents (answer reward EM + F1 = 2 either way), the
"world" question only after a search. Rewards come from the real
:func:`mmoa.train.mappo.rewards.decision_reward` (cost 0.2 per search, penalty 1 for malformed),
advantages from the real :func:`group_samples`, updates from the real ``PPOLearner``. The best
policy answers the known question and searches the world one (mean reward 1.9).

As in the issue, RL starts from a warm start: here one that is well-formed but undecided (half
``[Answer]``, half ``[Search]`` on both questions; from a random policy GRPO finds the always
correct search first and, once every rollout of the known question searches, its group has no
variance left to learn from). After training the mean reward must be high, the retrieval rate on
the known question low and on the world question high.
"""

from __future__ import annotations

import copy

import torch

from mmoa.train.mappo.grpo import PipelineOutcome, group_samples
from mmoa.train.mappo.learner import PolicyWithValue, PPOConfig, PPOLearner
from mmoa.train.mappo.rewards import decision_answer_reward, decision_reward
from tests.mappo_fixtures import tiny_policy

ANSWER, SEARCH = 3, 4
QUESTIONS = {"known": ([2, 10, 11], "Paris"), "world": ([2, 12, 13], "Ada Brel")}


def _reward(group: str, action: int, gold: str, cost: float) -> tuple[float, bool]:
    """``(reward, searched)`` of one decision under the real reward function."""
    if action == SEARCH:  # the documents hold the answer: the answer after them is right
        answer, searches, malformed = gold, 1, False
    elif action == ANSWER:  # right only when the model knows it
        answer, searches, malformed = (gold if group == "known" else "no idea"), 0, False
    else:
        answer, searches, malformed = "", 0, True
    reward = decision_reward(decision_answer_reward(answer, [gold]), searches, malformed,
                             retrieval_cost=cost, malformed_penalty=1.0)
    return reward.total, searches > 0


def _undecided_warm_start(model: PolicyWithValue) -> None:
    """Supervised steps towards half [Answer], half [Search] on both questions."""
    target = torch.zeros(16)
    target[ANSWER] = target[SEARCH] = 0.5
    optimizer = torch.optim.Adam(model.policy.parameters(), lr=1e-2)
    prompts = torch.tensor([prompt for prompt, _ in QUESTIONS.values()])
    for _ in range(60):
        logprobs = torch.log_softmax(model.policy(input_ids=prompts).logits[:, -1], -1)
        loss = -(target * logprobs).sum(-1).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_grpo_learns_to_answer_what_it_knows_and_search_the_rest() -> None:
    torch.manual_seed(0)
    policy = tiny_policy(seed=2)
    model = PolicyWithValue(policy, None)
    _undecided_warm_start(model)
    model = PolicyWithValue(policy, None, ref_model=copy.deepcopy(policy).eval())
    learner = PPOLearner(model, torch.optim.Adam(model.parameters(), lr=3e-3),
                         PPOConfig(algorithm="grpo", ppo_epochs=4, mini_batch_size=16,
                                   kl_loss_coef=0.0),
                         pad_id=0, generator=torch.Generator().manual_seed(0))
    sampler = torch.Generator().manual_seed(0)
    group = 16

    def rollout() -> tuple[list, float, dict[str, float]]:
        samples, rewards, rates = [], [], {}
        for name, (prompt, gold) in QUESTIONS.items():
            with torch.no_grad():
                logits = model.policy(input_ids=torch.tensor([prompt])).logits[0, -1]
            actions = torch.multinomial(torch.softmax(logits, -1), group, replacement=True,
                                        generator=sampler).tolist()
            outcomes, searched = [], []
            for action in actions:
                reward, did_search = _reward(name, action, gold, cost=0.2)
                rewards.append(reward)
                searched.append(did_search)
                outcomes.append(PipelineOutcome({"decision": (prompt, [action], None)}, reward,
                                                {"decision": 0.0}))
            samples += group_samples(outcomes, group, ("decision",))[0]
            rates[name] = sum(searched) / group
        return samples, sum(rewards) / len(rewards), rates

    _, before, start = rollout()
    assert 0.3 < start["known"] < 0.7 and 0.3 < start["world"] < 0.7, start
    history = []
    for _ in range(20):
        samples, mean_reward, rates = rollout()
        history.append((round(mean_reward, 2), rates))
        learner.update(learner.prepare(samples))
    _, after, rates = rollout()
    # undecided: about (2.0 + 1.8) / 2 on the known question and (1.8 + 0) / 2 on the other
    assert 1.1 < before < 1.7, before
    assert after > 1.75 and after > before + 0.2, (before, history, after)
    assert rates["known"] < 0.25, ("answers what it knows", history, rates)
    assert rates["world"] > 0.75, ("searches what it does not know", history, rates)
