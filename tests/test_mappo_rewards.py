"""Tests of mmoa.train.mappo.rewards: each penalty, the shared reward, per-agent totals."""

from __future__ import annotations

import pytest

from mmoa.agents.parsers import (
    AnswerParse,
    SelectionParse,
    SubquestionParse,
    parse_answer,
    parse_selection,
    parse_subquestions,
)
from mmoa.metrics import f1_score
from mmoa.train.mappo.rewards import (
    AgentRewards,
    Penalty,
    PenaltyConfig,
    compute_agent_rewards,
    generator_penalty,
    qr_penalty,
    selector_penalty,
    shared_reward,
)

Q = "Which river flows through the capital of Veldoria?"
DEFAULT = PenaltyConfig()


def sub_parse(raw_count: int = 2, total_chars: int = 60, empty: bool = False) -> SubquestionParse:
    # The penalty reads raw_count / total_chars / empty; the parser's own flags are for logging.
    return SubquestionParse(
        subquestions=["q"], raw_count=raw_count, total_chars=total_chars,
        too_many=False, too_long=False, empty=empty,
    )


# ---------------------------------------------------------------------------------------------
# Query Rewriter
# ---------------------------------------------------------------------------------------------


def test_paper_defaults() -> None:
    assert (DEFAULT.qr_penalty, DEFAULT.qr_max_subquestions, DEFAULT.qr_max_chars) == (-0.5, 4, 300)
    assert DEFAULT.selector_penalty == -1.0
    assert (DEFAULT.generator_penalty, DEFAULT.generator_max_words) == (-0.5, 30)
    assert DEFAULT.generator_format_penalty == 0.0
    assert DEFAULT.qr_penalize_empty and not DEFAULT.selector_penalize_empty


@pytest.mark.parametrize(
    ("parse", "value", "reasons"),
    [
        (sub_parse(raw_count=4, total_chars=300), 0.0, ()),  # both limits reached, not exceeded
        (sub_parse(raw_count=5, total_chars=100), -0.5, ("too_many",)),
        (sub_parse(raw_count=2, total_chars=301), -0.5, ("too_long",)),
        # Both rules: still one -0.5 (the penalty is assigned, not added up).
        (sub_parse(raw_count=6, total_chars=400), -0.5, ("too_many", "too_long")),
        (sub_parse(raw_count=0, total_chars=0, empty=True), -0.5, ("empty",)),
    ],
)
def test_qr_penalty(parse: SubquestionParse, value: float, reasons: tuple[str, ...]) -> None:
    assert qr_penalty(parse, DEFAULT) == Penalty(value, reasons)


def test_qr_penalty_on_real_parses() -> None:
    # Five lines: the count rule fires on the raw output although 4 sub-questions are kept.
    five = parse_subquestions("\n".join(f"Who is person {i}?" for i in range(5)), Q)
    assert len(five.subquestions) == 4
    assert qr_penalty(five, DEFAULT) == Penalty(-0.5, ("too_many",))
    # 3 lines of 101 characters: 303 > 300.
    long = parse_subquestions("\n".join(["x" * 100 + "?"] * 3), Q)
    assert qr_penalty(long, DEFAULT).reasons == ("too_long",)
    ok = parse_subquestions("What is the capital of Veldoria?\nWhich river flows through it?", Q)
    assert qr_penalty(ok, DEFAULT) == Penalty(0.0, ())
    # Empty and list-markers-only outputs fall back to the question and are penalised.
    for text in ("", "  \n ", "1.\n2."):
        assert qr_penalty(parse_subquestions(text, Q), DEFAULT) == Penalty(-0.5, ("empty",))


