"""The multi-turn search agent (RAG-R1 / Search-R1) on the demo world: format SFT, then RL.

Runs, every one evaluated with ``evaluate_qr_s_g.py --mode search_agent`` on the demo test
split:

* ``sft``: the format-learning SFT (``smollm2_search_agent_sft.yaml``) on multi-query
  trajectories (independent hops asked in one search);
* ``grpo-seedN``: GRPO (``smollm2_search_agent_grpo.yaml``) from it, one run per seed; the
  issue's target is RL above its SFT in every seed (paired per-question F1 gain);
* ``sft-single`` and ``grpo-single-seedN``: the single-query baseline (SFT trajectories with
  one query per search turn, and at most one query per search in RL and evaluation): retrieval
  rounds and seconds per question against the multi-query agent (RAG-R1's comparison);
* ``grpo-nomask-seedN``: GRPO with the retrieved tokens left in the loss and the KL
  (``mappo_search_mask_information=false``, Search-R1's ablation);
* three-agent rows (``--three-agent NAME=MODEL``): the QR -> Selector -> Generator pipeline of
  those models (e.g. the demo warm start and a MAPPO model) on the same questions, with the
  demo MAPPO config's generation limits, so the two pipelines share one table.

Per run: EM / F1 (with standard error), F1 by question type, search rounds, queries, retrieved
tokens per question, well-formed rate and seconds per question.

Resumable: each finished stage writes ``<work-dir>/<stage>/result.json`` and is skipped next
time; a training resumes from its last checkpoint. Needs the demo world and its index served
(``bash run_demo.sh`` leaves both; ``bash run_server.sh --index data/demo/index &``)::

    python bench/search_agent.py --seeds 1 2 3 \\
        --three-agent "three-agent SFT=saves/smollm2-135m/full/sft" \\
        --json-out bench/results/search_agent_smollm2.json

Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml
from bench_runs import (
    RESULT,
    ROOT,
    add_sft_eval_options,
    add_variant_option,
    bench_parser,
    code_version,
    mmoa_cli,
    paired_gain,
    per_question_f1,
    percent,
    print_result,
    resume_overrides,
    rollout_limits,
    run_logged,
    stage,
    train,
    training_tail,
    variant_suffix,
    write_result,
)

from mmoa.fileio import atomic_write_json

SFT_CONFIG = "LLaMA-Factory/examples/demo/smollm2_search_agent_sft.yaml"
RL_CONFIG = "LLaMA-Factory/examples/demo/smollm2_search_agent_grpo.yaml"
THREE_AGENT_CONFIG = "LLaMA-Factory/examples/demo/smollm2_full_mappo.yaml"
SCRIPT = "bench/search_agent.py"
#: SFT dataset name and the most queries a search may hold, per arm.
ARMS = {"multi": ("demo_search_sft", None), "single": ("demo_search_sft_single", 1)}
TYPES = ("one_hop", "bridge", "comparison", "yes_no")


def prepare_data(args: argparse.Namespace, work: Path) -> None:
    """Both arms' SFT trajectories (searched on the live server) and the RL question set."""
    marker = work / "data" / RESULT
    if marker.is_file():
        return
    log = work / "data" / "data.log"
    train_file = f"{args.world_dir}/train.jsonl"
    for arm, (name, _) in ARMS.items():
        run_logged(mmoa_cli("data", "search-sft", "--data_file", train_file, "--name", name,
                            "--query_mode", arm, "--retriever_url", args.retriever_url), log)
    if not (ROOT / "data" / "demo_mappo.jsonl").is_file():  # run_demo.sh leaves it
        run_logged(mmoa_cli("data", "mappo", "--data_file", train_file, "--name",
                            "demo_mappo"), log)
    atomic_write_json(marker, {"world_dir": args.world_dir})


