"""The decision agent's tags, parser, reward and keys (SmartRAG: retrieve or answer).

Well-formed and malformed turns (every malformed turn has its typed reason), the forced answer
at the quota, the reward ``answer - cost x searches - malformed penalty`` against hand-computed
values, and the ``mappo_decision_*`` keys' validation. The pipeline itself runs with the tiny
model and the real server in ``test_decision_agent_integration.py``.
"""

from __future__ import annotations

import pytest

from mmoa.agents.decision_tags import (
    DecisionStop,
    decision_prompt,
    format_decision,
    format_documents,
    parse_decision,
)
from mmoa.train.mappo.args import split_mappo_args
from mmoa.train.mappo.rewards import decision_answer_reward, decision_reward


def test_well_formed_decisions_parse() -> None:
    answer = parse_decision("[Answer]   Ada   Brel")
    assert (answer.action, answer.answer, answer.ok) == ("answer", "Ada Brel", True)
    search = parse_decision("[Search] birth year of Ada Brel")
    assert (search.action, search.queries) == ("search", ["birth year of Ada Brel"])
    # tolerant: leading space, tag case, spaces inside brackets, a colon, content on new lines
    loose = parse_decision("  [ SEARCH ]: Nox\n film ")
    assert (loose.action, loose.queries) == ("search", ["Nox film"])
    assert parse_decision("[answer] 1987").answer == "1987"


@pytest.mark.parametrize(("text", "reason"), [
    ("", DecisionStop.NO_ACTION),
    ("Paris", DecisionStop.NO_ACTION),
    ("I think [Answer] Paris", DecisionStop.NO_ACTION),
    ("<answer> Paris </answer>", DecisionStop.NO_ACTION),
    ("[Search]", DecisionStop.EMPTY_SEARCH),
    ("[Search]  \n ", DecisionStop.EMPTY_SEARCH),
    ("[Answer] ", DecisionStop.EMPTY_ANSWER),
    ("[Search] Nox [Answer] Ada Brel", DecisionStop.TWO_ACTIONS),
    ("[Answer] Paris\n[Search] capital", DecisionStop.TWO_ACTIONS),
    ("[Documents] (1) Nox: a film", DecisionStop.WROTE_DOCUMENTS),
    ("[Search] Nox\n[Documents] (1) Nox: a film", DecisionStop.WROTE_DOCUMENTS),
])
def test_malformed_turns_end_with_a_reason(text: str, reason: DecisionStop) -> None:
    parsed = parse_decision(text)
    assert parsed.action is None and parsed.error == reason and not parsed.ok
    assert not reason.well_formed


def test_a_turn_cut_by_the_token_limit_is_truncated_whatever_it_holds() -> None:
    assert parse_decision("[Answer] Par", finished=False).error == DecisionStop.TRUNCATED
    assert parse_decision("[Search] q", finished=False).error == DecisionStop.TRUNCATED
    assert parse_decision(" Par", forced_answer=True, finished=False).error \
        == DecisionStop.TRUNCATED


def test_the_forced_turn_at_the_quota_reads_only_an_answer() -> None:
    # the pipeline wrote "[Answer]"; the model writes the answer itself
    forced = parse_decision(" Rome", forced_answer=True)
    assert (forced.action, forced.answer) == ("answer", "Rome")
    assert parse_decision(" [Search] capital of Italy", forced_answer=True).error \
        == DecisionStop.SEARCH_AT_LIMIT
    assert parse_decision(" [Answer] Rome", forced_answer=True).error == DecisionStop.TWO_ACTIONS
    assert parse_decision("  ", forced_answer=True).error == DecisionStop.EMPTY_ANSWER
    assert DecisionStop.FORCED_ANSWER.well_formed and DecisionStop.ANSWERED.well_formed


