"""The demo world: determinism, answerability, schema and argument errors; the opt-in hard
world (namesakes of the asked entities) and the default world's byte identity."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from mmoa.cli import main as cli_main
from mmoa_demo.world import (
    DISTRACTOR_SHARE,
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


# -- the default world must not change (the demo's figures were measured on it) ---------------

#: sha256 over the files of ``write_demo_world(generate_demo_world(SMALL))`` (name, NUL, bytes,
#: in name order), taken before the hard-world options existed.
SMALL_WORLD_SHA256 = "b99cf85d8a02697e89abaaee21b8c395da619b2b3e20ffd48c78e40fd4f25442"


def _folder_sha256(folder: Path) -> str:
    digest = hashlib.sha256()
    for name, data in _files_bytes(folder).items():
        digest.update(name.encode() + b"\0" + data)
    return digest.hexdigest()


@pytest.mark.parametrize("explicit", [False, True])
def test_default_world_is_byte_identical(tmp_path: Path, explicit: bool) -> None:
    """The defaults of the new options (given or not) leave the world as it was, world.json
    included (it records the options only when they are set)."""
    config = SMALL if not explicit else DemoWorldConfig(
        **{**SMALL.__dict__, "distractor_share": DISTRACTOR_SHARE, "namesakes_per_entity": 0})
    write_demo_world(generate_demo_world(config), tmp_path / "w")
    assert _folder_sha256(tmp_path / "w") == SMALL_WORLD_SHA256
    assert "namesakes_per_entity" not in json.loads((tmp_path / "w" / "world.json").read_text())[
        "config"]


# -- the hard world ---------------------------------------------------------------------------

TINY = DemoWorldConfig(n_passages=60, n_train=4, n_dev=2, n_test=2, seed=3)
#: The tiny world's asked entities (the titles of its questions' gold passages) and the name
#: each one's namesakes share (a person's surname, a company's short name, ...).
TINY_NAME_KEYS = {
    "The Burning Harbor": "The Burning Harbor", "Deiswoun Pictures": "Deiswoun",
    "Roka Taimound": "Taimound", "Rendport": "Rendport", "The Last Garden": "The Last Garden",
    "The Distant Tide": "The Distant Tide", "The Frozen Road": "The Frozen Road",
    "Stin Vosji": "Vosji", "Tharkburg": "Tharkburg",
}


def _word(needle: str, text: str) -> bool:
    return re.search(rf"\b{re.escape(needle)}\b", text, re.IGNORECASE) is not None


def _titles_sharing(world, name: str) -> int:
    return sum(_word(name, p["title"]) for p in world.corpus)


def test_hard_world_adds_namesakes_of_every_asked_entity() -> None:
    """Counted from the corpus on a world small enough to check by hand: 9 entities are asked
    about (4 + 2 + 2 questions, bridges ask about 2), 2 namesakes each: 61 + 18 passages, and
    every asked entity's name is in 2 more titles than in the default world."""
    default = generate_demo_world(TINY)
    hard = generate_demo_world(DemoWorldConfig(**{**TINY.__dict__, "namesakes_per_entity": 2}))
    by_id = hard.passage_by_id()
    asked = {by_id[i]["title"] for records in hard.splits.values() for r in records
             for i in r["supporting_ids"]}
    assert asked == set(TINY_NAME_KEYS)
    assert (len(default.corpus), len(hard.corpus)) == (61, 79)
    assert hard.stats["namesake_passages"] == 18 and hard.stats["asked_entities"] == 9
    counts = {title: (_titles_sharing(default, key), _titles_sharing(hard, key))
              for title, key in TINY_NAME_KEYS.items()}
    assert counts == {
        "The Burning Harbor": (2, 4), "Deiswoun Pictures": (1, 3), "Roka Taimound": (1, 3),
        "Rendport": (2, 4), "The Last Garden": (2, 4), "The Distant Tide": (1, 3),
        "The Frozen Road": (1, 3), "Stin Vosji": (3, 5), "Tharkburg": (3, 5)}
    # DemoWorld.namesakes names them: two per gold passage, each sharing its entity's name
    assert {by_id[g]["title"] for g in hard.namesakes} == set(TINY_NAME_KEYS)
    for gold, namesakes in hard.namesakes.items():
        assert len(namesakes) == 2
        assert all(_word(TINY_NAME_KEYS[by_id[gold]["title"]], by_id[n]["title"])
                   for n in namesakes)


@pytest.fixture(scope="module")
def hard_world():
    return generate_demo_world(DemoWorldConfig(**{**SMALL.__dict__, "namesakes_per_entity": 3}))


