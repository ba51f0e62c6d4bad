"""Selector-only records with shuffled candidates (``mmoa.data.selector_permutations`` and
``data_builders/selector_permutations.py``): labels renumbered by hand-worked permutations, the
records rebuilt with the pipeline's own prompt, malformed records refused."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from mmoa.agents.prompts import generator_prompt, qr_prompt, selector_prompt
from mmoa.data.selector_permutations import (
    drawn_subset,
    parse_selector_record,
    permuted,
    permuted_selector_records,
    shown,
)
from mmoa.fileio import DataFormatError

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["Alpha\nAlpha is a letter.", "Beta\nBeta follows alpha.", "Gamma\nGamma is third."]


def selector_record(label: str = "Document0,Document2") -> dict[str, str]:
    return selector_prompt("Which letters are Greek?", DOCS).alpaca(label)


def test_a_record_parses_back_into_question_candidates_and_label() -> None:
    example = parse_selector_record(selector_record())
    assert example.question == "Which letters are Greek?"
    assert example.candidates == DOCS
    assert example.label == [0, 2]
    assert parse_selector_record(selector_record("")).label == []


def test_a_permutation_moves_the_documents_and_renumbers_the_label() -> None:
    example = parse_selector_record(selector_record())
    # shown order: Gamma (old 2), Alpha (old 0), Beta (old 1): gold old 0 -> 1, old 2 -> 0
    record = permuted(example, [2, 0, 1])
    assert record["output"] == "Document0,Document1"
    assert record == selector_prompt("Which letters are Greek?",
                                     [DOCS[2], DOCS[0], DOCS[1]]).alpaca("Document0,Document1")
    assert permuted(example, [0, 1, 2]) == selector_record()
    with pytest.raises(ValueError, match="permutation"):
        permuted(example, [0, 0, 1])


def test_only_selector_records_are_kept_and_each_label_names_the_same_documents() -> None:
    records = [qr_prompt("q?").alpaca("q?"), selector_record(),
               generator_prompt("q?", DOCS[:1]).alpaca("**a**"), selector_record("Document1")]
    out, found = permuted_selector_records(records, copies=3, seed=7)
    assert found == 2 and len(out) == 6
    wanted = [{DOCS[0], DOCS[2]}] * 3 + [{DOCS[1]}] * 3
    for record, gold in zip(out, wanted, strict=True):
        example = parse_selector_record(record)
        assert sorted(example.candidates) == sorted(DOCS)
        assert {example.candidates[i] for i in example.label} == gold
    assert permuted_selector_records(records, copies=3, seed=7)[0] == out  # seeded
    with pytest.raises(ValueError, match="copies"):
        permuted_selector_records(records, copies=0, seed=7)


def test_the_given_order_is_kept_first_when_asked() -> None:
    records = [selector_record(), selector_record("Document1")]
    out, found = permuted_selector_records(records, copies=2, seed=7, keep_given_order=True)
    assert found == 2 and len(out) == 6
    assert out[0] == records[0] and out[3] == records[1]  # rebuilt to the same text
    # the shuffled copies are the same draws as without the given order
    assert [out[i] for i in (1, 2, 4, 5)] == permuted_selector_records(records, 2, seed=7)[0]


@pytest.mark.parametrize(("edit", "message"), [
    (lambda r: r.update(input=r["input"].replace("Question: ", "Q: ")), "starts with"),
    (lambda r: r.update(input=r["input"].replace("Document1: ", "Document5: ")), "numbered"),
    (lambda r: r.update(output="Document2,Document0"), "canonical"),
    (lambda r: r.update(output="Document3"), "canonical"),
    (lambda r: r.update(instruction="Pick documents."), "rebuild"),
])
def test_a_record_the_prompt_did_not_write_is_refused(edit, message: str) -> None:
    record = selector_record()
    edit(record)
    with pytest.raises(DataFormatError, match=message):
        parse_selector_record(record)


def test_the_script_writes_and_registers_the_dataset(tmp_path: Path) -> None:
    source = tmp_path / "sft.json"
    source.write_text(json.dumps([qr_prompt("q?").alpaca("q?"), selector_record()]))
    out = tmp_path / "out"
    script = str(ROOT / "data_builders/selector_permutations.py")
    done = subprocess.run([sys.executable, script, "--input", str(source), "--output_dir",
                           str(out), "--copies", "2"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert len(json.loads((out / "selector_shuffled.json").read_text())) == 2
    info = json.loads((out / "dataset_info.json").read_text())
    assert info["selector_shuffled"]["file_name"] == "selector_shuffled.json"
    source.write_text(json.dumps([qr_prompt("q?").alpaca("q?")]))
    bad = subprocess.run([sys.executable, script, "--input", str(source), "--output_dir",
                          str(tmp_path / "none")], capture_output=True, text=True)
    assert bad.returncode == 2 and "no Selector record" in bad.stderr
    assert not (tmp_path / "none").exists()


def test_a_subset_shows_the_chosen_documents_and_keeps_their_gold() -> None:
    docs = [*DOCS, "Delta\nDelta is fourth.", "Epsilon\nEpsilon is fifth."]
    example = parse_selector_record(
        selector_prompt("Which letters are Greek?", docs).alpaca("Document1,Document4"))
    # shown: Epsilon (old 4, gold), Alpha (old 0), Beta (old 1, gold) -> Document0, Document2
    assert shown(example, [4, 0, 1]) == selector_prompt(
        "Which letters are Greek?", [docs[4], docs[0], docs[1]]).alpaca("Document0,Document2")
    assert shown(example, [2, 3])["output"] == ""  # no gold among them: the empty selection
    with pytest.raises(ValueError, match="distinct"):
        shown(example, [1, 1])
    with pytest.raises(ValueError, match="distinct"):
        shown(example, [5])


def test_subsets_are_drawn_per_copy_in_ranked_or_shuffled_order() -> None:
    rng = random.Random(3)
    for _ in range(20):
        ranked = drawn_subset(10, 5, "ranked", rng)
        assert len(set(ranked)) == 5 and ranked == sorted(ranked) and max(ranked) < 10
    assert sorted(drawn_subset(3, 5, "shuffled", rng)) == [0, 1, 2]  # fewer than asked: all
    draws = [tuple(drawn_subset(10, 5, "shuffled", rng)) for _ in range(50)]
    assert any(list(d) != sorted(d) for d in draws) and len(set(draws)) > 40

    docs = [f"T{i}\nText {i}." for i in range(10)]
    record = selector_prompt("q?", docs).alpaca("Document0,Document7")
    out, found = permuted_selector_records([record], copies=6, seed=5, keep_given_order=True,
                                           subset_size=5, subset_order="ranked")
    assert found == 1 and len(out) == 7
    top = parse_selector_record(out[0])  # the given order: the top five
    assert top.candidates == docs[:5] and top.label == [0]
    for made in out[1:]:
        example = parse_selector_record(made)
        assert len(example.candidates) == 5
        ranks = [docs.index(c) for c in example.candidates]
        assert ranks == sorted(ranks)
        assert [ranks[i] for i in example.label] == [r for r in ranks if r in (0, 7)]
        assert example.label  # every subset holds a gold candidate where the record has one
    no_gold = selector_prompt("q?", docs).alpaca("")
    assert parse_selector_record(permuted_selector_records(
        [no_gold], copies=1, seed=5, subset_size=5)[0][0]).label == []
    with pytest.raises(ValueError, match="subset_size"):
        permuted_selector_records([record], copies=1, seed=5, subset_size=0)
    with pytest.raises(ValueError, match="subset order"):
        permuted_selector_records([record], copies=1, seed=5, subset_size=5, subset_order="x")
