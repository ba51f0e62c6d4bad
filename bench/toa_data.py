"""Warm-start data by tree search (TOA) on the demo world: label quality, then the warm starts.

Three datasets label the same training questions (the first ``--questions`` of the demo train
split, candidates ``--k`` as the demo):

* ``heuristic``: ``mmoa-cli data sft`` (the demo's labels: sub-questions from the question,
  documents by answer-word overlap, the gold answer);
* ``best_of_n`` and ``toa``: ``mmoa-cli data toa --baselines`` over ``--model`` specs at the same
  budget (``--samples-per-model`` x models per question and agent), the agents' rewards of
  docs/toa.md, generation limits of the demo MAPPO config.

Then, per dataset and seed, a warm start (the demo SFT config from SmolLM2-135M-Instruct on
that dataset) evaluated on the demo test split (three-agent pipeline, the MAPPO config's
limits), and MAPPO (the demo config) from the best dataset's first-seed warm start. The table:
label quality (QR gold recall, Selector precision / recall, answer EM / F1, which model won),
test F1 of each warm start (mean over seeds) and of MAPPO after the best, with paired gains.

Resumable: each finished stage writes ``<work-dir>/<stage>/result.json`` and is skipped next
time; MAPPO resumes from its last checkpoint. The results and the three datasets are also kept
in ``--archive`` (committed beside the JSON; one archive per configuration), so a fresh
checkout resumes from them: the two searches take about an hour on 2 CPU cores. A warm-start
model MAPPO needs but the checkout lacks is trained again (its stage rerun, test figures
included). Needs the demo world and its index served::

    bash run_server.sh --index data/demo/index &
    python bench/toa_data.py --questions 100 --seeds 1 2 3 \\
        --json-out bench/results/toa_data_smollm2.json

Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench_runs import (
    RESULT,
    ROOT,
    add_sft_eval_options,
    archive_stages,
    bench_parser,
    code_version,
    mmoa_cli,
    paired_gain,
    per_question_f1,
    percent,
    portable,
    print_result,
    restore_archived_stages,
    rollout_limits,
    run_logged,
    stage,
    train_to_end,
    write_result,
)

from mmoa.data.registry import read_dataset_info, register_datasets

SFT_CONFIG = "LLaMA-Factory/examples/demo/smollm2_full_sft.yaml"
MAPPO_CONFIG = "LLaMA-Factory/examples/demo/smollm2_full_mappo.yaml"
SCRIPT = "bench/toa_data.py"
#: Where ``data sft`` / ``data toa`` write and register by default, and the SFT config reads.
DATASET_DIR = ROOT / "data"
DATASETS = ("heuristic", "best_of_n", "toa")
#: The models of the search: zero-shot SmolLM2 plainly and with the careful prompt, and the
#: demo warm start (trained on the heuristic labels of the whole train split).
DEFAULT_MODELS = (
    "name=smol,path=models/smollm2-135m-instruct,template=smollm2",
    "name=smol_careful,path=models/smollm2-135m-instruct,template=smollm2,variant=careful",
    "name=warm,path=saves/smollm2-135m/full/sft,template=smollm2",
)


def dataset_name(args: argparse.Namespace, dataset: str) -> str:
    """The registered name of a dataset (``data toa`` names the other method NAME_<method>)."""
    return {"heuristic": f"{args.name}_heuristic", "toa": args.name,
            "best_of_n": f"{args.name}_best_of_n"}[dataset]


def make_data(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The three datasets of the same questions and the label-quality report."""
    log = work / "data" / "data.log"
    common = ["--data_file", f"{args.world_dir}/train.jsonl", "--max_samples",
              str(args.questions), "--k", str(args.k), "--retriever_url", args.retriever_url]
    run_logged(mmoa_cli("data", "sft", *common, "--name", dataset_name(args, "heuristic")), log)
    report = work / "data" / "label_quality.json"
    command = mmoa_cli("data", "toa", *common, "--name", args.name, "--baselines",
                       "--samples_per_model", str(args.samples_per_model),
                       "--report", str(report), "--precision", args.precision, "--no_progress")
    for spec in args.models:
        command += ["--model", spec]
    run_logged([*command, *rollout_limits(MAPPO_CONFIG)], log)
    return json.loads(report.read_text())


def archive_datasets(args: argparse.Namespace, archive: Path) -> None:
    """The three SFT datasets (gzipped) and their registry entries into ``archive/datasets``."""
    info = read_dataset_info(DATASET_DIR)
    folder = archive / "datasets"
    folder.mkdir(parents=True, exist_ok=True)
    entries = {}
    for dataset in DATASETS:
        name = dataset_name(args, dataset)
        entries[name] = info[name]
        source = DATASET_DIR / info[name]["file_name"]
        (folder / f"{source.name}.gz").write_bytes(gzip.compress(source.read_bytes(), mtime=0))
    write_result(folder / "dataset_info.json", entries, SCRIPT)


