"""Corpus readers (JSONL, FlashRAG, DPR TSV) and the memory-mapped Arrow store."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from mmoa.fileio import DataFormatError
from mmoa.retrieval.corpus import (
    CorpusStore,
    Passage,
    PassageChecksum,
    detect_format,
    iter_corpus,
    write_corpus_store,
)

PASSAGES = [
    Passage("1", "Aaron", 'Aaron is a prophet; he said "hello"\tonce.'),
    Passage("2", "Zebra (film)", "A 1999 film.\nSecond line of text."),
    Passage("doc-3", "", "A passage without a title."),
    Passage("4", "Ünïcode — title", "Text with emoji 🙂 and CJK 漢字."),
]


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                    encoding="utf-8")
    return path


def write_dpr(path: Path, passages: list[Passage]) -> Path:
    import csv

    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t")
        writer.writerow(["id", "text", "title"])
        for p in passages:
            writer.writerow([p.id, p.text, p.title])
    return path


def test_three_formats_read_to_the_same_passages(tmp_path: Path) -> None:
    plain = write_jsonl(tmp_path / "c.jsonl",
                        [{"id": p.id, "title": p.title, "text": p.text} for p in PASSAGES])
    # FlashRAG keeps everything after the first newline as text.
    flashrag = write_jsonl(tmp_path / "f.jsonl",
                           [{"id": p.id, "contents": p.contents} for p in PASSAGES])
    dpr = write_dpr(tmp_path / "psgs_w100.tsv", PASSAGES)
    assert detect_format(plain) == "jsonl"
    assert detect_format(flashrag) == "flashrag"
    assert detect_format(dpr) == "dpr"
    for path in (plain, flashrag, dpr):
        assert list(iter_corpus(path)) == PASSAGES, path


def test_dpr_real_layout_with_quotes(tmp_path: Path) -> None:
    # The first lines of the real psgs_w100.tsv: quoted text with doubled quotes.
    path = tmp_path / "psgs_w100.tsv"
    path.write_text('id\ttext\ttitle\n1\t"Aaron Aaron ( or ; ""Ahärôn"") is a prophet"\tAaron\n'
                    '2\t"plain text"\t"Quoted, Title"\n', encoding="utf-8")
    got = list(iter_corpus(path))
    assert got == [Passage("1", "Aaron", 'Aaron Aaron ( or ; "Ahärôn") is a prophet'),
                   Passage("2", "Quoted, Title", "plain text")]
    assert got[0].contents == 'Aaron\nAaron Aaron ( or ; "Ahärôn") is a prophet'


def test_integer_ids_become_strings(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": 7, "title": "T", "text": "x"}])
    assert next(iter_corpus(path)).id == "7"


@pytest.mark.parametrize(("record", "message"), [
    ({"title": "T", "text": "x"}, ":2: field 'id' missing"),
    ({"id": "a", "text": "x"}, ":2: field 'title' missing"),
    ({"id": "a", "title": "T", "text": 5}, ":2: field 'text' must be a string, got int"),
    ({"id": True, "title": "T", "text": "x"}, ":2: field 'id' must be a string or an integer"),
])
def test_bad_jsonl_records_name_file_line_and_field(tmp_path: Path, record: dict,
                                                    message: str) -> None:
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": "ok", "title": "T", "text": "x"}, record])
    with pytest.raises(DataFormatError, match=message) as info:
        list(iter_corpus(path, "jsonl"))
    assert str(path) in str(info.value)


def test_bad_dpr_files(tmp_path: Path) -> None:
    bad_header = tmp_path / "a.tsv"
    bad_header.write_text("pid\tbody\n1\tx\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"a.tsv:1: header .* lacks"):
        list(iter_corpus(bad_header))
    short_row = tmp_path / "b.tsv"
    short_row.write_text("id\ttext\ttitle\n1\tx\tT\n2\tonly two\n", encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"b.tsv:3: expected 3 tab-separated fields"):
        list(iter_corpus(short_row))


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    odd = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "body": "x"}])
    with pytest.raises(DataFormatError, match="cannot tell the corpus format"):
        detect_format(odd)
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        list(iter_corpus(tmp_path / "nope.jsonl", "jsonl"))


def test_store_round_trip_lookup_and_order(tmp_path: Path) -> None:
    many = [Passage(str(i), f"Title {i}", f"text {i} " * (i % 7)) for i in range(1050)]
    manifest = write_corpus_store(iter(many), tmp_path / "store", batch_rows=100,
                                  progress=False)
    assert manifest.n_passages == 1050
    store = CorpusStore(tmp_path / "store")
    assert len(store) == 1050
    rows = [1049, 0, 5, 99, 100, 101, 5, 730]  # across batches, repeated, unsorted
    assert store.get(rows) == [many[r] for r in rows]
    assert store.get([]) == []
    chunks = list(store.iter_batches(64))
    assert [p for _, part in chunks for p in part] == many
    assert all(start == sum(len(c) for _, c in chunks[:i]) for i, (start, _) in
               enumerate(chunks))
    with pytest.raises(IndexError, match="row 1050 outside the corpus"):
        store.get([3, 1050])


def test_store_is_memory_mapped_not_loaded(tmp_path: Path) -> None:
    many = (Passage(str(i), "T", "word " * 200) for i in range(5000))  # ~5 MB of text
    write_corpus_store(many, tmp_path / "store", batch_rows=1000, progress=False)
    before = pa.total_allocated_bytes()
    store = CorpusStore(tmp_path / "store")
    assert len(store) == 5000
    # Opening maps the file: Arrow allocates no buffers for the 5 MB of passages.
    assert pa.total_allocated_bytes() - before < 100_000
    assert store.get([4999])[0].id == "4999"


def test_checksum_is_order_and_content_sensitive(tmp_path: Path) -> None:
    def digest(passages: list[Passage]) -> str:
        checksum = PassageChecksum()
        for p in passages:
            checksum.update(p.id, p.title, p.text)
        return checksum.hexdigest()

    assert digest(PASSAGES) != digest(PASSAGES[::-1])
    changed = [*PASSAGES[:-1], Passage("4", "Ünïcode — title", "other")]
    assert digest(PASSAGES) != digest(changed)
    manifest = write_corpus_store(iter(PASSAGES), tmp_path / "s", progress=False)
    assert manifest.checksum == digest(PASSAGES)
    assert CorpusStore(tmp_path / "s").compute_checksum() == manifest.checksum


def test_truncated_store_is_refused(tmp_path: Path) -> None:
    write_corpus_store(iter(PASSAGES), tmp_path / "s", progress=False)
    arrow = tmp_path / "s" / "passages.arrow"
    arrow.write_bytes(arrow.read_bytes()[:-10])
    with pytest.raises(DataFormatError, match="truncated or was replaced"):
        CorpusStore(tmp_path / "s")


def test_empty_corpus_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataFormatError, match="no passages"):
        write_corpus_store(iter([]), tmp_path / "s", source="empty.jsonl", progress=False)
