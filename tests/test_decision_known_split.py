"""The decision agent's known/world splits: measured on train and dev, never on test.

The split logic is checked with an answerer whose knowledge is known exactly (it knows the
capitals and nothing else), so which questions must be ``known`` can be said in advance; the
real zero-shot answerer (the tiny model through the decision pipeline's ``never`` policy) is
checked to run through the same code and to be asked nothing from the test part.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from mmoa.data.loaders import load_qa
from mmoa_demo.general_knowledge import CAPITALS, general_knowledge_questions
from mmoa_demo.known_split import (
    KnownSplitConfig,
    answered,
    build_known_split,
    model_answerer,
    split_pool,
    write_known_split,
)

CAPITAL_OF = {f"What is the capital of {country}?": capital for country, capital in CAPITALS}


class CapitalsOnly:
    """Answers the capital questions right and everything else wrong; records what it was
    asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, questions: Sequence[str]) -> list[str]:
        self.asked += questions
        return [CAPITAL_OF.get(q, "no idea") for q in questions]


def test_the_pool_is_split_per_category_disjoint_and_seeded() -> None:
    pool = general_knowledge_questions()
    assert len(pool) >= 150 and len({q.id for q in pool}) == len(pool)
    parts = split_pool(pool, KnownSplitConfig(seed=3))
    ids = [q.id for part in parts.values() for q in part]
    assert sorted(ids) == sorted(q.id for q in pool), "disjoint and complete"
    categories = {q.category for q in pool}
    assert {q.category for q in parts["dev"]} == categories == {q.category for q in parts["test"]}
    assert split_pool(pool, KnownSplitConfig(seed=3)) == parts
    assert split_pool(pool, KnownSplitConfig(seed=4)) != parts


def test_known_is_measured_on_train_and_dev_and_chosen_for_test_on_dev(
        tiny_world_dir: Path, tmp_path: Path) -> None:
    pool = general_knowledge_questions()
    world = {s: load_qa(tiny_world_dir / f"{s}.jsonl", "demo")[:5] for s in ("train", "dev",
                                                                             "test")}
    answerer = CapitalsOnly()
    config = KnownSplitConfig(seed=1)
    splits, report = build_known_split(pool, world, answerer, config)
    parts = split_pool(pool, config)
    assert set(answerer.asked) == {q.question for q in parts["train"] + parts["dev"]}
    assert not set(answerer.asked) & {q.question for q in parts["test"]}, "test never asked"
    for split in ("train", "dev", "test"):
        known = [r for r in splits[split] if r.group == "known"]
        worlds = [r for r in splits[split] if r.group == "world"]
        expected = {q.id for q in parts[split] if q.category == "capital"}
        assert {r.id for r in known} == expected
        assert [r.id for r in worlds] == [r.id for r in world[split]] or \
            sorted(r.id for r in worlds) == sorted(r.id for r in world[split])
        assert report["counts"][split] == {"known": len(expected), "world": 5}
    assert report["dev_accuracy_by_category"]["capital"] == 1.0
    assert report["dev_accuracy_by_category"]["element"] == 0.0
    assert report["test_categories_chosen_on_dev"] == ["capital"]

    out = write_known_split(splits, report, tmp_path / "mixed")
    again = load_qa(out / "test.jsonl", "auto")
    assert [(r.id, r.group) for r in again] == [(r.id, r.group) for r in splits["test"]]
    assert (out / "known_split.json").is_file()
    with pytest.raises(ValueError, match="correct_metric"):
        build_known_split(pool, world, answerer, KnownSplitConfig(correct_metric="acc"))
    with pytest.raises(ValueError, match="correct_metric"):
        build_known_split(pool, world, answerer, KnownSplitConfig(correct_metric="f1"))


def test_answered_needs_the_whole_gold_words() -> None:
    assert answered("The capital is Paris.", ["Paris"])
    assert answered("It is Addis Ababa", ["Addis Ababa"])
    assert answered("I do not know", ["I"]), "the word I is there: a whole-word hit"
    assert not answered("I do not know", ["N"]), "no substring hits inside words"
    assert not answered("Ababa Addis", ["Addis Ababa"])
    assert answered("Paris", ["Paris"], metric="em")
    assert not answered("The capital is Paris", ["Paris"], metric="em")


def test_the_zero_shot_answerer_is_the_decision_prompt_closed_book(
        tiny_model_dir: Path) -> None:
    answer = model_answerer(str(tiny_model_dir), "llama3", batch_size=2, max_new_tokens=4,
                            progress=False)
    predictions = answer(["What is the capital of France?", "Who wrote Hamlet?",
                          "What is the largest planet in the solar system?"])
    assert len(predictions) == 3 and all(isinstance(p, str) for p in predictions)


def test_the_command_defaults_are_the_configs_and_valid() -> None:
    """`mmoa-cli data known-split` with only the required flags builds a valid config (its
    default metric once named one that the validation refused)."""
    import argparse

    from mmoa_demo.known_split import KnownSplitConfig, add_known_split_arguments

    parser = argparse.ArgumentParser()
    add_known_split_arguments(parser)
    args = parser.parse_args(["--model_name_or_path", "m"])
    config = KnownSplitConfig(seed=args.seed, correct_metric=args.correct_metric,
                              min_category_accuracy=args.min_category_accuracy)
    config.validate()
    assert config == KnownSplitConfig()