def test_qr_penalty_configurable() -> None:
    cfg = PenaltyConfig(qr_penalty=-0.2, qr_max_subquestions=2, qr_max_chars=50,
                        qr_penalize_empty=False)
    assert qr_penalty(sub_parse(raw_count=3, total_chars=10), cfg) == Penalty(-0.2, ("too_many",))
    assert qr_penalty(sub_parse(raw_count=1, total_chars=51), cfg) == Penalty(-0.2, ("too_long",))
    assert qr_penalty(sub_parse(raw_count=0, total_chars=0, empty=True), cfg) == Penalty()
    # A zero penalty disables every QR rule (and reports none).
    assert qr_penalty(sub_parse(raw_count=9, total_chars=999), PenaltyConfig(qr_penalty=0.0)) \
        == Penalty()


# ---------------------------------------------------------------------------------------------
# Selector
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reasons"),
    [
        ("Document0,Document3", ()),
        ("", ()),  # empty selection: well-formed, not penalised (as the original)
        ("Document 3", ("malformed",)),
        ("Document12", ("out_of_range",)),
        ("Document0,Document0", ("duplicate",)),
        ("Document1,Document12,Document1", ("out_of_range", "duplicate")),
        ("3, 7", ("malformed",)),
    ],
)
def test_selector_penalty(text: str, reasons: tuple[str, ...]) -> None:
    pen = selector_penalty(parse_selection(text, 10), DEFAULT)
    assert pen == Penalty(-1.0 if reasons else 0.0, reasons)


def test_selector_penalty_crafted_and_configurable() -> None:
    all_bad = SelectionParse(ids=[1], malformed=True, out_of_range=True, duplicate=True)
    # Any number of violations costs one -1.0.
    assert selector_penalty(all_bad, DEFAULT) == Penalty(
        -1.0, ("malformed", "out_of_range", "duplicate"))
    cfg = PenaltyConfig(selector_penalty=-0.3, selector_penalize_empty=True)
    assert selector_penalty(parse_selection("  ", 10), cfg) == Penalty(-0.3, ("empty",))
    # With the empty rule on, a proper selection is still fine, and an all-out-of-range one is
    # reported as out_of_range, not empty.
    assert selector_penalty(parse_selection("Document2", 10), cfg) == Penalty()
    assert selector_penalty(parse_selection("Document12", 10), cfg).reasons == ("out_of_range",)


# ---------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------


def test_generator_penalty() -> None:
    assert generator_penalty(parse_answer("**Paris**"), DEFAULT) == Penalty()
    thirty = parse_answer("**" + " ".join(["w"] * 30) + "**")
    assert thirty.num_words == 30
    assert generator_penalty(thirty, DEFAULT) == Penalty()  # 30 is allowed, 31 is not
    thirty_one = parse_answer("**" + " ".join(["w"] * 31) + "**")
    assert generator_penalty(thirty_one, DEFAULT) == Penalty(-0.5, ("too_long",))
    # No ** : no penalty by default (the answer is still extracted and scored).
    assert generator_penalty(parse_answer("Paris"), DEFAULT) == Penalty()
    # A bold one-word answer followed by sixty words is a long output: penalised.
    dodge = parse_answer("**Paris** " + " ".join(["w"] * 60))
    assert generator_penalty(dodge, DEFAULT) == Penalty(-0.5, ("too_long",))


