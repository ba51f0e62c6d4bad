"""The search agent's prompt, tags and turn parser, defined once (RAG-R1 / Search-R1).

One LLM answers a question over several turns. In each turn it writes ``<think>...</think>`` and
then either ``<search>q1 ; q2 ; q3</search>`` (1 to ``max_queries`` queries, answered in parallel:
RAG-R1's multi-query search) or ``<answer>...</answer>``. After a search the pipeline appends the
top documents of every query as an ``<information>...</information>`` block that the model reads
but never writes (it is masked out of every loss). The SFT data builder, the RL rollouts and the
evaluation all take the prompt and the information block from here, so the model sees the same
text in all three.

The parser is tolerant where reading is unambiguous (upper case tags, spaces inside tags, queries
separated by ``;`` or new lines, text after the closing tag that the stop string let through) and
strict in what it reports: a turn that is neither a search nor an answer ends the trajectory with
a :class:`StopReason` that says why, so a malformed output is counted, never silently repaired.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from mmoa.agents.prompts import ChatMessages
from mmoa.defaults import SEARCH_MAX_QUERIES

__all__ = [
    "ANSWER_CLOSE",
    "FORCED_ANSWER_PREFIX",
    "FORCE_ANSWER_NOTE",
    "SEARCH_CLOSE",
    "STOP_STRINGS",
    "SearchPrompt",
    "StopReason",
    "TurnParse",
    "format_information",
    "format_turn",
    "parse_turn",
    "search_prompt",
    "vocabulary_texts",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
INFO_OPEN, INFO_CLOSE = "<information>", "</information>"
#: Generation of a turn stops right after either closing tag, so the model never writes the
#: information itself.
STOP_STRINGS: tuple[str, ...] = (SEARCH_CLOSE, ANSWER_CLOSE)
#: Written between several queries of one search.
QUERY_SEPARATOR = " ; "

SEARCH_SYSTEM = "You answer questions by searching a knowledge source step by step."
SEARCH_INSTRUCTION = (
    "Answer the question. First think inside <think> and </think>. If you need facts, search: "
    "write up to {max_queries} short search queries separated by ; inside <search> and "
    "</search>, and the top documents of every query will be given to you inside "
    "<information> and </information>. You can search several times. When you know the "
    "answer, write it inside <answer> and </answer> without explanation, for example "
    "<answer> Paris </answer>."
)
#: Appended to the last information block when the turn limit is reached; the next turn is
#: then started with :data:`FORCED_ANSWER_PREFIX`, so it can only be an answer.
FORCE_ANSWER_NOTE = "No more searches are allowed. Give the answer now."
FORCED_ANSWER_PREFIX = ANSWER_OPEN


class StopReason(enum.StrEnum):
    """How a trajectory ended: the first two are well-formed, every other one is malformed."""

    ANSWERED = "answered"
    #: The turn limit was reached and the answer was forced (well-formed if it was written).
    FORCED_ANSWER = "forced_answer"
    #: The turn ended (end of turn or token limit) without a closed ``<search>`` or ``<answer>``.
    NO_ACTION = "no_action"
    #: ``<search>`` or ``<answer>`` was opened but the token limit came before it was closed.
    TRUNCATED = "truncated"
    #: ``<search></search>`` without a single non-blank query.
    EMPTY_SEARCH = "empty_search"
    #: More queries than ``max_queries`` in one search.
    TOO_MANY_QUERIES = "too_many_queries"
    #: ``<answer></answer>`` with nothing inside.
    EMPTY_ANSWER = "empty_answer"
    #: The model wrote an ``<information>`` block itself (it must only read them).
    WROTE_INFORMATION = "wrote_information"
    #: The forced last turn did not close its ``<answer>``.
    NO_ANSWER_AT_LIMIT = "no_answer_at_limit"

    @property
    def well_formed(self) -> bool:
        return self in (StopReason.ANSWERED, StopReason.FORCED_ANSWER)


@dataclass(frozen=True)
class TurnParse:
    """One model turn, parsed.

    ``action`` is ``"search"`` (with ``queries``), ``"answer"`` (with ``answer``) or ``None`` when
    the turn is malformed, and then ``error`` says why. ``has_think`` records whether a closed
    ``<think>`` block preceded the action (the prompt asks for one; its absence is logged, not
    fatal). The decision agent (:mod:`mmoa.agents.decision_tags`) parses into this class too,
    with its own reasons (``error`` is then a ``DecisionStop``).
    """

    action: str | None
    queries: list[str] = field(default_factory=list)
    answer: str = ""
    has_think: bool = False
    error: StopReason | enum.StrEnum | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _tag(name: str, closing: bool = False) -> re.Pattern[str]:
    slash = "/" if closing else ""
    return re.compile(rf"<\s*{slash}\s*{name}\s*>", re.IGNORECASE)


_THINK = re.compile(r"<\s*think\s*>(.*?)<\s*/\s*think\s*>", re.IGNORECASE | re.DOTALL)
_SEARCH_OPEN, _SEARCH_CLOSE = _tag("search"), _tag("search", True)
_ANSWER_OPEN, _ANSWER_CLOSE = _tag("answer"), _tag("answer", True)
_INFO_OPEN = _tag("information")
_QUERY_SPLIT = re.compile(r"\s*(?:;|\n)\s*")


def split_queries(text: str) -> list[str]:
    """The queries of a ``<search>`` block: split on ``;`` or new lines, blanks dropped,
    repeats (ignoring case and spacing) kept once, in order."""
    out: list[str] = []
    seen: set[str] = set()
    for part in _QUERY_SPLIT.split(text):
        query = " ".join(part.split())
        if query and query.casefold() not in seen:
            seen.add(query.casefold())
            out.append(query)
    return out


def parse_turn(text: str, *, max_queries: int = SEARCH_MAX_QUERIES,
               forced_answer: bool = False) -> TurnParse:
    """Parse one model turn (the text it generated in that turn, nothing appended).

    The action is the first closed ``<search>`` or ``<answer>`` block after the thinking; text
    after its closing tag is ignored (a stop string can end inside a token). With
    ``forced_answer`` the turn was started with :data:`FORCED_ANSWER_PREFIX` by the pipeline, so
    ``text`` is the answer followed by ``</answer>``.
    """
    if max_queries < 1:
        raise ValueError(f"max_queries must be at least 1, got {max_queries}")
    if forced_answer:
        close = _ANSWER_CLOSE.search(text)
        if close is None:
            return TurnParse(None, error=StopReason.NO_ANSWER_AT_LIMIT)
        answer = " ".join(text[: close.start()].split())
        if not answer:
            return TurnParse(None, error=StopReason.EMPTY_ANSWER)
        return TurnParse("answer", answer=answer)
    think = _THINK.search(text)
    has_think = think is not None
    body_start = think.end() if think is not None else 0
    body = text[body_start:]
    if _INFO_OPEN.search(body):
        info = _INFO_OPEN.search(body)
        search = _SEARCH_OPEN.search(body)
        answer = _ANSWER_OPEN.search(body)
        first_action = min((m.start() for m in (search, answer) if m is not None),
                           default=len(body))
        if info is not None and info.start() < first_action:
            return TurnParse(None, has_think=has_think, error=StopReason.WROTE_INFORMATION)
    search_open = _SEARCH_OPEN.search(body)
    answer_open = _ANSWER_OPEN.search(body)
    openers = [(m.start(), kind, m) for kind, m in (("search", search_open),
                                                    ("answer", answer_open)) if m is not None]
    if not openers:
        return TurnParse(None, has_think=has_think, error=StopReason.NO_ACTION)
    _, kind, opener = min(openers, key=lambda item: item[0])
    closer = (_SEARCH_CLOSE if kind == "search" else _ANSWER_CLOSE).search(body, opener.end())
    if closer is None:
        return TurnParse(None, has_think=has_think, error=StopReason.TRUNCATED)
    inside = body[opener.end(): closer.start()]
    if _INFO_OPEN.search(inside):
        return TurnParse(None, has_think=has_think, error=StopReason.WROTE_INFORMATION)
    if kind == "answer":
        answer = " ".join(inside.split())
        if not answer:
            return TurnParse(None, has_think=has_think, error=StopReason.EMPTY_ANSWER)
        return TurnParse("answer", answer=answer, has_think=has_think)
    queries = split_queries(inside)
    if not queries:
        return TurnParse(None, has_think=has_think, error=StopReason.EMPTY_SEARCH)
    if len(queries) > max_queries:
        return TurnParse(None, queries=queries, has_think=has_think,
                         error=StopReason.TOO_MANY_QUERIES)
    return TurnParse("search", queries=queries, has_think=has_think)


@dataclass(frozen=True)
class SearchPrompt(ChatMessages):
    """The first user message of a trajectory; its chat is the agents' prompts' one
    (:class:`mmoa.agents.prompts.ChatMessages`), so :class:`mmoa.agents.render.PromptRenderer`
    encodes it the same way."""

    system: str
    instruction: str
    input: str


def search_prompt(question: str, max_queries: int = SEARCH_MAX_QUERIES) -> SearchPrompt:
    return SearchPrompt(SEARCH_SYSTEM, SEARCH_INSTRUCTION.format(max_queries=max_queries),
                        f"Question: {question.strip()}")


def format_information(queries: Sequence[str], documents: Sequence[Sequence[str]],
                       *, force_answer: bool = False) -> str:
    """The block appended after a search: every query with its numbered documents
    (``"title\\ntext"`` strings from the server, shown as ``title: text``)."""
    if len(queries) != len(documents):
        raise ValueError(f"{len(queries)} queries but {len(documents)} document lists")
    parts = []
    for query, docs in zip(queries, documents, strict=True):
        lines = [f"Query: {query}"]
        for i, doc in enumerate(docs, start=1):
            title, _, text = doc.strip().partition("\n")
            body = f"{title.strip()}: {' '.join(text.split())}" if text else title.strip()
            lines.append(f"({i}) {body}")
        parts.append("\n".join(lines))
    block = f"{INFO_OPEN}\n" + "\n\n".join(parts) + f"\n{INFO_CLOSE}"
    return f"{block}\n{FORCE_ANSWER_NOTE}" if force_answer else block


def format_turn(think: str, *, queries: Sequence[str] | None = None,
                answer: str | None = None) -> str:
    """A well-formed model turn (the SFT targets): ``<think>..</think>`` then a search or an
    answer."""
    if (queries is None) == (answer is None):
        raise ValueError("a turn is either a search (queries) or an answer")
    head = f"{THINK_OPEN} {think.strip()} {THINK_CLOSE}\n"
    if queries is not None:
        return f"{head}{SEARCH_OPEN} {QUERY_SEPARATOR.join(q.strip() for q in queries)} " \
               f"{SEARCH_CLOSE}"
    return f"{head}{ANSWER_OPEN} {answer.strip()} {ANSWER_CLOSE}"  # type: ignore[union-attr]


def vocabulary_texts() -> list[str]:
    """The fixed strings of this module (for a tokenizer trained on prompt wording)."""
    return [SEARCH_SYSTEM, SEARCH_INSTRUCTION.format(max_queries=SEARCH_MAX_QUERIES),
            FORCE_ANSWER_NOTE, THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, ANSWER_OPEN,
            ANSWER_CLOSE, INFO_OPEN, INFO_CLOSE]