def test_one_definition_round_trips() -> None:
    assert parse_decision(format_decision(query=" who  directed Nox ")).queries \
        == ["who directed Nox"]
    assert parse_decision(format_decision(answer="Ada Brel")).answer == "Ada Brel"
    with pytest.raises(ValueError, match="either a search"):
        format_decision(query="q", answer="a")
    block = format_documents(["Nox"], [["Nox\nNox is a 1987 film.", "Ada Brel"]])
    assert block == "[Documents]\n(1) Nox: Nox is a 1987 film.\n(2) Ada Brel"
    last = format_documents(["Nox"], [["Nox\nx"]], force_answer=True)
    assert last.endswith("No more searches are allowed. Give the answer now.")
    with pytest.raises(ValueError, match="exactly one query"):
        format_documents(["a", "b"], [[], []])
    prompt = decision_prompt("  Who directed Nox? ")
    assert prompt.input == "Question: Who directed Nox?"
    assert "[Answer]" in prompt.user and "[Search]" in prompt.user


# -- reward ------------------------------------------------------------------------------------


def test_answer_reward_is_em_f1_em_or_f1() -> None:
    # gold "Ada Brel", prediction "Brel": EM 0, F1 = 2 * (1 * 0.5) / 1.5 = 2/3
    assert decision_answer_reward("Brel", ["Ada Brel"], "f1") == pytest.approx(2 / 3)
    assert decision_answer_reward("Brel", ["Ada Brel"], "em") == 0.0
    assert decision_answer_reward("Brel", ["Ada Brel"], "em_f1") == pytest.approx(2 / 3)
    assert decision_answer_reward("ada brel", ["Ada Brel"]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="mappo_decision_answer_reward"):
        decision_answer_reward("x", ["y"], "acc")


@pytest.mark.parametrize(("answer", "searches", "malformed", "cost", "penalty", "total"), [
    (2.0, 0, False, 0.2, 1.0, 2.0),        # known, answered directly: no cost
    (2.0, 1, False, 0.2, 1.0, 1.8),        # searched once
    (2 / 3, 2, False, 0.2, 1.0, 2 / 3 - 0.4),
    (0.0, 0, True, 0.2, 1.0, -1.0),        # malformed, no search
    (0.0, 2, True, 0.1, 0.5, -0.7),        # malformed after two searches
    (1.0, 3, False, 0.0, 1.0, 1.0),        # cost 0: searching is free
])
def test_decision_reward_by_hand(answer: float, searches: int, malformed: bool, cost: float,
                                 penalty: float, total: float) -> None:
    reward = decision_reward(answer, searches, malformed, retrieval_cost=cost,
                             malformed_penalty=penalty)
    assert reward.total == pytest.approx(total)
    assert reward.answer == answer
    assert reward.retrieval_cost == pytest.approx(cost * searches)
    assert reward.malformed_penalty == (penalty if malformed else 0.0)


def test_decision_reward_defaults_are_smartrags_and_bad_costs_fail() -> None:
    assert decision_reward(1.5, 1, True).total == pytest.approx(1.5 - 0.2 - 1.0)
    with pytest.raises(ValueError, match="retrieval_cost"):
        decision_reward(1.0, 1, False, retrieval_cost=-0.2)
    with pytest.raises(ValueError, match="malformed_penalty"):
        decision_reward(1.0, 1, False, malformed_penalty=float("nan"))
    with pytest.raises(ValueError, match="searches"):
        decision_reward(1.0, -1, False)


# -- keys --------------------------------------------------------------------------------------


