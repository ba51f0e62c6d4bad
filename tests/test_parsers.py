"""Adversarial tests of the Query Rewriter, Selector and Generator output parsers."""

from __future__ import annotations

import pytest

from mmoa.agents.parsers import parse_answer, parse_selection, parse_subquestions

Q = "Which river flows through the capital of Veldoria?"

# ---------------------------------------------------------------------------------------------
# Query Rewriter
# ---------------------------------------------------------------------------------------------


def test_qr_canonical() -> None:
    out = parse_subquestions("What is the capital of Veldoria?\nWhich river flows through it?", Q)
    assert out.subquestions == ["What is the capital of Veldoria?", "Which river flows through it?"]
    assert out.raw_count == 2
    assert out.total_chars == 32 + 29
    assert out.well_formed
    assert not (out.too_many or out.too_long or out.empty)


def test_qr_strips_blank_lines_and_whitespace() -> None:
    out = parse_subquestions("\n\n   Who founded X?  \r\n\n\t\nWhen was X founded?\n", Q)
    assert out.subquestions == ["Who founded X?", "When was X founded?"]
    assert out.raw_count == 2
    assert out.well_formed


@pytest.mark.parametrize(
    "line",
    [
        "1. Who founded X?",
        "1) Who founded X?",
        "(1) Who founded X?",
        "2: Who founded X?",
        "- Who founded X?",
        "* Who founded X?",
        "• Who founded X?",
        "Sub-question 1: Who founded X?",
        "Subquestion 3. Who founded X?",
        "sub question 2) Who founded X?",
        "Q1: Who founded X?",
        "**1. Who founded X?**",
        "**Sub-question 1:** Who founded X?",
    ],
)
def test_qr_list_markers_are_dropped(line: str) -> None:
    assert parse_subquestions(line, Q).subquestions == ["Who founded X?"]


@pytest.mark.parametrize(
    "line",
    ["1990s bands from Seattle?", "1.5 million people live where?", "A.C. Milan founder?"],
)
def test_qr_numbers_that_are_not_markers_stay(line: str) -> None:
    assert parse_subquestions(line, Q).subquestions == [line]


def test_qr_truncates_and_flags_too_many() -> None:
    lines = [f"Question number {i}?" for i in range(6)]
    out = parse_subquestions("\n".join(lines), Q)
    assert out.subquestions == lines[:4]
    assert out.raw_count == 6
    assert out.too_many and not out.too_long and not out.well_formed


def test_qr_limits_are_parameters() -> None:
    lines = [f"Question number {i}?" for i in range(6)]  # 18 characters each
    out = parse_subquestions("\n".join(lines), Q, max_subquestions=6, max_lines=6, max_chars=108)
    assert out.subquestions == lines and out.total_chars == 108 and out.well_formed
    out = parse_subquestions("\n".join(lines), Q, max_subquestions=2, max_lines=6, max_chars=107)
    assert out.subquestions == lines[:2] and out.too_long and not out.too_many
    with pytest.raises(ValueError, match="max_subquestions must be >= 1"):
        parse_subquestions("x", Q, max_subquestions=0)


def test_qr_too_long_counts_every_line_before_truncation() -> None:
    # two lines of 160 characters: 320 > 300 although each line alone is short enough
    long_line = "W" * 159 + "?"
    out = parse_subquestions(f"{long_line}\n{long_line}x", Q)
    assert out.total_chars == 321
    assert out.too_long and not out.too_many and not out.well_formed
    # a single very long line (e.g. a model that never stops) is kept but flagged
    out = parse_subquestions("why " * 5000, Q)
    assert out.raw_count == 1 and out.too_long and len(out.subquestions) == 1


@pytest.mark.parametrize("text", ["", "   ", "\n\n\n", "-\n*\n1.\n", "**\n****"])
def test_qr_nothing_usable_falls_back_to_the_question(text: str) -> None:
    out = parse_subquestions(text, Q)
    assert out.subquestions == [Q]
    assert out.empty and not out.well_formed


def test_qr_duplicates_kept_once() -> None:
    out = parse_subquestions("Who is X?\nwho  is x?\n2. Who is X?\nWhen?", Q)
    assert out.subquestions == ["Who is X?", "When?"]
    assert out.raw_count == 4 and out.well_formed


def test_qr_garbage_and_unicode_lines_are_kept_as_written() -> None:
    out = parse_subquestions("Sure! Here are the sub-questions:\n東京タワーの高さは？\n🙂", Q)
    assert out.subquestions == ["Sure! Here are the sub-questions:", "東京タワーの高さは？", "🙂"]
    assert out.well_formed  # the format penalty concerns length and count, not content


