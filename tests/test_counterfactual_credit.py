"""The counterfactual credit per agent (``mappo_counterfactual_agents``): the defaults, the
reward replacement ``R - R_cf``, the per-agent group advantages, the logged statistics, the
keys' validation, and a learning test: a Selector trained with the credit learns a per-question
choice that beats its default."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from mmoa.agents.candidates import Candidate
from mmoa.agents.parsers import parse_answer, parse_selection, parse_subquestions
from mmoa.agents.pipeline import AgentCall, BatchTimings, Trace
from mmoa.data.records import QARecord
from mmoa.pipelines import get_pipeline
from mmoa.pipelines.counterfactual import (
    CF_GENERATOR_STAGE,
    CF_SELECTOR_STAGE,
    COUNTERFACTUAL_AGENTS,
    counterfactual_rewards,
    counterfactual_trace,
    default_selection,
    default_subquestions,
    run_counterfactuals,
    uses_default,
)
from mmoa.train.mappo.agent_stats import counterfactual_log_keys, counterfactual_stats
from mmoa.train.mappo.args import MappoArguments, split_mappo_args
from mmoa.train.mappo.grpo import PipelineOutcome, group_samples
from mmoa.train.mappo.rewards import compute_agent_rewards
from tests.mappo_fixtures import EOS, sample_responses, tiny_policy

QUESTION = "In which city was the director of The Lonely Bridge born?"
SUBQUESTION = "Who directed The Lonely Bridge?"


def _candidates(n: int, prefix: str = "p") -> list[Candidate]:
    return [Candidate({"id": f"{prefix}{i}", "contents": f"T{i}\ntext {i}"}, subquestion=0,
                      rank=i) for i in range(n)]


def _call(agent: str, response: Sequence[int] = (7, EOS)) -> AgentCall:
    return AgentCall(agent, None, [2, 3, 4], list(response), "")  # type: ignore[arg-type]


def _trace(question: str = QUESTION, subquestions: Sequence[str] = (SUBQUESTION,),
           selection: str = "Document0", answer: str = "**Kefield**", n_candidates: int = 3,
           selector_response: Sequence[int] = (7, EOS)) -> Trace:
    """A complete three-agent trace, as a rollout leaves it."""
    qr_text = "\n".join(subquestions)
    qr_parse = parse_subquestions(qr_text, question)
    selection_parse = parse_selection(selection, n_candidates)
    answer_parse = parse_answer(answer)
    return Trace(question=question, subquestions=qr_parse.subquestions,
                 candidates=_candidates(n_candidates), selected=selection_parse.ids,
                 answer=answer_parse.answer,
                 calls={"qr": _call("qr"), "selector": _call("selector", selector_response),
                        "generator": _call("generator")},
                 qr_parse=qr_parse, selection_parse=selection_parse, answer_parse=answer_parse)


# -- the defaults --------------------------------------------------------------------------------


def test_every_listed_agent_has_a_default_and_a_credit_curve() -> None:
    """``COUNTERFACTUAL_AGENTS`` (defined beside the statistics, so the training plots can name
    the agents without importing a pipeline) lists exactly the agents this module has a
    default for, and the per-agent figure draws each one's share beating its default."""
    from mmoa.train.plots import AGENT_PANELS

    for agent in COUNTERFACTUAL_AGENTS:
        assert isinstance(uses_default(agent, _trace(), "all"), bool)
        assert counterfactual_trace(agent, _trace(), "all").question == QUESTION
    with pytest.raises(ValueError, match="no counterfactual default for agent 'generator'"):
        uses_default("generator", _trace(), "all")
    credit = next(p for p in AGENT_PANELS if p.title == "credit per agent")
    drawn = {curve.key.split("/")[1] for curve in credit.curves if curve.key.startswith("cf_beat/")}
    assert drawn == set(COUNTERFACTUAL_AGENTS)
    assert get_pipeline("qr_s_g").counterfactual_agents == COUNTERFACTUAL_AGENTS


def test_the_selector_defaults_keep_every_candidate_or_the_top_one() -> None:
    assert default_selection(5, "all") == [0, 1, 2, 3, 4]
    assert default_selection(5, "top1") == [0]
    assert default_selection(0, "all") == [] and default_selection(0, "top1") == []
    with pytest.raises(ValueError, match="mappo_counterfactual_selector_default"):
        default_selection(5, "none")


