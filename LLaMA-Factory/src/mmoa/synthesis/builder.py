"""Warm-start data of the three agents by search (TOA or best-of-N), as SFT and DPO datasets.

The agents are searched in pipeline order, each on what the previous one's best response gives:

1. **Query Rewriter**: one search per question over ``qr_prompt``; the best sub-questions are
   the QR label.
2. The best sub-questions are retrieved and merged into K candidates exactly as the heuristic
   builder does (:func:`mmoa.data.sft_builder.retrieve_all`, :func:`merge_candidates`, the same
   seeded shuffle), so the Selector's prompts have the same shape in both datasets.
3. **Selector**: one search per question over ``selector_prompt``; the best selection is the
   Selector label.
4. **Generator**: one search over ``generator_prompt`` with the selected documents; the best
   answer is the Generator label (a question whose best answer is empty gets no Generator
   record: ``****`` would teach the format with no content).

SFT records come from :func:`mmoa.data.sft_builder.agent_records`, the construction of the
heuristic builder, and are registered the same way; so a TOA dataset is a drop-in replacement
for ``mmoa-cli data sft``'s. DPO pairs are the best vs the worst response of each search
(only when the best has the strictly higher reward and their canonical forms differ), both in
the agent's canonical output format, in LLaMA-Factory's pairwise Alpaca format (``ranking``).
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmoa.agents.candidates import Candidate, merge_candidates
from mmoa.agents.parsers import parse_answer, parse_selection, parse_subquestions
from mmoa.agents.prompts import (
    AgentName,
    format_answer,
    format_selection,
    format_subquestions,
    generator_prompt,
    qr_prompt,
    selector_prompt,
)
from mmoa.data.records import QARecord
from mmoa.data.registry import register_datasets
from mmoa.data.sft_builder import (
    ALPACA_COLUMNS,
    DocumentSearcher,
    agent_records,
    retrieve_all,
)
from mmoa.fileio import atomic_path
from mmoa.synthesis.policies import ResponsePolicy
from mmoa.synthesis.rewards import AgentRewards, AgentTask
from mmoa.synthesis.search import Method, SearchConfig, SearchResult, run_search, win_summary

__all__ = ["DPO_COLUMNS", "QuestionSynthesis", "ToaBuildConfig", "canonical_output",
           "dpo_pairs", "sft_records", "synthesise", "write_datasets"]

#: LLaMA-Factory's pairwise Alpaca columns (``ranking: true``), for the ``dpo`` stage.
DPO_COLUMNS = {"prompt": "instruction", "query": "input", "chosen": "chosen",
               "rejected": "rejected", "system": "system"}


@dataclass
class ToaBuildConfig:
    """Where the data goes, the candidates per question, the shuffle seed, and the search."""

    dataset_dir: str = "data"
    name: str = "demo_toa_sft"
    k: int = 10
    #: Seed of the candidate shuffling (as ``SFTBuildConfig.seed``).
    seed: int = 42
    method: Method = "toa"
    search: SearchConfig = field(default_factory=SearchConfig)
    request_size: int = 64


@dataclass
class QuestionSynthesis:
    """One question's labels and the searches that produced them."""

    record: QARecord
    subquestions: list[str]
    candidates: list[Candidate]
    selected: list[int]
    answer: str | None
    results: dict[AgentName, SearchResult]


def canonical_output(task: AgentTask, text: str) -> str:
    """A response in its agent's canonical format (what SFT trains and DPO compares)."""
    if task.agent == "qr":
        return format_subquestions(parse_subquestions(text, task.record.question).subquestions)
    if task.agent == "selector":
        return format_selection(sorted(parse_selection(text, len(task.candidates)).ids))
    return format_answer(answer_label(text))


def answer_label(text: str) -> str:
    """The Generator's answer as a label: parsed, white space collapsed (an answer parsed from
    unbolded text keeps its line breaks and control white space, which ``**...**`` must not
    carry: the parser would read it back differently)."""
    return " ".join(parse_answer(text).answer.split())


