"""Passage corpora: readers for the three common formats and a memory-mapped Arrow store.

The original system read the 21M-passage DPR TSV into pandas in every server process (tens of
GB of Python objects per copy). Here the corpus is converted once into an Arrow IPC file and
opened with ``pyarrow.memory_map``: a lookup touches only the pages of the rows it reads, the
operating system shares those pages between processes, and resident memory stays at a few
hundred MB even for the full Wikipedia dump.

Formats read (``fmt="auto"`` picks one from the file):

* ``jsonl``    - one object per line with ``id``, ``title`` and ``text``;
* ``flashrag`` - FlashRAG / Search-R1 JSONL with ``id`` and ``contents`` = ``"title\\ntext"``
  (split at the first newline; the title is kept verbatim, quotes included, so that
  ``title + "\\n" + text`` gives back the original ``contents``);
* ``dpr``      - DPR ``psgs_w100.tsv``: tab-separated ``id``, ``text``, ``title`` with a header.
"""

from __future__ import annotations

import csv
import hashlib
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
from tqdm.auto import tqdm

from mmoa.fileio import DataFormatError, PathLike, atomic_write_json, iter_jsonl

CORPUS_FORMATS = ("jsonl", "flashrag", "dpr")
STORE_FILE = "passages.arrow"
MANIFEST_FILE = "manifest.json"
STORE_VERSION = 1
_SCHEMA = pa.schema([("id", pa.string()), ("title", pa.string()), ("text", pa.string())])


@dataclass(frozen=True)
class Passage:
    """One retrievable unit. ``id`` is always a string (DPR ids are numbers in the file)."""

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """``"title\\ntext"``: the string the original ``/search`` API returns per document."""
        return f"{self.title}\n{self.text}"

    @property
    def encoder_text(self) -> str:
        """What the passage encoder sees: ``title text`` (the DPR / Contriever convention)."""
        return f"{self.title} {self.text}" if self.title else self.text


class PassageChecksum:
    """SHA-256 over a canonical serialisation of (id, title, text) in corpus order.

    Computed once while the store is written and saved in the index metadata, so an index can
    never be served next to a corpus whose rows do not match its vectors.
    """

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self.count = 0

    def update(self, passage_id: str, title: str, text: str) -> None:
        self._hash.update(json.dumps([passage_id, title, text], ensure_ascii=False).encode())
        self._hash.update(b"\n")
        self.count += 1

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


# ----------------------------------------------------------------------------------- readers