def restore_datasets(args: argparse.Namespace, archive: Path) -> None:
    """Write back and register the archived datasets the dataset folder lacks."""
    folder = archive / "datasets"
    entries = json.loads((folder / "dataset_info.json").read_text())
    missing = {name: entry for name, entry in entries.items()  # not the "code" it was made at
               if isinstance(entry, dict) and not (DATASET_DIR / entry["file_name"]).is_file()}
    for entry in missing.values():
        target = DATASET_DIR / entry["file_name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.decompress((folder / f"{entry['file_name']}.gz").read_bytes()))
    if missing:
        register_datasets(DATASET_DIR, missing)
        print(f"[data] restored from {folder}: {', '.join(sorted(missing))}", flush=True)


def evaluate(args: argparse.Namespace, model: Path, out: Path) -> dict[str, Any]:
    """The three-agent pipeline on the test split, as the demo MAPPO run generates."""
    command = [sys.executable, "evaluate/evaluate_qr_s_g.py", "--mode", "qr_s_g",
               "--model_name_or_path", str(model), "--template", "smollm2",
               "--data_file", f"{args.world_dir}/test.jsonl", "--k", str(args.k),
               "--retriever_url", args.retriever_url, "--precision", args.precision,
               "--output_dir", str(out)]
    command += rollout_limits(MAPPO_CONFIG)
    if args.max_eval:
        command += ["--max_samples", str(args.max_eval)]
    run_logged(command, out / "eval.log")
    metrics = json.loads((out / "metrics.json").read_text())
    selector = metrics["agents"].get("selector", {})
    return {"test": {"f1": metrics["f1"], "f1_se": metrics["f1_se"], "em": metrics["em"],
                     "selector_support_precision": selector.get("support_precision"),
                     "selector_support_recall": selector.get("support_recall"),
                     "mean_selected": selector.get("mean_selected"),
                     "num_questions": metrics["num_questions"]},
            "per_question_f1": per_question_f1(out)}


def warm_start(args: argparse.Namespace, work: Path, dataset: str, seed: int
               ) -> dict[str, Any]:
    output = work / f"sft-{dataset}-seed{seed}" / "model"
    train_to_end(SFT_CONFIG, [f"dataset={dataset_name(args, dataset)}", f"seed={seed}",
                              f"output_dir={output}", f"max_steps={args.sft_steps}",
                              *args.sft_overrides], output, output.parent / "train.log")
    return {**evaluate(args, output, output.parent / "eval"), "dataset": dataset, "seed": seed,
            "model": str(output)}


def mappo(args: argparse.Namespace, work: Path, warm: str) -> dict[str, Any]:
    output = work / "mappo" / "model"
    train_to_end(MAPPO_CONFIG, [f"model_name_or_path={warm}", f"output_dir={output}",
                                f"seed={args.seeds[0]}",
                                f"mappo_retriever_url={args.retriever_url}", *args.overrides],
                 output, output.parent / "train.log")
    return {**evaluate(args, output, output.parent / "eval"), "warm_start": warm}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from mmoa.retrieval.client import RetrievalClient

    work, archive = ROOT / args.work_dir, ROOT / args.archive
    RetrievalClient(args.retriever_url, timeout=120).wait_until_ready(timeout=60)
    if restored := restore_archived_stages(work, archive):
        print(f"[archive] stages restored from {archive}: {', '.join(restored)}", flush=True)
    data = stage(work, "data", lambda: make_data(args, work), SCRIPT)
    if (archive / "datasets").is_dir():
        restore_datasets(args, archive)
    else:
        archive_datasets(args, archive)
    result: dict[str, Any] = {"config": {**vars(args), "code": code_version(SCRIPT)},
                              "data": data, "warm_starts": {}}

    def record() -> None:
        archive_stages(work, archive, SCRIPT)
        if args.json_out:
            write_result(ROOT / args.json_out, public(result), SCRIPT)

    record()
    for seed in args.seeds:  # every dataset's first seed before any second seed
        for dataset in DATASETS:
            name = f"sft-{dataset}-seed{seed}"
            result["warm_starts"][name] = stage(
                work, name, lambda d=dataset, s=seed: warm_start(args, work, d, s), SCRIPT)
            print(f"[{name}] test F1 {100 * result['warm_starts'][name]['test']['f1']:.1f}",
                  flush=True)
            record()
    if args.mappo:
        best = best_dataset(result)
        name = f"sft-{best}-seed{args.seeds[0]}"
        # relative to the checkout in an archived result (see bench_runs.write_result)
        model = ROOT / result["warm_starts"][name]["model"] / "model.safetensors"
        if not (work / "mappo" / RESULT).is_file() and not model.is_file():
            (work / name / RESULT).unlink()  # restored from the archive: train it again
            result["warm_starts"][name] = stage(
                work, name, lambda: warm_start(args, work, best, args.seeds[0]), SCRIPT)
            record()
        warm = result["warm_starts"][name]
        result["mappo"] = stage(work, "mappo", lambda: mappo(args, work, warm["model"]), SCRIPT)
        result["mappo"]["dataset"] = best
        print(f"[mappo after {best}] test F1 {100 * result['mappo']['test']['f1']:.1f}",
              flush=True)
        record()
    return public(result)


def mean_f1(result: dict[str, Any], dataset: str) -> float:
    runs = [r for r in result["warm_starts"].values() if r["dataset"] == dataset]
    return statistics.fmean(r["test"]["f1"] for r in runs) if runs else float("nan")


def best_dataset(result: dict[str, Any]) -> str:
    """The dataset whose warm starts score the highest mean test F1 over the seeds."""
    return max(DATASETS, key=lambda d: mean_f1(result, d))


def public(result: dict[str, Any]) -> dict[str, Any]:
    """The JSON written out: label quality, each warm start's test figures with its paired gain
    over the heuristic warm start of the same seed, and MAPPO's gain over its warm start."""
    out: dict[str, Any] = {"config": result["config"], "data": result["data"],
                           "warm_starts": {}, "mean_f1": {}}
    starts = result["warm_starts"]
    for name, run in starts.items():
        entry = {k: v for k, v in run.items() if k != "per_question_f1"}
        base = starts.get(f"sft-heuristic-seed{run['seed']}")
        if base is not None and run["dataset"] != "heuristic":
            entry["gain_over_heuristic"] = paired_gain(base["per_question_f1"],
                                                       run["per_question_f1"])
        out["warm_starts"][name] = entry
    out["mean_f1"] = {d: mean_f1(result, d) for d in DATASETS
                      if any(r["dataset"] == d for r in starts.values())}
    if "mappo" in result:
        run = result["mappo"]
        # one may be read from the archive (portable), the other not
        warm = next(r for r in starts.values()
                    if portable(r["model"]) == portable(run["warm_start"]))
        out["mappo"] = {**{k: v for k, v in run.items() if k != "per_question_f1"},
                        "gain_over_warm_start": paired_gain(warm["per_question_f1"],
                                                            run["per_question_f1"])}
    return out


def format_table(result: dict[str, Any]) -> str:
    lines = ["| labels | QR gold R | Sel P | Sel R | #sel | ans EM | ans F1 | warm-start test F1 "
             "(mean of seeds) | seeds |", "| --- |" + " ---: |" * 8]
    quality = {q["method"]: q for q in result["data"]["label_quality"]}
    for dataset in DATASETS:
        q = quality.get(dataset, {})
        seeds = [r for r in result["warm_starts"].values() if r["dataset"] == dataset]
        lines.append(
            f"| {dataset} | {percent(q.get('qr_support_recall'))} | "
            f"{percent(q.get('selector_precision'))} | {percent(q.get('selector_recall'))} | "
            f"{q.get('mean_selected', 0):.2f} | {percent(q.get('answer_em'))} | "
            f"{percent(q.get('answer_f1'))} | {percent(result['mean_f1'].get(dataset))} | "
            + ", ".join(percent(r["test"]["f1"]) for r in seeds) + " |")
    if "mappo" in result:
        m = result["mappo"]
        gain = m["gain_over_warm_start"]
        lines.append(f"MAPPO after the best warm start ({m['dataset']}): test F1 "
                     f"{percent(m['test']['f1'])} ({100 * gain['gain']:+.1f} +- "
                     f"{100 * gain['gain_se']:.1f} over it)")
    return "\n".join(lines)


def main() -> None:
    parser = bench_parser(__doc__, "saves/bench/toa_data_runs")
    parser.add_argument("--questions", type=int, default=100,
                        help="training questions the three datasets label")
    parser.add_argument("--model", dest="models", action="append",
                        help="a model of the search (data toa's SPEC; repeatable; default: "
                             "zero-shot SmolLM2, its careful variant and the demo warm start)")
    parser.add_argument("--samples-per-model", dest="samples_per_model", type=int, default=2)
    parser.add_argument("--name", default="toa_bench", help="the datasets' registered name")
    parser.add_argument("--k", type=int, default=5, help="candidates per question (the demo's)")
    parser.add_argument("--sft-steps", dest="sft_steps", type=int, default=20,
                        help="warm-start steps (the demo config's)")
    parser.add_argument("--archive", default="bench/results/toa_data_smollm2",
                        help="folder (committed) keeping the stage results and the datasets")
    parser.add_argument("--no-mappo", dest="mappo", action="store_false",
                        help="stop after the warm starts")
    add_sft_eval_options(parser)
    args = parser.parse_args()
    args.models = args.models or list(DEFAULT_MODELS)
    result = run(args)
    print_result(result, format_table(result))


if __name__ == "__main__":
    main()
