"""Learning signal: does joint MAPPO improve on the warm start? SFT + MAPPO per seed, test F1.

For every seed: the demo warm start (SFT from the pre-trained tiny model), its test F1, MAPPO from
it, its test F1. Then the per-agent effect: from the first seed's warm start, MAPPO with only one
agent optimised at a time (the other two still act). Everything uses the demo configs of
``run_demo.sh`` (the same hyper-parameters; only seed and output folder change), which were tuned
on the dev split; the figures here are on the test split.

Needs what ``bash run_demo.sh`` leaves behind: the pre-trained tiny model, the SFT and MAPPO data
registered in data/dataset_info.json, the demo index; and a running retrieval server::

    bash run_server.sh --index data/demo/index &
    python bench/learning_signal.py --seeds 1 2 3           # about 35 min on 2 CPU cores

Prints one JSON object and a table; --json-out writes the JSON too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SFT_CONFIG = "LLaMA-Factory/examples/demo/tiny_full_sft.yaml"
MAPPO_CONFIG = "LLaMA-Factory/examples/demo/tiny_full_mappo.yaml"
AGENTS = ("qr", "selector", "generator")


def _run(command: list[str], log: Path) -> None:
    """Run one stage; its output goes to ``log`` (the bench prints one line per stage)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as handle:
        result = subprocess.run(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
                                check=False)
    if result.returncode != 0:
        raise SystemExit(f"failed ({result.returncode}): {' '.join(command)}\n  see {log}")


def _train(config: str, overrides: list[str], log: Path) -> None:
    _run([sys.executable, "-m", "mmoa.cli", "train", config, *overrides], log)


def _rollout_limits() -> list[str]:
    """Evaluation generates with the MAPPO rollout's per-agent limits (from its config)."""
    config = yaml.safe_load((ROOT / MAPPO_CONFIG).read_text())
    return [arg for agent in AGENTS for arg in
            (f"--max_new_tokens_{agent}", str(config[f"mappo_max_new_tokens_{agent}"]))]


def _evaluate(model: Path, args: argparse.Namespace, out: Path) -> dict:
    _run([sys.executable, "evaluate/evaluate_qr_s_g.py", "--model_name_or_path", str(model),
          "--data_file", args.eval_file, "--mode", "qr_s_g", "--k", str(args.k),
          "--retriever_url", args.retriever_url, *_rollout_limits(),
          "--output_dir", str(out)], out / "eval.log")
    return json.loads((out / "metrics.json").read_text())


def _summary(metrics: dict) -> dict:
    return {"f1": metrics["f1"], "em": metrics["em"], "acc": metrics["acc"],
            "selector_support_recall": metrics["agents"]["selector"].get("support_recall"),
            "mean_selected": metrics["agents"]["selector"].get("mean_selected")}


def run(args: argparse.Namespace) -> dict:
    work = Path(args.work_dir)
    common = [f"mappo_retriever_url={args.retriever_url}", f"mappo_top_k={args.k}",
              *args.overrides]
    result: dict = {"seeds": {}, "per_agent": {}, "config": vars(args).copy()}
    started = time.perf_counter()
    for seed in args.seeds:
        base = work / f"seed{seed}"
        t0 = time.perf_counter()
        _train(SFT_CONFIG, [f"model_name_or_path={args.base_model}", f"seed={seed}",
                            f"output_dir={base / 'sft'}", *args.overrides], base / "sft.log")
        sft = _summary(_evaluate(base / "sft", args, base / "eval_sft"))
        _train(MAPPO_CONFIG, [f"model_name_or_path={base / 'sft'}", f"seed={seed}",
                              f"output_dir={base / 'mappo'}", *common], base / "mappo.log")
        mappo = _summary(_evaluate(base / "mappo", args, base / "eval_mappo"))
        result["seeds"][seed] = {"sft": sft, "mappo": mappo,
                                 "delta_f1": mappo["f1"] - sft["f1"],
                                 "seconds": round(time.perf_counter() - t0, 1)}
        print(f"[seed {seed}] test F1 SFT {sft['f1']:.4f} -> MAPPO {mappo['f1']:.4f}", flush=True)
    first = work / f"seed{args.seeds[0]}"
    for agent in AGENTS if not args.skip_per_agent else ():
        out = work / f"only_{agent}"
        _train(MAPPO_CONFIG, [f"model_name_or_path={first / 'sft'}", f"seed={args.seeds[0]}",
                              f"output_dir={out / 'mappo'}", f"mappo_agents={agent}", *common],
               out / "mappo.log")
        metrics = _summary(_evaluate(out / "mappo", args, out / "eval"))
        result["per_agent"][agent] = metrics
        print(f"[only {agent}] test F1 {metrics['f1']:.4f}", flush=True)
    sft_f1 = [r["sft"]["f1"] for r in result["seeds"].values()]
    mappo_f1 = [r["mappo"]["f1"] for r in result["seeds"].values()]
    result["summary"] = {
        "sft_f1_mean": statistics.mean(sft_f1),
        "sft_f1_std": statistics.stdev(sft_f1) if len(sft_f1) > 1 else 0.0,
        "mappo_f1_mean": statistics.mean(mappo_f1),
        "mappo_f1_std": statistics.stdev(mappo_f1) if len(mappo_f1) > 1 else 0.0,
        "mappo_beats_sft_in_every_seed": all(m > s for s, m in zip(sft_f1, mappo_f1,
                                                                   strict=True)),
        "seconds": round(time.perf_counter() - started, 1),
    }
    return result


def format_table(result: dict) -> str:
    lines = [f"{'run':<22}{'test F1':>9}{'EM':>7}{'S recall':>10}{'S sel':>7}",
             "-" * 55]

    def row(name: str, m: dict) -> str:
        recall = m["selector_support_recall"]
        recall_text = f"{100 * recall:.1f}" if recall is not None else "-"
        return (f"{name:<22}{100 * m['f1']:>9.1f}{100 * m['em']:>7.1f}{recall_text:>10}"
                f"{m['mean_selected']:>7.2f}")

    for seed, r in result["seeds"].items():
        lines.append(row(f"seed {seed} SFT", r["sft"]))
        lines.append(row(f"seed {seed} MAPPO", r["mappo"]))
    for agent, m in result["per_agent"].items():
        lines.append(row(f"MAPPO only {agent}", m))
    s = result["summary"]
    lines.append("-" * 55)
    lines.append(f"SFT   F1 {100 * s['sft_f1_mean']:.1f} +- {100 * s['sft_f1_std']:.1f}   "
                 f"MAPPO F1 {100 * s['mappo_f1_mean']:.1f} +- {100 * s['mappo_f1_std']:.1f}   "
                 f"MAPPO > SFT in every seed: {s['mappo_beats_sft_in_every_seed']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--base-model", default="saves/tiny-llama3/pt",
                        help="the pre-trained tiny model the warm start begins from")
    parser.add_argument("--retriever-url", dest="retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--eval-file", dest="eval_file", default="data/demo/test.jsonl")
    parser.add_argument("--k", type=int, default=5, help="candidates per question (as the demo)")
    parser.add_argument("--work-dir", default="saves/learning_signal")
    parser.add_argument("--skip-per-agent", action="store_true")
    parser.add_argument("--json-out", help="also write the JSON here")
    parser.add_argument("overrides", nargs="*",
                        help="key=value overrides for every training run (e.g. bf16=true)")
    args = parser.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    print()
    print(format_table(result))
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
