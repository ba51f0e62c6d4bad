"""bench/selector_exploration.py: what the Selector's rollouts sample at each temperature. Its
figures against hand-computed values, its shared-prompt decoding against a plain ``generate``,
and a run on the tiny model."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from tests.bench_fixtures import load_bench

bench = load_bench("selector_exploration")


def test_spread_is_the_population_standard_deviation() -> None:
    assert bench.spread([1.0, 1.0, 1.0]) == 0.0
    # mean 0.5; squared deviations 0.25, 0.25 -> variance 0.25
    assert bench.spread([0.0, 1.0]) == pytest.approx(0.5)
    assert bench.spread([0.0, 0.0, 1.0, 1.0]) == pytest.approx(0.5)


def test_a_temperature_is_summarised_by_hand() -> None:
    questions = [
        # greedy the top two (F1 0.5); samples: the greedy twice, then the gold alone (F1 1)
        {"k": 3, "greedy": [0, 1], "greedy_f1": 0.5,
         "T=1": {"selections": [[0, 1], [0, 1], [1]], "f1": [0.5, 0.5, 1.0]}},
        # greedy the top one (F1 1); every sample the same: no variance, nothing beats greedy
        {"k": 3, "greedy": [0], "greedy_f1": 1.0,
         "T=1": {"selections": [[0], [0], [0]], "f1": [1.0, 1.0, 1.0]}},
        # no gold among the candidates: in the selection figures, out of the F1 ones
        {"k": 3, "greedy": [0], "greedy_f1": None,
         "T=1": {"selections": [[2], [0, 2], [0]], "f1": None}},
    ]
    got = bench.summarise_temperature(questions, "T=1")
    assert got["samples"] == 9
    assert got["documents"] == pytest.approx(12 / 9, abs=1e-4)  # 2+2+1 + 1+1+1 + 1+2+1
    # position 0 in 7 of 9 samples, 1 in 3, 2 in 2
    assert got["inclusion_by_position"] == pytest.approx([7 / 9, 3 / 9, 2 / 9], abs=1e-4)
    # the greedy selection: 2 + 3 + 1 samples
    assert got["greedy_share"] == pytest.approx(6 / 9, abs=1e-4)
    assert got["most_common"] == {"Document0": 4, "Document0,Document1": 2, "Document1": 1,
                                  "Document2": 1, "Document0,Document2": 1}
    assert got["selection_f1"] == pytest.approx(5.0 / 6, abs=1e-4)  # (2 + 3) / 6
    assert got["best_of_samples"] == pytest.approx(1.0)
    assert got["zero_variance_questions"] == pytest.approx(0.5)
    # the first question's spread: mean 2/3, deviations -1/6, -1/6, 1/3 -> sqrt(1/18)
    assert got["within_question_sd"] == pytest.approx(math.sqrt(1 / 18) / 2, abs=1e-4)
    assert got["beats_greedy_questions"] == pytest.approx(0.5)


def test_shared_prompt_decoding_equals_a_plain_generate(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompt = [5, 9, 14, 3, 7, 21, 40, 11]
    kwargs = {"max_new_tokens": 6, "do_sample": False, "eos_token_id": [2], "pad_token_id": 0}
    cache = bench.prefill(model, prompt)
    got = bench.shared_prompt_generate(model, prompt, cache, 3, **kwargs)
    # the cache is left as it was: a second call decodes the same
    assert bench.shared_prompt_generate(model, prompt, cache, 1, **kwargs) == got[:1]
    with torch.no_grad():
        plain = model.generate(input_ids=torch.tensor([prompt]),
                               attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               **kwargs)[0, len(prompt):].tolist()
    want = plain[:plain.index(2) + 1] if 2 in plain else plain
    assert got == [want, want, want]


def _predictions(tiny_world_dir: Path, path: Path) -> None:
    dev = [json.loads(line) for line in (tiny_world_dir / "dev.jsonl").open()][:3]
    corpus = [json.loads(line) for line in (tiny_world_dir / "corpus.jsonl").open()]
    gold_ids = {pid for record in dev for pid in record["supporting_ids"]}
    others = [d["id"] for d in corpus if d["id"] not in gold_ids][:2]
    with path.open("w") as handle:
        for record in dev:
            ids = [record["supporting_ids"][0], *others, *record["supporting_ids"][1:]]
            handle.write(json.dumps({
                "id": record["id"], "question": record["question"],
                "candidates": [{"index": i, "id": pid, "subquestion": 0, "rank": i}
                               for i, pid in enumerate(ids)]}) + "\n")


def test_the_bench_on_the_tiny_model(tiny_model_dir: Path, tiny_world_dir: Path,
                                     tmp_path: Path) -> None:
    predictions = tmp_path / "predictions.jsonl"
    _predictions(tiny_world_dir, predictions)
    args = argparse.Namespace(model=str(tiny_model_dir), template="llama3",
                              predictions=str(predictions),
                              corpus=str(tiny_world_dir / "corpus.jsonl"),
                              data_file=str(tiny_world_dir / "dev.jsonl"), max_questions=None,
                              temperatures=[0.01, 2.0], samples=4, top_p=1.0,
                              max_new_tokens=12, seed=1, precision="fp32", use_cpu=True,
                              json_out=None)
    result = bench.measure(args)
    assert result["questions"] == 3 and result["questions_with_gold_candidates"] == 3
    for row in result["per_question"]:
        assert row["gold"][0] and not any(row["gold"][1:3])  # as the file was written
        assert all(0 <= i < row["k"] for i in row["greedy"])
        for key in ("T=0.01", "T=2"):
            assert len(row[key]["selections"]) == 4 == len(row[key]["f1"])
            assert all(0.0 <= f <= 1.0 for f in row[key]["f1"])
    # at T = 0.01 sampling is the greedy choice: the shared-prompt sampling and the greedy
    # decoding see the same distribution
    cold = result["temperatures"]["0.01"]
    assert cold["greedy_share"] == 1.0 and cold["zero_variance_questions"] == 1.0
    assert cold["beats_greedy_questions"] == 0.0
    assert cold["selection_f1"] == result["greedy"]["selection_f1"]
    assert sum(result["temperatures"]["2"]["most_common"].values()) <= 12
    assert "beats greedy" in bench.table(result)


def test_bad_options_are_one_line_errors(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    present = tmp_path / "x.jsonl"
    present.write_text("")
    base = ["--model", str(tmp_path), "--predictions", str(present), "--corpus", str(present),
            "--data-file", str(present)]
    for extra, name in ((["--samples", "1"], "--samples"),
                        (["--temperatures", "0.5", "0"], "--temperatures"),
                        (["--top-p", "1.5"], "--top-p"),
                        (["--max-new-tokens", "0"], "--max-new-tokens")):
        with pytest.raises(SystemExit) as stopped:
            bench.parse_args([*base, *extra])
        assert stopped.value.code == 2
        assert name in capsys.readouterr().err
