"""TOA data synthesis end to end: two "models" (the tiny model, and the tiny model with the
``careful`` prompt variant at another temperature), the real retrieval server, a tiny budget;
the SFT and DPO files must load through LLaMA-Factory's own dataset loader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmoa.agents.parsers import parse_answer, parse_selection, parse_subquestions
from mmoa.agents.prompts import (
    REFINEMENT_HEADER,
    generator_prompt,
    qr_prompt,
    refinement_prompt,
    selector_prompt,
)
from mmoa.cli import main as cli_main
from mmoa.data.loaders import load_qa
from mmoa.data.registry import read_dataset_info
from mmoa.data.sft_builder import ALPACA_COLUMNS
from mmoa.retrieval.client import RetrievalClient
from mmoa.synthesis.builder import DPO_COLUMNS, ToaBuildConfig, sft_records, synthesise
from mmoa.synthesis.policies import LocalModelPolicy, ModelSpec, PlayRequest
from mmoa.synthesis.rewards import AgentRewards, GeneratorF1Reward, QRRecallReward, SelectorReward
from mmoa.synthesis.search import SearchConfig

N_QUESTIONS = 3
TOKENS = {"qr": 12, "selector": 10, "generator": 6}
FOREIGN = {"someone_elses_data": {"file_name": "other.json", "formatting": "sharegpt"}}


def _specs(model_dir: Path) -> list[str]:
    return [f"name=tiny,path={model_dir},template=llama3",
            f"name=tiny_careful,path={model_dir},template=llama3,variant=careful,"
            "temperature=0.7"]


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> LocalModelPolicy:
    return LocalModelPolicy([ModelSpec.parse(s) for s in _specs(tiny_model_dir)],
                            max_new_tokens=TOKENS, seed=3)


def test_policy_prompts_and_shared_weights(policy: LocalModelPolicy) -> None:
    assert policy.models == ["tiny", "tiny_careful"]
    assert len(policy._loaded) == 1, "two specs of one checkpoint share its weights"
    prompt = qr_prompt("Who directed Blue Harbor?")
    plain = policy.prompt_for(PlayRequest("tiny", prompt, "Who directed it?"))
    assert plain == refinement_prompt(prompt, "Who directed it?")
    assert plain.input.endswith(f"{REFINEMENT_HEADER}\nWho directed it?")
    careful = policy.prompt_for(PlayRequest("tiny_careful", prompt))
    assert careful.system != prompt.system and careful.input == prompt.input
    with pytest.raises(ValueError, match="unknown model"):
        policy.prompt_for(PlayRequest("nope", prompt))
    assert policy.resolved_precision in ("bf16", "fp32")  # auto, resolved for this machine


def test_policy_rejects_an_unknown_precision(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="precision must be one of"):
        LocalModelPolicy([ModelSpec.parse(_specs(tiny_model_dir)[0])], precision="fp16")


def test_toa_synthesis_spends_the_budget_and_builds_canonical_records(
        policy: LocalModelPolicy, tiny_world_dir: Path, tiny_server_url: str) -> None:
    records = load_qa(tiny_world_dir / "train.jsonl", "demo")[:N_QUESTIONS]
    client = RetrievalClient(tiny_server_url)
    rewards = AgentRewards(QRRecallReward(client, k=5), SelectorReward(policy.answerer()),
                           GeneratorF1Reward())
    search = SearchConfig(samples_per_model=2, width_limit=1, seed=1, progress=False)
    items = synthesise(records, policy, rewards, client,
                       ToaBuildConfig(k=5, method="toa", search=search))
    refined = 0
    for item in items:
        for agent, result in item.results.items():
            assert len(result.plays) == 4, f"{agent}: budget 2 x 2 models"
            assert {p.model for p in result.plays} <= {"tiny", "tiny_careful"}
            for i, play in enumerate(result.plays):
                assert play.refines is None or play.refines < i
                refined += play.refines is not None
            assert result.best.reward == max(p.reward for p in result.plays)
        qr_best = item.results["qr"].best.text
        assert item.subquestions == parse_subquestions(qr_best, item.record.question).subquestions
        assert len(item.candidates) == 5
        assert item.selected == sorted(parse_selection(item.results["selector"].best.text,
                                                       5).ids)
    assert refined > 0, "width limit 1: later plays refine earlier responses"
    rows = sft_records(items)
    texts = [[c.text for c in item.candidates] for item in items]
    position = 0
    for item, cands in zip(items, texts, strict=True):
        question = item.record.question
        assert rows[position] == qr_prompt(question).alpaca("\n".join(item.subquestions))
        sel = rows[position + 1]
        assert sel == selector_prompt(question, cands).alpaca(sel["output"])
        position += 2
        if item.answer is not None:
            gen = rows[position]
            assert gen == generator_prompt(question, [cands[i] for i in item.selected]).alpaca(
                f"**{item.answer}**")
            assert parse_answer(gen["output"]).answer == item.answer
            position += 1
    assert position == len(rows)


def test_cli_writes_sft_and_dpo_that_llamafactory_loads(
        tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str,
        tmp_path: Path) -> None:
    (tmp_path / "dataset_info.json").write_text(json.dumps(FOREIGN))
    args = ["data", "toa", "--data_file", str(tiny_world_dir / "train.jsonl"),
            "--max_samples", str(N_QUESTIONS), "--dataset_dir", str(tmp_path),
            "--name", "tiny_toa", "--retriever_url", tiny_server_url,
            "--samples_per_model", "2", "--k", "5", "--baselines", "--no_progress",
            # fp32: the tiny model's samples (and so the DPO pairs below) are those of exact
            # arithmetic on every machine, not of bf16 autocast where the CPU has it
            "--precision", "fp32",
            *[a for spec in _specs(tiny_model_dir) for a in ("--model", spec)],
            *[a for agent, n in TOKENS.items() for a in (f"--max_new_tokens_{agent}", str(n))]]
    assert cli_main(args) == 0
    info = read_dataset_info(tmp_path)
    assert info["someone_elses_data"] == FOREIGN["someone_elses_data"]
    for name in ("tiny_toa", "tiny_toa_best_of_n"):
        assert info[name] == {"file_name": f"{name}.json", "formatting": "alpaca",
                              "columns": ALPACA_COLUMNS}
        assert info[f"{name}_dpo"] == {"file_name": f"{name}_dpo.json", "formatting": "alpaca",
                                       "ranking": True, "columns": DPO_COLUMNS}
    summary = json.loads((tmp_path / "tiny_toa_label_quality.json").read_text())
    assert summary["budget_per_question_and_agent"] == 4
    assert summary["precision"] == "fp32"
    rows = {q["method"]: q for q in summary["label_quality"]}
    assert set(rows) == {"heuristic", "toa", "best_of_n"}
    assert rows["heuristic"]["answer_f1"] == 1.0, "the heuristic labels the gold answer"
    for method in ("toa", "best_of_n"):
        for agent, wins in rows[method]["wins"].items():
            assert sum(wins["wins"].values()) == N_QUESTIONS, agent
        assert 0.0 <= rows[method]["qr_support_recall"] <= 1.0
    sft = json.loads((tmp_path / "tiny_toa.json").read_text())
    dpo = json.loads((tmp_path / "tiny_toa_dpo.json").read_text())
    assert 2 * N_QUESTIONS <= len(sft) <= 3 * N_QUESTIONS
    assert all(set(r) == {"instruction", "input", "output", "system"} for r in sft)
    assert all(set(r) == {"instruction", "input", "chosen", "rejected", "system"}
               and r["chosen"] != r["rejected"] for r in dpo)
    # the seeded search on the untrained model finds reward differences (QR recall varies with
    # the junk queries it writes), so real pairs reach the loader
    assert dpo, "no DPO pair: every search tied"
    _load_with_llamafactory(tiny_model_dir, tmp_path, "tiny_toa", "sft", len(sft))
    _load_with_llamafactory(tiny_model_dir, tmp_path, "tiny_toa_dpo", "rm", len(dpo))


def _load_with_llamafactory(model_dir: Path, dataset_dir: Path, name: str, stage: str,
                            expected: int) -> None:
    """LLaMA-Factory's own loader (``rm`` is the pairwise stage the dpo workflow loads with)."""
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    model_args, data_args, training_args, _, _ = get_train_args({
        "model_name_or_path": str(model_dir), "stage": "dpo" if stage == "rm" else stage,
        "do_train": True, "finetuning_type": "full", "dataset": name,
        "dataset_dir": str(dataset_dir), "template": "llama3", "cutoff_len": 4096,
        "output_dir": str(dataset_dir / f"out_{name}"), "overwrite_cache": True,
        "report_to": "none", "preprocessing_num_workers": 1,
    })
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    dataset = get_dataset(template, model_args, data_args, training_args, stage,
                          **tokenizer_module)["train_dataset"]
    assert len(dataset) == expected
    columns = set(dataset.column_names)
    if stage == "rm":
        assert {"chosen_input_ids", "rejected_input_ids"} <= columns
    else:
        assert {"input_ids", "labels"} <= columns
