"""bench/selector_discrimination.py: whether the Selector's preference over its selections
depends on the documents or only on their positions. Its formulas against hand-computed
values, its cached scoring against a plain forward pass, and a run on the tiny model."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from tests.bench_fixtures import load_bench

bench = load_bench("selector_discrimination")


def test_canonical_selections_are_every_subset_ascending_empty_first() -> None:
    assert bench.canonical_selections(3) == [
        (), (0,), (1,), (2,), (0, 1), (0, 2), (1, 2), (0, 1, 2)]
    assert len(bench.canonical_selections(5)) == 32


def test_inclusion_is_the_mass_of_the_selections_holding_each_candidate() -> None:
    selections = [(), (0,), (1,), (0, 1)]
    q = bench.normalise([math.log(0.1), math.log(0.2), math.log(0.3), math.log(0.4)])
    assert q == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert bench.inclusion(selections, q, 2) == pytest.approx([0.6, 0.7])


def test_auc_counts_ties_half() -> None:
    # pairs: .9>.5, .9>.1, .5=.5 (half), .5>.1 -> 3.5 of 4
    assert bench.auc([0.9, 0.5], [0.5, 0.1]) == pytest.approx(0.875)
    assert bench.auc([0.2], [0.2]) == pytest.approx(0.5)
    assert bench.auc([], [0.3]) is None


def test_stratified_auc_weights_positions_by_their_pairs() -> None:
    scores = [[0.9, 0.2, 0.5], [0.4, 0.6, 0.5], [0.8, 0.7, 0.5]]
    gold = [[True, False, True], [False, True, True], [True, False, True]]
    # position 0: gold .9 .8 vs .4 -> 1.0 over 2 pairs; position 1: gold .6 vs .2 .7 -> 0.5 over
    # 2 pairs; position 2: all gold, no pair, no weight -> (2 * 1.0 + 2 * 0.5) / 4
    value, per_position = bench.stratified_auc(scores, gold)
    assert value == pytest.approx(0.75)
    assert [p["auc"] for p in per_position] == [1.0, 0.5, None]
    assert [(p["gold"], p["other"]) for p in per_position] == [(2, 1), (1, 2), (3, 0)]


def test_the_marginal_rule_keeps_the_candidates_at_or_above_the_threshold() -> None:
    assert bench.marginal_selection([0.9, 0.5, 0.49, 0.7], 0.5) == [0, 1, 3]
    assert bench.marginal_selection([0.2, 0.1], 0.5) == []


def test_a_rule_is_summarised_by_precision_recall_and_its_most_common_choice() -> None:
    gold = [[True, False, True], [False, True, False], [True, False, False]]
    summary = bench.selection_summary([[0], [0, 1], [0]], gold)
    # precision 1, 1/2, 1 -> 5/6; recall 1/2, 1, 1 -> 5/6; documents 4/3; "Document0" twice
    assert summary["precision"] == pytest.approx(0.8333, abs=1e-4)
    assert summary["recall"] == pytest.approx(0.8333, abs=1e-4)
    assert summary["documents"] == pytest.approx(1.333, abs=1e-3)
    assert summary["choices"] == {"Document0": 2, "Document0,Document1": 1}
    assert summary["most_common_share"] == pytest.approx(0.6667, abs=1e-4)
    assert bench.selection_summary([[], [1]], [[True], [False, True]])["precision"] == 1.0


def test_title_overlap_is_the_share_of_the_title_words_the_question_holds() -> None:
    question = "Are Cardinal Health and Kansas City Southern located in the same state?"
    assert bench.title_overlap(question, "Kansas City Southern") == 1.0
    # "Kansas City Southern Railway": 3 of its 4 content words are in the question
    assert bench.title_overlap(question, "Kansas City Southern Railway") == pytest.approx(0.75)
    # stop words and punctuation do not count: "The" and "(" are dropped, "Health" matches
    assert bench.title_overlap(question, "The Health (magazine)") == pytest.approx(0.5)
    assert bench.title_overlap(question, "Of the") == 0.0
    # "and" and "no" are stop words, "4" has one letter
    assert bench.content_words("Hook and Ladder No. 4") == {"hook", "ladder"}


def test_the_title_rule_keeps_full_matches_else_the_top_candidate() -> None:
    assert bench.title_rule_selection([0.5, 1.0, 0.0, 1.0]) == [1, 3]
    assert bench.title_rule_selection([0.5, 0.9]) == [0]


def test_the_title_reference_reads_the_documents_without_a_model() -> None:
    overlaps = [[1.0, 0.0, 1.0], [0.5, 1.0, 0.0]]
    gold = [[True, False, True], [False, True, False]]
    reference = bench.title_reference(overlaps, gold)
    # position 0: gold 1.0 vs 0.5; position 1: gold 1.0 vs 0.0; position 2: gold 1.0 vs 0.0
    assert reference["content_auc"] == 1.0
    # rule: [0, 2] (both gold) and [1] (gold): precision 1, recall 1
    assert reference["rule"]["choices"] == {"Document0,Document2": 1, "Document1": 1}
    assert reference["rule"]["precision"] == 1.0 and reference["rule"]["recall"] == 1.0


def test_a_candidate_title_comes_from_the_title_field_else_the_first_line() -> None:
    from mmoa.agents.candidates import Candidate

    assert bench.candidate_title(Candidate({"title": "Pittosporum", "text": "x"}, 0, 0)) \
        == "Pittosporum"
    assert bench.candidate_title(Candidate("Descolea\nDescolea is a genus", 0, 0)) == "Descolea"


def test_precision_and_recall_of_a_selection() -> None:
    gold = [True, False, True, False]
    assert bench.precision_recall([0, 1], gold) == (0.5, 0.5)
    assert bench.precision_recall([], gold) == (None, 0.0)
    assert bench.precision_recall([1], [False, False]) == (0.0, None)


def test_cached_scoring_equals_a_plain_forward_pass(tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompt = [5, 9, 14, 3, 7, 21]
    responses = [[4], [8, 12, 2], [30, 31]]
    # chunk 2: the second chunk copies the prompt's cache again
    got = bench.response_logprobs(model, prompt, responses, chunk=2)
    with torch.no_grad():
        for response, value in zip(responses, got, strict=True):
            ids = torch.tensor([prompt + response])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
            want = sum(float(logp[len(prompt) - 1 + t, tok]) for t, tok in enumerate(response))
            assert value == pytest.approx(want, abs=1e-4)


def test_the_bench_on_the_tiny_model(tiny_model_dir: Path, tiny_world_dir: Path,
                                     tmp_path: Path) -> None:
    dev = [json.loads(line) for line in (tiny_world_dir / "dev.jsonl").open()][:3]
    corpus = [json.loads(line) for line in (tiny_world_dir / "corpus.jsonl").open()]
    gold_ids = {pid for record in dev for pid in record["supporting_ids"]}
    others = [d["id"] for d in corpus if d["id"] not in gold_ids][:2]
    predictions = tmp_path / "predictions.jsonl"
    with predictions.open("w") as handle:
        for record in dev:
            ids = [record["supporting_ids"][0], *others, *record["supporting_ids"][1:]]
            row = {"id": record["id"], "question": record["question"],
                   "candidates": [{"index": i, "id": pid, "subquestion": 0, "rank": i}
                                  for i, pid in enumerate(ids)],
                   "selected_ids": [0]}
            handle.write(json.dumps(row) + "\n")
    args = argparse.Namespace(model=str(tiny_model_dir), template="llama3",
                              predictions=str(predictions),
                              corpus=str(tiny_world_dir / "corpus.jsonl"),
                              data_file=str(tiny_world_dir / "dev.jsonl"), max_questions=None,
                              thresholds=[0.5],
                              precision="fp32", use_cpu=True, json_out=None)
    result = bench.measure(args)
    assert result["questions"] == 3 and not result["skipped"]
    for row in result["per_question"]:
        k = row["k"]
        assert row["gold"][0] and not any(row["gold"][1:3])  # as the file was written
        assert all(0.0 <= m <= 1.0 for m in row["inclusion"]) and len(row["inclusion"]) == k
        assert 1 <= row["label_rank"] <= 2 ** k and 0.0 < row["label_p"] <= 1.0
        assert row["label"] == [i for i in range(k) if row["gold"][i]]
    assert result["content_auc"] is None or 0.0 <= result["content_auc"] <= 1.0
    assert sum(result["argmax"]["choices"].values()) == 3
    assert sum(result["marginal"]["0.5"]["choices"].values()) == 3
    assert result["top1"]["documents"] == 1.0
    assert sum(result["title_reference"]["rule"]["choices"].values()) == 3
    assert all(len(row["title_overlap"]) == row["k"] for row in result["per_question"])
    assert "content AUC" in bench.table(result)


def test_a_candidate_missing_from_the_corpus_is_refused(tiny_world_dir: Path) -> None:
    from mmoa.data.support import GoldSupport

    row = {"id": "q", "candidates": [{"id": "nowhere"}]}
    with pytest.raises(SystemExit):
        bench.question_inputs(row, {}, GoldSupport("id", frozenset({"x"})))


def test_missing_inputs_and_bad_thresholds_are_one_line_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    present = tmp_path / "x.jsonl"
    present.write_text("")
    base = ["--model", str(tmp_path), "--predictions", str(present), "--corpus", str(present),
            "--data-file", str(present)]
    with pytest.raises(SystemExit) as missing:
        bench.parse_args([*base[:2], "--predictions", str(tmp_path / "none.jsonl"), *base[4:]])
    assert missing.value.code == 2
    assert "--predictions" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.parse_args([*base, "--thresholds", "0.5", "1.5"])
    assert "--thresholds" in capsys.readouterr().err