def test_the_query_rewriters_default_is_the_question_alone() -> None:
    assert default_subquestions(QUESTION) == [QUESTION]
    rewritten = _trace()
    copied = _trace(subquestions=(QUESTION,))
    empty = _trace(subquestions=())  # nothing written: the parser falls back to the question
    assert not uses_default("qr", rewritten, "all")
    assert uses_default("qr", copied, "all") and uses_default("qr", empty, "all")
    cf = counterfactual_trace("qr", rewritten, "all")
    assert cf.question == QUESTION and cf.subquestions == [QUESTION]
    assert cf.candidates == [] and cf.calls == {}, "retrieval and the Selector still to run"


def test_the_selector_uses_its_default_only_with_the_same_ids_in_the_same_order() -> None:
    assert uses_default("selector", _trace(selection="Document0,Document1,Document2"), "all")
    assert not uses_default("selector", _trace(selection="Document1,Document0,Document2"),
                            "all"), "another order is another Generator prompt"
    assert not uses_default("selector", _trace(selection="Document0"), "all")
    assert uses_default("selector", _trace(selection="Document0"), "top1")
    assert not uses_default("selector", _trace(selection="Document1"), "top1")
    trace = _trace(selection="Document2")
    for default, ids in (("all", [0, 1, 2]), ("top1", [0])):
        cf = counterfactual_trace("selector", trace, default)
        assert cf.candidates == trace.candidates and cf.selected == ids
        assert cf.subquestions == trace.subquestions, "the Query Rewriter's output is kept"
        assert cf.answer == "" and cf.calls == {}, "the Generator still to run"
    with pytest.raises(ValueError, match="no counterfactual default for agent 'generator'"):
        uses_default("generator", trace, "all")


class FakeRagPipeline:
    """What :func:`run_counterfactuals` asks of a :class:`RagPipeline`: retrieval and the
    Selector over some traces, then the Generator over others; it records each call."""

    def __init__(self, answer_of: Any = None) -> None:
        self.calls: list[tuple[str, list[Trace]]] = []
        self.answer_of = answer_of or (lambda trace: f"**{len(trace.selected)} docs**")

    def retrieve_and_select(self, traces: list[Trace]) -> BatchTimings:
        self.calls.append(("retrieve_and_select", list(traces)))
        for trace in traces:
            trace.candidates = _candidates(4, prefix="q")
            trace.selected = [3]
        return BatchTimings(retrieve=0.25, selector=0.5)

    def answer(self, traces: list[Trace]) -> float:
        self.calls.append(("answer", list(traces)))
        for trace in traces:
            trace.answer_parse = parse_answer(self.answer_of(trace))
            trace.answer = trace.answer_parse.answer
        return 1.0


def test_the_counterfactuals_run_batched_and_only_where_the_output_is_not_the_default() -> None:
    traces = [_trace(),  # rewrites, selects one: both counterfactuals
              _trace(subquestions=(QUESTION,), selection="Document0,Document1,Document2"),
              _trace(subquestions=(QUESTION,), selection="Document1")]  # the Selector's only
    fake = FakeRagPipeline()
    timings = run_counterfactuals(fake, traces, ("qr", "selector"), "all")  # type: ignore[arg-type]
    assert set(traces[0].counterfactuals) == {"qr", "selector"}
    assert traces[1].counterfactuals == {}, "both outputs are their defaults: no generation"
    assert set(traces[2].counterfactuals) == {"selector"}
    # one retrieval + Selector stage for the Query Rewriter's defaults, then ONE Generator stage
    # for every counterfactual of every agent
    assert [name for name, _ in fake.calls] == ["retrieve_and_select", "answer"]
    assert fake.calls[0][1] == [traces[0].counterfactuals["qr"]]
    assert fake.calls[1][1] == [traces[0].counterfactuals["qr"], traces[0].counterfactuals[
        "selector"], traces[2].counterfactuals["selector"]]
    assert timings == {"retrieve": 0.25, CF_SELECTOR_STAGE: 0.5, CF_GENERATOR_STAGE: 1.0}
    assert traces[0].counterfactuals["selector"].answer == "3 docs"  # all three candidates
    assert traces[0].counterfactuals["qr"].answer == "1 docs"  # its own Selector's choice

    selector_only = [_trace(selection="Document2")]
    fake = FakeRagPipeline()
    timings = run_counterfactuals(fake, selector_only, ("selector",), "top1")  # type: ignore
    assert timings == {CF_GENERATOR_STAGE: 1.0}
    assert [name for name, _ in fake.calls] == ["answer"]
    assert selector_only[0].counterfactuals["selector"].selected == [0]
    nothing = FakeRagPipeline()
    assert run_counterfactuals(nothing, [_trace(selection="Document0")], ("selector",),
                               "top1") == {}  # type: ignore[arg-type]
    assert nothing.calls == []


