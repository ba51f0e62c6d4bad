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

from collections.abc import Sequence

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
