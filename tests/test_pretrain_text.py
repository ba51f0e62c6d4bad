"""Pre-training text of the tiny demo model: other worlds, no evaluation-world entity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmoa.fileio import atomic_write_json
from mmoa_demo.pretrain_text import (
    build_pretrain_texts,
    copy_drill,
    main,
    text_kind,
    write_pretrain_dataset,
)
from mmoa_demo.world import DemoWorld


def test_texts_come_from_other_worlds_without_evaluation_titles(tiny_world: DemoWorld) -> None:
    excluded = {p["title"] for p in tiny_world.corpus}
    texts = build_pretrain_texts(seeds=(5, 6), n_passages=200, exclude_titles=excluded,
                                 drills=False)
    with_everything = build_pretrain_texts(seeds=(5, 6), n_passages=200, drills=False)
    assert 0 < len(texts) < len(with_everything) <= 400
    titles = {t["text"].split("\n", 1)[0] for t in texts}
    assert not titles & excluded
    # Each record is "Title\nText", as documents appear in the agents' prompts.
    assert all(len(t["text"].split("\n")) == 2 for t in texts)
    assert texts == build_pretrain_texts(seeds=(5, 6), n_passages=200, exclude_titles=excluded,
                                         drills=False)


def test_drills_repeat_what_came_before(tiny_world: DemoWorld) -> None:
    excluded = {p["title"] for p in tiny_world.corpus}
    texts = build_pretrain_texts(seeds=(5,), n_passages=200, exclude_titles=excluded)
    kinds = [text_kind(t["text"]) for t in texts]
    assert {"passage", "reading", "copy"} == set(kinds)
    assert kinds.count("copy") == kinds.count("passage")
    for text in (t["text"] for t in texts if text_kind(t["text"]) == "reading"):
        documents, tail = text.split("\n\nQuestion: ")
        assert "\nSub-questions: " in tail and "\nAnswer: " in tail
        assert not any(line in excluded for line in documents.split("\n"))
    denser = build_pretrain_texts(seeds=(5,), n_passages=200, exclude_titles=excluded,
                                  copy_drills_per_passage=3)
    assert [text_kind(t["text"]) for t in denser].count("copy") == 3 * kinds.count("passage")
    assert copy_drill(["Ada Li", "Bo Ek"]) == (
        "Names: Ada Li, Bo Ek.\nThe same names again: Ada Li, Bo Ek.")


def test_fresh_copy_names_are_not_the_worlds_titles() -> None:
    texts = build_pretrain_texts(seeds=(5,), n_passages=200, fresh_copy_names=True)
    drills = [t["text"] for t in texts if text_kind(t["text"]) == "copy"]
    world_titles = {t["text"].split("\n", 1)[0] for t in texts if text_kind(t["text"]) == "passage"}
    listed = [d.split("\n")[0].removeprefix("Names: ").removesuffix(".").split(", ")
              for d in drills]
    assert drills and all(len(names) == 8 == len(set(names)) for names in listed)
    every_name = [name for names in listed for name in names]
    assert not set(every_name) & world_titles
    assert len(set(every_name)) > 0.9 * len(every_name)  # drawn afresh, hardly ever repeated
    assert texts == build_pretrain_texts(seeds=(5,), n_passages=200, fresh_copy_names=True)


def test_registration_keeps_foreign_entries(tmp_path: Path) -> None:
    atomic_write_json(tmp_path / "dataset_info.json", {"mine": {"file_name": "mine.json"}})
    path = write_pretrain_dataset([{"text": "A\nB."}], tmp_path, "pt_text")
    info = json.loads((tmp_path / "dataset_info.json").read_text())
    assert info["mine"] == {"file_name": "mine.json"}
    assert info["pt_text"] == {"file_name": "pt_text.jsonl", "columns": {"prompt": "text"}}
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"text": "A\nB."}]
    with pytest.raises(ValueError, match="no pre-training text"):
        write_pretrain_dataset([], tmp_path, "empty")


def test_cli_excludes_the_corpus_titles(tiny_world_dir: Path, tmp_path: Path, capsys) -> None:
    assert main(["--dataset-dir", str(tmp_path), "--seeds", "7", "--n-passages", "100",
                 "--exclude-corpus", str(tiny_world_dir / "corpus.jsonl")]) == 0
    assert "registered as 'demo_pt'" in capsys.readouterr().out
    corpus_titles = {json.loads(line)["title"]
                     for line in (tiny_world_dir / "corpus.jsonl").read_text().splitlines()}
    texts = [json.loads(line) for line in (tmp_path / "demo_pt.jsonl").read_text().splitlines()]
    assert texts and not {t["text"].split("\n", 1)[0] for t in texts} & corpus_titles


def test_mmoa_cli_data_pretrain_is_the_same_builder(tmp_path: Path) -> None:
    from mmoa.cli import main as cli_main

    assert cli_main(["data", "pretrain", "--dataset-dir", str(tmp_path / "a"), "--seeds", "7",
                     "--n-passages", "100"]) == 0
    assert main(["--dataset-dir", str(tmp_path / "b"), "--seeds", "7",
                 "--n-passages", "100"]) == 0
    assert ((tmp_path / "a/demo_pt.jsonl").read_text()
            == (tmp_path / "b/demo_pt.jsonl").read_text())
