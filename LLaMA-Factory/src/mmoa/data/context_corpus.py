"""The paragraphs of QA files as a retrieval corpus: HotpotQA, 2WikiMultihopQA and FlashRAG files.

Many users hold a multi-hop QA file and no Wikipedia dump: every HotpotQA / 2Wiki record carries
the paragraphs it was asked over (``context``: ``[[title, [sentence, ...]], ...]``; FlashRAG's
copies keep them in ``metadata.context``). Together they make a small real corpus, which
:func:`build_context_corpus` writes as the JSONL ``{"id", "title", "text"}`` that
``build_index.py`` reads:

* a paragraph's text is its sentences joined as written (HotpotQA sentences carry their own
  leading space; a space is put between two that touch), white space collapsed;
* each distinct paragraph is written once (same title and same text), in order of first
  appearance over the files as given;
* its id is ``ctx-`` + the first 16 hex digits of the sha256 of ``title\\ntext``: the same
  paragraph gets the same id whichever files, in whichever order, it is built from;
* the file is written atomically; bad input stops the build with a
  :class:`~mmoa.fileio.DataFormatError` naming the file, the record and the field.

The report counts the questions whose gold supporting titles (``supporting_facts``) are all,
partly or not at all in the corpus: in HotpotQA's *fullwiki* files the context is what a TF-IDF
retriever found, so gold paragraphs are often missing, and a ``supporting``-labelled Selector
can only learn from the questions whose gold paragraphs the server can return.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmoa.data.loaders import detect_format, iter_raw_records, supporting_titles_of
from mmoa.data.records import json_type_name
from mmoa.data.support import normalize_title
from mmoa.fileio import DataFormatError, PathLike, atomic_write_jsonl

__all__ = [
    "CONTEXT_FORMATS",
    "ContextCorpusReport",
    "build_context_corpus",
    "join_sentences",
    "main",
    "paragraph_id",
]

#: The dataset layouts whose records carry their paragraphs.
CONTEXT_FORMATS: tuple[str, ...] = ("hotpotqa", "2wiki", "flashrag")


def join_sentences(sentences: Sequence[str]) -> str:
    """One paragraph from its sentences: joined as written (a space only where two touch),
    white space collapsed, so the same paragraph spaced two ways is one paragraph."""
    text = ""
    for sentence in sentences:
        if text and sentence and not text[-1].isspace() and not sentence[0].isspace():
            text += " "
        text += sentence
    return " ".join(text.split())


def paragraph_id(title: str, text: str) -> str:
    """A stable id: ``ctx-`` + 16 hex digits of sha256(``title\\ntext``)."""
    return "ctx-" + hashlib.sha256(f"{title}\n{text}".encode()).hexdigest()[:16]


@dataclass
class ContextCorpusReport:
    """What the builder read and wrote; printed as the summary and returned to callers."""

    output: str = ""
    files: list[str] = field(default_factory=list)
    questions: int = 0
    #: Paragraphs read (every record's context), empty ones included.
    paragraphs_read: int = 0
    #: Distinct paragraphs written.
    paragraphs: int = 0
    duplicates: int = 0
    #: Paragraphs without any text (skipped).
    empty: int = 0
    #: Questions by how many of their gold supporting titles the corpus holds.
    gold_all: int = 0
    gold_some: int = 0
    gold_none: int = 0
    #: Questions that name no supporting title (a test file, a FlashRAG file without metadata).
    no_gold: int = 0

    def lines(self) -> list[str]:
        out = [
            f"corpus -> {self.output}: {self.paragraphs} paragraphs from {self.questions} "
            f"questions in {len(self.files)} file(s) ({self.paragraphs_read} read, "
            f"{self.duplicates} duplicates removed"
            + (f", {self.empty} empty skipped" if self.empty else "") + ")",
        ]
        with_gold = self.questions - self.no_gold
        if with_gold:
            out.append(
                f"  gold supporting titles in the corpus: all {self.gold_all}, some "
                f"{self.gold_some}, none {self.gold_none} of {with_gold} questions"
                + (f" ({self.no_gold} name no supporting titles)" if self.no_gold else ""))
        else:
            out.append("  no question names supporting titles (gold coverage not measured)")
        return out


def _record_format(obj: Mapping[str, Any], fmt: str, where: str) -> str:
    """The layout of a file, from its first record (the QA loaders' detection; a HotpotQA /
    2Wiki file without answers, as the official test files, is still read for its context)."""
    if fmt == "auto":
        try:
            fmt = detect_format(obj, where)
        except DataFormatError:
            if "context" in obj:
                return "2wiki" if "evidences" in obj else "hotpotqa"
            if isinstance(obj.get("metadata"), Mapping) and "context" in obj["metadata"]:
                return "flashrag"
            raise
    if fmt not in CONTEXT_FORMATS:
        raise DataFormatError(
            f"{where}: a {fmt} file has no paragraphs to make a corpus from; expected a "
            f"HotpotQA or 2WikiMultihopQA file ('context' field) or a FlashRAG file "
            f"('metadata.context')")
    return fmt


def _sentences(value: Any, field_name: str, where: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise DataFormatError(f"{where}: field {field_name} must be a list of sentences "
                              f"(strings), got {json_type_name(value)}")
    return value


def _pair_paragraphs(context: Any, field_name: str, where: str) -> Iterator[tuple[str, str]]:
    """``[[title, [sentence, ...]], ...]`` (HotpotQA, 2Wiki)."""
    if not isinstance(context, list):
        raise DataFormatError(f"{where}: field {field_name} must be a list of "
                              f"[title, [sentences]] pairs, got {json_type_name(context)}")
    for i, pair in enumerate(context):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise DataFormatError(f"{where}: field {field_name} item {i} must be a "
                                  f"[title, [sentences]] pair, got {json_type_name(pair)}"
                                  + (f" of {len(pair)}" if isinstance(pair, list) else ""))
        yield pair[0], join_sentences(_sentences(pair[1], f"{field_name} item {i}", where))


def _columnar_paragraphs(context: Mapping[str, Any], field_name: str,
                         where: str) -> Iterator[tuple[str, str]]:
    """``{"title": [...], "sentences" | "content": [[...], ...]}`` (the Hugging Face layout
    of FlashRAG's copies)."""
    titles = context.get("title")
    key = next((k for k in ("sentences", "content") if k in context), None)
    if not isinstance(titles, list) or key is None or not isinstance(context[key], list) \
            or len(context[key]) != len(titles):
        raise DataFormatError(
            f"{where}: field {field_name} must hold 'title' and 'sentences' lists of one "
            f"length (or be a list of [title, [sentences]] pairs), got keys {sorted(context)}")
    for i, (title, sentences) in enumerate(zip(titles, context[key], strict=True)):
        if not isinstance(title, str):
            raise DataFormatError(f"{where}: field {field_name}['title'] item {i} must be a "
                                  f"string, got {json_type_name(title)}")
        yield title, join_sentences(_sentences(sentences, f"{field_name}[{key!r}] item {i}",
                                               where))


def _paragraphs(obj: Mapping[str, Any], fmt: str, where: str) -> Iterator[tuple[str, str]]:
    if fmt == "flashrag":
        metadata = obj.get("metadata")
        if not isinstance(metadata, Mapping) or "context" not in metadata:
            raise DataFormatError(f"{where}: field 'metadata.context' is missing (a FlashRAG "
                                  f"record must keep its paragraphs there to make a corpus)")
        context, name = metadata["context"], "'metadata.context'"
    else:
        if "context" not in obj:
            raise DataFormatError(f"{where}: field 'context' is missing (the record's "
                                  f"[title, [sentences]] paragraphs)")
        context, name = obj["context"], "'context'"
    if isinstance(context, Mapping):
        yield from _columnar_paragraphs(context, name, where)
    else:
        yield from _pair_paragraphs(context, name, where)


def build_context_corpus(paths: Sequence[PathLike], output: PathLike,
                         fmt: str = "auto") -> ContextCorpusReport:
    """Write the distinct paragraphs of ``paths`` to ``output`` (JSONL ``id,title,text``).

    ``fmt`` is ``auto`` (per file, from its first record) or one of :data:`CONTEXT_FORMATS`.
    Nothing is written when any input is bad.
    """
    if fmt != "auto" and fmt not in CONTEXT_FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected 'auto' or one of {CONTEXT_FORMATS}")
    if not paths:
        raise ValueError("no input file given")
    report = ContextCorpusReport(output=str(output), files=[str(p) for p in paths])
    rows: dict[str, dict[str, str]] = {}
    gold: list[list[str] | None] = []
    for path in paths:
        file_fmt: str | None = None
        for where, _, obj in iter_raw_records(path):
            file_fmt = file_fmt or _record_format(obj, fmt, where)
            report.questions += 1
            gold.append(supporting_titles_of(obj, file_fmt, where))
            for title, text in _paragraphs(obj, file_fmt, where):
                report.paragraphs_read += 1
                title = " ".join(title.split())
                if not text:
                    report.empty += 1
                    continue
                pid = paragraph_id(title, text)
                if pid in rows:
                    report.duplicates += 1
                else:
                    rows[pid] = {"id": pid, "title": title, "text": text}
        if file_fmt is None:
            raise DataFormatError(f"{path}: the file holds no records")
    if not rows:
        raise DataFormatError(f"{', '.join(report.files)}: no paragraph with text was found")
    titles = {normalize_title(r["title"]) for r in rows.values()}
    for names in gold:
        keys = {normalize_title(t) for t in names or ()} - {""}
        if not keys:
            report.no_gold += 1
        elif keys <= titles:
            report.gold_all += 1
        elif keys & titles:
            report.gold_some += 1
        else:
            report.gold_none += 1
    report.paragraphs = atomic_write_jsonl(output, rows.values())
    return report


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build_corpus.py",
        description="Write the paragraphs of HotpotQA / 2WikiMultihopQA / FlashRAG QA files "
                    "(each record's context) as a JSONL corpus {id, title, text} for "
                    "build_index.py: each distinct paragraph once, with a stable id.",
        epilog="example: python data_builders/build_corpus.py --data_file "
               "data/hotpotqa/hotpot_train_v1.1.json data/hotpotqa/hotpot_dev_distractor_v1.json "
               "--output data/hotpotqa/corpus.jsonl",
    )
    parser.add_argument("--data_file", nargs="+", required=True,
                        help="one or more QA files (JSON list or JSON Lines)")
    parser.add_argument("--data_format", default="auto", choices=("auto", *CONTEXT_FORMATS),
                        help="their layout (default: detected per file)")
    parser.add_argument("--output", "-o", required=True, help="corpus JSONL to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    output = Path(args.output)
    try:
        if output.exists() and not args.overwrite:
            raise FileExistsError(f"{output}: exists; pass --overwrite to replace it")
        report = build_context_corpus(args.data_file, output, args.data_format)
    except (FileNotFoundError, FileExistsError, DataFormatError, ValueError) as err:
        print(f"build_corpus: error: {err} (nothing was written)", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0
