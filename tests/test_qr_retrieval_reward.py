"""The Query Rewriter's retrieval reward (``mappo_qr_retrieval_reward``): the bonus, its place in
an agent's score, its validation, and the qr_s_g pipeline's samples with and without it."""

from __future__ import annotations

import pytest

from mmoa.agents.candidates import Candidate
from mmoa.agents.parsers import parse_answer, parse_selection, parse_subquestions
from mmoa.agents.pipeline import AgentCall, Trace
from mmoa.data.records import QARecord
from mmoa.pipelines import get_pipeline
from mmoa.train.mappo.args import MappoArguments
from mmoa.train.mappo.rewards import compute_agent_rewards, retrieval_bonus

QUESTION = "In which city was the director of The Lonely Bridge born?"


def test_retrieval_bonus_is_the_weighted_candidate_recall() -> None:
    assert retrieval_bonus(2 / 3, 0.5) == pytest.approx(1 / 3)
    assert retrieval_bonus(0.0, 0.5) == 0.0  # no gold retrieved: a bonus of 0, not none
    assert retrieval_bonus(None, 0.5) is None  # no gold passage named: nothing to reward
    assert retrieval_bonus(1.0, 0.0) is None  # off
    with pytest.raises(ValueError, match="finite number >= 0"):
        retrieval_bonus(1.0, -0.1)


def test_a_bonus_adds_to_its_agent_only() -> None:
    qr = parse_subquestions("Who directed The Lonely Bridge?", QUESTION)
    sel = parse_selection("Document0", 5)
    ans = parse_answer("**Kefield**")
    rewards = compute_agent_rewards(qr, sel, ans, ans.answer, ["Kefield"], bonuses={"qr": 0.25})
    # shared F1 1.0, no penalty fires: QR 1.0 + 0.25, the others 1.0
    assert rewards.totals == pytest.approx({"qr": 1.25, "selector": 1.0, "generator": 1.0})
    assert rewards.bonus("selector") == 0.0
    row = rewards.as_dict()
    assert row["bonus/qr"] == 0.25 and row["total/qr"] == pytest.approx(1.25)
    assert "bonus/selector" not in row
    with pytest.raises(ValueError, match="did not act"):
        compute_agent_rewards(None, sel, ans, ans.answer, ["Kefield"], bonuses={"qr": 0.1})
    with pytest.raises(ValueError, match="finite number >= 0"):
        compute_agent_rewards(qr, sel, ans, ans.answer, ["Kefield"], bonuses={"qr": -0.1})


def test_the_argument_is_checked() -> None:
    assert MappoArguments().mappo_qr_retrieval_reward == 0.0
    with pytest.raises(ValueError, match="mappo_qr_retrieval_reward must be a finite"):
        MappoArguments(mappo_qr_retrieval_reward=-1.0)
    with pytest.raises(ValueError, match="has none"):
        MappoArguments(mappo_qr_retrieval_reward=0.5, mappo_algorithm="grpo")


def _call(agent: str, response: list[int]) -> AgentCall:
    return AgentCall(agent, None, [1, 2, 3], response, "")  # type: ignore[arg-type]


def _trace(candidate_ids: list[str], answer: str) -> Trace:
    answer_parse = parse_answer(answer)
    return Trace(
        question=QUESTION, subquestions=["Who directed The Lonely Bridge?"],
        candidates=[Candidate({"id": i, "contents": f"T{i}\ntext"}, subquestion=0, rank=r)
                    for r, i in enumerate(candidate_ids)],
        selected=[0], answer=answer_parse.answer,
        calls={a: _call(a, [7, 8]) for a in ("qr", "selector", "generator")},
        qr_parse=parse_subquestions("Who directed The Lonely Bridge?", QUESTION),
        selection_parse=parse_selection("Document0", len(candidate_ids)),
        answer_parse=answer_parse)


def test_the_qr_s_g_samples_carry_the_bonus_on_the_query_rewriters_sample() -> None:
    pipeline = get_pipeline("qr_s_g")
    records = [QARecord(id="a", question=QUESTION, answers=["Kefield"],
                        supporting_ids=["p1", "p9"]),
               QARecord(id="b", question=QUESTION, answers=["Kefield"])]  # no gold named
    # record a: gold p1 of {p1, p9} among the candidates -> recall 1/2; answer F1 1.0
    # record b: answer "Paris" -> F1 0; no gold, so no bonus
    traces = [_trace(["p1", "p2", "p3"], "**Kefield**"), _trace(["p4"], "**Paris**")]

    samples, logs = pipeline.samples(records, traces, MappoArguments(mappo_qr_retrieval_reward=0.4))
    scores = {(s.agent, i // 3): s.score for i, s in enumerate(samples)}
    assert scores[("qr", 0)] == pytest.approx(1.0 + 0.4 * 0.5)
    assert scores[("selector", 0)] == pytest.approx(1.0)
    assert scores[("generator", 0)] == pytest.approx(1.0)
    assert scores[("qr", 1)] == pytest.approx(0.0)
    assert logs["retrieval_reward/qr"] == pytest.approx(0.2)  # the mean over records with gold
    assert logs["reward/qr"] == pytest.approx((1.2 + 0.0) / 2)

    plain, plain_logs = pipeline.samples(records, traces, MappoArguments())
    assert [s.score for s in plain if s.agent == "qr"] == pytest.approx([1.0, 0.0])
    assert "retrieval_reward/qr" not in plain_logs