def synthesise(
    records: Sequence[QARecord],
    policy: ResponsePolicy,
    rewards: AgentRewards,
    retriever: DocumentSearcher,
    config: ToaBuildConfig,
    rng: random.Random | None = None,
) -> list[QuestionSynthesis]:
    """Search the three agents in pipeline order (see the module docstring). ``rng`` shuffles
    the candidates (default: a new stream seeded with ``config.seed``); a caller that
    synthesises in parts passes one stream through all of them."""
    for record in records:
        if not record.answers:
            raise ValueError(f"record {record.id!r} has no gold answers; the rewards need them")
    method, search = config.method, config.search
    qr_tasks = [AgentTask("qr", r, qr_prompt(r.question)) for r in records]
    qr_results = run_search(method, qr_tasks, policy, rewards.qr, search, f"{method} qr")
    subquestions = [parse_subquestions(res.best.text, r.question).subquestions
                    for r, res in zip(records, qr_results, strict=True)]
    ranked = retrieve_all(retriever, [q for qs in subquestions for q in qs], config.k,
                          config.request_size)
    rng = rng if rng is not None else random.Random(config.seed)
    candidates = []
    for qs in subquestions:
        merged = merge_candidates([ranked[q] for q in qs], config.k)
        rng.shuffle(merged)
        candidates.append(merged)

    sel_tasks = [AgentTask("selector", r, selector_prompt(r.question, [c.text for c in cs]),
                           tuple(cs)) for r, cs in zip(records, candidates, strict=True)]
    sel_results = run_search(method, sel_tasks, policy, rewards.selector, search,
                             f"{method} selector")
    selected = [sorted(parse_selection(res.best.text, len(cs)).ids)
                for res, cs in zip(sel_results, candidates, strict=True)]

    gen_tasks = [AgentTask("generator", r, generator_prompt(
        r.question, [cs[i].text for i in ids]))
        for r, cs, ids in zip(records, candidates, selected, strict=True)]
    gen_results = run_search(method, gen_tasks, policy, rewards.generator, search,
                             f"{method} generator")
    out = []
    for i, record in enumerate(records):
        answer = answer_label(gen_results[i].best.text)
        out.append(QuestionSynthesis(
            record, subquestions[i], candidates[i], selected[i], answer or None,
            {"qr": qr_results[i], "selector": sel_results[i], "generator": gen_results[i]}))
    return out


def sft_records(items: Sequence[QuestionSynthesis]) -> list[dict[str, str]]:
    """The Alpaca records of the three agents, built as the heuristic builder builds them."""
    out: list[dict[str, str]] = []
    for item in items:
        out.extend(agent_records(item.record.question, item.subquestions,
                                 [c.text for c in item.candidates], item.selected, item.answer))
    return out


def dpo_pairs(items: Sequence[QuestionSynthesis]) -> list[dict[str, str]]:
    """Best vs worst response of every search, in LLaMA-Factory's pairwise Alpaca format."""
    out = []
    for item in items:
        for result in item.results.values():
            best, worst = result.best, result.worst
            if not best.reward > worst.reward:
                continue
            chosen = canonical_output(result.task, best.text)
            rejected = canonical_output(result.task, worst.text)
            if chosen == rejected:
                continue
            prompt = result.task.prompt
            out.append({"instruction": prompt.instruction, "input": prompt.input,
                        "chosen": chosen, "rejected": rejected, "system": prompt.system})
    return out


def _write_json(path: Path, rows: list[dict[str, str]]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(rows, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def write_datasets(items: Sequence[QuestionSynthesis], dataset_dir: str | Path, name: str
                   ) -> dict[str, Any]:
    """``<name>.json`` (SFT, alpaca) and ``<name>_dpo.json`` (pairwise, ``ranking: true``),
    both registered in ``dataset_info.json``; every write is atomic."""
    folder = Path(dataset_dir)
    sft, dpo = sft_records(items), dpo_pairs(items)
    sft_path, dpo_path = folder / f"{name}.json", folder / f"{name}_dpo.json"
    _write_json(sft_path, sft)
    _write_json(dpo_path, dpo)
    register_datasets(folder, {
        name: {"file_name": sft_path.name, "formatting": "alpaca", "columns": ALPACA_COLUMNS},
        f"{name}_dpo": {"file_name": dpo_path.name, "formatting": "alpaca", "ranking": True,
                        "columns": DPO_COLUMNS},
    })
    n = len(items)
    records = {"qr": n, "selector": n, "generator": sum(i.answer is not None for i in items)}
    return {"sft_name": name, "sft_file": str(sft_path), "sft_records": records,
            "dpo_name": f"{name}_dpo", "dpo_file": str(dpo_path),
            "dpo_pairs": dict(Counter(_agent_of(r) for r in dpo))}


def _agent_of(row: dict[str, str]) -> str:
    from mmoa.agents.prompts import GENERATOR_SYSTEM, QR_SYSTEM

    return {QR_SYSTEM: "qr", GENERATOR_SYSTEM: "generator"}.get(row["system"], "selector")


def wins_by_agent(items: Sequence[QuestionSynthesis]) -> dict[str, Any]:
    """Per agent: which model wrote the winning response how often."""
    agents: tuple[AgentName, ...] = ("qr", "selector", "generator")
    return {a: win_summary([item.results[a] for item in items]) for a in agents}