def test_a_counterfactual_reward_is_the_traces_own_where_the_output_was_the_default() -> None:
    trace = _trace(subquestions=(QUESTION,))
    trace.counterfactuals["selector"] = Trace(question=QUESTION, answer="Paris")
    rewards = counterfactual_rewards(trace, ("qr", "selector"), "all",
                                     lambda answer: float(answer == "Kefield"), factual=0.75)
    assert rewards == {"qr": 0.75, "selector": 0.0}
    with pytest.raises(RuntimeError, match="no counterfactual for 'qr'"):
        counterfactual_rewards(_trace(), ("qr",), "all", lambda answer: 1.0, factual=1.0)


# -- the reward replacement ----------------------------------------------------------------------


def test_a_baseline_replaces_the_shared_reward_by_the_gain_penalties_unchanged() -> None:
    qr = parse_subquestions(SUBQUESTION, QUESTION)
    sel = parse_selection("Document0,Document0", 5)  # a repeated id: the Selector's -1 fires
    ans = parse_answer("**Kefield**")
    rewards = compute_agent_rewards(qr, sel, ans, ans.answer, ["Kefield"],
                                    bonuses={"qr": 0.25}, baselines={"qr": 0.4, "selector": 1.0})
    # R = 1; QR: 1 - 0.4 + 0.25 (its bonus); Selector: 1 - 1 - 1 (its penalty); Generator: R
    assert rewards.shared == 1.0
    assert rewards.totals == pytest.approx({"qr": 0.85, "selector": -1.0, "generator": 1.0})
    assert rewards.shared_for("qr") == pytest.approx(0.6)
    assert rewards.shared_for("generator") == 1.0
    row = rewards.as_dict()
    assert row["baseline/qr"] == 0.4 and row["baseline/selector"] == 1.0
    assert "baseline/generator" not in row
    with pytest.raises(ValueError, match="did not act"):
        compute_agent_rewards(None, sel, ans, ans.answer, ["Kefield"], baselines={"qr": 0.1})
    with pytest.raises(ValueError, match="must be a finite number"):
        compute_agent_rewards(qr, sel, ans, ans.answer, ["Kefield"],
                              baselines={"qr": float("nan")})


def _records() -> list[QARecord]:
    return [QARecord(id="a", question=QUESTION, answers=["Kefield"]),
            QARecord(id="b", question=QUESTION, answers=["Kefield"])]


def _credited_traces() -> list[Trace]:
    """Record a: rewrites (its default, the question, answers Paris: F1 0) and selects
    Document0 (the default, all three, answers Kefield too); answers Kefield (F1 1).
    Record b: copies the question (its default: no counterfactual) and selects Document1 (the
    default answers Kefield); answers Paris (F1 0)."""
    a = _trace(selection="Document0", answer="**Kefield**")
    a.counterfactuals = {"qr": Trace(question=QUESTION, answer="Paris"),
                         "selector": Trace(question=QUESTION, answer="Kefield")}
    b = _trace(subquestions=(QUESTION,), selection="Document1", answer="**Paris**")
    b.counterfactuals = {"selector": Trace(question=QUESTION, answer="Kefield")}
    return [a, b]


