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
import time
from pathlib import Path
from typing import Any

from learning_signal import (
    ROOT,
    _code_version,
    _last_checkpoint,
    _per_question_f1,
    _run,
    _train,
    paired_gain,
)

from mmoa.fileio import atomic_write_json

SFT_CONFIG = "LLaMA-Factory/examples/demo/smollm2_decision_agent_sft.yaml"
RL_CONFIG = "LLaMA-Factory/examples/demo/smollm2_decision_agent_grpo.yaml"
RESULT = "result.json"


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "mmoa.cli", *argv]


def prepare_data(args: argparse.Namespace, work: Path) -> None:
    """The SFT trajectories (searches answered by the live server) and the RL prompt set."""
    marker = work / "data" / RESULT
    if marker.is_file():
        return
    log = work / "data" / "data.log"
    _run(_cli("data", "decision-sft", "--data_file", f"{args.split_dir}/train.jsonl",
              "--name", "demo_decision_sft", "--retriever_url", args.retriever_url), log)
    _run(_cli("data", "mappo", "--data_file", f"{args.split_dir}/train.jsonl",
              "--name", "demo_decision_mappo"), log)
    atomic_write_json(marker, {"split_dir": args.split_dir})


def evaluate(args: argparse.Namespace, model: Path, out: Path, policy: str = "model"
             ) -> dict[str, Any]:
    """``evaluate_qr_s_g.py --mode decision_agent`` on the test split; its metrics and the
    per-question F1."""
    _run([sys.executable, "evaluate/evaluate_qr_s_g.py", "--mode", "decision_agent",
          "--decision_policy", policy, "--model_name_or_path", str(model),
          "--template", "smollm2", "--data_file", f"{args.split_dir}/test.jsonl",
          "--retriever_url", args.retriever_url, "--precision", "fp32",
          "--output_dir", str(out)], out / "eval.log")
    metrics = json.loads((out / "metrics.json").read_text())
    return {"summary": summary(metrics), "per_question_f1": _per_question_f1(out)}


def summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """What the table shows: overall and per-group EM / F1 / retrieval rate / searches."""
    decision = metrics["agents"]["decision"]
    return {"num_questions": metrics["num_questions"], "em": metrics["em"], "f1": metrics["f1"],
            "f1_se": metrics["f1_se"], "retrieval_rate": decision["retrieval_rate"],
            "mean_searches": decision["mean_searches"],
            "well_formed_rate": decision["well_formed_rate"],
            "forced_rate": decision["forced_rate"], "by_group": metrics.get("by_group", {}),
            "seconds_per_question": metrics.get("seconds_per_question")}


def stage(work: Path, name: str, produce: Any) -> dict[str, Any]:
    """Run ``produce()`` once: its result is kept in ``<work>/<name>/result.json``."""
    path = work / name / RESULT
    if path.is_file():
        return json.loads(path.read_text())
    started = time.perf_counter()
    result = produce()
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["code"] = _code_version()
    atomic_write_json(path, result)
    return result


def train_rl(args: argparse.Namespace, warm: Path, output: Path, seed: int, cost: float) -> None:
    """One GRPO run from the warm start, resumed from its last checkpoint."""
    if (output / "model.safetensors").is_file():
        return
    overrides = [f"model_name_or_path={warm}", f"output_dir={output}", f"seed={seed}",
                 f"max_steps={args.steps}", f"mappo_decision_retrieval_cost={cost}",
                 f"mappo_retriever_url={args.retriever_url}", *args.overrides]
    if (checkpoint := _last_checkpoint(output)) is not None:
        overrides.append(f"resume_from_checkpoint={checkpoint}")
    _train(RL_CONFIG, overrides, output.parent / "train.log")


def training_tail(output: Path, last: int = 3) -> dict[str, float]:
    """Mean of the last logged steps' reward and retrieval keys (the trainer's own log)."""
    rows = [json.loads(line) for line in (output / "trainer_log.jsonl").read_text().splitlines()
            if line.strip()][-last:]
    keys = sorted({k for r in rows for k in r if k == "reward" or k.startswith("decision/")})
    return {k: sum(r[k] for r in rows if k in r) / sum(k in r for r in rows) for k in keys}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from mmoa.retrieval.client import RetrievalClient

    work = ROOT / args.work_dir
    RetrievalClient(args.retriever_url, timeout=120).wait_until_ready(timeout=60)
    prepare_data(args, work)
    warm = work / "sft" / "model"

    def warm_start() -> dict[str, Any]:
        if not (warm / "model.safetensors").is_file():
            _train(SFT_CONFIG, [f"output_dir={warm}", *args.sft_overrides],
                   warm.parent / "train.log")
        return evaluate(args, warm, warm.parent / "eval")

    result: dict[str, Any] = {"config": {**vars(args), "code": _code_version()}, "runs": {}}
    runs = result["runs"]
    runs["sft"] = stage(work, "sft", warm_start)
    for policy in ("always", "never"):
        runs[policy] = stage(work, policy, lambda p=policy: evaluate(
            args, warm, work / p / "eval", policy=p))
    plan = [(args.cost, seed) for seed in args.seeds] + [(c, args.seeds[0])
                                                          for c in args.curve_costs]
    for cost, seed in plan:
        name = f"grpo-cost{cost:g}-seed{seed}"

        def rl(cost: float = cost, seed: int = seed, name: str = name) -> dict[str, Any]:
            output = work / name / "model"
            train_rl(args, warm, output, seed, cost)
            out = evaluate(args, output, work / name / "eval")
            out.update(seed=seed, cost=cost, training=training_tail(output))
            return out

        runs[name] = stage(work, name, rl)
        print(f"[{name}] {_line(runs[name])}", flush=True)
        if args.json_out:
            atomic_write_json(ROOT / args.json_out, public(result))
    return public(result)


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
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--cost", type=float, default=0.2,
                        help="the retrieval cost of the seeded runs (SmartRAG's)")
    parser.add_argument("--curve-costs", dest="curve_costs", type=float, nargs="*",
                        default=[0.0, 0.1],
                        help="further costs, one run each with the first seed (the F1 vs "
                             "retrieval-rate curve)")
    parser.add_argument("--steps", type=int, default=12, help="GRPO steps per run")
    parser.add_argument("--split-dir", dest="split_dir", default="data/demo_decision")
    parser.add_argument("--retriever-url", dest="retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--work-dir", dest="work_dir", default="saves/bench/decision_agent_runs")
    parser.add_argument("--sft-override", dest="sft_overrides", action="append", default=[],
                        help="key=value for the warm-start config (repeatable)")
    parser.add_argument("--json-out", dest="json_out")
    parser.add_argument("overrides", nargs="*", help="extra key=value for the GRPO config")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    print(format_table(result))


if __name__ == "__main__":
    main()
