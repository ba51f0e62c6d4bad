"""TOA and best-of-N drivers at the same budget, DPO pairs and model specs (no model needed:
a scripted sampler whose responses name who wrote them and what they refined)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from mmoa.agents.candidates import Candidate
from mmoa.agents.prompts import generator_prompt, qr_prompt, selector_prompt
from mmoa.data.records import QARecord
from mmoa.synthesis.builder import QuestionSynthesis, dpo_pairs
from mmoa.synthesis.policies import ModelSpec, PlayRequest
from mmoa.synthesis.rewards import AgentTask
from mmoa.synthesis.search import (
    Play,
    SearchConfig,
    SearchResult,
    best_of_n,
    toa_search,
    win_summary,
)

RECORD = QARecord("q", "Where was Ada Brel born?", ["Tronford"])


class ScriptedSampler:
    """Writes ``model`` from scratch and ``model>previous`` as a refinement; logs requests."""

    def __init__(self) -> None:
        self.models = ["m1", "m2"]
        self.requests: list[PlayRequest] = []

    def respond(self, requests: Sequence[PlayRequest]) -> list[str]:
        self.requests.extend(requests)
        return [r.model if r.previous is None else f"{r.model}>{r.previous}" for r in requests]


def depth_reward(tasks: Sequence[AgentTask], responses: Sequence[str]) -> list[float]:
    """Longer refinement chains and model m2 score higher."""
    return [0.1 * r.count(">") + (0.05 if r.startswith("m2") else 0.0) for r in responses]


def _tasks(n: int) -> list[AgentTask]:
    return [AgentTask("qr", RECORD, qr_prompt(f"question {i}")) for i in range(n)]


def test_best_of_n_spends_the_budget_round_robin_from_scratch() -> None:
    sampler = ScriptedSampler()
    results = best_of_n(_tasks(3), sampler, depth_reward,
                        SearchConfig(samples_per_model=2, progress=False))
    assert len(sampler.requests) == 3 * 4 and all(r.previous is None for r in sampler.requests)
    for result in results:
        assert [p.model for p in result.plays] == ["m1", "m2", "m1", "m2"]
        assert result.best.text == "m2" and result.best == result.plays[1], "earliest on ties"
    assert win_summary(results) == {"wins": {"m2": 3}, "best_is_refinement": 0, "all_tied": 0,
                                    "tasks": 3}
    flat = best_of_n(_tasks(2), ScriptedSampler(), lambda t, r: [0.0] * len(r),
                     SearchConfig(samples_per_model=1, progress=False))
    assert win_summary(flat)["all_tied"] == 2


def test_toa_spends_the_same_budget_and_refines_the_parent_response() -> None:
    sampler = ScriptedSampler()
    results = toa_search(_tasks(3), sampler, depth_reward,
                         SearchConfig(samples_per_model=2, width_limit=1, seed=4,
                                      progress=False))
    assert len(sampler.requests) == 3 * 4
    for result in results:
        assert len(result.plays) == 4
        for play in result.plays:
            if play.refines is None:
                assert play.text == play.model
            else:
                assert play.text == f"{play.model}>{result.plays[play.refines].text}"
        assert result.best.refines is not None, "refinements score higher here"
    summary = win_summary(results)
    assert summary["best_is_refinement"] == 3 and sum(summary["wins"].values()) == 3


def test_dpo_pairs_are_best_vs_worst_in_canonical_form() -> None:
    candidates = tuple(Candidate({"id": f"p{i}", "contents": f"T{i}\ntext {i}"}, 0, i)
                       for i in range(3))
    texts = [c.text for c in candidates]
    sel = AgentTask("selector", RECORD, selector_prompt(RECORD.question, texts), candidates)
    gen = AgentTask("generator", RECORD, generator_prompt(RECORD.question, texts[:1]))
    qr = AgentTask("qr", RECORD, qr_prompt(RECORD.question))
    item = QuestionSynthesis(RECORD, ["q"], list(candidates), [0], "Tronford", {
        "selector": SearchResult(sel, [Play("m1", "Document 2, Document0", 1.5),
                                       Play("m2", "Document1", 0.2)]),
        "generator": SearchResult(gen, [Play("m1", "**Orvale**", 0.0),
                                        Play("m2", "Answer: Tronford", 1.0)]),
        # a tie: no pair; same canonical form: no pair
        "qr": SearchResult(qr, [Play("m1", "a", 0.3), Play("m2", "b", 0.3)]),
    })
    same = QuestionSynthesis(RECORD, ["q"], [], [], None, {
        "qr": SearchResult(qr, [Play("m1", "1. Who?", 0.9), Play("m2", "Who?", 0.1)])})
    pairs = dpo_pairs([item, same])
    assert pairs == [
        {**_prompt(sel), "chosen": "Document0,Document2", "rejected": "Document1"},
        {**_prompt(gen), "chosen": "**Tronford**", "rejected": "**Orvale**"},
    ]


def _prompt(task: AgentTask) -> dict[str, str]:
    return {"instruction": task.prompt.instruction, "input": task.prompt.input,
            "system": task.prompt.system}


def test_model_spec_parsing_names_the_bad_field() -> None:
    spec = ModelSpec.parse("name=a,path=/m,template=llama3,variant=careful,temperature=0.5")
    assert (spec.name, spec.model_name_or_path, spec.variant, spec.temperature) == (
        "a", "/m", "careful", 0.5)
    with pytest.raises(ValueError, match="template= is required"):
        ModelSpec.parse("name=a,path=/m")
    with pytest.raises(ValueError, match="keys"):
        ModelSpec.parse("name=a,path=/m,template=t,colour=red")
    with pytest.raises(ValueError, match="variant must be one of"):
        ModelSpec.parse("name=a,path=/m,template=t,variant=loud")
    with pytest.raises(ValueError, match="samples_per_model"):
        SearchConfig(samples_per_model=0).budget(2)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "name=a,path=/m"], "template= is required"),
        (["--model", "name=a,path=/m,template=llama3", "--width_limit", "0"],
         "width_limit must be >= 1"),
        (["--model", "name=a,path=/m,template=llama3", "--retriever_url", "http://127.0.0.1:9"],
         "127.0.0.1:9"),
    ],
)
def test_cli_bad_input_writes_nothing(tmp_path, capsys, extra: list[str], message: str) -> None:
    import json

    from mmoa.cli import main as cli_main

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(RECORD.to_dict()) + "\n")
    foreign = {"other": {"file_name": "other.json"}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(foreign))
    args = ["data", "toa", "--data_file", str(data), "--data_format", "demo",
            "--dataset_dir", str(tmp_path), "--name", "t", *extra]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "nothing was written" in err
    assert json.loads((tmp_path / "dataset_info.json").read_text()) == foreign
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset_info.json", "train.jsonl"]


def test_answer_labels_read_back_as_written() -> None:
    from mmoa.agents.parsers import parse_answer
    from mmoa.synthesis.builder import answer_label

    for raw in ("Republic44\x0bTherkpal", "Paris\nFrance", "**New  York**", "Answer: Oslo"):
        label = answer_label(raw)
        assert "\n" not in label and "\x0b" not in label
        assert parse_answer(f"**{label}**").answer == label