#: The evaluator's search limits where an RL config leaves them at the trainer's defaults.
SEARCH_DEFAULTS = {"mappo_search_max_turns": 4, "mappo_search_max_queries": 3,
                   "mappo_search_top_k": 3, "mappo_max_new_tokens_search": 128}


def _rl_config(config: str = RL_CONFIG) -> dict[str, Any]:
    return {**SEARCH_DEFAULTS, **yaml.safe_load((ROOT / config).read_text())}


def evaluate(args: argparse.Namespace, model: Path, out: Path, max_queries: int | None, *,
             template: str = "smollm2", data_file: str | None = None,
             scoring: str | None = None, rl_config: str = RL_CONFIG) -> dict[str, Any]:
    """``--mode search_agent`` on the test split (or ``data_file``) with the turn limits of
    ``rl_config``; the keywords let another bench (``side_by_side.py``) evaluate another
    model, split or scoring the same way."""
    rl = _rl_config(rl_config)
    command = [sys.executable, "evaluate/evaluate_qr_s_g.py", "--mode", "search_agent",
               "--model_name_or_path", str(model), "--template", template,
               "--data_file", data_file or f"{args.world_dir}/test.jsonl",
               "--retriever_url", args.retriever_url, "--precision", args.precision,
               "--search_max_turns", str(rl["mappo_search_max_turns"]),
               "--search_max_queries", str(max_queries or rl["mappo_search_max_queries"]),
               "--search_top_k", str(rl["mappo_search_top_k"]),
               "--max_new_tokens_search", str(rl["mappo_max_new_tokens_search"]),
               "--output_dir", str(out)]
    if args.max_eval:
        command += ["--max_samples", str(args.max_eval)]
    if scoring:
        command += ["--scoring", scoring]
    run_logged(command, out / "eval.log")
    return _scored(out)


def evaluate_three_agent(args: argparse.Namespace, model: str, out: Path) -> dict[str, Any]:
    """The three-agent pipeline on the same questions, as the demo MAPPO run generates."""
    mappo = yaml.safe_load((ROOT / THREE_AGENT_CONFIG).read_text())
    command = [sys.executable, "evaluate/evaluate_qr_s_g.py", "--mode", "qr_s_g",
               "--model_name_or_path", model, "--template", "smollm2",
               "--data_file", f"{args.world_dir}/test.jsonl",
               "--retriever_url", args.retriever_url, "--precision", args.precision,
               "--k", str(mappo["mappo_top_k"]), "--output_dir", str(out)]
    command += rollout_limits(THREE_AGENT_CONFIG)
    if args.max_eval:
        command += ["--max_samples", str(args.max_eval)]
    run_logged(command, out / "eval.log")
    return {**_scored(out), "model": model}


def _scored(out: Path) -> dict[str, Any]:
    metrics = json.loads((out / "metrics.json").read_text())
    return {"summary": summary(metrics), "per_question_f1": per_question_f1(out)}


def summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """What the table shows: EM / F1, F1 by type, and the search statistics per question."""
    search = metrics["agents"].get("search", {})
    return {"mode": metrics.get("mode"), "num_questions": metrics["num_questions"],
            "em": metrics["em"], "f1": metrics["f1"], "f1_se": metrics["f1_se"],
            "f1_by_type": metrics.get("f1_by_type", {}),
            "mean_turns": search.get("mean_turns"), "mean_searches": search.get("mean_searches"),
            "mean_queries": search.get("mean_queries"),
            "mean_retrieved_tokens": search.get("mean_retrieved_tokens"),
            "well_formed_rate": search.get("well_formed_rate"),
            "forced_rate": search.get("forced_rate"),
            "seconds_per_question": metrics.get("seconds_per_question")}


def train_sft(args: argparse.Namespace, arm: str, output: Path, config: str = SFT_CONFIG
              ) -> None:
    """The arm's format SFT from ``config`` (``args.sft_overrides`` last, so they win)."""
    if not (output / "model.safetensors").is_file():
        train(config, [f"dataset={ARMS[arm][0]}", f"output_dir={output}",
                       f"max_steps={args.sft_steps}", *args.sft_overrides],
              output.parent / "train.log")


