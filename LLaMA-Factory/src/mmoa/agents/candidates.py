"""Merging the retriever's per-sub-question rankings into the Selector's K numbered candidates.

The Query Rewriter writes 1-4 sub-questions, the retriever ranks documents for each, and the
Selector sees exactly K candidates. Each sub-question gets a share of the K slots
(:func:`split_counts`); for K=10 this is the original system's table 1:[10], 2:[5,5], 3:[4,3,3],
4:[3,3,2,2]. Unlike the original, a document retrieved for two sub-questions is shown once, and
the freed slot goes to the next document of the same ranking, so the Selector never wastes a slot
on a repeat.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Candidate", "Doc", "doc_key", "doc_text", "merge_candidates", "split_counts"]

Doc = Mapping[str, Any] | str
"""A retrieved document: a dict with ``contents`` or ``text`` (and optionally ``title`` and
``id``), or a plain ``"title\\ntext"`` string."""


def split_counts(k: int, num_subquestions: int) -> list[int]:
    """How many of the K candidate slots each sub-question gets.

    An even split with the remainder going to the first sub-questions, one each: for K=10 this is
    exactly the original table (1:[10], 2:[5,5], 3:[4,3,3], 4:[3,3,2,2], and 5:[2,2,2,2,2]).
    With more sub-questions than slots the last ones get 0.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if num_subquestions < 1:
        raise ValueError(f"num_subquestions must be >= 1, got {num_subquestions}")
    base, extra = divmod(k, num_subquestions)
    return [base + (1 if i < extra else 0) for i in range(num_subquestions)]


def doc_text(doc: Doc) -> str:
    """The text a prompt shows for a document: ``contents``, else ``title + "\\n" + text``."""
    if isinstance(doc, str):
        return doc
    contents = doc.get("contents")
    if isinstance(contents, str):
        return contents
    text = doc.get("text")
    if not isinstance(text, str):
        raise ValueError(
            f"a document dict needs a string 'contents' or 'text', got keys {sorted(doc)}"
        )
    title = doc.get("title")
    return f"{title}\n{text}" if isinstance(title, str) and title else text


def doc_key(doc: Doc) -> tuple[str, str]:
    """Identity for de-duplication: the ``id`` when the document has one, else its text."""
    if not isinstance(doc, str) and doc.get("id") is not None:
        return ("id", str(doc["id"]))
    return ("text", doc_text(doc))


@dataclass(frozen=True)
class Candidate:
    """One of the K candidates: the document, the sub-question it was retrieved for (0-based) and
    its 0-based rank in that sub-question's ranking."""

    doc: Doc
    subquestion: int
    rank: int

    @property
    def text(self) -> str:
        return doc_text(self.doc)

    @property
    def id(self) -> str | None:
        if isinstance(self.doc, str) or self.doc.get("id") is None:
            return None
        return str(self.doc["id"])


def merge_candidates(ranked_lists: Sequence[Sequence[Doc]], k: int = 10) -> list[Candidate]:
    """Merge per-sub-question rankings (best first) into at most ``k`` distinct candidates.

    1. Sub-question ``i`` gets ``split_counts(k, n)[i]`` slots and fills them in rank order,
       skipping documents already taken (same ``id``, or same text when there is no id), i.e.
       backfilling from its own next ranks.
    2. Slots left because a ranking ran out are filled round-robin over the sub-questions, each
       giving its next untaken document, until ``k`` are taken or every ranking is used up.

    The result is ordered by (sub-question, rank), so the candidates of the first sub-question
    come first, as in the original system. Fewer than ``k`` come back only when the rankings hold
    fewer than ``k`` distinct documents.
    """
    if not ranked_lists:
        raise ValueError("merge_candidates needs at least one ranked list (one per sub-question)")
    counts = split_counts(k, len(ranked_lists))
    next_rank = [0] * len(ranked_lists)
    seen: set[tuple[str, str]] = set()
    taken: list[Candidate] = []

    def take_next(i: int) -> bool:
        ranking = ranked_lists[i]
        while next_rank[i] < len(ranking):
            rank = next_rank[i]
            next_rank[i] += 1
            doc = ranking[rank]
            if not isinstance(doc, str | Mapping):
                raise TypeError(
                    f"sub-question {i}, rank {rank}: a document must be a dict or a string, "
                    f"got {type(doc).__name__}"
                )
            try:
                key = doc_key(doc)
            except ValueError as err:
                raise ValueError(f"sub-question {i}, rank {rank}: {err}") from None
            if key not in seen:
                seen.add(key)
                taken.append(Candidate(doc=doc, subquestion=i, rank=rank))
                return True
        return False

    for i, share in enumerate(counts):
        for _ in range(share):
            if not take_next(i):
                break
    while len(taken) < k:
        progress = False
        for i in range(len(ranked_lists)):
            if len(taken) >= k:
                break
            progress = take_next(i) or progress
        if not progress:
            break
    return sorted(taken, key=lambda c: (c.subquestion, c.rank))
