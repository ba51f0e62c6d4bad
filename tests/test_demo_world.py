"""The demo world: determinism, answerability, schema and argument errors."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from mmoa.cli import main as cli_main
from mmoa_demo.world import (
    QUESTION_TYPES,
    DemoWorldConfig,
    DemoWorldError,
    generate_demo_world,
    write_demo_world,
)

SMALL = DemoWorldConfig(n_passages=400, n_train=200, n_dev=40, n_test=40, seed=7)


@pytest.fixture(scope="module")
def world():
    return generate_demo_world(SMALL)


def _files_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_same_seed_gives_identical_files(tmp_path: Path) -> None:
    write_demo_world(generate_demo_world(SMALL), tmp_path / "a")
    write_demo_world(generate_demo_world(SMALL), tmp_path / "b")
    assert _files_bytes(tmp_path / "a") == _files_bytes(tmp_path / "b")


def test_other_seed_gives_other_world(world) -> None:
    other = generate_demo_world(DemoWorldConfig(**{**SMALL.__dict__, "seed": 8}))
    assert other.corpus != world.corpus
    assert other.splits["train"] != world.splits["train"]


def test_sizes_and_type_mix(world) -> None:
    assert len(world.corpus) == SMALL.n_passages
    assert {s: len(q) for s, q in world.splits.items()} == {"train": 200, "dev": 40, "test": 40}
    for records in world.splits.values():
        assert {r["type"] for r in records} == set(QUESTION_TYPES)
    assert world.stats["distractor_passages"] == 120


def test_schema_and_ids(world) -> None:
    ids = [p["id"] for p in world.corpus]
    assert len(set(ids)) == len(ids)
    assert all(set(p) == {"id", "title", "text"} and p["title"] and p["text"] for p in world.corpus)
    known = set(ids)
    seen_questions: set[str] = set()
    for split, records in world.splits.items():
        for r in records:
            resolved = {"resolved_decomposition"} if r["type"] == "bridge" else set()
            assert set(r) == {
                "id", "question", "answers", "supporting_ids", "decomposition", "type"
            } | resolved
            assert r["id"].startswith(f"{split}-")
            assert r["answers"] and all(isinstance(a, str) and a for a in r["answers"])
            assert r["supporting_ids"] and set(r["supporting_ids"]) <= known
            assert r["question"] not in seen_questions, "questions repeat across splits"
            seen_questions.add(r["question"])


def test_decompositions_are_non_empty(world) -> None:
    for records in world.splits.values():
        for r in records:
            assert 1 <= len(r["decomposition"]) <= 4
            assert all(isinstance(s, str) and s.strip().endswith("?") for s in r["decomposition"])
            if r["type"] in ("bridge", "comparison"):
                assert len(r["decomposition"]) == 2


def test_bridge_hops_resolved_name_the_entity_the_first_hop_finds(world) -> None:
    """A multi-turn agent asks its second hop about what the first found: the resolved hop
    names the title of the second supporting passage, the first hop is asked unchanged."""
    by_id = world.passage_by_id()
    bridges = [r for records in world.splits.values() for r in records if r["type"] == "bridge"]
    assert bridges
    for r in bridges:
        first, second = r["resolved_decomposition"]
        assert first == r["decomposition"][0]
        assert second != r["decomposition"][1]
        assert by_id[r["supporting_ids"][1]]["title"] in second, r


def test_every_answer_occurs_in_its_supporting_passages(world) -> None:
    by_id = world.passage_by_id()
    for records in world.splits.values():
        for r in records:
            support = " ".join(
                f"{by_id[i]['title']} {by_id[i]['text']}" for i in r["supporting_ids"]
            ).lower()
            if r["type"] == "yes_no":
                assert r["answers"] in (["yes"], ["no"])
                continue
            assert any(a.lower() in support for a in r["answers"]), r


def _yes_no_template(question: str) -> str:
    return "did_direct" if question.startswith("Did ") else question.rsplit(" ", 1)[-1]


@pytest.mark.parametrize("split", ["train", "dev", "test"])
def test_yes_no_is_balanced_within_every_template(world, split) -> None:
    """The wording of a yes/no question must not give its answer away."""
    counts: dict[str, Counter] = {}
    for r in world.splits[split]:
        if r["type"] == "yes_no":
            counts.setdefault(_yes_no_template(r["question"]), Counter())[r["answers"][0]] += 1
    assert counts
    for template, answers in counts.items():
        assert abs(answers["yes"] - answers["no"]) <= 1, (template, answers)


def test_distractors_share_names_with_real_passages(world) -> None:
    titles = {p["title"] for p in world.corpus}
    novels = [t for t in titles if t.endswith(" (novel)")]
    assert novels and all(t.removesuffix(" (novel)") in titles for t in novels)
    surnames = [t.split()[-1] for t in titles if re.fullmatch(r"[A-Z][a-z]+ [A-Z][a-z]+", t)]
    assert len(surnames) > len(set(surnames)), "expected namesakes sharing a surname"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_passages": -1}, "n_passages must be a non-negative integer"),
        ({"n_train": -5}, "n_train must be a non-negative integer"),
        ({"n_passages": 10}, "n_passages must be at least"),
        ({"n_train": 0, "n_dev": 0, "n_test": 0}, "at least one question"),
        ({"n_train": 100_000}, "can make at most"),
    ],
)
def test_invalid_arguments_raise_clear_errors(overrides: dict, message: str) -> None:
    with pytest.raises(DemoWorldError, match=message):
        generate_demo_world(DemoWorldConfig(**{**SMALL.__dict__, **overrides}))


def test_cli_writes_world_and_refuses_bad_arguments(tmp_path: Path, capsys) -> None:
    out = tmp_path / "demo"
    args = ["data", "demo-world", "--out", str(out), "--n-passages", "300", "--n-train", "60",
            "--n-dev", "10", "--n-test", "10", "--seed", "3"]
    assert cli_main(args) == 0
    before = _files_bytes(out)
    meta = json.loads((out / "world.json").read_text())
    assert meta["config"]["seed"] == 3 and meta["questions"]["train"] == 60

    assert cli_main([*args, "--n-passages", "-2"]) == 2
    assert cli_main([*args, "--n-train", "999999"]) == 2
    err = capsys.readouterr().err
    assert "nothing was written" in err and "can make at most" in err
    assert _files_bytes(out) == before, "a refused run must leave the old world untouched"

    fresh = tmp_path / "never"
    assert cli_main(["data", "demo-world", "--out", str(fresh), "--n-passages", "-1"]) == 2
    assert not fresh.exists()
