"""Oracle retrieval: each evaluated question's gold supporting passages, read from the corpus.

The evaluation mode ``gold_g`` gives the Generator these passages instead of the K candidates
that the Query Rewriter, the retriever and the Selector find: the Generator's F1 on them is an
upper bound of what the retrieval side can hand it, and the gap to a ``rag`` / ``qr_s_g`` run is
the room the retrieval-side agents leave. It is not a deployable mode: a new question has no gold
passages.

:class:`GoldPassages` is a :class:`~mmoa.agents.pipeline.DocumentRetriever` (the pipeline calls
``search_documents(queries, k)`` with each question as its only query) that knows the answer to
every question of the evaluated records and nothing else. The gold passages are those of
:class:`~mmoa.data.support.GoldSupport`, the same ones the candidate recall counts: the record's
``supporting_ids`` (the demo world), else its supporting titles (HotpotQA, 2Wiki), compared after
:func:`~mmoa.data.support.normalize_title`, so FlashRAG's quoted corpus titles match too. By
title, every passage (100-word chunk) of a gold article is gold; a question gets its articles'
chunks in corpus order, one of each article in turn, at most ``k`` in all.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmoa.data.records import QARecord
from mmoa.data.support import GoldSupport, normalize_title, passage_title
from mmoa.fileio import PathLike

__all__ = ["GoldPassages", "iter_passage_source"]

#: Ids of records shown in an error message.
_SHOWN = 5


def iter_passage_source(source: PathLike) -> Iterator[Any]:
    """The passages (:class:`~mmoa.retrieval.corpus.Passage`) of a corpus file (``jsonl``,
    FlashRAG ``jsonl`` or DPR ``tsv``, as the index builder reads it), of an index folder (its
    ``corpus/passages.arrow``) or of a corpus store folder (``passages.arrow``)."""
    from mmoa.retrieval.corpus import STORE_FILE, CorpusStore, iter_corpus
    from mmoa.retrieval.index import CORPUS_DIR

    path = Path(source)
    if not path.exists():
        raise FileNotFoundError(f"{path}: gold corpus not found (a corpus .jsonl/.tsv file or "
                                "an index folder)")
    if not path.is_dir():
        yield from iter_corpus(path)
        return
    store = path / CORPUS_DIR if (path / CORPUS_DIR / STORE_FILE).is_file() else path
    if not (store / STORE_FILE).is_file():
        raise FileNotFoundError(f"{path}: a folder without {CORPUS_DIR}/{STORE_FILE} or "
                                f"{STORE_FILE}; give a corpus file or an index folder")
    for _, passages in CorpusStore(store).iter_batches(50_000):
        yield from passages


@dataclass(frozen=True)
class _Want:
    """What one question needs: its gold keys in the record's order, compared by id or title."""

    record_id: str
    by: str
    keys: tuple[str, ...]


def _ordered_keys(record: QARecord, support: GoldSupport) -> tuple[str, ...]:
    """The record's gold keys in the order the record gives them (``GoldSupport.keys`` is a
    set)."""
    if support.by == "id":
        return tuple(dict.fromkeys(record.supporting_ids or ()))
    titles = (normalize_title(t) for t in record.supporting_titles or ())
    return tuple(key for key in dict.fromkeys(titles) if key)


def _shown(ids: Sequence[str]) -> str:
    more = f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else ""
    return ", ".join(repr(i) for i in ids[:_SHOWN]) + more


class GoldPassages:
    """Each record's gold supporting passages by question text: ``search_documents`` returns
    ``{"id", "contents"}`` documents as the retrieval server does, at most ``k`` per query."""

    def __init__(self, documents: dict[str, list[dict[str, Any]]], source: str) -> None:
        #: question text -> its gold documents, best first
        self.documents = documents
        self.source = source

    @classmethod
    def from_records(cls, records: Iterable[QARecord], source: PathLike, *,
                     per_title: int | None = None) -> GoldPassages:
        """One pass over the corpus at ``source`` (:func:`iter_passage_source`), keeping the
        passages whose id or normalised title a record names. ``per_title`` keeps at most that
        many chunks of one gold article (the evaluation passes ``k``: no question can use
        more); ``None`` keeps every chunk.

        ``ValueError`` when a record names no gold passage, when one of its gold ids or titles
        is not in the corpus, or when two records ask the same question with different gold
        passages (the pipeline knows a question only by its text)."""
        records = list(records)
        wants: dict[str, _Want] = {}
        without: list[str] = []
        for record in records:
            support = GoldSupport.of(record)
            if support is None:
                without.append(record.id)
                continue
            want = _Want(record.id, support.by, _ordered_keys(record, support))
            known = wants.setdefault(record.question, want)
            if (known.by, set(known.keys)) != (want.by, set(want.keys)):
                raise ValueError(
                    f"records {known.record_id!r} and {record.id!r} ask the same question "
                    f"({record.question!r}) with different gold passages; gold passages are "
                    "looked up by question text, so keep one of them")
        if without:
            raise ValueError(
                f"{len(without)} of {len(records)} record(s) name no gold supporting passage "
                f"(no supporting_ids, no supporting titles), e.g. {_shown(without)}: the "
                "Generator has nothing to read; evaluate a file whose records all name them "
                "(or, where only later records lack them, fewer with --max_samples)")
        ids = {key for w in wants.values() if w.by == "id" for key in w.keys}
        titles = {key for w in wants.values() if w.by == "title" for key in w.keys}
        by_id: dict[str, dict[str, Any]] = {}
        by_title: dict[str, list[dict[str, Any]]] = {t: [] for t in titles}
        for passage in iter_passage_source(source):
            if passage.id in ids and passage.id not in by_id:
                by_id[passage.id] = {"id": passage.id, "contents": passage.contents}
            if titles:
                chunks = by_title.get(normalize_title(passage_title(passage.contents)))
                if chunks is not None and (per_title is None or len(chunks) < per_title):
                    chunks.append({"id": passage.id, "contents": passage.contents})
        missing = [(w.record_id, w.by, key) for w in wants.values() for key in w.keys
                   if (key not in by_id if w.by == "id" else not by_title[key])]
        if missing:
            shown = ", ".join(f"{by} {key!r} (record {rid!r})" for rid, by, key in missing[:_SHOWN])
            more = f" and {len(missing) - _SHOWN} more" if len(missing) > _SHOWN else ""
            raise ValueError(
                f"{len(missing)} gold passage(s) are not in the corpus {source}: {shown}{more}; "
                "is it the corpus the records' supporting passages come from?")
        documents = {
            question: ([by_id[key] for key in want.keys] if want.by == "id"
                       else _interleave([by_title[key] for key in want.keys]))
            for question, want in wants.items()}
        return cls(documents, str(source))

    def search_documents(self, queries: Sequence[str], k: int) -> list[list[dict[str, Any]]]:
        """Each query's gold documents (a query is a question of the records), at most ``k``."""
        out = []
        for query in queries:
            if query not in self.documents:
                raise ValueError(f"{query!r} is not the question of any record the gold "
                                 f"passages were read for (from {self.source})")
            out.append(self.documents[query][:k])
        return out


def _interleave(lists: Sequence[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The first of each list, then the second of each, ...: every gold article is read before
    a second chunk of any (HotpotQA's supporting facts are mostly in an article's first)."""
    out: list[dict[str, Any]] = []
    for rank in range(max((len(chunks) for chunks in lists), default=0)):
        out.extend(chunks[rank] for chunks in lists if rank < len(chunks))
    return out
