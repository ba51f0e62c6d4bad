"""The per-agent MAPPO statistics (mmoa.train.mappo.agent_stats, the learner's per-agent KL and
entropy) and the drift monitor, on hand-made traces and tensors: no model. Expected values are
worked out by hand in the comments."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mmoa import defaults
from mmoa.agents.candidates import Candidate
from mmoa.agents.parsers import parse_answer
from mmoa.agents.pipeline import AgentCall, Trace
from mmoa.agents.prompts import selector_prompt
from mmoa.data.records import QARecord
from mmoa.train.mappo.agent_stats import (
    DRIFT_FLAGS_KEY,
    DRIFT_RULES,
    DriftMonitor,
    DriftRule,
    answer_words,
    candidate_gold_recall,
    empty_selection_stats,
    selection_gold_stats,
    step_agent_stats,
)
from mmoa.train.mappo.learner import (
    PPOLearner,
    Rollout,
    agent_token_sums,
    fold_agent_token_means,
)
from mmoa.train.mappo.samples import Sample, collate


def candidate(doc_id: str, title: str = "T") -> Candidate:
    return Candidate({"id": doc_id, "contents": f"{title}\nsome text"}, subquestion=0, rank=0)


def trace(ids: list[str], selected: list[int], answer: str = "**Paris**") -> Trace:
    return Trace(question="q", subquestions=["q"], candidates=[candidate(i) for i in ids],
                 selected=selected, answer=parse_answer(answer).answer,
                 answer_parse=parse_answer(answer))


def record(gold: list[str] | None, titles: list[str] | None = None) -> QARecord:
    return QARecord(id="r", question="q", answers=["Paris"], supporting_ids=gold,
                    supporting_titles=titles)


# -- the statistics ------------------------------------------------------------------------------

def test_selection_recall_and_precision_against_the_gold_passages() -> None:
    # candidates p1..p5, gold {p1, p3, p9}; selected p1, p2 -> 1 of 3 gold found, 1 of 2 is gold
    t = trace(["p1", "p2", "p3", "p4", "p5"], [0, 1])
    assert selection_gold_stats(record(["p1", "p3", "p9"]), t) == (pytest.approx(1 / 3), 0.5)
    # nothing selected: every gold passage is missing (recall 0), precision has no value
    assert selection_gold_stats(record(["p1"]), trace(["p1"], [])) == (0.0, None)
    # no gold at all: neither
    assert selection_gold_stats(record(None), t) == (None, None)
    # gold by title when the record has no ids (HotpotQA), compared normalised
    titled = Trace(question="q", candidates=[candidate("x", "Paris"), candidate("y", "Rome")],
                   selected=[1])
    assert selection_gold_stats(record(None, ["paris", "Berlin"]), titled) == (0.0, 0.0)


def test_candidate_recall_counts_gold_among_all_k_candidates() -> None:
    # gold {p1, p3, p9} among p1..p5: p1 and p3 -> 2/3, whatever the Selector kept
    t = trace(["p1", "p2", "p3", "p4", "p5"], [1])
    assert candidate_gold_recall(record(["p1", "p3", "p9"]), t) == pytest.approx(2 / 3)
    assert candidate_gold_recall(record(None), t) is None


def test_answer_words_of_the_extracted_answer() -> None:
    assert answer_words(trace(["p1"], [0], "The answer is **New York City**.")) == 3
    no_parse = Trace(question="q", answer="four words right here")
    assert answer_words(no_parse) == 4


def test_step_means_leave_out_records_without_gold() -> None:
    records = [record(["p1", "p2"]), record(None), record(["p3"])]
    traces = [trace(["p1", "p2", "p3"], [0], "**a b**"),  # sel recall 1/2, precision 1, cand 1
              trace(["p1"], [0], "**a b c d**"),           # no gold: words only
              trace(["p3", "p4"], [], "**a b c**")]        # sel recall 0, no precision, cand 1
    stats = step_agent_stats(records, traces)
    assert stats == pytest.approx({
        "selected_gold_recall": (0.5 + 0.0) / 2,
        "selected_gold_precision": 1.0,
        "candidate_gold_recall": (1.0 + 1.0) / 2,
        "answer_words": (2 + 4 + 3) / 3,
    })
    # no record of the step has gold: no gold key at all (not a 0 that looks like a collapse)
    assert step_agent_stats([record(None)], [trace(["p1"], [0])]) == {"answer_words": 1.0}
    with pytest.raises(ValueError, match="2 records for 1 traces"):
        step_agent_stats([record(None)] * 2, [trace(["p1"], [0])])


def test_empty_selection_stats_average_the_selector_calls_that_recorded_them() -> None:
    def with_selector(probability: float | None, greedy_stop: bool | None) -> Trace:
        t = trace(["p1", "p2"], [0])
        t.calls["selector"] = AgentCall("selector", selector_prompt("q", ["a", "b"]), [1], [2],
                                        "Document0", opening_stop_probability=probability,
                                        opening_greedy_stop=greedy_stop)
        return t

    # 0.1, 0.7 and 0.4 -> 0.4; greedy stops at one of three -> 1/3; a call without a mask
    # (None) and a trace without a Selector call count in neither
    traces = [with_selector(0.1, False), with_selector(0.7, True), with_selector(0.4, False),
              with_selector(None, None), trace(["p1"], [0])]
    stats = step_agent_stats([record(None)] * 5, traces)
    assert stats["empty_selection_probability"] == pytest.approx(0.4)
    assert stats["greedy_empty_rate"] == pytest.approx(1 / 3)
    assert empty_selection_stats([trace(["p1"], [0])]) == {
        "empty_selection_probability": None, "greedy_empty_rate": None}


# -- per-agent KL and entropy (learner) ------------------------------------------------------------

def test_agent_token_sums_and_means_over_mini_batches() -> None:
    # two samples of qr, one of selector; 2 and 3 real tokens; padding holds inf (never counted)
    samples = [Sample("qr", [1], [5, 6], 0.0), Sample("selector", [1], [5, 6, 7], 0.0)]
    values = torch.tensor([[1.0, 3.0, float("inf")], [2.0, 2.0, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    sums = agent_token_sums("entropy", samples, values, mask)
    assert sums == {"entropy/qr:token_sum": 4.0, "entropy/qr:tokens": 2.0,
                    "entropy/selector:token_sum": 9.0, "entropy/selector:tokens": 3.0}
    # a second mini-batch with one qr sample of 1 token, value 7: qr (4 + 7) / (2 + 1) = 11/3,
    # not the mean of the mini-batch means (2 + 7) / 2; selector 9 / 3 = 3
    stats = {"entropy": [1.0, 2.0], **{k: [v] for k, v in sums.items()}}
    stats["entropy/qr:token_sum"].append(7.0)
    stats["entropy/qr:tokens"].append(1.0)
    assert fold_agent_token_means(stats) == pytest.approx({"entropy/qr": 11 / 3,
                                                           "entropy/selector": 3.0})
    assert stats == {"entropy": [1.0, 2.0]}, "the sums are taken out of the statistics"


def test_agent_kl_is_the_per_token_mean_over_each_agents_tokens() -> None:
    samples = [Sample("qr", [1], [5, 6], 0.0), Sample("generator", [1, 2], [7], 0.0),
               Sample("qr", [1], [8], 0.0)]
    batch = collate(samples, pad_id=0)
    # k1 = old - ref per token; qr: (0.5 + 0.1) + (-0.2) over 3 tokens = 0.4 / 3;
    # generator: 1.0 over 1 token; the padded positions differ wildly and count for nothing
    old = torch.tensor([[-1.0, -2.0], [-0.5, 9.0], [-1.2, -9.0]])
    ref = torch.tensor([[-1.5, -2.1], [-1.5, 0.0], [-1.0, 9.0]])
    rollout = Rollout(samples, batch, old, ref, None, None, None, torch.zeros_like(old), None)
    assert PPOLearner.agent_kl(rollout) == pytest.approx({"kl/qr": 0.4 / 3,
                                                          "kl/generator": 1.0})
    no_reference = Rollout(samples, batch, old, None, None, None, None, old, None)
    assert PPOLearner.agent_kl(no_reference) == {}


def test_a_key_only_some_processes_log_is_their_mean() -> None:
    """Two processes: this one logs a and b, the other only a (its gold-less questions): a is
    the mean of both, b this process's value, and both reduce the same vector."""
    from mmoa.train.mappo.trainer import MappoTrainer

    other = {"a": 3.0}
    reduced: list[torch.Tensor] = []

    def reduce(tensor: torch.Tensor, reduction: str) -> torch.Tensor:
        assert reduction == "sum"
        keys = ["a", "b"]
        theirs = torch.tensor([[other.get(k, 0.0), float(k in other)] for k in keys],
                              dtype=tensor.dtype)
        reduced.append(tensor)
        return tensor + theirs

    fake = SimpleNamespace(args=SimpleNamespace(world_size=2),
                           accelerator=SimpleNamespace(device="cpu", reduce=reduce))
    import accelerate.utils

    original = accelerate.utils.gather_object
    accelerate.utils.gather_object = lambda keys: [*keys, *sorted(other)]
    try:
        out = MappoTrainer._mean_over_processes(fake, {"a": 1.0, "b": 5.0})  # type: ignore[arg-type]
    finally:
        accelerate.utils.gather_object = original
    assert out == {"a": 2.0, "b": 5.0}
    assert reduced[0].shape == (2, 2)


