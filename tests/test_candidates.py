"""Tests of the K-candidate split table and the per-sub-question merge with de-duplication."""

from __future__ import annotations

import pytest

from mmoa.agents.candidates import Candidate, doc_key, doc_text, merge_candidates, split_counts


def docs(prefix: str, n: int) -> list[dict[str, str]]:
    """n distinct documents "<prefix>0".. with ids, titles and texts."""
    return [
        {"id": f"{prefix}{r}", "title": f"T{prefix}{r}", "text": f"text {prefix}{r}"}
        for r in range(n)
    ]


def ids(candidates: list[Candidate]) -> list[str | None]:
    return [c.id for c in candidates]


def sources(candidates: list[Candidate]) -> list[tuple[int, int]]:
    return [(c.subquestion, c.rank) for c in candidates]


# ---------------------------------------------------------------------------------------------
# Split table
# ---------------------------------------------------------------------------------------------


def test_split_table_for_k10_is_the_original() -> None:
    assert split_counts(10, 1) == [10]
    assert split_counts(10, 2) == [5, 5]
    assert split_counts(10, 3) == [4, 3, 3]
    assert split_counts(10, 4) == [3, 3, 2, 2]
    assert split_counts(10, 5) == [2, 2, 2, 2, 2]


@pytest.mark.parametrize(
    ("k", "n", "expected"),
    [
        (20, 1, [20]),
        (20, 3, [7, 7, 6]),  # 20 = 3*6 + 2: the first two get one more
        (20, 4, [5, 5, 5, 5]),
        (5, 4, [2, 1, 1, 1]),
        (3, 4, [1, 1, 1, 0]),  # more sub-questions than slots
        (1, 1, [1]),
    ],
)
def test_split_general_rule(k: int, n: int, expected: list[int]) -> None:
    assert split_counts(k, n) == expected
    assert sum(expected) == k


def test_split_errors() -> None:
    with pytest.raises(ValueError, match="k must be >= 1"):
        split_counts(0, 1)
    with pytest.raises(ValueError, match="num_subquestions must be >= 1"):
        split_counts(10, 0)


# ---------------------------------------------------------------------------------------------
# Merging
# ---------------------------------------------------------------------------------------------


def test_merge_one_subquestion_takes_top_k() -> None:
    out = merge_candidates([docs("a", 12)])
    assert ids(out) == [f"a{r}" for r in range(10)]
    assert sources(out) == [(0, r) for r in range(10)]


@pytest.mark.parametrize(("n", "table"), [(2, [5, 5]), (3, [4, 3, 3]), (4, [3, 3, 2, 2])])
def test_merge_follows_the_table_with_distinct_documents(n: int, table: list[int]) -> None:
    lists = [docs(chr(ord("a") + i), 10) for i in range(n)]
    out = merge_candidates(lists, k=10)
    expected = [f"{chr(ord('a') + i)}{r}" for i in range(n) for r in range(table[i])]
    assert ids(out) == expected
    assert sources(out) == [(i, r) for i in range(n) for r in range(table[i])]


def test_merge_skips_duplicates_and_backfills_from_the_same_ranking() -> None:
    a = docs("a", 10)
    # sub-question 1 retrieved a0 and a2 again at ranks 0 and 2
    b = [a[0], *docs("b", 1), a[2], *docs("b", 10)[1:]]
    # b's ranking by id: a0, b0, a2, b1, b2, ... -> share 5: skip a0, b0, skip a2, b1, b2, b3, b4
    out = merge_candidates([a, b], k=10)
    assert ids(out) == ["a0", "a1", "a2", "a3", "a4", "b0", "b1", "b2", "b3", "b4"]
    assert sources(out)[5:] == [(1, 1), (1, 3), (1, 4), (1, 5), (1, 6)]


def test_merge_duplicate_inside_one_ranking() -> None:
    a = docs("a", 4)
    out = merge_candidates([[a[0], a[0], a[1], a[1], a[2], a[3]]], k=3)
    assert ids(out) == ["a0", "a1", "a2"]
    assert sources(out) == [(0, 0), (0, 2), (0, 4)]