# ---------------------------------------------------------------------------------------------
# Selector
# ---------------------------------------------------------------------------------------------


def test_selector_canonical() -> None:
    out = parse_selection("Document0,Document3,Document7", 10)
    assert out.ids == [0, 3, 7]
    assert out.well_formed and not (out.malformed or out.out_of_range or out.duplicate)


def test_selector_order_is_kept() -> None:
    assert parse_selection("Document7,Document0,Document3", 10).ids == [7, 0, 3]


def test_selector_surrounding_whitespace_is_ignored() -> None:
    out = parse_selection("  Document1,Document2\n", 10)
    assert out.ids == [1, 2] and out.well_formed


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_selector_empty_output_is_allowed(text: str) -> None:
    out = parse_selection(text, 10)
    assert out.ids == [] and out.well_formed


@pytest.mark.parametrize(
    "text",
    [
        "Document 3,Document 7",
        "document3,document7",
        "DOCUMENT3, DOCUMENT7",
        "Document3, Document7",
        "Document3\nDocument7",
        "Document3 Document7",
        "3, 7",
        "3,7",
        "[3, 7]",
        "Document #3 and Document #7",
        "The helpful documents are Document3 and Document7.",
        "Document3,Document7,",
    ],
)
def test_selector_tolerant_forms_are_read_but_flagged(text: str) -> None:
    out = parse_selection(text, 10)
    assert out.ids == [3, 7]
    assert out.malformed and not out.out_of_range and not out.duplicate
    assert not out.well_formed


def test_selector_numbers_outside_document_mentions_are_ignored() -> None:
    # "document" appears, so only numbers right after it count: not 2019, not 2
    out = parse_selection("Document 3 (from 2019) and 2 others", 10)
    assert out.ids == [3] and out.malformed and not out.out_of_range


def test_selector_out_of_range_dropped_and_flagged() -> None:
    out = parse_selection("Document3,Document10,Document12", 10)
    assert out.ids == [3]
    assert out.out_of_range and not out.malformed and not out.duplicate
    assert not out.well_formed


def test_selector_duplicates_dropped_and_flagged() -> None:
    out = parse_selection("Document4,Document1,Document4,Document04", 10)
    assert out.ids == [4, 1]
    assert out.duplicate and not out.malformed and not out.out_of_range


def test_selector_multi_digit_ids_for_large_k() -> None:
    out = parse_selection("Document12,Document3,Document19", 20)
    assert out.ids == [12, 3, 19] and out.well_formed
    out = parse_selection("Document12,Document20", 20)
    assert out.ids == [12] and out.out_of_range


def test_selector_all_flags_at_once() -> None:
    out = parse_selection("Document 1, Document 1, Document 99", 10)
    assert out.ids == [1]
    assert out.malformed and out.duplicate and out.out_of_range


@pytest.mark.parametrize(
    "text",
    [
        "I don't know",
        "None of the documents are helpful.",
        ",,,",
        "Document",
        "DocumentX,DocumentY",
        "Document٣",  # an Arabic-Indic digit is not an id
        "三",
    ],
)
def test_selector_garbage_selects_nothing_and_is_malformed(text: str) -> None:
    out = parse_selection(text, 10)
    assert out.ids == []
    assert out.malformed and not out.well_formed


def test_selector_very_long_output() -> None:
    text = ",".join(f"Document{i % 10}" for i in range(5000))
    out = parse_selection(text, 10)
    assert out.ids == list(range(10))
    assert out.duplicate and not out.malformed
    out = parse_selection("Document" + "9" * 400, 10)
    assert out.ids == [] and out.out_of_range


def test_selector_zero_candidates() -> None:
    assert parse_selection("", 0).well_formed
    out = parse_selection("Document0", 0)
    assert out.ids == [] and out.out_of_range
    with pytest.raises(ValueError, match="num_candidates must be >= 0"):
        parse_selection("Document0", -1)


# ---------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------


