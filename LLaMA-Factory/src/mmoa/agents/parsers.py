"""Parsers of the three agents' raw outputs: tolerant in what they read, strict in what they report.

Each parser returns what the pipeline needs next (sub-questions, selected document ids, the answer)
and flags describing how the output deviated from its prescribed format; the MAPPO trainer turns the
flags into the per-agent penalties and logs their rates. Reading is tolerant because a policy early
in training writes ``Document 3`` or ``1. Who ...``, and dropping such output silently (as the
original system did with ``Document 3``) hides what the model meant; reporting stays strict so the
penalty still teaches the canonical format.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mmoa.defaults import QR_MAX_CHARS, QR_MAX_SUBQUESTIONS

__all__ = [
    "AnswerParse",
    "SelectionParse",
    "SubquestionParse",
    "parse_answer",
    "parse_selection",
    "parse_subquestions",
]

# ---------------------------------------------------------------------------------------------
# Query Rewriter
# ---------------------------------------------------------------------------------------------

# A leading list marker and the white space after it: bullets ("-", "*", "•", "·", "–"),
# numbers ("1.", "2)", "(3)", "4:"), and labels ("Sub-question 1:", "Subquestion 2.", "Q3:").
# A number must be followed by white space, so "1.5 million ..." or "1990s ..." is left alone.
_LIST_MARKER = re.compile(
    r"""^(?:
        [-*•·–]+\s*
      | \(?[0-9]{1,2}[.):](?:\s+|$)
      | (?:sub[-\s]?questions?|q)\s*[0-9]{1,2}\s*[.):-]\s*
    )""",
    re.IGNORECASE | re.VERBOSE,
)


@dataclass(frozen=True)
class SubquestionParse:
    """The Query Rewriter's parsed output.

    ``subquestions`` are what goes to the retriever: at least one (the original question when the
    output held nothing usable) and at most ``max_subquestions``. ``raw_count`` and
    ``total_chars`` describe the output as written (non-blank lines and their stripped lengths).
    The flags say why it is not well-formed: ``too_many`` lines, ``too_long`` in total, or
    ``empty`` (nothing usable, so the original question was used).
    """

    subquestions: list[str]
    raw_count: int
    total_chars: int
    too_many: bool
    too_long: bool
    empty: bool

    @property
    def well_formed(self) -> bool:
        return not (self.too_many or self.too_long or self.empty)


def _clean_subquestion(line: str) -> str:
    line = line.replace("**", "").strip()
    line = _LIST_MARKER.sub("", line, count=1)
    return " ".join(line.split())


def parse_subquestions(
    text: str,
    original_question: str,
    *,
    max_subquestions: int = QR_MAX_SUBQUESTIONS,
    max_lines: int = QR_MAX_SUBQUESTIONS,
    max_chars: int = QR_MAX_CHARS,
) -> SubquestionParse:
    """Split the Query Rewriter's output into sub-questions, one per line.

    Each line is stripped; blank lines are dropped; markdown bold markers (``**``) and one
    leading list marker ("1.", "2)", "(3)", "-", "*", "•", "Sub-question 1:", "Q1:") are removed;
    repeated sub-questions (ignoring case and spacing) are kept once; the first
    ``max_subquestions`` are kept. With no usable line the original question is used alone.

    Well-formed means: at most ``max_lines`` non-blank lines, at most ``max_chars`` characters
    over those lines, and at least one usable sub-question. Unlike the original system, the
    count check runs on the output as written, before truncation, so it can actually fire.
    """
    if max_subquestions < 1:
        raise ValueError(f"max_subquestions must be >= 1, got {max_subquestions}")
    raw_lines = [line.strip() for line in text.splitlines() if line.strip()]
    kept: list[str] = []
    seen: set[str] = set()
    for line in raw_lines:
        sub = _clean_subquestion(line)
        key = sub.casefold()
        if sub and key not in seen:
            seen.add(key)
            kept.append(sub)
    empty = not kept
    total_chars = sum(len(line) for line in raw_lines)
    return SubquestionParse(
        subquestions=[original_question] if empty else kept[:max_subquestions],
        raw_count=len(raw_lines),
        total_chars=total_chars,
        too_many=len(raw_lines) > max_lines,
        too_long=total_chars > max_chars,
        empty=empty,
    )


# ---------------------------------------------------------------------------------------------
# Selector
# ---------------------------------------------------------------------------------------------

_CANONICAL_SELECTION = re.compile(r"Document[0-9]+(?:,Document[0-9]+)*")
_DOCUMENT_ID = re.compile(r"documents?\s*#?\s*([0-9]+)", re.IGNORECASE)
_BARE_NUMBER = re.compile(r"\b([0-9]+)\b", re.ASCII)


@dataclass(frozen=True)
class SelectionParse:
    """The Selector's parsed output.

    ``ids`` are the selected candidate indices: in range, without repeats, in the order written.
    Flags: ``malformed`` (the output is not exactly ``DocumentI,DocumentJ,...``),
    ``out_of_range`` (an id >= the number of candidates was written), ``duplicate`` (an id was
    written twice). An empty output selects nothing and is well-formed.
    """

    ids: list[int]
    malformed: bool
    out_of_range: bool
    duplicate: bool

    @property
    def well_formed(self) -> bool:
        return not (self.malformed or self.out_of_range or self.duplicate)


def parse_selection(text: str, num_candidates: int) -> SelectionParse:
    """Read the document ids from the Selector's output for ``num_candidates`` candidates.

    Canonical: ``Document3,Document7`` (surrounding white space ignored). Also read, but flagged
    ``malformed``: ``Document 3``, ``document3``, spaces or newlines between items, ``3, 7`` and
    ``[3, 7]``. When the output mentions "document" anywhere only numbers written right after
    "Document" count (so "Document 3 (from 2019)" selects 3 alone); otherwise every standalone
    number does. Ids may have several digits, so K > 10 works.

    The empty output is accepted and well-formed: it selects no document and the Generator then
    answers without documents. This keeps the original system's choice not to penalise it.
    """
    if num_candidates < 0:
        raise ValueError(f"num_candidates must be >= 0, got {num_candidates}")
    stripped = text.strip()
    if not stripped:
        return SelectionParse(ids=[], malformed=False, out_of_range=False, duplicate=False)
    pattern = _DOCUMENT_ID if "document" in stripped.lower() else _BARE_NUMBER
    written = [int(match) for match in pattern.findall(stripped)]
    ids: list[int] = []
    for doc_id in written:
        if doc_id < num_candidates and doc_id not in ids:
            ids.append(doc_id)
    return SelectionParse(
        ids=ids,
        malformed=_CANONICAL_SELECTION.fullmatch(stripped) is None,
        out_of_range=any(doc_id >= num_candidates for doc_id in written),
        duplicate=len(set(written)) < len(written),
    )


# ---------------------------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------------------------

# Two or more asterisks, a text with at least one visible character and no asterisk, two or more
# asterisks: "**Paris**", "***Paris***", "** New\nYork **"; "****" alone is no span.
# (Written so that no two parts can match the same characters: linear time on long outputs.)
_BOLD_SPAN = re.compile(r"\*{2,}(\s*[^*\s][^*]*)\*{2,}")
_ANSWER_LABEL = re.compile(r"answer\s*:", re.IGNORECASE)


@dataclass(frozen=True)
class AnswerParse:
    """The Generator's parsed output: the answer, whether it came in the prescribed ``**answer**``
    form (``bold``, which is what well-formed means here) and the length in words of everything
    the Generator wrote (``num_words``, which the length penalty uses: counting only the bold
    span would let ``"**Paris** "`` followed by sixty words pass as a one-word answer)."""

    answer: str
    bold: bool
    num_words: int

    @property
    def well_formed(self) -> bool:
        return self.bold

    @property
    def answer_words(self) -> int:
        """Length of the extracted answer in words (what the evaluation reports)."""
        return len(self.answer.split())


def parse_answer(text: str) -> AnswerParse:
    """Take the answer out of the Generator's output.

    In order: the first ``**...**`` span with some text and no ``*`` in it (white space inside
    collapsed);
    else the first non-empty line after the last "Answer:" (any case); else the whole output.
    Stray ``*`` are removed and the result is trimmed. In the last case line breaks are kept, so
    :func:`mmoa.metrics.extract_answer` can still cut a reasoning preamble at scoring time.
    """
    written = _count_words(text)
    match = _BOLD_SPAN.search(text)
    if match:
        answer = " ".join(match.group(1).split())
        return AnswerParse(answer=answer, bold=True, num_words=written)
    labels = list(_ANSWER_LABEL.finditer(text))
    if labels:
        rest = text[labels[-1].end() :].replace("*", "")
        lines = [line.strip() for line in rest.splitlines() if line.strip()]
        if lines:
            return AnswerParse(answer=lines[0], bold=False, num_words=written)
    answer = text.replace("*", "").strip()
    return AnswerParse(answer=answer, bold=False, num_words=written)


def _count_words(text: str) -> int:
    """Words of a Generator output as written; markup asterisks are not words."""
    return len(text.replace("*", " ").split())