def test_hard_world_is_the_default_world_plus_namesakes(world, hard_world) -> None:
    """Same questions, answers and gold passages' text; only the namesakes are new, so an
    oracle scores the same on both worlds and the difference is retrieval."""
    def content(w, ids):
        by_id = w.passage_by_id()
        return [(by_id[i]["title"], by_id[i]["text"]) for i in ids]

    assert {(p["title"], p["text"]) for p in world.corpus} <= {
        (p["title"], p["text"]) for p in hard_world.corpus}
    namesakes = [n for ids in hard_world.namesakes.values() for n in ids]
    assert len(hard_world.corpus) == len(world.corpus) + len(namesakes)
    titles = [p["title"] for p in hard_world.corpus]
    assert len(set(titles)) == len(titles)
    for split, records in world.splits.items():
        for old, new in zip(records, hard_world.splits[split], strict=True):
            assert {k: v for k, v in old.items() if k != "supporting_ids"} == {
                k: v for k, v in new.items() if k != "supporting_ids"}
            assert content(world, old["supporting_ids"]) == content(
                hard_world, new["supporting_ids"])
            assert all(len(hard_world.namesakes[g]) == 3 for g in new["supporting_ids"])


def test_hard_world_gold_ids_hold_the_answers(hard_world) -> None:
    by_id = hard_world.passage_by_id()
    for records in hard_world.splits.values():
        for r in records:
            if r["type"] == "yes_no":
                continue
            support = " ".join(
                f"{by_id[i]['title']} {by_id[i]['text']}" for i in r["supporting_ids"]).lower()
            assert any(a.lower() in support for a in r["answers"]), r


def test_namesakes_do_not_state_the_asked_fact(hard_world) -> None:
    """A namesake that names the asked entity itself never holds the answer (it gives other
    facts, for a similarly named entity)."""
    by_id = hard_world.passage_by_id()
    checked = 0
    for records in hard_world.splits.values():
        for r in records:
            if r["type"] != "one_hop":
                continue
            subject = by_id[r["supporting_ids"][0]]["title"]
            for n in hard_world.namesakes[r["supporting_ids"][0]]:
                text = by_id[n]["text"]
                if _word(subject, text):
                    checked += 1
                    assert not any(_word(a, text) for a in r["answers"]), (r, by_id[n])
    assert checked > 0


def test_namesakes_keep_the_second_hop_behind_the_first(hard_world) -> None:
    """No namesake of a bridge question's first entity names its second, and none of the
    second names the first: the second hop is still found only through the first."""
    by_id = hard_world.passage_by_id()
    bridges = [r for records in hard_world.splits.values() for r in records
               if r["type"] == "bridge"]
    assert bridges
    for r in bridges:
        first, second = r["supporting_ids"]
        for own, other in ((first, second), (second, first)):
            name = by_id[other]["title"]
            for n in hard_world.namesakes[own]:
                assert not _word(name, by_id[n]["title"] + " " + by_id[n]["text"]), (r, by_id[n])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"distractor_share": -0.1}, "distractor_share must be a number from 0 to 0.9"),
        ({"distractor_share": 0.95}, "distractor_share must be a number from 0 to 0.9"),
        ({"distractor_share": math.nan}, "distractor_share must be a number"),
        ({"distractor_share": "0.5"}, "distractor_share must be a number"),
        ({"distractor_share": True}, "distractor_share must be a number"),
        ({"n_passages": 60, "distractor_share": 0.5}, "leaves 30 of the 60 passages"),
        ({"namesakes_per_entity": -1}, "namesakes_per_entity must be an integer from 0 to 6"),
        ({"namesakes_per_entity": 7}, "namesakes_per_entity must be an integer from 0 to 6"),
        ({"namesakes_per_entity": 1.5}, "namesakes_per_entity must be an integer"),
    ],
)
def test_invalid_hard_options_raise_clear_errors(overrides: dict, message: str) -> None:
    with pytest.raises(DemoWorldError, match=re.escape(message)):
        generate_demo_world(DemoWorldConfig(**{**SMALL.__dict__, **overrides}))


def test_distractor_share_changes_the_mix() -> None:
    world = generate_demo_world(DemoWorldConfig(**{**SMALL.__dict__, "distractor_share": 0.5}))
    assert world.stats["distractor_passages"] == 200


def test_cli_hard_preset_and_refusals(tmp_path: Path, capsys) -> None:
    out = tmp_path / "hard"
    args = ["data", "demo-world", "--out", str(out), "--n-passages", "60", "--n-train", "4",
            "--n-dev", "2", "--n-test", "2", "--seed", "3"]
    assert cli_main([*args, "--hard"]) == 0
    meta = json.loads((out / "world.json").read_text())
    assert meta["config"]["namesakes_per_entity"] == 3 and "distractor_share" not in meta["config"]
    assert meta["namesake_passages"] == 27 and meta["passages"] == 61 + 27
    assert "27 namesakes of 9 asked entities" in capsys.readouterr().out
    assert cli_main([*args, "--hard", "--namesakes-per-entity", "1"]) == 0
    assert json.loads((out / "world.json").read_text())["namesake_passages"] == 9
    before = _files_bytes(out)
    assert cli_main([*args, "--distractor-share", "2"]) == 2
    assert cli_main([*args, "--namesakes-per-entity", "9"]) == 2
    err = capsys.readouterr().err
    assert "nothing was written" in err and "distractor_share must be" in err
    assert "namesakes_per_entity must be" in err
    assert _files_bytes(out) == before
    fresh = tmp_path / "never"
    assert cli_main(["data", "demo-world", "--out", str(fresh), "--distractor-share", "1"]) == 2
    assert not fresh.exists()