def train_rl(args: argparse.Namespace, warm: Path, output: Path, seed: int,
             extra: list[str], config: str = RL_CONFIG) -> None:
    """One GRPO run of ``config`` from ``warm``, resumed from its last checkpoint."""
    if (output / "model.safetensors").is_file():
        return
    overrides = [f"model_name_or_path={warm}", f"output_dir={output}", f"seed={seed}",
                 f"max_steps={args.steps}", f"mappo_retriever_url={args.retriever_url}",
                 *extra, *args.overrides]
    train(config, [*overrides, *resume_overrides(output)], output.parent / "train.log")


def _search_key(key: str) -> bool:
    """The trainer-log keys kept per run: reward, answer F1, KL and the search statistics."""
    return key in ("reward", "answer_f1", "kl") or key.startswith("search/")


def plan(args: argparse.Namespace) -> list[tuple[str, str, int, list[str]]]:
    """(run name, arm, seed, extra RL overrides) of every RL run, in the order they run: the
    seeds first (the target), then the no-mask comparison (it reuses the multi-query SFT),
    then the single-query arm (its own SFT first). A ``--variant`` name ends every RL run's
    name, so runs with other overrides never resume or reuse each other in one work dir."""
    end = variant_suffix(args.variant)
    runs = [(f"grpo-seed{seed}{end}", "multi", seed, []) for seed in args.seeds]
    runs += [(f"grpo-nomask-seed{seed}{end}", "multi", seed,
              ["mappo_search_mask_information=false"]) for seed in args.nomask_seeds]
    runs += [(f"grpo-single-seed{seed}{end}", "single", seed, ["mappo_search_max_queries=1"])
             for seed in args.single_seeds]
    return runs


def run(args: argparse.Namespace) -> dict[str, Any]:
    from mmoa.retrieval.client import RetrievalClient

    work = ROOT / args.work_dir
    RetrievalClient(args.retriever_url, timeout=120).wait_until_ready(timeout=60)
    prepare_data(args, work)
    result: dict[str, Any] = {"config": {**vars(args), "code": code_version(SCRIPT)}, "runs": {}}
    runs = result["runs"]

    def record(name: str) -> None:
        print(f"[{name}] {_line(runs[name])}", flush=True)
        if args.json_out:
            write_result(ROOT / args.json_out, public(result), SCRIPT)

    warm = {arm: work / f"sft-{arm}" / "model" for arm in ARMS}

    def warm_start(arm: str) -> None:
        """The arm's format SFT and its evaluation, once, before its first RL run."""
        if f"sft-{arm}" in runs:
            return
        def produce() -> dict[str, Any]:
            train_sft(args, arm, warm[arm])
            return {**evaluate(args, warm[arm], warm[arm].parent / "eval", ARMS[arm][1]),
                    "arm": arm}
        runs[f"sft-{arm}"] = stage(work, f"sft-{arm}", produce, SCRIPT)
        record(f"sft-{arm}")

    warm_start("multi")
    for spec in args.three_agent:
        label, _, model = spec.partition("=")
        name = f"three-agent {label}"
        folder = "three-agent-" + "".join(c if c.isalnum() else "-" for c in label)
        runs[name] = stage(work, folder, lambda m=model, f=folder: evaluate_three_agent(
            args, m, work / f / "eval"), SCRIPT)
        record(name)
    for name, arm, seed, extra in plan(args):
        warm_start(arm)

        def rl(name: str = name, arm: str = arm, seed: int = seed, extra: list[str] = extra
               ) -> dict[str, Any]:
            output = work / name / "model"
            train_rl(args, warm[arm], output, seed, extra)
            out = evaluate(args, output, work / name / "eval", ARMS[arm][1])
            for checkpoint in output.glob("checkpoint-*"):  # the final model is in output
                shutil.rmtree(checkpoint, ignore_errors=True)
            out.update(arm=arm, seed=seed, overrides=extra,
                       training=training_tail(output, _search_key))
            return out

        runs[name] = stage(work, name, rl, SCRIPT)
        record(name)
    return public(result)


