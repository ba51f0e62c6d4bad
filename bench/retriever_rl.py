"""HARR on the demo world: does RL of the query encoder beat the frozen one? Recall and F1.

For each arm (the retrieval states the encoder is trained and measured on) the frozen encoder
is measured first, then one ``retriever_rl`` run per seed from the demo config
(``LLaMA-Factory/examples/demo/smollm2_retriever_rl.yaml``; ``--reward recall``, the default
here: the recall of the gold passages among the picks, which the demo world knows; ``--reward
f1``: HARR's answer F1 of the frozen SmolLM2 warm start), each measured the same way:

* ``plain``: one retrieval per reference sub-question, the sub-question alone as the state;
* ``history``: the same rounds with HARR's history-aware state (earlier sub-queries and what
  their retrievals observed; ``retriever_history: true``).

The measurement (:func:`mmoa.train.retriever_rl.evaluate.evaluate_encoder`) is greedy with the
states the arm trains on: dev and test recall@3 / recall@5 of the gold passages (top k of every
round together), test answer EM/F1 with the frozen generator answering from the top 3 of every
round. Gains are paired per question against the frozen encoder of the same arm, with their
standard errors.

Resumable: a finished run writes ``<work-dir>/<arm>-<reward>-seed<N>/result.json`` and is
skipped next time; an interrupted training continues from its last checkpoint. Needs the demo
world, its index served (``bash run_server.sh --index data/demo/index &``), ``demo_mappo``
data and the warm start (``saves/smollm2-135m/full/sft``)::

    python bench/retriever_rl.py --seeds 1 2 3 --json-out bench/results/retriever_rl_smollm2.json

Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from bench_runs import (
    RESULT,
    ROOT,
    bench_parser,
    code_version,
    paired_gain,
    print_result,
    resume_overrides,
    train,
    write_result,
)

from mmoa.fileio import atomic_write_json

CONFIG = "LLaMA-Factory/examples/demo/smollm2_retriever_rl.yaml"
ARMS = {"plain": False, "history": True}


def measure(args: argparse.Namespace, client: Any, generator: Any, encoder: Path | None,
            history: bool) -> dict[str, Any]:
    """Dev recall and test recall + F1 with the server serving ``encoder`` (None: the
    index's own), per question and summarised; the server gets its own encoder back."""
    from mmoa.data.loaders import load_qa
    from mmoa.train.retriever_rl.evaluate import evaluate_encoder

    client.reload_encoder(str(encoder.resolve()) if encoder else None)
    try:
        out = {}
        for split, path, gen in (("dev", args.dev_file, None), ("test", args.test_file, generator)):
            result = evaluate_encoder(load_qa(path), client, queries="decomposition",
                                      history=history, top_k=args.top_k, generator=gen)
            out[split] = {"summary": result["summary"],
                          "rows": {r["id"]: {k: v for k, v in r.items() if k != "id"}
                                   for r in result["rows"]}}
        return out
    finally:
        client.reload_encoder(None)


def encoder_path(run_dir: Path) -> Path:
    """Where :func:`train_encoder` writes the trained query encoder of a run in ``run_dir``."""
    return run_dir / "train" / "encoder"


def train_encoder(args: argparse.Namespace, run_dir: Path, seed: int, history: bool,
                  config: str = CONFIG) -> Path:
    """One ``retriever_rl`` run of ``config`` (resumed from its last checkpoint); returns its
    encoder (:func:`encoder_path`)."""
    encoder = encoder_path(run_dir)
    output = encoder.parent
    overrides = [f"output_dir={output}", f"seed={seed}", f"max_steps={args.steps}",
                 f"learning_rate={args.lr}", f"save_steps={args.save_steps}",
                 f"model_name_or_path={args.model}", f"retriever_url={args.retriever_url}",
                 f"retriever_top_k={args.top_k}", "retriever_queries=decomposition",
                 f"retriever_history={str(history).lower()}",
                 f"retriever_max_new_tokens={args.max_new_tokens}",
                 f"retriever_reward={args.reward}",
                 # a recall reward needs no answers: skip the generator in training
                 f"retriever_log_answer_f1={str(args.reward == 'f1').lower()}", *args.overrides]
    if encoder.is_dir():  # trained before the run's measurement was interrupted
        return encoder
    train(config, [*overrides, *resume_overrides(output)], run_dir / "train.log")
    return encoder


def training_figures(output: Path) -> dict[str, float]:
    """Mean time per step, and rollout F1 / recall of the first and last five steps."""
    rows = [json.loads(line) for line in (output / "trainer_log.jsonl").read_text().splitlines()
            if line.strip()]
    out = {"steps": len(rows), "time_per_step": statistics.fmean(r["time/step"] for r in rows)}
    for key in [k for k in ("answer_f1", "recall") if k in rows[0]]:
        out[f"{key}_first5"] = statistics.fmean(r[key] for r in rows[:5])
        out[f"{key}_last5"] = statistics.fmean(r[key] for r in rows[-5:])
    return out


def gains(frozen: dict[str, Any], trained: dict[str, Any]) -> dict[str, Any]:
    """Paired gains of ``trained`` over ``frozen``: dev/test recall@5, test F1."""
    def column(result: dict[str, Any], split: str, key: str) -> dict[str, float]:
        return {q: float(r[key]) for q, r in result[split]["rows"].items()}

    return {"dev_recall@5": paired_gain(column(frozen, "dev", "recall@5"),
                                        column(trained, "dev", "recall@5")),
            "test_recall@5": paired_gain(column(frozen, "test", "recall@5"),
                                         column(trained, "test", "recall@5")),
            "test_f1": paired_gain(column(frozen, "test", "f1"), column(trained, "test", "f1"))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from mmoa.retrieval.client import RetrievalClient
    from mmoa.train.retriever_rl.evaluate import frozen_generator

    work = ROOT / args.work_dir
    client = RetrievalClient(args.retriever_url, timeout=120)
    client.wait_until_ready(timeout=60)
    generator = frozen_generator(args.model, "smollm2", args.max_new_tokens, 16)
    result: dict[str, Any] = {"config": {**vars(args), "config_file": CONFIG,
                                         "code": code_version("bench/retriever_rl.py")},
                              "arms": {}}
    frozen: dict[str, Any] = {}
    for arm in args.arms:  # every arm's frozen encoder first, then the seeds arm by arm
        frozen_dir = work / f"{arm}-frozen"
        frozen[arm] = _load(frozen_dir)
        if frozen[arm] is None:
            started = time.perf_counter()
            frozen[arm] = {"measure": measure(args, client, generator, None, ARMS[arm])}
            _save(frozen_dir, frozen[arm], started)
        print(f"[{arm}] frozen: {_line(frozen[arm]['measure'])}", flush=True)
        result["arms"][arm] = {"frozen": frozen[arm], "runs": {}}
    for seed in args.seeds:
        for arm in args.arms:
            run_dir = work / f"{arm}-{args.reward}-seed{seed}"
            done = _load(run_dir)
            if done is None:
                started = time.perf_counter()
                encoder = train_encoder(args, run_dir, seed, ARMS[arm])
                done = {"seed": seed, "training": training_figures(encoder.parent),
                        "measure": measure(args, client, generator, encoder, ARMS[arm])}
                done["gains"] = gains(frozen[arm]["measure"], done["measure"])
                _save(run_dir, done, started)
            print(f"[{arm}] seed {seed}: {_line(done['measure'])}", flush=True)
            result["arms"][arm]["runs"][seed] = done
            if args.json_out:
                write_result(ROOT / args.json_out, _public(result), "bench/retriever_rl.py")
    return _public(result)


def _load(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / RESULT
    return json.loads(path.read_text()) if path.is_file() else None


def _save(run_dir: Path, result: dict[str, Any], started: float) -> None:
    result["seconds"] = round(time.perf_counter() - started, 1)
    atomic_write_json(run_dir / RESULT, result)


def _line(measured: dict[str, Any]) -> str:
    dev, test = measured["dev"]["summary"], measured["test"]["summary"]
    return (f"dev R@5 {100 * dev['recall@5']:.1f}  test R@5 {100 * test['recall@5']:.1f}  "
            f"test F1 {100 * test['f1']:.1f}")


def _public(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON written out: summaries and gains, the per-question rows left in work-dir."""
    def strip(measured: dict[str, Any]) -> dict[str, Any]:
        return {split: m["summary"] for split, m in measured.items()}

    arms = {}
    for arm, data in result["arms"].items():
        runs = {str(seed): {k: (strip(v) if k == "measure" else v) for k, v in r.items()}
                for seed, r in data["runs"].items()}
        beats = sum(r["gains"]["test_f1"]["gain"] > 0 and r["gains"]["test_recall@5"]["gain"] > 0
                    and r["gains"]["dev_recall@5"]["gain"] > 0 for r in data["runs"].values())
        arms[arm] = {"frozen": strip(data["frozen"]["measure"]), "runs": runs,
                     "seeds_above_frozen": f"{beats} of {len(runs)}"}
    return {"config": result["config"], "arms": arms}


def format_table(result: dict[str, Any]) -> str:
    lines = ["| arm | encoder | dev R@5 | test R@5 | test F1 | gain R@5 dev / test | gain F1 "
             "| s/step |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for arm, data in result["arms"].items():
        f = data["frozen"]
        lines.append(f"| {arm} | frozen | {100 * f['dev']['recall@5']:.1f} | "
                     f"{100 * f['test']['recall@5']:.1f} | {100 * f['test']['f1']:.1f} | | | |")
        for seed, r in data["runs"].items():
            m, g = r["measure"], r["gains"]
            lines.append(
                f"| {arm} | seed {seed} | {100 * m['dev']['recall@5']:.1f} | "
                f"{100 * m['test']['recall@5']:.1f} | {100 * m['test']['f1']:.1f} | "
                f"{100 * g['dev_recall@5']['gain']:+.1f} / {100 * g['test_recall@5']['gain']:+.1f}"
                f" | {100 * g['test_f1']['gain']:+.1f} +- {100 * g['test_f1']['gain_se']:.1f} | "
                f"{r['training']['time_per_step']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = bench_parser(__doc__, "saves/bench/retriever_rl_runs")
    parser.add_argument("--model", default="saves/smollm2-135m/full/sft",
                        help="the frozen generator (the SmolLM2 warm start)")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--reward", choices=["recall", "f1"], default="recall",
                        help="the training reward: gold-passage recall of the picks (the demo "
                             "world knows them; no generator in training) or answer F1 (HARR)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--save-steps", dest="save_steps", type=int, default=10)
    parser.add_argument("--top-k", dest="top_k", type=int, default=3,
                        help="passages per round (the config's retriever_top_k)")
    parser.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=16,
                        help="the generator's answer length (the demo MAPPO config's)")
    parser.add_argument("--dev-file", dest="dev_file", default="data/demo/dev.jsonl")
    parser.add_argument("--test-file", dest="test_file", default="data/demo/test.jsonl")
    result = run(parser.parse_args())
    print_result(result, format_table(result))


if __name__ == "__main__":
    main()
