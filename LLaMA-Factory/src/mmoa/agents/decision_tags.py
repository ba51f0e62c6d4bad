"""The decision agent's prompt, tags and turn parser, defined once (SmartRAG: retrieve or answer).

One policy decides, at every step, whether to answer from what it knows or to search with a
query it writes itself::

    [Search] birth year of Ada Brel          (the pipeline appends the top-k documents)
    [Answer] 1950

A search returns the top documents as an observation turn that starts with ``[Documents]``; the
model reads it but never writes it (it is masked out of every loss). Each search costs reward,
and after ``max_searches`` searches the pipeline starts the next turn with ``[Answer]``, so an
answer is forced (SmartRAG's quota). The SFT data builder, the RL rollouts and the evaluation all
take the prompt, the tags and the observation from here, so the model sees the same text in all
three.

The parser is tolerant where reading is unambiguous (tag case, spaces inside the brackets, a
colon after the tag, spacing of the content) and strict in what it reports: a turn that is not
exactly one action ends the trajectory with a :class:`DecisionStop` that says why, so a malformed
output is counted and penalised, never silently repaired.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence

from mmoa.agents.search_tags import SearchPrompt, TurnParse

__all__ = [
    "ANSWER_TAG",
    "DOCUMENTS_TAG",
    "FORCED_ANSWER_PREFIX",
    "FORCE_ANSWER_NOTE",
    "SEARCH_TAG",
    "DecisionStop",
    "decision_prompt",
    "format_decision",
    "format_documents",
    "parse_decision",
]

ANSWER_TAG, SEARCH_TAG, DOCUMENTS_TAG = "[Answer]", "[Search]", "[Documents]"

DECISION_SYSTEM = "You answer questions. You may search a knowledge source, but every search " \
    "has a cost."
DECISION_INSTRUCTION = (
    # The example is a made-up fact: with "[Answer] Paris" SmolLM2 answered Paris to 16 of 17
    # dev capital questions; with no example it mostly wrote nothing after the forced [Answer].
    "Answer the question. If you know the answer, write [Answer] followed by only the short "
    "answer, for example [Answer] Ada Brel to \"Who directed the film Nox?\". If you need "
    "facts, write [Search] followed by "
    "one short search query, and the top documents will be given to you after [Documents]. "
    "Search only when you do not know the answer. Write one action and nothing else."
)
#: Appended to the observation of the last allowed search; the next turn is then started with
#: :data:`FORCED_ANSWER_PREFIX`, so it can only be an answer.
FORCE_ANSWER_NOTE = "No more searches are allowed. Give the answer now."
FORCED_ANSWER_PREFIX = ANSWER_TAG


class DecisionStop(enum.StrEnum):
    """How a decision trajectory ended: the first two are well-formed, every other one is
    malformed (and costs ``mappo_decision_malformed_penalty``)."""

    ANSWERED = "answered"
    #: The quota of searches was used up and the answer was forced (well-formed if written).
    FORCED_ANSWER = "forced_answer"
    #: The turn does not start with ``[Answer]`` or ``[Search]``.
    NO_ACTION = "no_action"
    #: The token limit came before the end of the turn.
    TRUNCATED = "truncated"
    #: ``[Search]`` without a query.
    EMPTY_SEARCH = "empty_search"
    #: ``[Answer]`` without an answer.
    EMPTY_ANSWER = "empty_answer"
    #: A second ``[Answer]`` or ``[Search]`` in the same turn.
    TWO_ACTIONS = "two_actions"
    #: The model wrote a ``[Documents]`` block itself (it must only read them).
    WROTE_DOCUMENTS = "wrote_documents"
    #: The forced answer turn wrote ``[Search]`` instead of an answer.
    SEARCH_AT_LIMIT = "search_at_limit"

    @property
    def well_formed(self) -> bool:
        return self in (DecisionStop.ANSWERED, DecisionStop.FORCED_ANSWER)


def _tag(name: str) -> str:
    return rf"\[\s*{name}\s*\]\s*:?"


_ANSWER = re.compile(_tag("answer"), re.IGNORECASE)
_SEARCH = re.compile(_tag("search"), re.IGNORECASE)
_ACTION = re.compile(rf"{_tag('answer')}|{_tag('search')}", re.IGNORECASE)
_DOCUMENTS = re.compile(_tag("documents"), re.IGNORECASE)


def _content(text: str) -> str:
    return " ".join(text.split())


def parse_decision(text: str, *, forced_answer: bool = False,
                   finished: bool = True) -> TurnParse:
    """Parse one model turn (the text it generated, nothing appended).

    ``finished`` says whether the turn ended by itself (end of turn) rather than at the token
    limit; a turn cut by the limit is :attr:`DecisionStop.TRUNCATED` whatever it holds, as its
    answer or query may be cut too. With ``forced_answer`` the pipeline started the turn with
    :data:`FORCED_ANSWER_PREFIX`, so ``text`` is the answer itself.
    """
    if not finished:
        return TurnParse(None, error=DecisionStop.TRUNCATED)
    if forced_answer:
        if _SEARCH.search(text):
            return TurnParse(None, error=DecisionStop.SEARCH_AT_LIMIT)
        if _ANSWER.search(text):
            return TurnParse(None, error=DecisionStop.TWO_ACTIONS)
        if _DOCUMENTS.search(text):
            return TurnParse(None, error=DecisionStop.WROTE_DOCUMENTS)
        answer = _content(text)
        if not answer:
            return TurnParse(None, error=DecisionStop.EMPTY_ANSWER)
        return TurnParse("answer", answer=answer)
    stripped = text.lstrip()
    if _DOCUMENTS.match(stripped):
        return TurnParse(None, error=DecisionStop.WROTE_DOCUMENTS)
    opener = _ACTION.match(stripped)
    if opener is None:
        return TurnParse(None, error=DecisionStop.NO_ACTION)
    rest = stripped[opener.end():]
    if _DOCUMENTS.search(rest):
        return TurnParse(None, error=DecisionStop.WROTE_DOCUMENTS)
    if _ACTION.search(rest):
        return TurnParse(None, error=DecisionStop.TWO_ACTIONS)
    content = _content(rest)
    if _ANSWER.match(opener.group(0)):
        if not content:
            return TurnParse(None, error=DecisionStop.EMPTY_ANSWER)
        return TurnParse("answer", answer=content)
    if not content:
        return TurnParse(None, error=DecisionStop.EMPTY_SEARCH)
    return TurnParse("search", queries=[content])


def decision_prompt(question: str) -> SearchPrompt:
    """The first user message of a trajectory (the search agent's prompt class, so
    :class:`mmoa.agents.render.PromptRenderer` encodes it the same way)."""
    return SearchPrompt(DECISION_SYSTEM, DECISION_INSTRUCTION, f"Question: {question.strip()}")


def format_documents(queries: Sequence[str], documents: Sequence[Sequence[str]],
                     *, force_answer: bool = False) -> str:
    """The observation appended after a search: its numbered documents (``"title\\ntext"``
    strings from the server, shown as ``title: text``)."""
    if len(queries) != 1 or len(documents) != 1:
        raise ValueError(f"a decision search has exactly one query, got {len(queries)} queries "
                         f"and {len(documents)} document lists")
    lines = [DOCUMENTS_TAG]
    for i, doc in enumerate(documents[0], start=1):
        title, _, text = doc.strip().partition("\n")
        body = f"{title.strip()}: {' '.join(text.split())}" if text else title.strip()
        lines.append(f"({i}) {body}")
    block = "\n".join(lines)
    return f"{block}\n{FORCE_ANSWER_NOTE}" if force_answer else block


def format_decision(*, query: str | None = None, answer: str | None = None) -> str:
    """A well-formed model turn (the SFT targets and the scripted baseline's search)."""
    if (query is None) == (answer is None):
        raise ValueError("a decision is either a search (query) or an answer")
    if query is not None:
        return f"{SEARCH_TAG} {_content(query)}"
    return f"{ANSWER_TAG} {_content(answer)}"  # type: ignore[arg-type]