# -- the drift monitor -----------------------------------------------------------------------------

def test_thresholds_come_from_the_defaults() -> None:
    by_key = {rule.key: rule for rule in DRIFT_RULES}
    assert by_key["num_selected"].threshold == defaults.DRIFT_SELECTED_FRACTION == 0.5
    assert by_key["selected_gold_recall"].threshold == defaults.DRIFT_RECALL_DROP == 0.20
    assert by_key["candidate_gold_recall"].threshold == defaults.DRIFT_RECALL_DROP
    assert by_key["answer_words"].threshold == defaults.DRIFT_ANSWER_WORDS_RATIO == 2.0
    assert by_key["kl/selector"].threshold == defaults.DRIFT_NEGATIVE_KL == -0.1
    assert by_key["empty_selection_probability"].threshold \
        == defaults.DRIFT_EMPTY_SELECTION_RISE == 0.20
    assert {rule.key: rule.agent for rule in DRIFT_RULES} == {
        "num_selected": "selector", "selected_gold_recall": "selector",
        "candidate_gold_recall": "qr", "answer_words": "generator",
        "empty_selection_probability": "selector",
        "kl/qr": "qr", "kl/selector": "selector", "kl/generator": "generator"}


def test_each_rule_at_its_threshold() -> None:
    half = DriftRule("selector", "num_selected", "fraction_at_most", 0.5)
    assert not half.crossed(4.9, 2.46) and half.crossed(4.9, 2.45) and half.crossed(4.9, 1.0)
    assert not half.crossed(0.0, 0.0), "half of no documents says nothing"
    drop = DriftRule("selector", "selected_gold_recall", "drop_over", 0.2)
    assert not drop.crossed(0.76, 0.57) and drop.crossed(0.76, 0.55)  # 19 vs 21 points
    assert not drop.crossed(0.5, 0.9), "a rise is no drop"
    double = DriftRule("generator", "answer_words", "ratio_at_least", 2.0)
    assert not double.crossed(2.0, 3.9) and double.crossed(2.0, 4.0)
    assert not double.crossed(0.0, 5.0)
    negative = DriftRule("selector", "kl/selector", "below", -0.1)
    assert not negative.crossed(0.0, -0.1) and negative.crossed(0.0, -0.11)
    assert negative.crossed(0.3, -0.63), "an absolute floor: the baseline does not matter"
    assert negative.describe() == "fell below -0.1"
    empty = DriftRule("selector", "empty_selection_probability", "rise_over", 0.2)
    assert not empty.crossed(0.014, 0.21) and empty.crossed(0.014, 0.26)  # 19.6 vs 24.6 points
    assert not empty.crossed(0.5, 0.1), "a fall is no rise"
    assert empty.describe() == "rose by more than 20 points"