def detect_format(path: PathLike) -> str:
    """Guess the corpus format from the suffix and, for JSONL, the first record's fields."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: corpus file not found")
    if source.suffix.lower() in {".tsv", ".tab"}:
        return "dpr"
    for line_number, record in iter_jsonl(source):
        if "contents" in record:
            return "flashrag"
        if "text" in record:
            return "jsonl"
        raise DataFormatError(
            f"{source}:{line_number}: cannot tell the corpus format; expected the fields "
            f"'id','title','text' (jsonl) or 'id','contents' (FlashRAG), got {sorted(record)}"
        )
    raise DataFormatError(f"{source}: corpus file has no records")


def _field_id(record: dict[str, Any], where: str) -> str:
    if "id" not in record:
        raise DataFormatError(f"{where}: field 'id' missing")
    value = record["id"]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DataFormatError(f"{where}: field 'id' must be a string or an integer, "
                              f"got {type(value).__name__}")
    return str(value)


def _field_str(record: dict[str, Any], name: str, where: str) -> str:
    if name not in record:
        raise DataFormatError(f"{where}: field '{name}' missing")
    value = record[name]
    if not isinstance(value, str):
        raise DataFormatError(f"{where}: field '{name}' must be a string, "
                              f"got {type(value).__name__}")
    return value


def _iter_jsonl(path: Path) -> Iterator[Passage]:
    for line_number, record in iter_jsonl(path):
        where = f"{path}:{line_number}"
        yield Passage(
            _field_id(record, where),
            _field_str(record, "title", where),
            _field_str(record, "text", where),
        )


def _iter_flashrag(path: Path) -> Iterator[Passage]:
    for line_number, record in iter_jsonl(path):
        where = f"{path}:{line_number}"
        contents = _field_str(record, "contents", where)
        title, _, text = contents.partition("\n")
        yield Passage(_field_id(record, where), title, text)


def _iter_dpr(path: Path) -> Iterator[Passage]:
    csv.field_size_limit(sys.maxsize)
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle, delimiter="\t")
        header = next(reader, None)
        if header is None:
            raise DataFormatError(f"{path}: empty file; expected a header 'id<TAB>text<TAB>title'")
        columns = [name.strip().lower() for name in header]
        missing = [name for name in ("id", "text", "title") if name not in columns]
        if missing:
            raise DataFormatError(
                f"{path}:1: header {header} lacks {missing}; expected 'id<TAB>text<TAB>title'"
            )
        i_id, i_text, i_title = (columns.index(n) for n in ("id", "text", "title"))
        for row in reader:
            if not row:
                continue
            if len(row) != len(columns):
                raise DataFormatError(
                    f"{path}:{reader.line_num}: expected {len(columns)} tab-separated fields "
                    f"({', '.join(columns)}), got {len(row)}"
                )
            yield Passage(row[i_id], row[i_title], row[i_text])


def iter_corpus(path: PathLike, fmt: str = "auto") -> Iterator[Passage]:
    """Stream the passages of a corpus file; errors name the file, the line and the field."""
    source = Path(path)
    if fmt == "auto":
        fmt = detect_format(source)
    if fmt not in CORPUS_FORMATS:
        raise ValueError(f"unknown corpus format {fmt!r}; expected one of {CORPUS_FORMATS} "
                         f"or 'auto'")
    if not source.is_file():
        raise FileNotFoundError(f"{source}: corpus file not found")
    return {"jsonl": _iter_jsonl, "flashrag": _iter_flashrag, "dpr": _iter_dpr}[fmt](source)


# ------------------------------------------------------------------------------------- store


@dataclass(frozen=True)
class CorpusManifest:
    """What ``manifest.json`` beside the Arrow file records about the store."""

    n_passages: int
    checksum: str
    arrow_bytes: int
    source: str
    version: int = STORE_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "n_passages": self.n_passages,
                "checksum": self.checksum, "arrow_bytes": self.arrow_bytes,
                "source": self.source}


def write_corpus_store(
    passages: Iterable[Passage],
    out_dir: PathLike,
    *,
    source: str = "",
    batch_rows: int = 50_000,
    progress: bool = True,
) -> CorpusManifest:
    """Write ``passages`` to ``out_dir/passages.arrow`` in record batches of ``batch_rows``.

    Memory stays bounded by one batch whatever the corpus size. ``out_dir`` is expected to be
    inside a folder that is moved into place atomically (the index builder's ``atomic_dir``).
    """
    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    arrow_path = target / STORE_FILE
    checksum = PassageChecksum()
    ids: list[str] = []
    titles: list[str] = []
    texts: list[str] = []

    with pa.OSFile(str(arrow_path), "wb") as sink, ipc.new_file(sink, _SCHEMA) as writer:

        def flush() -> None:
            if ids:
                writer.write_batch(pa.record_batch([ids, titles, texts], schema=_SCHEMA))
                ids.clear()
                titles.clear()
                texts.clear()

        bar = tqdm(passages, desc="corpus store", unit=" passages", disable=not progress)
        for passage in bar:
            checksum.update(passage.id, passage.title, passage.text)
            ids.append(passage.id)
            titles.append(passage.title)
            texts.append(passage.text)
            if len(ids) >= batch_rows:
                flush()
        flush()
    if checksum.count == 0:
        raise DataFormatError(f"{source or 'corpus'}: no passages to store")
    manifest = CorpusManifest(checksum.count, checksum.hexdigest(), arrow_path.stat().st_size,
                              source)
    atomic_write_json(target / MANIFEST_FILE, manifest.to_json())
    return manifest


class CorpusStore:
    """Read-only, memory-mapped view of a corpus store folder; safe to share between threads."""

    def __init__(self, directory: PathLike) -> None:
        self.directory = Path(directory)
        arrow_path = self.directory / STORE_FILE
        manifest_path = self.directory / MANIFEST_FILE
        for required in (arrow_path, manifest_path):
            if not required.is_file():
                raise FileNotFoundError(f"{required}: corpus store file missing "
                                        f"(build the index with data_builders/build_index.py)")
        raw = json.loads(manifest_path.read_text(encoding="utf-8"))
        try:
            self.manifest = CorpusManifest(
                int(raw["n_passages"]), str(raw["checksum"]), int(raw["arrow_bytes"]),
                str(raw.get("source", "")), int(raw.get("version", STORE_VERSION)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise DataFormatError(f"{manifest_path}: bad manifest ({err!r})") from err
        size = arrow_path.stat().st_size
        if size != self.manifest.arrow_bytes:
            raise DataFormatError(
                f"{arrow_path}: {size} bytes on disk but the manifest records "
                f"{self.manifest.arrow_bytes}; the store is truncated or was replaced"
            )
        self._mmap = pa.memory_map(str(arrow_path), "r")
        reader = ipc.open_file(self._mmap)
        self._batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        counts = np.array([b.num_rows for b in self._batches], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        if int(self._starts[-1]) != self.manifest.n_passages:
            raise DataFormatError(
                f"{arrow_path}: holds {int(self._starts[-1])} passages but the manifest "
                f"records {self.manifest.n_passages}"
            )

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def checksum(self) -> str:
        return self.manifest.checksum

    def get(self, rows: Sequence[int]) -> list[Passage]:
        """Passages at ``rows`` (in that order); only the touched pages are read."""
        if len(rows) == 0:
            return []
        wanted = np.asarray(rows, dtype=np.int64)
        if wanted.min() < 0 or wanted.max() >= len(self):
            bad = int(wanted[(wanted < 0) | (wanted >= len(self))][0])
            raise IndexError(f"row {bad} outside the corpus (0..{len(self) - 1})")
        batch_of = np.searchsorted(self._starts, wanted, side="right") - 1
        out: list[Passage | None] = [None] * len(wanted)
        for batch_index in np.unique(batch_of):
            positions = np.nonzero(batch_of == batch_index)[0]
            local = wanted[positions] - self._starts[batch_index]
            table = self._batches[batch_index].take(pa.array(local))
            columns = [table.column(i).to_pylist() for i in range(3)]
            for j, position in enumerate(positions):
                out[position] = Passage(columns[0][j], columns[1][j], columns[2][j])
        return out  # type: ignore[return-value]

    def iter_batches(self, batch_rows: int = 10_000) -> Iterator[tuple[int, list[Passage]]]:
        """Yield ``(first_row, passages)`` chunks in row order, for encoding."""
        for batch_index, batch in enumerate(self._batches):
            base = int(self._starts[batch_index])
            for offset in range(0, batch.num_rows, batch_rows):
                part = batch.slice(offset, batch_rows)
                cols = [part.column(i).to_pylist() for i in range(3)]
                yield base + offset, [Passage(a, b, c) for a, b, c in zip(*cols, strict=True)]

    def sample(self, n: int, seed: int = 0) -> list[Passage]:
        """``n`` distinct passages drawn uniformly (all of them when ``n >= len(self)``)."""
        if n >= len(self):
            return self.get(range(len(self)))
        rows = np.sort(np.random.default_rng(seed).choice(len(self), size=n, replace=False))
        return self.get(rows.tolist())

    def compute_checksum(self, progress: bool = False) -> str:
        """Re-hash every row (slow for 21M passages; used by ``--verify-corpus``)."""
        checksum = PassageChecksum()
        bar = tqdm(total=len(self), desc="verify corpus", unit=" passages", disable=not progress)
        for _, passages in self.iter_batches(50_000):
            for p in passages:
                checksum.update(p.id, p.title, p.text)
            bar.update(len(passages))
        bar.close()
        return checksum.hexdigest()
