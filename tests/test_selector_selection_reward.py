"""The Selector's selection reward (``mappo_selector_selection_reward``): the F1 of a selection
against the gold passages among its candidates, the bonus, its validation, and the qr_s_g
pipeline's samples with and without it."""

from __future__ import annotations

import pytest

from mmoa.agents.candidates import Candidate
from mmoa.agents.parsers import parse_answer, parse_selection, parse_subquestions
from mmoa.agents.pipeline import AgentCall, Trace
from mmoa.data.records import QARecord
from mmoa.pipelines import get_pipeline
from mmoa.train.mappo.agent_stats import selection_gold_f1
from mmoa.train.mappo.args import MappoArguments
from mmoa.train.mappo.rewards import selection_bonus

QUESTION = "In which city was the director of The Lonely Bridge born?"
SUBQUESTION = "Who directed The Lonely Bridge?"


def _call(agent: str) -> AgentCall:
    return AgentCall(agent, None, [1, 2, 3], [7, 8], "")  # type: ignore[arg-type]


def _trace(candidate_ids: list[str], selected: list[int], answer: str = "**Kefield**") -> Trace:
    answer_parse = parse_answer(answer)
    output = ",".join(f"Document{i}" for i in selected)
    return Trace(
        question=QUESTION, subquestions=[SUBQUESTION],
        candidates=[Candidate({"id": i, "contents": f"T{i}\ntext"}, subquestion=0, rank=r)
                    for r, i in enumerate(candidate_ids)],
        selected=selected, answer=answer_parse.answer,
        calls={a: _call(a) for a in ("qr", "selector", "generator")},
        qr_parse=parse_subquestions(SUBQUESTION, QUESTION),
        selection_parse=parse_selection(output, len(candidate_ids)),
        answer_parse=answer_parse)


def _record(*gold: str) -> QARecord:
    return QARecord(id="a", question=QUESTION, answers=["Kefield"], supporting_ids=list(gold))


FIVE = ["p1", "p2", "p3", "p4", "p5"]


@pytest.mark.parametrize(("gold", "selected", "expected"), [
    # both gold passages among the candidates
    (("p1", "p3"), [0], 2 * 1.0 * 0.5 / 1.5),           # P 1, R 1/2 -> 2/3
    (("p1", "p3"), [0, 2], 1.0),                        # exactly the gold ones
    (("p1", "p3"), [0, 1, 2], 2 * (2 / 3) * 1.0 / (5 / 3)),  # P 2/3, R 1 -> 0.8
    (("p1", "p3"), [0, 1, 2, 3, 4], 2 * 0.4 * 1.0 / 1.4),  # every candidate: P 0.4 -> 4/7
    (("p1", "p3"), [1, 3], 0.0),                        # no gold kept
    (("p1", "p3"), [], 0.0),                            # nothing kept
    # one of the two gold passages retrieved: recall counts the reachable one only
    (("p1", "p9"), [0], 1.0),
    (("p1", "p9"), [0, 1], 2 * 0.5 * 1.0 / 1.5),         # P 1/2, R 1 -> 2/3
])
def test_selection_f1_is_against_the_gold_passages_among_the_candidates(
        gold: tuple[str, ...], selected: list[int], expected: float) -> None:
    assert selection_gold_f1(_record(*gold), _trace(FIVE, selected)) == pytest.approx(expected)


def test_selection_f1_is_none_where_no_choice_could_hold_a_gold_passage() -> None:
    assert selection_gold_f1(_record("p8", "p9"), _trace(FIVE, [0])) is None  # none retrieved
    no_gold = QARecord(id="b", question=QUESTION, answers=["Kefield"])
    assert selection_gold_f1(no_gold, _trace(FIVE, [0])) is None  # none named


def test_selection_bonus_is_the_weighted_f1() -> None:
    assert selection_bonus(2 / 3, 0.5) == pytest.approx(1 / 3)
    assert selection_bonus(0.0, 0.5) == 0.0  # a wrong choice: a bonus of 0, not none
    assert selection_bonus(None, 0.5) is None
    assert selection_bonus(1.0, 0.0) is None  # off
    with pytest.raises(ValueError, match="the selection reward's weight must be a finite"):
        selection_bonus(1.0, float("nan"))


def test_the_argument_is_checked() -> None:
    assert MappoArguments().mappo_selector_selection_reward == 0.0
    with pytest.raises(ValueError, match="mappo_selector_selection_reward must be a finite "
                                         r"number >= 0 \(a reward added to the Selector's"):
        MappoArguments(mappo_selector_selection_reward=-1.0)
    with pytest.raises(ValueError, match="mappo_selector_selection_reward is learned against"):
        MappoArguments(mappo_selector_selection_reward=0.5, mappo_algorithm="grpo")


def test_the_qr_s_g_samples_carry_the_bonus_on_the_selectors_sample() -> None:
    pipeline = get_pipeline("qr_s_g")
    records = [_record("p1", "p3"), _record("p8", "p9"),
               QARecord(id="c", question=QUESTION, answers=["Kefield"])]
    # a: gold p1, p3 retrieved, the top two (p1, p2) kept: P 1/2, R 1/2 -> F1 1/2; answer F1 1.0
    # b: no gold retrieved -> no bonus; answer "Paris" -> F1 0
    # c: no gold named -> no bonus; answer F1 1.0
    traces = [_trace(FIVE, [0, 1]), _trace(FIVE, [0], "**Paris**"), _trace(FIVE, [0])]

    args = MappoArguments(mappo_selector_selection_reward=0.6, mappo_qr_retrieval_reward=0.4)
    samples, logs = pipeline.samples(records, traces, args)
    scores = {(s.agent, i // 3): s.score for i, s in enumerate(samples)}
    assert scores[("selector", 0)] == pytest.approx(1.0 + 0.6 * 0.5)
    assert scores[("qr", 0)] == pytest.approx(1.0 + 0.4 * 1.0)  # both gold among candidates
    assert scores[("generator", 0)] == pytest.approx(1.0)
    assert scores[("selector", 1)] == pytest.approx(0.0)
    assert scores[("qr", 1)] == pytest.approx(0.0)  # retrieval recall 0: a bonus of 0
    assert scores[("selector", 2)] == pytest.approx(1.0)
    assert logs["selection_reward/selector"] == pytest.approx(0.3)  # record a only
    assert logs["retrieval_reward/qr"] == pytest.approx(0.2)  # (0.4 + 0) / 2
    assert logs["reward/selector"] == pytest.approx((1.3 + 0.0 + 1.0) / 3)

    plain, plain_logs = pipeline.samples(records, traces, MappoArguments())
    assert [s.score for s in plain if s.agent == "selector"] == pytest.approx([1.0, 0.0, 1.0])
    assert "selection_reward/selector" not in plain_logs

    # a Selector that is not optimised gets no sample, hence no bonus
    frozen, frozen_logs = pipeline.samples(records, traces, MappoArguments(
        mappo_agents="qr,generator", mappo_selector_selection_reward=0.6))
    assert {s.agent for s in frozen} == {"qr", "generator"}
    assert "selection_reward/selector" not in frozen_logs