def test_the_monitor_warns_once_per_statistic_and_counts_flags_every_step() -> None:
    monitor = DriftMonitor()
    first = {"num_selected": 4.92, "selected_gold_recall": 0.76, "candidate_gold_recall": 0.77,
             "answer_words": 2.0, "reward": 0.4}
    report = monitor.observe(1, first)
    assert report is not None and report.flags == 0 and report.warnings == []
    assert monitor.baselines == {"num_selected": 4.92, "selected_gold_recall": 0.76,
                                 "candidate_gold_recall": 0.77, "answer_words": 2.0}
    # step 2: the Selector halves (2.4 <= 2.46) and its recall drops 0.76 -> 0.5 (26 points);
    # candidate recall drops 15 points (not flagged), answer words 3.9 < 4 (not flagged)
    report = monitor.observe(2, {**first, "num_selected": 2.4, "selected_gold_recall": 0.5,
                                 "candidate_gold_recall": 0.62, "answer_words": 3.9})
    assert report is not None and report.flags == 2
    assert report.warnings == [
        "[mappo] step 2: drift: selector num_selected 4.92 -> 2.4 (fell to 0.5 x the first "
        "step's or less; warned once per run)",
        "[mappo] step 2: drift: selector selected_gold_recall 0.76 -> 0.5 (fell by more than "
        "20 points; warned once per run)"]
    # step 3: still collapsed, and now the answers doubled: counted again, warned only for
    # the new one
    report = monitor.observe(3, {**first, "num_selected": 1.0, "selected_gold_recall": 0.37,
                                 "answer_words": 4.0})
    assert report is not None and report.flags == 3
    assert len(report.warnings) == 1
    assert report.warnings[0].startswith("[mappo] step 3: drift: generator answer_words 2 -> 4 ")
    # step 4: recovered: no flag, no warning, baselines unchanged
    report = monitor.observe(4, first)
    assert report is not None and (report.flags, report.warnings) == (0, [])
    assert monitor.baselines["num_selected"] == 4.92