def test_merge_duplicates_by_text_when_there_is_no_id() -> None:
    a = ["Paris\nParis is the capital of France.", "Lyon\nLyon is a city.", "Nice\nNice is nice."]
    b = ["Lyon\nLyon is a city.", "Marseille\nA port.", "Lille\nA northern city."]
    out = merge_candidates([a, b], k=4)
    assert [c.text for c in out] == [a[0], a[1], b[1], b[2]]
    assert sources(out) == [(0, 0), (0, 1), (1, 1), (1, 2)]
    assert all(c.id is None for c in out)
    # dicts without an id are compared by title + text
    da = [{"title": "Lyon", "text": "Lyon is a city."}]
    db = [{"contents": "Lyon\nLyon is a city."}, {"title": "Nice", "text": "Nice is nice."}]
    assert [c.text for c in merge_candidates([da, db], k=2)] == [
        "Lyon\nLyon is a city.",
        "Nice\nNice is nice.",
    ]


def test_merge_backfills_from_other_subquestions_when_one_runs_out() -> None:
    # shares [4, 3, 3]; sub-question 0 has only 2 documents -> 2 slots free;
    # round-robin: sub 0 (empty), sub 1 -> b3, sub 2 -> c3
    out = merge_candidates([docs("a", 2), docs("b", 10), docs("c", 10)], k=10)
    assert ids(out) == ["a0", "a1", "b0", "b1", "b2", "b3", "c0", "c1", "c2", "c3"]
    assert len(out) == 10


def test_merge_backfill_round_robin_spreads_over_subquestions() -> None:
    # shares [3, 3, 2, 2]; sub 0 and sub 1 are empty -> 6 free slots go round-robin to 2 and 3
    out = merge_candidates([[], [], docs("c", 10), docs("d", 10)], k=10)
    assert ids(out) == ["c0", "c1", "c2", "c3", "c4", "d0", "d1", "d2", "d3", "d4"]


def test_merge_too_short_overall_returns_fewer() -> None:
    a = docs("a", 3)
    out = merge_candidates([a, [a[1], *docs("b", 2)]], k=10)
    assert ids(out) == ["a0", "a1", "a2", "b0", "b1"]
    assert merge_candidates([[], []], k=10) == []


def test_merge_k20_four_subquestions() -> None:
    lists = [docs(p, 10) for p in "abcd"]
    lists[3][0] = lists[0][0]  # d's best document is a0 again
    out = merge_candidates(lists, k=20)
    assert len(out) == 20
    assert ids(out) == (
        [f"a{r}" for r in range(5)]
        + [f"b{r}" for r in range(5)]
        + [f"c{r}" for r in range(5)]
        + [f"d{r}" for r in range(1, 6)]
    )


def test_merge_k20_with_multi_digit_ranks() -> None:
    out = merge_candidates([docs("a", 30)], k=20)
    assert [c.rank for c in out] == list(range(20))


def test_candidate_keeps_the_original_document() -> None:
    a = docs("a", 1)
    (cand,) = merge_candidates([a], k=1)
    assert cand.doc is a[0]
    assert cand.text == "Ta0\ntext a0"
    assert cand.id == "a0"


def test_doc_text_and_key() -> None:
    assert doc_text("T\nbody") == "T\nbody"
    assert doc_text({"contents": "C"}) == "C"
    assert doc_text({"title": "T", "text": "body"}) == "T\nbody"
    assert doc_text({"title": "", "text": "body"}) == "body"
    assert doc_key({"id": 12, "text": "x"}) == ("id", "12")
    assert doc_key({"id": None, "text": "x"}) == ("text", "x")
    with pytest.raises(ValueError, match="needs a string 'contents' or 'text'"):
        doc_text({"title": "T"})


def test_merge_input_errors() -> None:
    with pytest.raises(ValueError, match="at least one ranked list"):
        merge_candidates([], k=10)
    with pytest.raises(ValueError, match="sub-question 1, rank 0: a document dict needs"):
        merge_candidates([docs("a", 1), [{"title": "no text"}]], k=2)
    with pytest.raises(
        TypeError, match="sub-question 0, rank 1: a document must be a dict or a string"
    ):
        merge_candidates([["ok", 3]], k=2)  # type: ignore[list-item]
