"""The corpus builder over QA files' own paragraphs (``data_builders/build_corpus.py``): hand-made
HotpotQA, 2WikiMultihopQA and FlashRAG files in their published layouts, the dedupe, the stable
ids, the gold-title counts, and the one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from json_files import write_json, write_jsonl

from mmoa.data.context_corpus import build_context_corpus, join_sentences, main, paragraph_id
from mmoa.fileio import DataFormatError, read_jsonl
from mmoa.retrieval.corpus import detect_format, iter_corpus

ROOT = Path(__file__).resolve().parents[1]

DERRICKSON = ["Scott Derrickson", ["Scott Derrickson is an American director.",
                                   " He lives in Los Angeles."]]
ED_WOOD = ["Ed Wood", ["Edward Davis Wood Jr. was an American filmmaker.",
                       "He made low-budget films."]]  # no leading space: joined with one
GENENTECH = ["Genentech", ["Genentech is a biotechnology corporation."]]
DOCTOR = ["Doctor Strange (2016 film)", ["Doctor Strange is a 2016 film."]]

HOTPOT = [
    {"_id": "q1", "answer": "yes", "type": "comparison", "level": "hard",
     "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
     "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
     "context": [DERRICKSON, ED_WOOD]},
    {"_id": "q2", "answer": "Genentech", "type": "bridge", "level": "medium",
     "question": "Which company did the lobbyist Evan Morris work for?",
     "supporting_facts": [["Evan Morris", 0], ["Genentech", 0]],  # Evan Morris: not in context
     "context": [GENENTECH, ED_WOOD]},  # Ed Wood again: a duplicate
    {"_id": "q3", "answer": "Sam Raimi", "type": "bridge", "level": "hard",
     "question": "Who directed the sequel?",
     "supporting_facts": [["Doctor Strange in the Multiverse of Madness", 0]],  # absent
     "context": [DOCTOR, ["Empty paragraph", [""]]]},
]  # fmt: skip

TWOWIKI = [
    {"_id": "w1", "type": "comparison", "answer": "Low",
     "question": "Which album came out first, Heroes or Low?",
     "context": [['"Heroes" (David Bowie album)', ["It was released in 1977."]],
                 ["Low (David Bowie album)", ["Low was released in January 1977."]]],
     "supporting_facts": [['"Heroes" (David Bowie album)', 0], ["Low (David Bowie album)", 0]],
     "evidences": [['"Heroes"', "publication date", "1977"]]},
]  # fmt: skip

# FlashRAG's copies keep the Hugging Face columnar layout inside "metadata".
FLASHRAG = [
    {"id": "dev_0", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
     "golden_answers": ["yes"],
     "metadata": {"type": "comparison",
                  "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood"],
                                       "sent_id": [0, 0]},
                  "context": {"title": ["Scott Derrickson", "Ed Wood"],
                              "sentences": [DERRICKSON[1], ED_WOOD[1]]}}},
]  # fmt: skip


_write_json, _write_jsonl = write_json, write_jsonl


def test_join_sentences() -> None:
    assert join_sentences(["A b.", " C d.", "E f."]) == "A b. C d. E f."
    assert join_sentences(["  A  b. ", "\nC."]) == "A b. C."
    assert join_sentences([""]) == ""


def test_hotpotqa_paragraphs_once_with_stable_ids(tmp_path: Path) -> None:
    out = tmp_path / "corpus.jsonl"
    report = build_context_corpus([_write_json(tmp_path / "hotpot.json", HOTPOT)], out)
    rows = read_jsonl(out)
    assert [r["title"] for r in rows] == ["Scott Derrickson", "Ed Wood", "Genentech",
                                          "Doctor Strange (2016 film)"]
    assert rows[1]["text"] == ("Edward Davis Wood Jr. was an American filmmaker. "
                               "He made low-budget films.")
    assert rows[0]["text"] == "Scott Derrickson is an American director. He lives in Los Angeles."
    assert all(r["id"] == paragraph_id(r["title"], r["text"]) for r in rows)
    assert len({r["id"] for r in rows}) == 4
    assert (report.questions, report.paragraphs_read, report.paragraphs, report.duplicates,
            report.empty) == (3, 6, 4, 1, 1)
    assert (report.gold_all, report.gold_some, report.gold_none, report.no_gold) == (1, 1, 1, 0)
    summary = "\n".join(report.lines())
    assert "4 paragraphs from 3 questions" in summary and "1 duplicates removed" in summary
    assert "all 1, some 1, none 1 of 3 questions" in summary
    # the format build_index.py reads
    assert detect_format(out) == "jsonl"
    assert [p.id for p in iter_corpus(out)] == [r["id"] for r in rows]


def test_ids_do_not_depend_on_the_files_or_their_order(tmp_path: Path) -> None:
    hotpot = _write_json(tmp_path / "hotpot.json", HOTPOT)
    flashrag = _write_jsonl(tmp_path / "dev.jsonl", FLASHRAG)
    one = build_context_corpus([hotpot, flashrag], tmp_path / "a.jsonl")
    two = build_context_corpus([flashrag, hotpot], tmp_path / "b.jsonl")
    a, b = read_jsonl(tmp_path / "a.jsonl"), read_jsonl(tmp_path / "b.jsonl")
    assert sorted(map(json.dumps, a)) == sorted(map(json.dumps, b))
    # FlashRAG's two paragraphs are HotpotQA's first two, spaced the same after joining
    assert one.paragraphs == two.paragraphs == 4 and one.duplicates == 3
    alone = build_context_corpus([flashrag], tmp_path / "c.jsonl")
    ids = {r["title"]: r["id"] for r in a}
    assert {r["title"]: r["id"] for r in read_jsonl(tmp_path / "c.jsonl")} == {
        t: ids[t] for t in ("Scott Derrickson", "Ed Wood")}
    assert (alone.gold_all, alone.no_gold) == (1, 0)


def test_2wiki_and_quoted_titles(tmp_path: Path) -> None:
    report = build_context_corpus([_write_json(tmp_path / "2wiki.json", TWOWIKI)],
                                  tmp_path / "corpus.jsonl")
    titles = [r["title"] for r in read_jsonl(tmp_path / "corpus.jsonl")]
    assert titles == ['"Heroes" (David Bowie album)', "Low (David Bowie album)"]
    assert report.gold_all == 1


def test_file_without_answers_is_read_for_its_context(tmp_path: Path) -> None:
    """The official HotpotQA test files have no answer and no supporting facts."""
    bare = [{"_id": r["_id"], "question": r["question"], "context": r["context"]} for r in HOTPOT]
    report = build_context_corpus([_write_jsonl(tmp_path / "test.jsonl", bare)],
                                  tmp_path / "corpus.jsonl")
    assert report.paragraphs == 4 and report.no_gold == 3
    assert "no question names supporting titles" in "\n".join(report.lines())


NO_CONTEXT = {k: v for k, v in HOTPOT[0].items() if k != "context"}


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([NO_CONTEXT], "record 0: field 'context' is missing"),
        ([HOTPOT[0], {**HOTPOT[1], "context": [["Genentech"]]}],
         "record 1: field 'context' item 0 must be a [title, [sentences]] pair"),
        ([{**HOTPOT[0], "context": [["T", [1, 2]]]}],
         "record 0: field 'context' item 0 must be a list of sentences"),
        ([{**HOTPOT[0], "context": "text"}], "record 0: field 'context' must be a list"),
        ([{**HOTPOT[0], "supporting_facts": [["T"]]}],
         "record 0: field 'supporting_facts' item 0"),
        ([{"id": "1", "question": "q", "answers": ["a"]}], "a demo file has no paragraphs"),
        ([{"x": 1}], "unknown dataset format"),
        ([], "holds no records"),
    ],
)
def test_bad_input_names_file_record_and_field(tmp_path: Path, records: list[Any],
                                                message: str) -> None:
    source = _write_json(tmp_path / "bad.json", records)
    out = tmp_path / "corpus.jsonl"
    out.write_text("kept\n")
    with pytest.raises(DataFormatError) as err:
        build_context_corpus([source], out)
    assert message in str(err.value) and str(source) in str(err.value)
    assert out.read_text() == "kept\n"  # nothing written over the old file


def test_flashrag_without_context_and_jsonl_line_numbers(tmp_path: Path) -> None:
    rows = [FLASHRAG[0], {**FLASHRAG[0], "id": "dev_1", "metadata": {"type": "bridge"}}]
    source = _write_jsonl(tmp_path / "dev.jsonl", rows)
    with pytest.raises(DataFormatError, match=r"dev\.jsonl:2: field 'metadata.context'"):
        build_context_corpus([source], tmp_path / "corpus.jsonl")
    bad = {**FLASHRAG[0], "metadata": {"context": {"title": ["A"], "sentences": []}}}
    with pytest.raises(DataFormatError, match=r"dev2\.jsonl:1: field 'metadata.context' must"):
        build_context_corpus([_write_jsonl(tmp_path / "dev2.jsonl", [bad])],
                             tmp_path / "corpus.jsonl")


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _write_json(tmp_path / "hotpot.json", HOTPOT)
    out = tmp_path / "corpus.jsonl"
    assert main(["--data_file", str(source), "--output", str(out)]) == 0
    assert "4 paragraphs from 3 questions" in capsys.readouterr().out
    assert main(["--data_file", str(source), "--output", str(out)]) == 2
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["--data_file", str(tmp_path / "missing.json"), "--output", str(out),
                 "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("build_corpus: error:") and "missing.json" in err
    assert len(err.strip().splitlines()) == 1


def test_thin_script(tmp_path: Path) -> None:
    source = _write_json(tmp_path / "hotpot.json", HOTPOT)
    out = tmp_path / "corpus.jsonl"
    result = subprocess.run([sys.executable, str(ROOT / "data_builders/build_corpus.py"),
                             "--data_file", str(source), "--output", str(out)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "gold supporting titles in the corpus: all 1, some 1, none 1" in result.stdout
    assert len(read_jsonl(out)) == 4


class _WholeCorpus:
    """A searcher that returns the whole corpus for every query (the labels are what matter)."""

    def __init__(self, corpus: Path) -> None:
        self.documents = [{"id": p.id, "contents": p.contents} for p in iter_corpus(corpus)]

    def search_documents(self, queries: Any, k: int) -> list[list[dict[str, str]]]:
        return [self.documents[:k] for _ in queries]


def test_supporting_labels_over_a_context_corpus_count_missing_gold(tmp_path: Path) -> None:
    """Fullwiki-style records whose gold paragraphs the corpus lacks: kept, with an empty
    Selector target and a Generator record without documents, and counted in the summary."""
    from mmoa.data.loaders import load_qa
    from mmoa.data.sft_builder import SFTBuildConfig, build_sft_records

    source = _write_json(tmp_path / "hotpot.json", HOTPOT)
    corpus = tmp_path / "corpus.jsonl"
    build_context_corpus([source], corpus)
    config = SFTBuildConfig(dataset_dir=str(tmp_path), k=10, label_source="supporting")
    records, report = build_sft_records(load_qa(source), _WholeCorpus(corpus), config)
    assert dict(report.gold_in_candidates) == {"all": 1, "some": 1, "none": 1}
    assert ("gold passages among the K candidates: all 1, some 1, none 1 of 3 records "
            "(none: empty Selector target, Generator without documents)") in "\n".join(
                report.lines())
    assert len(records) == 9  # every question keeps its three agent records
    selector, generator = records[7], records[8]  # q3: no gold paragraph in the corpus
    assert selector["output"] == "" and "Document" not in generator["input"]
    assert records[4]["output"].count("Document") == 1  # q2: Genentech only