def test_decision_keys_defaults_alias_and_errors() -> None:
    args, rest = split_mappo_args({"mappo_pipeline": "smart_rag", "stage": "mappo"})
    assert args.is_decision_agent and args.is_multiturn and not args.is_search_agent
    assert rest == {"stage": "mappo"}
    assert (args.mappo_decision_retrieval_cost, args.mappo_decision_malformed_penalty,
            args.mappo_decision_answer_reward, args.mappo_decision_max_searches) \
        == (0.2, 1.0, "em_f1", 2)
    args, _ = split_mappo_args({"mmoa_pipeline": "decision_agent",
                                "mappo_decision_max_searches": "0",
                                "mappo_decision_retrieval_cost": "0.1"})
    assert (args.mappo_decision_max_searches, args.mappo_decision_retrieval_cost) == (0, 0.1)
    for key, value, message in (
            ("mappo_decision_retrieval_cost", -0.2, "mappo_decision_retrieval_cost"),
            ("mappo_decision_malformed_penalty", -1, "mappo_decision_malformed_penalty"),
            ("mappo_decision_max_searches", -1, "mappo_decision_max_searches"),
            ("mappo_decision_answer_reward", "acc", "mappo_decision_answer_reward"),
            ("mappo_decision_top_k", 0, "mappo_decision_top_k")):
        with pytest.raises(ValueError, match=message):
            split_mappo_args({"mappo_pipeline": "decision_agent", key: value})


# -- the example configs -----------------------------------------------------------------------


def test_the_decision_examples_parse_and_train_the_same_trajectories_per_step() -> None:
    from pathlib import Path

    import yaml

    demo = Path(__file__).resolve().parents[1] / "LLaMA-Factory" / "examples" / "demo"
    grpo, rest = split_mappo_args(yaml.safe_load(
        (demo / "smollm2_decision_agent_grpo.yaml").read_text()))
    ppo, _ = split_mappo_args(yaml.safe_load(
        (demo / "smollm2_decision_agent_ppo.yaml").read_text()))
    tiny, _ = split_mappo_args(yaml.safe_load(
        (demo / "tiny_decision_agent_grpo.yaml").read_text()))
    assert rest["stage"] == "mappo" and rest["dataset"] == "demo_decision_mappo"
    for args in (grpo, ppo, tiny):
        assert args.is_decision_agent
        assert (args.mappo_decision_retrieval_cost, args.mappo_decision_malformed_penalty,
                args.mappo_decision_answer_reward) == (0.2, 1.0, "em_f1")
    assert (grpo.mappo_algorithm, ppo.mappo_algorithm) == ("grpo", "ppo")
    assert grpo.mappo_questions_per_rollout * grpo.rollouts_per_question \
        == ppo.mappo_questions_per_rollout * ppo.rollouts_per_question
    sft = yaml.safe_load((demo / "smollm2_decision_agent_sft.yaml").read_text())
    assert (sft["stage"], sft["dataset"], sft["mask_history"]) \
        == ("sft", "demo_decision_sft", True)
    assert grpo.mappo_decision_max_searches == 2


# -- real data: PopQA's popular / unpopular groups ---------------------------------------------


def test_popqa_records_carry_their_popularity_group(tmp_path) -> None:
    import json

    from mmoa.data.loaders import POPQA_POPULAR_MIN_VIEWS, load_qa
    from mmoa.fileio import DataFormatError

    rows = [
        {"id": 4222362, "subj": "George Rankin", "prop": "occupation", "s_pop": 142,
         "question": "What is George Rankin's occupation?",
         "possible_answers": '["politician", "political leader"]'},
        {"id": 1, "subj": "Paris", "prop": "country", "s_pop": POPQA_POPULAR_MIN_VIEWS,
         "question": "In what country is Paris?", "possible_answers": ["France"]},
    ]
    path = tmp_path / "popqa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    rare, famous = load_qa(path)
    assert (rare.id, rare.answers, rare.type, rare.group) \
        == ("4222362", ["politician", "political leader"], "occupation", "unpopular")
    assert (famous.answers, famous.group) == (["France"], "popular")
    assert famous.to_dict()["group"] == "popular"
    path.write_text(json.dumps({**rows[0], "possible_answers": "politician"}) + "\n")
    with pytest.raises(DataFormatError, match="possible_answers"):
        load_qa(path)
    path.write_text(json.dumps({**rows[0], "s_pop": "many"}) + "\n")
    with pytest.raises(DataFormatError, match="s_pop"):
        load_qa(path)
