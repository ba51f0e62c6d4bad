"""Matching retrieved passages against a record's gold supporting passages: by id, else by title.

The evaluation's retrieval and Selector statistics and the SFT builder's ``supporting`` labels
all ask one question, "is this passage a gold supporting passage?", and answer it here, once.

Two facts about real data shape the answer:

* HotpotQA and 2WikiMultihopQA name their supporting facts by Wikipedia *title*; they know no
  passage id of any retrieval corpus. When a record has no ``supporting_ids``, a passage counts as
  supporting when its title (the first line of ``"title\\ntext"``) is a gold title. Every
  100-word chunk of a gold article then counts, which is how users of those datasets read "gold
  passage" over DPR-style corpora.
* FlashRAG's wiki corpora keep literal double quotes around every title
  (``"\\"Evan Morris\\"\\nEvan L. Morris ..."``), an artefact of their conversion from DPR's CSV
  file, while the datasets' gold titles have none. Compared verbatim, no title ever matched and
  gold-passage recall read 0.

Titles are therefore compared after :func:`normalize_title`, applied to both sides.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from mmoa.data.records import QARecord

__all__ = ["GoldSupport", "PassageLike", "normalize_title", "passage_title"]


class PassageLike(Protocol):
    """What matching needs of a passage (:class:`mmoa.agents.candidates.Candidate` fits)."""

    @property
    def id(self) -> str | None: ...

    @property
    def text(self) -> str: ...


def normalize_title(title: str) -> str:
    """The form in which two Wikipedia titles are compared.

    Unicode NFC (the same title can arrive composed or decomposed); ``_`` read as a space
    (MediaWiki treats them as one character in titles); surrounding white space and double
    quotes removed (FlashRAG's quoting; stripping *all* outer quotes on both sides also keeps
    titles that really start with a quote, such as ``"Heroes" (David Bowie album)``, equal in
    both corpora); inner white space collapsed; lower case (as the evaluation always compared).
    """
    text = unicodedata.normalize("NFC", title).replace("_", " ")
    text = text.strip().strip('"').strip()
    return " ".join(text.split()).lower()


def passage_title(text: str) -> str:
    """The title of a ``"title\\ntext"`` passage: its first line, as the retrieval API gives it."""
    return text.split("\n", 1)[0]


@dataclass(frozen=True)
class GoldSupport:
    """A record's gold supporting passages, as passage ids or as normalised titles."""

    by: Literal["id", "title"]
    keys: frozenset[str]

    @classmethod
    def of(cls, record: QARecord) -> GoldSupport | None:
        """Ids when the record has them (the demo world), else titles (HotpotQA, 2Wiki,
        FlashRAG metadata); ``None`` when it names no supporting passage."""
        if record.supporting_ids:
            return cls("id", frozenset(record.supporting_ids))
        if record.supporting_titles:
            keys = frozenset(normalize_title(t) for t in record.supporting_titles) - {""}
            if keys:
                return cls("title", keys)
        return None

    def key(self, passage: PassageLike) -> str | None:
        """The passage's id or normalised title, whichever this support is compared by."""
        if self.by == "id":
            return passage.id
        return normalize_title(passage_title(passage.text))

    def matches(self, passage: PassageLike) -> bool:
        return self.key(passage) in self.keys

    def covered(self, passages: Sequence[PassageLike]) -> frozenset[str]:
        """The gold keys found among ``passages``."""
        return self.keys & {self.key(p) for p in passages}

    def recall(self, passages: Sequence[PassageLike]) -> float:
        """Share of the gold passages (ids or titles) found among ``passages``."""
        return len(self.covered(passages)) / len(self.keys)

    def precision(self, passages: Sequence[PassageLike]) -> float | None:
        """Share of ``passages`` that are gold; ``None`` for no passages."""
        if not passages:
            return None
        return sum(self.matches(p) for p in passages) / len(passages)

    def f1(self, passages: Sequence[PassageLike]) -> float:
        """Harmonic mean of :meth:`precision` and :meth:`recall` (0 for no passages): a
        selection scores high only by holding the gold passages and little else."""
        precision, recall = self.precision(passages), self.recall(passages)
        if not precision or not recall:
            return 0.0
        return 2 * precision * recall / (precision + recall)
