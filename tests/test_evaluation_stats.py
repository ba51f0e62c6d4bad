"""Evaluation statistics against hand-computed values: standard error, Selector precision,
the Selector's choices."""

from __future__ import annotations

import math

import pytest

from mmoa.agents.candidates import Candidate
from mmoa.agents.pipeline import Trace
from mmoa.data.records import QARecord
from mmoa.evaluation import (
    _support_precision,
    _support_recall,
    selector_choices,
    standard_error,
)


def test_standard_error_of_the_mean() -> None:
    # values 0, 1, 0, 1: sample stdev sqrt(1/3), n = 4 -> sqrt(1/3) / 2
    assert standard_error([0.0, 1.0, 0.0, 1.0]) == pytest.approx(math.sqrt(1 / 3) / 2)
    assert standard_error([0.5, 0.5, 0.5]) == 0.0
    assert standard_error([1.0]) is None


def _trace(ids: list[str], selected: list[int]) -> Trace:
    candidates = [Candidate({"id": i, "contents": f"T{i}\ntext"}, 0, r) for r, i in enumerate(ids)]
    return Trace(question="q", candidates=candidates, selected=selected)


def test_selector_precision_and_recall_of_gold_passages() -> None:
    record = QARecord("1", "q", ["a"], supporting_ids=["p1", "p3"])
    trace = _trace(["p0", "p1", "p2", "p3"], selected=[1, 2, 0])
    assert _support_precision(record, trace) == pytest.approx(1 / 3)  # p1 of p1, p2, p0
    assert _support_recall(record, trace, selected_only=True) == pytest.approx(1 / 2)
    assert _support_recall(record, trace, selected_only=False) == 1.0
    assert _support_precision(record, _trace(["p0", "p1"], selected=[])) is None
    assert _support_precision(QARecord("2", "q", ["a"]), trace) is None


def test_the_selectors_choices_by_hand() -> None:
    # four questions: [0], [0] again (written twice and out of order: the same choice),
    # [0, 2] and nothing kept
    choices = selector_choices([[0], [0, 0], [2, 0], []])
    assert choices == {"num_selected_share": {"0": 0.25, "1": 0.5, "2": 0.25},
                       "position_share": {"0": 0.75, "2": 0.25},
                       "distinct_choices": 3, "most_common_choice": [0],
                       "most_common_share": 0.5}
    # "keep the top candidate" for every question: one choice, share 1.0
    constant = selector_choices([[0]] * 5)
    assert constant["distinct_choices"] == 1 and constant["most_common_share"] == 1.0
    assert selector_choices([]) == {}
