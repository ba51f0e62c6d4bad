"""SmartRAG on the demo world: does RL teach the decision agent to skip retrieval it does not need?

One warm start (``LLaMA-Factory/examples/demo/smollm2_decision_agent_sft.yaml``: labels from the
measured zero-shot correctness, answer directly where the model knows), then GRPO runs
(``smollm2_decision_agent_grpo.yaml``) per retrieval cost and seed. Every model is evaluated on
the mixed test split (``data/demo_decision/test.jsonl``: the ``known`` group, which the
zero-shot model answers closed book, and the ``world`` group, which only retrieval answers),
next to two baselines that use the warm start as the answerer:

* ``always``: one search with the original question, then the answer (plain RAG);
* ``never``: the answer at once (closed book).

Per run: EM/F1 and the retrieval rate per group, searches per question, and the paired F1 gain
over the warm start with its standard error. The issue's target: after RL the retrieval rate on
known questions falls and F1 does not (judged per seed at the default cost).

Resumable: each finished stage writes ``<work-dir>/<stage>/result.json`` and is skipped next
time; a training resumes from its last checkpoint. Needs the decision split
(``mmoa-cli data known-split ... --out data/demo_decision``) and the demo index served
(``bash run_server.sh --index data/demo/index &``)::

    python bench/decision_agent.py --seeds 1 2 3 --curve-costs 0 0.1 \
        --json-out bench/results/decision_agent_smollm2.json

Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench_runs import (
    RESULT,
    ROOT,
    add_precision_option,
    add_variant_option,
    bench_parser,
    code_version,
    mmoa_cli,
    paired_gain,
    per_question_f1,
    print_result,
    resume_overrides,
    run_logged,
    stage,
    train,
    training_tail,
    variant_suffix,
    write_result,
)

from mmoa.fileio import atomic_write_json, atomic_write_jsonl, read_jsonl

SFT_CONFIG = "LLaMA-Factory/examples/demo/smollm2_decision_agent_sft.yaml"
RL_CONFIG = "LLaMA-Factory/examples/demo/smollm2_decision_agent_grpo.yaml"
SCRIPT = "bench/decision_agent.py"


def dataset_names(args: argparse.Namespace) -> tuple[str, str]:
    """The SFT and RL datasets of a split, named after its folder (``data/demo_decision`` ->
    ``demo_decision_sft`` / ``demo_decision_mappo``, the configs' own names), so that benches
    of two splits never overwrite each other's data."""
    split = Path(args.split_dir).name
    return f"{split}_sft", f"{split}_mappo"


def rl_dataset(args: argparse.Namespace) -> str:
    """The RL prompt set: the split's own, or its copy with the known questions repeated."""
    name = dataset_names(args)[1]
    return name if args.known_repeat == 1 else f"{name}_known{args.known_repeat}"


def known_weighted_rows(rows: list[dict[str, Any]], repeat: int) -> list[dict[str, Any]]:
    """``rows`` with every ``known`` question ``repeat`` times (ids suffixed ``-r2``, ``-r3``,
    ...), so that more of each RL step's groups ask a question the model can answer without
    searching: with the balanced split's 59 known of 259, about one question of a 4-question
    step is known, and most of its groups all answer directly (no reward variance)."""
    out = []
    for row in rows:
        out.append(row)
        if row.get("group") == "known":
            out.extend({**row, "id": f"{row['id']}-r{copy}"} for copy in range(2, repeat + 1))
    return out


def prepare_data(args: argparse.Namespace, work: Path) -> None:
    """The SFT trajectories (searches answered by the live server) and the RL prompt set."""
    log = work / "data" / "data.log"
    marker = work / "data" / RESULT
    if not marker.is_file():
        run_logged(mmoa_cli("data", "decision-sft", "--data_file",
                            f"{args.split_dir}/train.jsonl", "--name", dataset_names(args)[0],
                            "--retriever_url", args.retriever_url), log)
        run_logged(mmoa_cli("data", "mappo", "--data_file", f"{args.split_dir}/train.jsonl",
                            "--name", dataset_names(args)[1]), log)
        atomic_write_json(marker, {"split_dir": args.split_dir})
    weighted_marker = work / "data" / f"{rl_dataset(args)}.json"
    if args.known_repeat > 1 and not weighted_marker.is_file():
        rows = read_jsonl(ROOT / args.split_dir / "train.jsonl")
        weighted = work / "data" / f"train_known{args.known_repeat}.jsonl"
        atomic_write_jsonl(weighted, known_weighted_rows(rows, args.known_repeat))
        run_logged(mmoa_cli("data", "mappo", "--data_file", str(weighted),
                            "--name", rl_dataset(args)), log)
        atomic_write_json(weighted_marker, {"split_dir": args.split_dir,
                                            "known_repeat": args.known_repeat})


def evaluate(args: argparse.Namespace, model: Path, out: Path, policy: str = "model",
             data_file: str | None = None, sample_seed: int | None = None, *,
             template: str = "smollm2", scoring: str | None = None,
             max_samples: int | None = None) -> dict[str, Any]:
    """``evaluate_qr_s_g.py --mode decision_agent`` on the test split (or ``data_file``),
    greedy or, with ``sample_seed``, sampled as the rollouts are; its metrics and the
    per-question F1. The keywords let another bench (``side_by_side.py``) evaluate another
    model, scoring or number of questions the same way."""
    sampling = [] if sample_seed is None else ["--do_sample", "--seed", str(sample_seed)]
    extra = [*(["--scoring", scoring] if scoring else []),
             *(["--max_samples", str(max_samples)] if max_samples else [])]
    run_logged([sys.executable, "evaluate/evaluate_qr_s_g.py", "--mode", "decision_agent",
          "--decision_policy", policy, "--model_name_or_path", str(model),
          "--template", template, "--data_file", data_file or f"{args.split_dir}/test.jsonl",
          "--retriever_url", args.retriever_url, "--precision", args.precision,
          "--output_dir", str(out), *sampling, *extra], out / "eval.log")
    metrics = json.loads((out / "metrics.json").read_text())
    return {"summary": summary(metrics), "per_question_f1": per_question_f1(out)}


def summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """What the table shows: overall and per-group EM / F1 / retrieval rate / searches."""
    decision = metrics["agents"]["decision"]
    return {"num_questions": metrics["num_questions"], "em": metrics["em"], "f1": metrics["f1"],
            "f1_se": metrics["f1_se"], "retrieval_rate": decision["retrieval_rate"],
            "mean_searches": decision["mean_searches"],
            "well_formed_rate": decision["well_formed_rate"],
            "forced_rate": decision["forced_rate"], "by_group": metrics.get("by_group", {}),
            "seconds_per_question": metrics.get("seconds_per_question")}


def train_rl(args: argparse.Namespace, warm: Path, output: Path, seed: int, cost: float,
             config: str = RL_CONFIG) -> None:
    """One GRPO run of ``config`` from the warm start, resumed from its last checkpoint
    (``args.overrides`` last, so they win over the split's dataset)."""
    if (output / "model.safetensors").is_file():
        return
    overrides = [f"model_name_or_path={warm}", f"output_dir={output}", f"seed={seed}",
                 f"max_steps={args.steps}", f"mappo_decision_retrieval_cost={cost}",
                 f"mappo_retriever_url={args.retriever_url}",
                 f"dataset={rl_dataset(args)}", *args.overrides]
    train(config, [*overrides, *resume_overrides(output)], output.parent / "train.log")


def _decision_key(key: str) -> bool:
    """The trainer-log keys the table's training columns read: the reward and the decisions."""
    return key == "reward" or key.startswith("decision/")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from mmoa.retrieval.client import RetrievalClient

    work = ROOT / args.work_dir
    RetrievalClient(args.retriever_url, timeout=120).wait_until_ready(timeout=60)
    prepare_data(args, work)
    warm = work / "sft" / "model"

    def warm_start() -> dict[str, Any]:
        if not (warm / "model.safetensors").is_file():
            train(SFT_CONFIG, [f"output_dir={warm}", f"dataset={dataset_names(args)[0]}",
                               *args.sft_overrides],
                   warm.parent / "train.log")
        return evaluate(args, warm, warm.parent / "eval")

    result: dict[str, Any] = {"config": {**vars(args), "code": code_version(SCRIPT)}, "runs": {}}
    runs = result["runs"]
    runs["sft"] = stage(work, "sft", warm_start, SCRIPT)
    for policy in ("always", "never"):
        runs[policy] = stage(work, policy, lambda p=policy: evaluate(
            args, warm, work / p / "eval", policy=p), SCRIPT)
    plan = [(args.cost, seed) for seed in args.seeds] + [(c, args.seeds[0])
                                                          for c in args.curve_costs]
    for cost, seed in plan:
        name = (f"grpo-cost{cost:g}-seed{seed}" + variant_suffix(args.variant)
                + (f"-known{args.known_repeat}" if args.known_repeat > 1 else ""))

        def rl(cost: float = cost, seed: int = seed, name: str = name) -> dict[str, Any]:
            output = work / name / "model"
            train_rl(args, warm, output, seed, cost)
            out = evaluate(args, output, work / name / "eval")
            out.update(seed=seed, cost=cost, training=training_tail(output, _decision_key))
            return out

        runs[name] = stage(work, name, rl, SCRIPT)
        print(f"[{name}] {_line(runs[name])}", flush=True)
        if args.json_out:
            write_result(ROOT / args.json_out, public(result), SCRIPT)
    if args.sampled_eval:
        result["sampled"] = sampled_runs(args, work, list(runs))
        if args.json_out:
            write_result(ROOT / args.json_out, public(result), SCRIPT)
    return public(result)


def sampled_runs(args: argparse.Namespace, work: Path, names: list[str]) -> dict[str, Any]:
    """The warm start and every RL model evaluated with sampling (the rollouts' temperature
    and top-p) on the test questions of group ``--sampled-eval``, ``--sampled-repeats`` times
    (seeds 0, 1, ...): whether the policy as it is sampled in training skips search where the
    greedy one does not. Means over the repeats."""
    group = args.sampled_eval
    data = work / "data" / f"test_{group}.jsonl"
    if not data.is_file():
        rows = [r for r in read_jsonl(ROOT / args.split_dir / "test.jsonl")
                if group == "all" or r.get("group") == group]
        if not rows:
            raise SystemExit(f"--sampled-eval {group}: no test question of that group")
        atomic_write_jsonl(data, rows)
    out: dict[str, Any] = {}
    for name in names:
        if name in ("always", "never"):
            continue
        model = work / name / "model"
        repeats = []
        for seed in range(args.sampled_repeats):
            label = f"sampled-{group}/{name}-s{seed}"
            repeats.append(stage(work, label, lambda m=model, label=label, seed=seed: evaluate(
                args, m, work / label / "eval", data_file=str(data), sample_seed=seed), SCRIPT))
        summaries = [r["summary"] for r in repeats]
        out[name] = {key: sum(s[key] for s in summaries) / len(summaries)
                     for key in ("f1", "em", "retrieval_rate", "mean_searches")}
        out[name].update(num_questions=summaries[0]["num_questions"], repeats=len(summaries))
        print(f"[{name}, sampled, {group}] F1 {100 * out[name]['f1']:.1f}  "
              f"ret% {100 * out[name]['retrieval_rate']:.0f}", flush=True)
    return out


def _group(run: dict[str, Any], group: str, key: str) -> float:
    return run["summary"]["by_group"].get(group, {}).get(key, float("nan"))


def _line(run: dict[str, Any]) -> str:
    s = run["summary"]
    return (f"F1 {100 * s['f1']:.1f}  ret% known {100 * _group(run, 'known', 'retrieval_rate'):.0f}"
            f"  ret% world {100 * _group(run, 'world', 'retrieval_rate'):.0f}")


def public(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON written out: summaries, gains over the warm start and the target per seed;
    per-question figures stay in work-dir."""
    sft = result["runs"]["sft"]
    out: dict[str, Any] = {"config": result["config"], "runs": {}}
    met = []
    for name, run in result["runs"].items():
        entry = {k: v for k, v in run.items() if k != "per_question_f1"}
        if name != "sft":
            entry["gain_f1"] = paired_gain(sft["per_question_f1"], run["per_question_f1"])
        if name.startswith("grpo") and run["cost"] == result["config"]["cost"]:
            falls = (_group(run, "known", "retrieval_rate")
                     < _group(sft, "known", "retrieval_rate"))
            holds = entry["gain_f1"]["gain"] >= 0
            entry["target"] = {"known_retrieval_falls": falls, "f1_not_lower": holds}
            met.append(falls and holds)
        out["runs"][name] = entry
    out["target_met"] = f"{sum(met)} of {len(met)} seeds"
    if "sampled" in result:
        out["sampled"] = {"group": result["config"]["sampled_eval"],
                          "repeats": result["config"]["sampled_repeats"],
                          "runs": result["sampled"]}
    return out


def format_table(result: dict[str, Any]) -> str:
    lines = ["| run | F1 | EM | known F1 | known ret% | world F1 | world ret% | searches/q "
             "| F1 gain vs SFT |", "| --- |" + " ---: |" * 8]
    for name, run in result["runs"].items():
        s, gain = run["summary"], run.get("gain_f1")
        lines.append(
            f"| {name} | {100 * s['f1']:.1f} | {100 * s['em']:.1f} | "
            f"{100 * _group(run, 'known', 'f1'):.1f} | "
            f"{100 * _group(run, 'known', 'retrieval_rate'):.0f} | "
            f"{100 * _group(run, 'world', 'f1'):.1f} | "
            f"{100 * _group(run, 'world', 'retrieval_rate'):.0f} | {s['mean_searches']:.2f} | "
            + (f"{100 * gain['gain']:+.1f} +- {100 * gain['gain_se']:.1f} |" if gain else "|"))
    lines.append(f"target (known retrieval falls, F1 not lower): {result['target_met']}")
    if "sampled" in result:
        sampled = result["sampled"]
        lines += ["", f"sampled decoding, test group {sampled['group']}, "
                      f"{sampled['repeats']} repeats:",
                  "| run | n | F1 | EM | ret% | searches/q |", "| --- |" + " ---: |" * 5]
        lines += [f"| {name} | {r['num_questions']} | {100 * r['f1']:.1f} | {100 * r['em']:.1f} "
                  f"| {100 * r['retrieval_rate']:.0f} | {r['mean_searches']:.2f} |"
                  for name, r in sampled["runs"].items()]
    return "\n".join(lines)


def main() -> None:
    parser = bench_parser(__doc__, "saves/bench/decision_agent_runs")
    parser.add_argument("--cost", type=float, default=0.2,
                        help="the retrieval cost of the seeded runs (SmartRAG's)")
    parser.add_argument("--curve-costs", dest="curve_costs", type=float, nargs="*",
                        default=[0.0, 0.1],
                        help="further costs, one run each with the first seed (the F1 vs "
                             "retrieval-rate curve)")
    parser.add_argument("--steps", type=int, default=12, help="GRPO steps per run")
    parser.add_argument("--split-dir", dest="split_dir", default="data/demo_decision")
    parser.add_argument("--sft-override", dest="sft_overrides", action="append", default=[],
                        help="key=value for the warm-start config (repeatable)")
    add_precision_option(parser)
    add_variant_option(parser, "grpo-cost0.2-seed1-NAME")
    parser.add_argument("--known-repeat", dest="known_repeat", type=int, default=1,
                        help="each known question N times in the RL prompt set (the runs' "
                             "folders get -knownN); the warm start and the test are unchanged")
    parser.add_argument("--sampled-eval", dest="sampled_eval", metavar="GROUP",
                        help="also evaluate the warm start and the RL models with sampling "
                             "(as in training) on the test questions of GROUP (known, world "
                             "or all)")
    parser.add_argument("--sampled-repeats", dest="sampled_repeats", type=int, default=3,
                        help="sampled evaluations per model, seeds 0..N-1 (default 3)")
    args = parser.parse_args()
    if args.known_repeat < 1:
        parser.error("--known-repeat must be at least 1")
    if args.sampled_repeats < 1:
        parser.error("--sampled-repeats must be at least 1")
    result = run(args)
    print_result(result, format_table(result))


if __name__ == "__main__":
    main()
