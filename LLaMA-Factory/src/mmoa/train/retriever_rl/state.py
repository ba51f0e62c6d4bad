"""The retrieval policy's state: what the query encoder embeds at each retrieval of a question.

``retriever_queries: question`` retrieves once, for the question. ``decomposition`` retrieves
once per sub-question of the dataset's reference decomposition (the demo world and HotpotQA-style
data have one), in order, and the generator answers from all the documents picked. A bridge
question's second sub-question ("Which country is the birthplace of X in?") does not name what
the first retrieval found (the city), so two questions with different answers can have the same
state: HARR's state aliasing. ``retriever_history: true`` gives the encoder the history
(HARR's history-aware state): the current sub-query, then each earlier sub-query with what its
retrieval observed. HARR's observations are written by the LLM; ours are the picked passages
themselves, clipped, since the generator side here writes only the final answer.

The current sub-query comes first, not last as in HARR: the encoder truncates at its maximum
length, and what must never be cut is the question being asked now.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mmoa.data.records import QARecord

#: Characters of each picked passage kept in the history.
OBSERVATION_CHARS = 200
QUERY_MODES = ("question", "decomposition")


def sub_queries(record: QARecord, mode: str) -> list[str]:
    """The queries of ``record``'s retrievals: the question, or its reference sub-questions
    (the question itself when the record has no decomposition)."""
    if mode == "decomposition" and record.decomposition:
        return [q for q in record.decomposition if q.strip()] or [record.question]
    return [record.question]


def observation(documents: Sequence[str]) -> str:
    """What one retrieval observed: its picked passages (``"title\\ntext"``), each clipped."""
    return " | ".join(" ".join(d.split())[:OBSERVATION_CHARS] for d in documents)


def state_text(current: str, history: Sequence[tuple[str, str]]) -> str:
    """The history-aware state: the current sub-query, then ``sub-query: observation`` of each
    earlier retrieval, oldest first. Without history it is the sub-query itself."""
    if not history:
        return current
    return "\n".join([current, *(f"{query}: {seen}" for query, seen in history)])


#: ``retrieve(states, round)``: one result per state, each a dict with the ranked
#: ``"documents"`` (``{"id", "contents", ...}``) and whatever else the retrieval reports.
Retrieve = Callable[[list[str], int], list[dict[str, Any]]]


#: What a retrieval round leaves: (sample, state, result) per retrieval, in call order.
Event = tuple[int, str, dict[str, Any]]


def retrieval_rounds(queries: Sequence[Sequence[str]], history: bool, retrieve: Retrieve,
                     keep: int | None = None
                     ) -> tuple[list[dict[str, dict[str, Any]]], list[Event]]:
    """Every sample's retrievals, round by round: round ``h`` of all samples that have an
    ``h``-th sub-query in one ``retrieve`` call (one request), the state of each with or
    without its history.

    The first ``keep`` documents of a result (all when ``None``) are what the retrieval picked:
    they enter the history's observation and the sample's documents. A greedy evaluation asks
    for more (recall@5 from the same call) while keeping the rollout's top-k.

    Returns per sample its picked documents (id -> document, first seen first, each once) and
    the events ``(sample, state, result)`` in call order, which the trainer turns into the
    Plackett-Luce terms of each round.
    """
    trace: list[list[tuple[str, str]]] = [[] for _ in queries]
    documents: list[dict[str, dict[str, Any]]] = [{} for _ in queries]
    events: list[Event] = []
    for hop in range(max((len(q) for q in queries), default=0)):
        active = [i for i, q in enumerate(queries) if hop < len(q)]
        states = [state_text(queries[i][hop], trace[i] if history else []) for i in active]
        for i, state, result in zip(active, states, retrieve(states, hop), strict=True):
            picked = result["documents"][:keep]
            events.append((i, state, result))
            for doc in picked:
                documents[i].setdefault(doc["id"], doc)
            trace[i].append((queries[i][hop], observation([d["contents"] for d in picked])))
    return documents, events