def test_the_qr_s_g_samples_score_each_listed_agent_by_its_gain() -> None:
    pipeline = get_pipeline("qr_s_g")
    args = MappoArguments(mappo_counterfactual_agents="qr,selector")
    samples, logs = pipeline.samples(_records(), _credited_traces(), args)
    scores = {(s.agent, i // 3): s.score for i, s in enumerate(samples)}
    # a: R 1; QR's default 0 -> gain 1; Selector's default 1 -> gain 0; Generator R
    # b: R 0; QR used its default -> R_cf = R, gain 0; Selector's default 1 -> gain -1
    assert scores == pytest.approx({("qr", 0): 1.0, ("selector", 0): 0.0, ("generator", 0): 1.0,
                                    ("qr", 1): 0.0, ("selector", 1): -1.0,
                                    ("generator", 1): 0.0})
    assert logs["answer_f1"] == 0.5, "the answer reward is logged as it is"
    expected = {"cf_reward/qr": 0.0, "cf_gain/qr": 0.5, "cf_beat/qr": 0.5, "cf_tie/qr": 0.5,
                "cf_lost/qr": 0.0, "cf_default/qr": 0.5,
                "cf_reward/selector": 1.0, "cf_gain/selector": -0.5, "cf_beat/selector": 0.0,
                "cf_tie/selector": 0.5, "cf_lost/selector": 0.5, "cf_default/selector": 0.0}
    assert {k: logs[k] for k in expected} == pytest.approx(expected)
    assert set(counterfactual_log_keys(("qr", "selector"))) == set(expected)
    assert logs["reward/selector"] == pytest.approx(-0.5), "the scores the agent learns from"

    plain_samples, plain_logs = pipeline.samples(_records(), _credited_traces(), MappoArguments())
    assert [s.score for s in plain_samples] == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]
    assert not any(key.startswith("cf_") for key in plain_logs), "off: today's behaviour"
    only_selector = MappoArguments(mappo_counterfactual_agents="selector")
    samples, logs = pipeline.samples(_records(), _credited_traces(), only_selector)
    assert [s.score for s in samples if s.agent == "qr"] == [1.0, 0.0]
    assert "cf_gain/qr" not in logs and logs["cf_gain/selector"] == pytest.approx(-0.5)


def test_the_counterfactual_statistics_by_hand() -> None:
    stats = counterfactual_stats([1.0, 0.5, 0.0, 0.25],
                                 {"selector": [0.5, 0.5, 1.0, 0.25]},
                                 {"selector": [False, True, False, False]})
    assert stats == pytest.approx({"cf_reward/selector": 0.5625, "cf_gain/selector": -0.125,
                                   "cf_beat/selector": 0.25, "cf_tie/selector": 0.5,
                                   "cf_lost/selector": 0.25, "cf_default/selector": 0.25})
    assert counterfactual_stats([], {"qr": []}, {"qr": []}) == {}
    with pytest.raises(ValueError, match="for 2 traces"):
        counterfactual_stats([1.0, 0.0], {"qr": [1.0]}, {"qr": [True]})


# -- group-relative algorithms -------------------------------------------------------------------


def test_a_grouped_agent_with_a_baseline_has_its_own_group() -> None:
    """One question, G = 2, shared rewards [1, 0]. The Query Rewriter has no baseline: group
    advantages of [1, 0] under ``mean``: [0.5, -0.5]. The Selector's counterfactual rewards
    [1, 0] make its gains [0, 0]: advantage 0 for both (and, flat for it, skipped by
    ``skip``), its penalty -1 in rollout 2 still added."""
    def outcome(shared: float, selector_cf: float, selector_penalty: float) -> PipelineOutcome:
        return PipelineOutcome({"qr": ([2], [5, EOS], None), "selector": ([3], [6, EOS], None)},
                               shared, {"qr": 0.0, "selector": selector_penalty},
                               baselines={"selector": selector_cf})

    outcomes = [outcome(1.0, 1.0, 0.0), outcome(0.0, 0.0, -1.0)]
    samples, logs = group_samples(outcomes, 2, ("qr", "selector"), "mean")
    got = {(s.agent, i // 2): (s.advantage, s.score) for i, s in enumerate(samples)}
    assert got == {("qr", 0): (0.5, 1.0), ("selector", 0): (0.0, 0.0),
                   ("qr", 1): (-0.5, 0.0), ("selector", 1): (-1.0, -1.0)}
    assert logs["grpo/zero_variance_groups"] == 0.0, "logged on the answer reward"
    kept, logs = group_samples(outcomes, 2, ("qr", "selector"), "mean", "skip")
    assert [(s.agent, s.advantage) for s in kept] == [("qr", 0.5), ("qr", -0.5),
                                                      ("selector", -1.0)]
    assert logs["grpo/skipped_samples"] == 1.0
    # mean_std over the Selector's own gains [1 - 0.2, 0 - 0.6] = [0.8, -0.6]: (x - 0.1) / std
    outcomes = [outcome(1.0, 0.2, 0.0), outcome(0.0, 0.6, 0.0)]
    samples, _ = group_samples(outcomes, 2, ("qr", "selector"), "mean_std")
    std = (0.7 ** 2 * 2) ** 0.5  # the sample standard deviation (n - 1) of [0.8, -0.6]
    selector = [s.advantage for s in samples if s.agent == "selector"]
    assert selector == pytest.approx([0.7 / (std + 1e-4), -0.7 / (std + 1e-4)])


# -- the keys ------------------------------------------------------------------------------------


def test_the_keys_default_to_off_and_are_checked() -> None:
    args = MappoArguments()
    assert args.mappo_counterfactual_agents == "" and args.counterfactual_agents == ()
    assert args.mappo_counterfactual_selector_default == "all"
    assert MappoArguments(mappo_counterfactual_agents=" qr, selector ").counterfactual_agents \
        == ("qr", "selector")
    listed, _ = split_mappo_args({"mappo_counterfactual_agents": ["selector", "qr"]})
    assert listed.counterfactual_agents == ("selector", "qr"), "a YAML list is the comma string"
    top1, _ = split_mappo_args({"mappo_counterfactual_agents": "selector",
                                "mappo_counterfactual_selector_default": "top1",
                                "mappo_algorithm": "grpo"})
    assert top1.mappo_counterfactual_selector_default == "top1"


@pytest.mark.parametrize(("config", "message"), [
    ({"mappo_counterfactual_agents": "generator"},
     "mappo_counterfactual_agents must name agents among qr, selector, each at most once, "
     "got 'generator'"),
    ({"mappo_counterfactual_agents": "qr,qr"}, "mappo_counterfactual_agents must name"),
    ({"mappo_counterfactual_agents": "selector", "mappo_agents": "qr,generator"},
     "mappo_counterfactual_agents names selector, which mappo_agents does not optimise"),
    ({"mappo_counterfactual_agents": "qr", "mappo_pipeline": "search_agent"},
     "mappo_counterfactual_agents: mappo_pipeline: search_agent has no agent"),
    ({"mappo_counterfactual_selector_default": "top3"},
     "mappo_counterfactual_selector_default must be one of all, top1, got 'top3'"),
    ({"mappo_counterfactual_agents": True}, "mappo_counterfactual_agents must be a string"),
])
def test_a_wrong_value_is_one_line_naming_the_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        split_mappo_args(config)
    assert "\n" not in str(error.value)


def test_the_rollout_declares_the_counterfactual_stages() -> None:
    pipeline = get_pipeline("qr_s_g")
    plain = pipeline.rollout_stages(MappoArguments(), 4)
    assert [(s.name, s.rows) for s in plain] == [("qr", 4), ("selector", 4), ("generator", 4)]
    both = pipeline.rollout_stages(MappoArguments(mappo_counterfactual_agents="qr,selector"), 4)
    assert [(s.name, s.rows, s.exact) for s in both[3:]] == [
        (CF_SELECTOR_STAGE, 4, False), (CF_GENERATOR_STAGE, 8, False)]
    selector = pipeline.rollout_stages(MappoArguments(mappo_counterfactual_agents="selector"), 4)
    assert [(s.name, s.rows) for s in selector[3:]] == [(CF_GENERATOR_STAGE, 4)]
    assert get_pipeline("search_agent").counterfactual_agents == ()
    assert get_pipeline("decision_agent").counterfactual_agents == ()


# -- learning ------------------------------------------------------------------------------------

#: The learning task's Selector: its first token picks the selection among three candidates.
SELECTIONS = {7: "Document0,Document1,Document2", 8: "Document1", 9: "Document2"}
#: Per question: its gold answer and the one candidate that holds it.
TASKS = [(QARecord(id="q1", question="Where was Ann Kefield born?", answers=["Kefield"]), [1],
          [2, 10, 11]),
         (QARecord(id="q2", question="Where was Bo Dunmore born?", answers=["Dunmore"]), [2],
          [2, 12, 13])]


def _toy_answer(trace: Trace, record: QARecord, gold: list[int]) -> str:
    """The toy Generator: the gold answer from the gold candidate alone (F1 1), a diluted one
    from all three (``X town``, F1 2/3), nothing useful otherwise (F1 0)."""
    if trace.selected == gold:
        return f"**{record.answers[0]}**"
    if trace.selected == [0, 1, 2]:
        return f"**{record.answers[0]} town**"
    return "**Nowhere**"


def _toy_trace(record: QARecord, gold: list[int], prompt: list[int],
               response: list[int]) -> Trace:
    selection = parse_selection(SELECTIONS.get(response[0], ""), 3)
    trace = Trace(question=record.question, subquestions=[record.question],
                  candidates=_candidates(3), selected=selection.ids,
                  calls={"qr": _call("qr"), "generator": _call("generator"),
                         "selector": AgentCall("selector", None, prompt, response,  # type: ignore
                                               SELECTIONS.get(response[0], ""))},
                  qr_parse=parse_subquestions(record.question, record.question),
                  selection_parse=selection)
    trace.answer_parse = parse_answer(_toy_answer(trace, record, gold))
    trace.answer = trace.answer_parse.answer
    return trace


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_the_counterfactual_credit_learns_a_per_question_choice(algorithm: str) -> None:
    """Two questions whose gold passage is another candidate each; the Selector's default
    (all three) gives a diluted answer (F1 2/3), the gold candidate alone the answer (F1 1).
    The Selector (a tiny policy, 16 rollouts a question) is trained with the counterfactual
    credit through the qr_s_g pipeline's own samples (its default's answer from
    :func:`run_counterfactuals`) and PPOLearner: its answer reward must rise above the
    default's, beating the default on most questions, with a different choice per question."""
    from mmoa.train.mappo.learner import PolicyWithValue, PPOConfig, PPOLearner
    from mmoa.train.mappo.value_head import ValueHead

    grouped = algorithm != "ppo"
    args = MappoArguments(mappo_agents="selector", mappo_counterfactual_agents="selector",
                          mappo_algorithm=algorithm, mappo_group_size=16)
    torch.manual_seed(0)
    policy = tiny_policy(seed=1)
    model = PolicyWithValue(policy, None if grouped else ValueHead(32),
                            ref_model=copy.deepcopy(policy).eval())
    config = PPOConfig(algorithm=algorithm, ppo_epochs=4, mini_batch_size=16,
                       init_kl_coef=0.01, min_kl_coef=0.0, adaptive_kl=False)
    learner = PPOLearner(model, torch.optim.Adam(model.parameters(), lr=3e-3), config, pad_id=0,
                         generator=torch.Generator().manual_seed(0))
    sampler = torch.Generator().manual_seed(0)
    pipeline = get_pipeline("qr_s_g")

    def rollout() -> tuple[list[Any], dict[str, float], list[Trace]]:
        records, traces = [], []
        for record, gold, prompt in TASKS:
            for response in sample_responses(model, prompt, 16, 2, sampler):
                records.append(record)
                traces.append(_toy_trace(record, gold, prompt, response))
        for record, gold, _ in TASKS:
            mine = [t for t in traces if t.question == record.question]
            fake = FakeRagPipeline(lambda t, r=record, g=gold: _toy_answer(t, r, g))
            run_counterfactuals(fake, mine, ("selector",), "all")  # type: ignore[arg-type]
        # a grouped algorithm's samples take each record once, its G rollouts next to each other
        return (*pipeline.samples(records[::16] if grouped else records, traces, args), traces)

    _, before, _ = rollout()
    history = []
    for _ in range(12):
        samples, logs, _ = rollout()
        history.append(round(logs["answer_f1"], 3))
        stats = learner.update(learner.prepare(samples))
        assert stats["skipped_updates"] == 0
    _, after, traces = rollout()
    assert before["answer_f1"] < 0.3 and before["cf_beat/selector"] < 0.2, before
    assert after["answer_f1"] > 0.85, (history, after)
    assert after["cf_gain/selector"] > 0.15 and after["cf_beat/selector"] > 0.75, after
    choices = [max(set(picks), key=picks.count) for picks in (
        [tuple(t.selected) for t in traces if t.question == record.question]
        for record, _, _ in TASKS)]
    assert choices == [(1,), (2,)], "a choice per question, not one constant"