def test_the_monitor_ignores_what_is_not_logged() -> None:
    monitor = DriftMonitor()
    assert monitor.observe(1, {"reward": 1.0, "loss": 0.3}) is None  # another pipeline
    # gold recall first appears at step 2 (step 1 had no gold): that is its baseline
    assert monitor.observe(1, {"num_selected": 5.0, "selected_gold_recall": float("nan")}
                           ).flags == 0  # type: ignore[union-attr]
    assert "selected_gold_recall" not in monitor.baselines
    monitor.observe(2, {"num_selected": 5.0, "selected_gold_recall": 0.4})
    assert monitor.baselines["selected_gold_recall"] == 0.4


def test_a_resumed_run_keeps_its_baselines_and_does_not_warn_again() -> None:
    history = [{"step": 1, "num_selected": 5.0, "loss": 1.0},
               {"step": 2, "num_selected": 2.0, DRIFT_FLAGS_KEY: 1.0},
               {"train_runtime": 3.0, "step": 2}]
    monitor = DriftMonitor()
    monitor.replay(history)
    assert monitor.baselines == {"num_selected": 5.0} and monitor.warned == {"num_selected"}
    report = monitor.observe(3, {"num_selected": 1.0})
    assert report is not None and (report.flags, report.warnings) == (1, [])


# -- the web UI's log ---------------------------------------------------------------------------

def test_the_trainer_log_lines_carry_the_per_agent_keys(tmp_path: Path) -> None:
    from mmoa.train.mappo.log_callback import MappoLogCallback

    callback = MappoLogCallback(curve_keys=["loss", "answer_f1", "value_loss"])
    args = SimpleNamespace(should_save=True, output_dir=str(tmp_path))
    state = SimpleNamespace(max_steps=2, global_step=0, log_history=[], num_input_tokens_seen=0)
    callback.on_train_begin(args, state, None)
    for step, selected in ((1, 4.9), (2, 1.0)):
        state.global_step = step
        state.log_history.append({"loss": 0.5, "reward": 0.3, "num_selected": selected,
                                  "kl/selector": 0.01 * step, "time/step": 9.0, "step": step,
                                  "answer_f1": 0.25 * step, "value_loss": 0.1,
                                  "selection_reward/selector": 0.2 * step,
                                  "cf_beat/qr": 0.125 * step, "cf_gain/qr": 0.01})
        callback.on_log(args, state, None)
    callback.on_train_end(args, state, None)
    lines = [json.loads(line) for line in (tmp_path / "trainer_log.jsonl").read_text()
             .splitlines()]
    assert [(e["current_steps"], e["num_selected"], e["kl/selector"], e["answer_f1"])
            for e in lines] == [(1, 4.9, 0.01, 0.25), (2, 1.0, 0.02, 0.5)]
    assert all(e["value_loss"] == 0.1 for e in lines)
    assert all("time/step" not in e and e["loss"] == 0.5 for e in lines)
    # the agents' credit (the credit panel's keys) too, while the run trains
    assert [(e["selection_reward/selector"], e["cf_beat/qr"]) for e in lines] == [
        (0.2, 0.125), (0.4, 0.25)]
    assert all("cf_gain/qr" not in e for e in lines)  # no panel draws it