def test_generator_canonical() -> None:
    out = parse_answer("**Chief of Protocol**")
    assert out.answer == "Chief of Protocol"
    assert out.bold and out.well_formed and out.num_words == 3


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("The answer is **Paris**.", "Paris"),
        ("Based on Document0, **the Amsel** flows through it. **wrong**", "the Amsel"),
        ("**  New\nYork  City **", "New York City"),
        ("****\n**Paris**", "Paris"),  # an empty bold span is skipped
        ("***Paris***", "Paris"),  # stray asterisks around the span
        ("**東京**", "東京"),
        ("**Małgorzata Braunek**", "Małgorzata Braunek"),
    ],
)
def test_generator_bold_span(text: str, answer: str) -> None:
    out = parse_answer(text)
    assert out.answer == answer and out.bold and out.answer_words == len(answer.split())
    assert out.num_words == len(text.replace("*", " ").split())  # everything written


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("Answer: Paris", "Paris"),
        ("answer:Paris", "Paris"),
        ("Let me think.\nFinal ANSWER:  Paris\nIt is the capital.", "Paris"),
        ("Answer: Lyon\nAnswer: Paris", "Paris"),  # the last label wins
        ("Answer:\n\n  *Paris*  ", "Paris"),
    ],
)
def test_generator_answer_label(text: str, answer: str) -> None:
    out = parse_answer(text)
    assert out.answer == answer and not out.bold and not out.well_formed


@pytest.mark.parametrize(
    ("text", "answer", "words"),
    [
        ("Paris", "Paris", 1),
        ("  Paris is the capital. ", "Paris is the capital.", 4),
        ("*Paris*", "Paris", 1),
        ("**Paris", "Paris", 1),  # unclosed bold
        ("", "", 0),
        ("   ", "", 0),
        ("Answer:", "Answer:", 1),  # a label with nothing after it
        ("I think...\n\nParis", "I think...\n\nParis", 3),  # kept for metrics.extract_answer
    ],
)
def test_generator_plain_text(text: str, answer: str, words: int) -> None:
    out = parse_answer(text)
    assert out.answer == answer and not out.bold and out.num_words == words


def test_generator_asterisks_inside_the_answer() -> None:
    # "*" cannot be told from markup: no bold span is recognised and the asterisks are removed
    out = parse_answer("**M*A*S*H**")
    assert out.answer == "MASH" and not out.bold


def test_generator_long_unclosed_bold() -> None:
    out = parse_answer("**" + "word " * 20000)
    assert out.answer == ("word " * 20000).strip() and not out.bold and out.num_words == 20000


def test_generator_word_count_for_the_length_penalty() -> None:
    rambling = "**" + " ".join(["word"] * 45) + "**"
    out = parse_answer(rambling)
    assert out.bold and out.num_words == 45
    huge = "blah " * 10000
    out = parse_answer(huge)
    assert out.num_words == 10000 and not out.bold


def test_generator_words_outside_the_bold_span_count() -> None:
    """A short bold answer followed by a long text is a long output: the length penalty must
    see the sixty words after ``**Paris**``, not the one inside it."""
    out = parse_answer("**Paris** " + " ".join(["more"] * 60))
    assert out.answer == "Paris" and out.answer_words == 1 and out.num_words == 61
    out = parse_answer("Let me explain at length.\nAnswer: Paris")
    assert out.answer == "Paris" and out.answer_words == 1 and out.num_words == 7


def test_the_pipeline_keeps_the_configured_number_of_subquestions() -> None:
    """``GenerationSettings.max_subquestions`` (MAPPO's ``mappo_qr_max_subquestions``) decides
    how many sub-questions reach the retriever, not a constant in the parser."""
    from mmoa.agents.pipeline import AgentCall, GenerationSettings, RagPipeline

    class Canned(RagPipeline):
        def generate(self, agent, prompts, processor_for=None, copies=1):  # fixed outputs
            text = {"qr": "q1?\nq2?\nq3?\nq4?\nq5?\nq6?", "selector": "Document0",
                    "generator": "**x**"}[agent]
            return [AgentCall(agent, p, [], [1], text) for p in prompts for _ in range(copies)]

    class Docs:
        def search_documents(self, queries, k):
            return [[{"id": f"{q}-{i}", "contents": f"T\n{q} {i}"} for i in range(k)]
                    for q in queries]

    from mmoa.agents.render import PromptRenderer

    class NoTokenizer(PromptRenderer):
        stop_token_ids = (1,)  # type: ignore[assignment]

        def __init__(self) -> None:  # the canned outputs need no chat template
            pass

    renderer = NoTokenizer()
    for limit, expected in ((2, 2), (6, 6)):
        pipeline = Canned(None, None, renderer, Docs(), k=3,  # type: ignore[arg-type]
                          settings=GenerationSettings(max_subquestions=limit))
        trace = pipeline.run(["Q?"])[0]
        assert len(trace.subquestions) == expected
        assert trace.qr_parse is not None and trace.qr_parse.raw_count == 6