def test_generator_format_penalty_adds_up() -> None:
    cfg = PenaltyConfig(generator_penalty=-1.0, generator_max_words=3,
                        generator_format_penalty=-0.25)
    assert generator_penalty(AnswerParse("Paris", bold=False, num_words=1), cfg) == Penalty(
        -0.25, ("not_bold",))
    # Length and format: -1.0 + -0.25 = -1.25.
    assert generator_penalty(AnswerParse("a b c d", bold=False, num_words=4), cfg) == Penalty(
        -1.25, ("too_long", "not_bold"))
    assert generator_penalty(AnswerParse("a b c d", bold=True, num_words=4), cfg) == Penalty(
        -1.0, ("too_long",))


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"qr_penalty": 0.5}, "qr_penalty must be a finite number <= 0"),
        ({"selector_penalty": float("nan")}, "selector_penalty"),
        ({"generator_max_words": 0}, "generator_max_words must be an integer >= 1"),
        ({"qr_max_chars": 2.5}, "qr_max_chars"),
    ],
)
def test_penalty_config_validation(kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        PenaltyConfig(**kwargs)


def test_penalty_config_types() -> None:
    with pytest.raises(TypeError, match="qr_penalize_empty"):
        PenaltyConfig(qr_penalize_empty="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="generator_penalty"):
        PenaltyConfig(generator_penalty="-0.5")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Shared reward and totals
# ---------------------------------------------------------------------------------------------


def test_shared_reward_is_mmoa_metrics() -> None:
    # "the Eiffel Tower in Paris" -> "eiffel tower in paris" (4 tokens) vs "eiffel tower" (2):
    # 2 common; P = 2/4, R = 2/2, F1 = 2 * 0.5 * 1 / 1.5 = 2/3.
    assert shared_reward("the Eiffel Tower in Paris", ["Eiffel Tower"]) == pytest.approx(2 / 3)
    assert shared_reward("the Eiffel Tower in Paris", "Eiffel Tower", metric="em") == 0.0
    assert shared_reward("the Eiffel Tower in Paris", "Eiffel Tower", metric="acc") == 1.0
    # Maximum over aliases; the yes/no rule; the same number as mmoa.metrics.f1_score.
    assert shared_reward("Paris", ["Lyon", "paris."]) == 1.0
    assert shared_reward("yes", ["no"]) == 0.0
    pred, golds = "Rock–Paper Scissors", ["rock paper"]
    assert shared_reward(pred, golds) == f1_score(pred, golds)  # 2 * (2/3 * 1) / (5/3) = 0.8
    assert shared_reward(pred, golds) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="unknown reward metric"):
        shared_reward("a", "a", metric="rouge")


def test_compute_agent_rewards_totals() -> None:
    qr = parse_subquestions("\n".join(f"Who is person {i}?" for i in range(5)), Q)  # too many
    sel = parse_selection("Document0,Document0", 10)  # duplicate
    ans = parse_answer("**the Eiffel Tower in Paris**")
    rewards = compute_agent_rewards(qr, sel, ans, ans.answer, ["Eiffel Tower"])
    # shared F1 = 2/3 (see above); totals: QR 2/3 - 0.5, S 2/3 - 1.0, G 2/3 + 0.
    assert rewards.shared == pytest.approx(2 / 3)
    assert rewards.agents == ("qr", "selector", "generator")
    assert rewards.penalty("qr") == -0.5
    assert rewards.penalty("selector") == -1.0
    assert rewards.penalty("generator") == 0.0
    assert rewards.totals == pytest.approx(
        {"qr": 2 / 3 - 0.5, "selector": 2 / 3 - 1.0, "generator": 2 / 3})
    row = rewards.as_dict()
    assert row["reason/qr/too_many"] == 1.0 and row["reason/selector/duplicate"] == 1.0
    assert row["total/generator"] == pytest.approx(2 / 3)
    assert not any(key.startswith("reason/generator") for key in row)


def test_compute_agent_rewards_partial_pipeline_and_config() -> None:
    # s_g mode: no Query Rewriter; a custom metric and penalties.
    cfg = PenaltyConfig(generator_penalty=-1.0, generator_max_words=2)
    ans = parse_answer("Answer: the river Sylve")
    rewards = compute_agent_rewards(None, parse_selection("", 10), ans, ans.answer,
                                    "Sylve", config=cfg, metric="acc")
    # The answer is "the river Sylve" (the line after "Answer:"): its normal form "river sylve"
    # contains "sylve": Acc 1; 4 words written ("Answer:" included) > 2 -> -1.0.
    assert ans.answer == "the river Sylve" and ans.num_words == 4
    assert rewards.agents == ("selector", "generator")
    assert rewards.totals == {"selector": 1.0, "generator": 0.0}
    with pytest.raises(KeyError, match="only \\['selector', 'generator'\\] acted"):
        rewards.total("qr")


def test_agent_rewards_default_is_empty() -> None:
    assert AgentRewards(shared=0.5).agents == ()
