"""``bench/seed_table.py``: the seeds of a side-by-side table pooled, against hand-computed
figures, and the tables it refuses to pool."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.bench_fixtures import import_bench

TABLE = {"model": "smollm2", "base_model": "models/smollm2", "train_file": "train.json",
         "dev_file": "dev.json", "test_file": "test.json", "eval_split": "test",
         "eval_file": "test.json", "scoring": "hotpotqa", "max_eval": None}
#: Per-question F1 of the shared rows: the warm start, rag K = 5, rag K = 1 (the strongest).
SHARED = {"sft": {"q1": 0.0, "q2": 0.5, "q3": 1.0},
          "sft_rag": {"q1": 0.5, "q2": 0.5, "q3": 0.5},
          "sft_rag1": {"q1": 1.0, "q2": 0.0, "q3": 1.0}}
MAPPO = {1: {"q1": 1.0, "q2": 0.5, "q3": 1.0}, 2: {"q1": 0.5, "q2": 1.0, "q3": 1.0}}


@pytest.fixture(scope="module")
def seeds():
    return import_bench("seed_table")


def row(name: str, f1s: dict[str, float], key: str, **extra: Any) -> dict[str, Any]:
    values = list(f1s.values())
    return {"method": name, "label": name, "status": "ok", "key": key,
            "f1": sum(values) / len(values), "f1_se": 0.1, "em": 0.0,
            "per_question_f1": f1s, **extra}


def table_json(seed: int, mappo: dict[str, float] | None, **shared_keys: str) -> dict[str, Any]:
    rows = {name: row(name, f1s, shared_keys.get(name, f"k-{name}"))
            for name, f1s in SHARED.items()}
    rows["mappo"] = (row("mappo", mappo, f"k-mappo-{seed}", vs="sft", training={})
                     if mappo else {"method": "mappo", "status": "failed", "key": "x",
                                    "error": "killed"})
    return {"bench": "side_by_side", "table": dict(TABLE), "config": {"seed": seed},
            "order": list(rows), "rows": rows}


def test_two_seeds_pooled_by_hand(seeds):
    result = seeds.build({"a.json": table_json(1, MAPPO[1]), "b.json": table_json(2, MAPPO[2])},
                         ["sft_rag", "sft_rag1"])
    mappo = result["methods"]["mappo"]
    assert list(mappo["references"]) == ["sft", "sft_rag", "sft_rag1"]  # its vs row first
    # seed 1 - sft: (1, 0, 0) -> 1/3; seed 2 - sft: (0.5, 0.5, 0) -> 1/3
    assert mappo["seeds"]["1"]["paired"]["sft"]["gain"] == pytest.approx(1 / 3)
    assert mappo["seeds"]["2"]["paired"]["sft"]["gain"] == pytest.approx(1 / 3)
    # over rag K = 1: seed 1 (0, 0.5, 0) -> 1/6 > 0; seed 2 (-0.5, 1, 0) -> 1/6 > 0
    assert mappo["above"] == {"sft": 2, "sft_rag": 2, "sft_rag1": 2}
    # pooled: per question (0.75, 0.75, 1.0) - (1, 0, 1) = (-0.25, 0.75, 0)
    best = mappo["pooled_vs_strongest"]
    assert best["vs"] == "sft_rag1" and best["seeds"] == 2 and best["n"] == 3
    assert best["gain"] == pytest.approx(1 / 6)
    sd = math.sqrt(((-0.25 - 1 / 6) ** 2 + (0.75 - 1 / 6) ** 2 + (1 / 6) ** 2) / 2)
    assert best["gain_se"] == pytest.approx(sd / math.sqrt(3))  # 0.3005
    assert best["in_se"] == pytest.approx((1 / 6) / (sd / math.sqrt(3)))
    markdown = seeds.format_markdown(result)
    assert "| seeds above | | 2 of 2 | 2 of 2 | 2 of 2 |" in markdown
    assert "Pooled gain over the strongest reference (sft_rag1): +16.7 +- 30.0 F1" in markdown


def test_a_failed_seed_is_named_and_left_out(seeds):
    result = seeds.build({"a.json": table_json(1, MAPPO[1]), "b.json": table_json(2, None)},
                         ["sft_rag", "sft_rag1"])
    mappo = result["methods"]["mappo"]
    assert mappo["seeds_missing"] == [2] and list(mappo["seeds"]) == ["1"]
    assert mappo["pooled"]["sft_rag1"]["seeds"] == 1
    assert "no finished row for seeds [2]" in seeds.format_markdown(result)


def test_tables_that_cannot_be_pooled_are_refused(seeds, capsys):
    other = table_json(2, MAPPO[2])
    other["table"]["eval_split"] = "dev"
    with pytest.raises(SystemExit):
        seeds.build({"a.json": table_json(1, MAPPO[1]), "b.json": other}, [])
    assert "differ in eval_split" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        seeds.build({"a.json": table_json(1, MAPPO[1]), "b.json": table_json(1, MAPPO[2])}, [])
    assert "both ran seed 1" in capsys.readouterr().err
    retrained = table_json(2, MAPPO[2], sft="another-warm-start")
    with pytest.raises(SystemExit):
        seeds.build({"a.json": table_json(1, MAPPO[1]), "b.json": retrained}, [])
    assert "the row 'sft' differs" in capsys.readouterr().err


def test_the_command_writes_json_and_markdown(seeds, tmp_path):
    paths = []
    for seed in (1, 2):
        path = tmp_path / f"seed{seed}.json"
        path.write_text(json.dumps(table_json(seed, MAPPO[seed])))
        paths.append(str(path))
    seeds.main([*paths, "--json-out", str(tmp_path / "out.json"),
                "--markdown", str(tmp_path / "out.md")])
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["code"] and written["methods"]["mappo"]["above"]["sft_rag1"] == 2
    assert Path(tmp_path / "out.md").read_text().startswith("Seeds pooled: model smollm2")