def public(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON written out: summaries, each RL run's paired gain over its own SFT and the
    target per seed (multi-query GRPO above the multi-query SFT); per-question F1 stays in
    the work folder."""
    runs = result["runs"]
    out: dict[str, Any] = {"config": result["config"], "runs": {}}
    met = []
    end = variant_suffix(result["config"].get("variant", ""))
    for name, run in runs.items():
        entry = {k: v for k, v in run.items() if k != "per_question_f1"}
        base = runs.get(f"sft-{run['arm']}") if name.startswith("grpo") else None
        if base is not None:
            entry["gain_f1"] = paired_gain(base["per_question_f1"], run["per_question_f1"])
            if name == f"grpo-seed{run['seed']}{end}":
                entry["above_sft"] = entry["gain_f1"]["gain"] > 0
                met.append(entry["above_sft"])
        out["runs"][name] = entry
    out["target_met"] = f"{sum(met)} of {len(met)} seeds"
    return out


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _line(run: dict[str, Any]) -> str:
    s = run["summary"]
    return (f"F1 {percent(s['f1'])}  rounds {_num(s['mean_searches'])}  "
            f"s/q {_num(s['seconds_per_question'])}")


def format_table(result: dict[str, Any]) -> str:
    lines = ["| run | F1 | EM | " + " | ".join(TYPES) + " | rounds | queries | ret tok | "
             "fmt ok% | s/q | F1 gain vs its SFT |", "| --- |" + " ---: |" * (len(TYPES) + 8)]
    for name, run in result["runs"].items():
        s, gain = run["summary"], run.get("gain_f1")
        by_type = s.get("f1_by_type", {})
        tokens = s.get("mean_retrieved_tokens")
        lines.append(
            f"| {name} | {percent(s['f1'])} +- {percent(s['f1_se'])} | {percent(s['em'])} | "
            + " | ".join(percent(by_type.get(t)) for t in TYPES)
            + f" | {_num(s['mean_searches'])} | {_num(s['mean_queries'])} | "
            f"{'-' if tokens is None else f'{tokens:.0f}'} | {percent(s['well_formed_rate'])} | "
            f"{_num(s['seconds_per_question'])} | "
            + (f"{100 * gain['gain']:+.1f} +- {100 * gain['gain_se']:.1f} |" if gain else "|"))
    lines.append(f"target (multi-query GRPO above its SFT): {result['target_met']}")
    return "\n".join(lines)


def main() -> None:
    parser = bench_parser(__doc__, "saves/bench/search_agent_runs")
    parser.add_argument("--single-seeds", dest="single_seeds", type=int, nargs="*", default=[1],
                        help="seeds of the single-query arm's GRPO runs (none: no single arm)")
    parser.add_argument("--nomask-seeds", dest="nomask_seeds", type=int, nargs="*", default=[1],
                        help="seeds of the GRPO runs without the information mask")
    parser.add_argument("--three-agent", dest="three_agent", action="append", default=[],
                        metavar="LABEL=MODEL",
                        help="a three-agent model evaluated on the same questions (repeatable)")
    parser.add_argument("--steps", type=int, default=12, help="GRPO steps per run")
    add_variant_option(parser, "grpo-seed1-NAME")
    parser.add_argument("--sft-steps", dest="sft_steps", type=int, default=40,
                        help="format-SFT steps (the demo config's)")
    add_sft_eval_options(parser)
    result = run(parser.parse_args())
    print_result(result, format_table(result))


if __name__ == "__main__":
    main()
