"""Learning signal: does joint MAPPO improve on the warm start? Test F1 with standard errors.

A warm start (the demo SFT config from SmolLM2-135M-Instruct, seed 42) serves the MAPPO runs
of a session: the seeds differ in the MAPPO run (question order, sampling, mini-batch order).
Then the per-agent ablation of the paper: MAPPO optimising only the Query Rewriter, only the
Selector, only the Generator (from the same warm start, the first seed); the first seed's run
with all three is the "all agents" row. The configs are the demo's; every figure here is on
the test split.

Each MAPPO run is paired with the warm start it was trained from: its gain is the mean
per-question F1 difference on the same test questions. The project's machines keep no files
between sessions and the SFT is not bit-for-bit repeatable across them (the same config and
seed gave test F1 42.8 in one session and 41.7 in another), so a bench that spans sessions
re-trains the warm start each session and its seeds may come from different warm starts; the
mean of the paired gains then also averages over warm starts.

Resumable: each finished run writes ``<work-dir>/<run>/result.json`` and is skipped next time;
an interrupted MAPPO run continues from its last checkpoint. The finished runs recorded in the
previous JSON (``--previous``, default the ``--json-out`` file) are carried over with their
warm start's figures, and a warm start whose weights (SHA-256) match an earlier one reuses that
evaluation instead of running it again. Run it again until the summary says every run is done.

Needs the demo data (``bash run_demo.sh`` leaves it, or the stages by hand: world, index, SFT and
MAPPO data) and a running retrieval server::

    bash run_server.sh --index data/demo/index &
    python bench/learning_signal.py --seeds 1 2 3 --json-out bench/results/learning_signal.json

The demo world's own test split has 200 questions: a paired gain then has a standard error of
about 3 F1, larger than the 2-point gain the target asks for. A larger test set comes from a
second world of the same generator with its own corpus (seed 43, every question a test question;
no entity, passage or question of it was seen in training), served on its own port::

    python data_builders/make_demo_world.py --out data/test_world --seed 43 \
        --n-passages 2000 --n-train 0 --n-dev 0 --n-test 1000
    python data_builders/build_index.py --corpus data/test_world/corpus.jsonl \
        --output data/test_world/index
    bash run_server.sh --index data/test_world/index --port 8001 &
    python bench/learning_signal.py --eval-file data/test_world/test.jsonl \
        --eval-retriever-url http://127.0.0.1:8001 --json-out bench/results/learning_signal.json

Baselines on the same questions (``--baselines rag:5 rag:1``): the warm start as one-shot
retrieve-then-generate (the question alone, the top K passages), each paired with the warm
start's three-agent pipeline and with every MAPPO seed. On a world whose top passage is nearly
always a gold one, ``rag`` with K = 1 is the bar a Selector has to clear. A baseline of the same
warm-start weights recorded in ``--previous`` is reused, not evaluated again.

Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_runs import (
    RESULT,
    AttemptClock,
    check_overrides,
    code_version,
    load_json_or_exit,
    model_arguments,
    paired_gain,
    per_question_f1,
    percent,
    rollout_limits,
    run_logged,
    train_to_end,
    training_tail,
    write_result,
)

from mmoa.fileio import atomic_write_json
from mmoa.metrics import SCORING_PROFILES

AGENTS = ("qr", "selector", "generator")
#: What this bench's JSON must hold to be reported or carried over, and what a finished
#: run's result.json must hold (bench_runs.read_json_object).
PREVIOUS_KEYS = {"warm_start": dict, "mappo": dict, "ablation": dict}
RESULT_KEYS = {**PREVIOUS_KEYS, "warm_start.test": dict}
WHAT = "a learning_signal result JSON"
MODELS = {
    # name: (base model, template, SFT config, MAPPO config)
    "smollm2": ("models/smollm2-135m-instruct", "smollm2",
                "LLaMA-Factory/examples/demo/smollm2_full_sft.yaml",
                "LLaMA-Factory/examples/demo/smollm2_full_mappo.yaml"),
    "tiny": ("saves/tiny-llama3/pt", "llama3",
             "LLaMA-Factory/examples/demo/tiny_full_sft.yaml",
             "LLaMA-Factory/examples/demo/tiny_full_mappo.yaml"),
}
#: The GRPO config of each model (``--algorithm grpo``): its MAPPO config with
#: ``mappo_algorithm: grpo``, 4 questions x group size 4 = the same 16 pipelines a step.
GRPO_CONFIGS = {"smollm2": "LLaMA-Factory/examples/demo/smollm2_full_grpo.yaml",
                "tiny": "LLaMA-Factory/examples/demo/tiny_full_grpo.yaml"}


def rl_config(args: argparse.Namespace) -> str:
    """The config of the RL runs: the model's MAPPO config, or its GRPO one."""
    return GRPO_CONFIGS[args.model] if args.algorithm == "grpo" else MODELS[args.model][3]
#: Seeds the target is judged on ("MAPPO above the warm start in 3 of 3 seeds").
TARGET_SEEDS = 3


def evaluate(model: Path, args: argparse.Namespace, out: Path, mode: str = "qr_s_g",
             base: str | Path | None = None, k: int | None = None) -> dict[str, Any]:
    """The pipeline of ``mode`` (``qr_s_g``; ``rag`` for retrieve-then-generate) on
    ``args.eval_file`` with the RL config's generation limits; its ``metrics.json``. Other
    benches (``side_by_side.py``) evaluate their three-agent rows with it, so that every
    three-agent figure is scored the same way; ``args.scoring`` (absent: the evaluator's
    default profile) picks the scoring, e.g. ``hotpotqa`` on real HotpotQA files. ``base``:
    the model a LoRA ``model`` was trained from (see :func:`model_arguments`); ``k``: the
    candidates per question (default ``args.k``)."""
    template = MODELS[args.model][1]
    command = [sys.executable, "evaluate/evaluate_qr_s_g.py", *model_arguments(model, base),
               "--template", template, "--data_file", args.eval_file, "--mode", mode,
               "--k", str(k or args.k),
               "--retriever_url", args.eval_retriever_url or args.retriever_url,
               "--precision", args.precision, *rollout_limits(rl_config(args)),
               "--output_dir", str(out)]
    if args.max_eval:
        command += ["--max_samples", str(args.max_eval)]
    if getattr(args, "scoring", None):
        command += ["--scoring", args.scoring]
    run_logged(command, out / "eval.log")
    return json.loads((out / "metrics.json").read_text())


def weights_digest(model_dir: Path) -> str:
    """SHA-256 over the model's weight files (sorted by name): the identity of a warm start
    across sessions, where a re-trained one must be the same model for earlier seeds to pair
    with it."""
    files = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    if not files:
        raise SystemExit(f"no weight files (*.safetensors, *.bin) in {model_dir}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def warm_start_ref(sft: dict[str, Any]) -> dict[str, Any]:
    """What a MAPPO run records of the warm start it was paired with."""
    return {"model": sft["model"], "weights_sha256": sft.get("weights_sha256"),
            "test": {k: sft["test"].get(k) for k in ("f1", "f1_se", "em", "acc")}}


def load_previous(path: str | None, args: argparse.Namespace | None = None
                  ) -> dict[str, Any] | None:
    """The earlier JSON whose runs are carried over; refused when it scored another question
    set (its figures would be paired with questions this invocation does not evaluate) or
    trained other runs (another algorithm, other agents) or scored them otherwise."""
    if not path or not Path(path).is_file():
        return None
    previous = load_json_or_exit(path, f"{WHAT} whose runs are carried over (or pass "
                                       f"--previous none)", PREVIOUS_KEYS)
    if args is not None:
        config = {"algorithm": "ppo", "agents": ",".join(AGENTS),  # before those options
                  **previous.get("config", {})}
        for key in ("eval_file", "max_eval", "algorithm", "agents", "scoring"):
            ours = getattr(args, key, None)  # scoring: absent before the option existed
            if config.get(key) != ours:
                raise SystemExit(f"{path} was made with {key}={config.get(key)!r}, this run "
                                 f"with {ours!r}: its runs cannot be carried over "
                                 "(pass --previous none, or another --json-out)")
    return previous


def summary(metrics: dict[str, Any], eval_dir: Path) -> dict[str, Any]:
    """What a run records of its evaluation: EM / F1 (with SE), the agents' statistics."""
    agents = metrics["agents"]
    selector, generator = agents.get("selector", {}), agents.get("generator", {})
    return {
        "f1": metrics["f1"], "f1_se": metrics.get("f1_se"), "em": metrics["em"],
        "acc": metrics["acc"], "num_questions": metrics["num_questions"],
        "candidate_support_recall": agents.get("retrieval", {}).get("candidate_support_recall"),
        "mean_subquestions": agents.get("qr", {}).get("mean_subquestions"),
        "selector_support_recall": selector.get("support_recall"),
        "selector_support_precision": selector.get("support_precision"),
        "mean_selected": selector.get("mean_selected"),
        # 1.0: the Selector made one choice for every question (e.g. the top candidate)
        "selector_most_common_share": selector.get("choices", {}).get("most_common_share"),
        "mean_answer_words": generator.get("mean_answer_words"),
        "well_formed": {a: agents.get(a, {}).get("well_formed_rate") for a in AGENTS},
        "scoring": metrics.get("scoring", {}).get("profile", "mmoa"),
        "eval_dir": str(eval_dir),
    }


#: The logged keys a MAPPO run's last steps are summarised by (rollout F1, reward, KL, step
#: time, each agent's penalty rate, and the per-agent statistics that show a collapse: the
#: Selector's documents and gold recall, the candidates' gold recall, the answer's words, the
#: drift monitor's flags; the run's training_agents.png draws them step by step).
TAIL_KEYS = ("answer_f1", "reward", "kl", "time/step", *(f"penalty_rate/{a}" for a in AGENTS),
             "num_selected", "selected_gold_recall", "candidate_gold_recall", "answer_words",
             "drift_flags")


def _training_tail(output_dir: Path, last: int = 5) -> dict[str, float]:
    """Mean of the last ``last`` logged MAPPO steps of :data:`TAIL_KEYS`."""
    return training_tail(output_dir, TAIL_KEYS.__contains__, last)


def _done(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / RESULT
    return load_json_or_exit(path, "a finished run's result (remove it to run it again)",
                             {"test": dict}) if path.is_file() else None


def _finish(run_dir: Path, result: dict[str, Any], clock: AttemptClock) -> dict[str, Any]:
    """Keep a run's result with its wall time over every attempt (a run cut by a session's
    end and resumed from its checkpoint counts both), after its clock has stopped."""
    result["seconds"] = round(clock.total, 1)
    result["attempts"] = clock.attempts
    atomic_write_json(run_dir / RESULT, result)
    clock.finish()
    return result


def warm_start(args: argparse.Namespace, work: Path,
               earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """The warm start, trained here unless ``--warm-start`` names one, and its test figures;
    taken from an ``earlier`` warm start (no evaluation) with the same weights digest."""
    run_dir = work / "warm_start"
    if (done := _done(run_dir)) is not None:
        return done
    with AttemptClock(run_dir) as clock:
        record = _warm_start_record(args, run_dir, earlier)
    return _finish(run_dir, record, clock)


def _warm_start_record(args: argparse.Namespace, run_dir: Path,
                       earlier: list[dict[str, Any]]) -> dict[str, Any]:
    model = Path(args.warm_start) if args.warm_start else run_dir / "sft"
    if not args.warm_start:
        train_warm_start(args, model)
    digest = weights_digest(model)
    record: dict[str, Any] = {"model": str(model), "trained_here": not args.warm_start,
                              "weights_sha256": digest}
    same = next((w for w in earlier if w.get("weights_sha256") == digest
                 and "per_question_f1" in w), None)
    if same is not None:
        print(f"[warm start] same weights as an earlier one ({digest[:12]}): its evaluation "
              "is reused", flush=True)
        record.update(test=same["test"], per_question_f1=same["per_question_f1"],
                      reused_evaluation=True)
        return record
    metrics = evaluate(model, args, run_dir / "eval")
    record.update(test=summary(metrics, run_dir / "eval"),
                  per_question_f1=per_question_f1(run_dir / "eval"))
    return record


def train_warm_start(args: argparse.Namespace, model: Path) -> None:
    """The model's three-agent SFT config into ``model`` (resumed where it was cut), from
    ``--base-model`` or the model's own base; its log beside ``model``."""
    base, _, sft_config, _ = MODELS[args.model]
    train_to_end(sft_config, [f"model_name_or_path={args.base_model or base}", "seed=42",
                              f"output_dir={model}", *args.sft_overrides, *args.overrides],
                 model, model.parent / "train.log")


def earlier_warm_starts(previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every warm start a previous JSON recorded (its current one and those before)."""
    if previous is None:
        return []
    return [previous["warm_start"], *previous.get("earlier_warm_starts", [])]


def carried_runs(previous: dict[str, Any] | None,
                 source: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The MAPPO and ablation runs of ``previous``, each with the warm start it was paired
    with (a run recorded before runs named theirs was paired with the JSON's warm start)."""
    if previous is None:
        return {}, {}

    def mark(runs: dict[str, Any]) -> dict[str, Any]:
        return {name: {**run, "warm_start": run.get("warm_start",
                                                    warm_start_ref(previous["warm_start"])),
                       "carried_over_from": run.get("carried_over_from", source)}
                for name, run in runs.items()}
    return mark(previous.get("mappo", {})), mark(previous.get("ablation", {}))


def mappo_run(args: argparse.Namespace, work: Path, name: str, seed: int, agents: str,
              sft_model: str, keep_checkpoints: bool = False) -> dict[str, Any]:
    """One MAPPO / GRPO run from ``sft_model`` and its test figures, kept in
    ``<work>/<name>/result.json``; resumed from its last checkpoint when an earlier attempt
    was cut, its seconds summed over the attempts. Its ``checkpoint-N`` folders are deleted
    once it has trained, unless ``keep_checkpoints`` (for ``bench/dev_curve.py``)."""
    run_dir = work / name
    if (done := _done(run_dir)) is not None:
        return done
    with AttemptClock(run_dir) as clock:
        record = _mappo_record(args, run_dir, name, seed, agents, sft_model, keep_checkpoints)
    return _finish(run_dir, record, clock)


def _mappo_record(args: argparse.Namespace, run_dir: Path, name: str, seed: int, agents: str,
                  sft_model: str, keep_checkpoints: bool) -> dict[str, Any]:
    output = run_dir / "mappo"
    code = run_dir / "code_version.txt"  # the commit the run started with
    if not code.is_file():
        run_dir.mkdir(parents=True, exist_ok=True)
        code.write_text(code_version("bench/learning_signal.py") + "\n")
    train_rl(args, output, seed, agents, sft_model, keep_checkpoints)
    metrics = evaluate(output, args, run_dir / "eval", base=sft_model)
    return {"seed": seed, "agents": agents, "algorithm": args.algorithm, "model": str(output),
            "code_version": code.read_text().strip(),
            "test": summary(metrics, run_dir / "eval"),
            "per_question_f1": per_question_f1(run_dir / "eval"),
            "training_last_steps": _training_tail(output)}


def train_rl(args: argparse.Namespace, output: Path, seed: int, agents: str, sft_model: str,
             keep_checkpoints: bool = False) -> None:
    """One run of the RL config of ``args.algorithm`` from ``sft_model`` into ``output``
    (resumed where it was cut; its log beside ``output``)."""
    overrides = [f"model_name_or_path={sft_model}", f"seed={seed}", f"output_dir={output}",
                 f"mappo_retriever_url={args.retriever_url}", f"mappo_top_k={args.k}",
                 f"mappo_agents={agents}", *args.mappo_overrides, *args.overrides]
    train_to_end(rl_config(args), overrides, output, output.parent / "train.log",
                 keep_checkpoints)


def parse_baseline(spec: str) -> tuple[str, int]:
    """``rag:1`` -> (``rag``, 1): a baseline's evaluation mode and candidates per question."""
    mode, _, k = spec.partition(":")
    if mode != "rag" or not k.isdigit() or int(k) < 1:
        raise argparse.ArgumentTypeError(f"a baseline is rag:K with K >= 1, not {spec!r}")
    return mode, int(k)


def baseline_name(spec: str) -> str:
    mode, k = parse_baseline(spec)
    return f"{mode}_k{k}"


def baseline_run(args: argparse.Namespace, work: Path, spec: str, sft: dict[str, Any],
                 earlier: list[dict[str, Any]]) -> dict[str, Any]:
    """The warm start evaluated as the baseline ``spec`` (``rag:K``), kept in
    ``<work>/baseline_<name>/result.json``; taken from an ``earlier`` record of the same spec
    and warm-start weights instead of evaluating again."""
    mode, k = parse_baseline(spec)
    name = baseline_name(spec)
    run_dir = work / f"baseline_{name}"
    if (done := _done(run_dir)) is not None and \
            done.get("weights_sha256") == sft["weights_sha256"]:
        return done
    same = next((b for b in earlier if b.get("spec") == spec
                 and b.get("weights_sha256") == sft["weights_sha256"]), None)
    if same is not None:
        print(f"[baseline {name}] same warm start as an earlier one: its evaluation is reused",
              flush=True)
        return {key: value for key, value in same.items() if key != "paired"}
    with AttemptClock(run_dir) as clock:
        metrics = evaluate(Path(sft["model"]), args, run_dir / "eval", mode=mode, k=k)
        record = {"spec": spec, "mode": mode, "k": k, "model": sft["model"],
                  "weights_sha256": sft["weights_sha256"],
                  "test": summary(metrics, run_dir / "eval"),
                  "per_question_f1": per_question_f1(run_dir / "eval")}
    return _finish(run_dir, record, clock)


def baseline_pairings(baseline: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """Paired gains over ``baseline`` (on the same questions) of the warm start's three-agent
    pipeline, of each MAPPO seed trained from that warm start, and of those seeds pooled
    (:func:`pooled_gain`)."""
    base = baseline["per_question_f1"]
    sft = result["warm_start"]
    paired: dict[str, Any] = {}
    if sft.get("weights_sha256") == baseline["weights_sha256"] and "per_question_f1" in sft:
        paired["warm_start"] = paired_gain(base, sft["per_question_f1"])
    seeds = {seed: run for seed, run in result["mappo"].items()
             if run["warm_start"].get("weights_sha256") == baseline["weights_sha256"]
             and "per_question_f1" in run}
    for seed, run in seeds.items():
        paired[f"mappo_seed{seed}"] = paired_gain(base, run["per_question_f1"])
    if len(seeds) > 1:
        paired["mappo_seeds_pooled"] = pooled_gain(
            base, [run["per_question_f1"] for run in seeds.values()])
    return paired


def mean_over_seeds(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each question's F1 averaged over the runs (seeds) that all scored it."""
    questions = [q for q in runs[0] if all(q in run for run in runs)]
    return {q: statistics.fmean(run[q] for run in runs) for q in questions}


def pooled_gain(sft: dict[str, float], runs: list[dict[str, float]]) -> dict[str, float]:
    """Mean F1 gain of several MAPPO seeds over the warm start they share, with its standard
    error over questions: each question's gain is averaged over the seeds first, since seeds
    scored on the same questions are not independent samples (the question-to-question spread
    counts once, the seed-to-seed noise averages out). One run gives :func:`paired_gain`."""
    return {**paired_gain(sft, mean_over_seeds(runs)), "seeds": len(runs)}


def pooled_over_current_warm_start(result: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`pooled_gain` of the MAPPO seeds trained from this invocation's warm start (the
    ones whose per-question F1 is recorded); None when there are none."""
    sft = result["warm_start"]
    runs = [run for run in result["mappo"].values()
            if run["warm_start"].get("weights_sha256") == sft.get("weights_sha256")
            and "per_question_f1" in run]
    if "per_question_f1" not in sft or not runs:
        return None
    return {**pooled_gain(sft["per_question_f1"], [r["per_question_f1"] for r in runs]),
            "seed_names": sorted(str(r["seed"]) for r in runs)}


def _summarise(result: dict[str, Any], started: float) -> dict[str, Any]:
    """The target is judged only once every planned seed is done (``target_met`` is ``None``
    before): one seed above the warm start is not "3 of 3"."""
    gains = [r["paired"]["gain"] for r in result["mappo"].values()]
    # the target speaks of three seeds, whatever one invocation was asked to run
    planned = max(len({str(seed) for seed in result["config"]["seeds"]} | set(result["mappo"])),
                  TARGET_SEEDS)
    sft = result["warm_start"]
    digests = {r["warm_start"].get("weights_sha256") or r["warm_start"]["model"]
               for r in [*result["mappo"].values(), *result["ablation"].values()]}
    return {
        "sft_f1": sft["test"]["f1"], "sft_f1_se": sft["test"]["f1_se"],
        "warm_starts_used": len(digests),
        "sft_f1_mean_of_seeds": statistics.fmean(
            r["warm_start"]["test"]["f1"] for r in result["mappo"].values()) if gains else None,
        "mappo_f1_mean": statistics.fmean(r["test"]["f1"] for r in result["mappo"].values())
        if gains else None,
        "mean_gain": statistics.fmean(gains) if gains else None,
        # the seed-to-seed spread of the gain (its standard error over seeds)
        "mean_gain_se_over_seeds": statistics.stdev(gains) / math.sqrt(len(gains))
        if len(gains) > 1 else None,
        "pooled_gain_current_warm_start": pooled_over_current_warm_start(result),
        "seeds_above_sft": sum(g > 0 for g in gains), "seeds": len(gains),
        "seeds_planned": planned,
        "runs_done": 1 + len(result["mappo"]) + len(result["ablation"]),
        "target": "MAPPO above SFT in every seed, mean gain >= 0.02 F1",
        "target_met": None if len(gains) < planned else
        all(g > 0 for g in gains) and statistics.fmean(gains) >= 0.02,
        "seconds_this_invocation": round(time.perf_counter() - started, 1),
    }


def _refresh(result: dict[str, Any], started: float) -> None:
    """Recomputes what is derived from the runs: the summary, and each baseline's pairings with
    the warm start and the seeds (a resumed bench or ``--report`` may hold seeds the baselines
    were not yet paired with)."""
    result["summary"] = _summarise(result, started)
    for baseline in result.get("baselines", {}).values():
        baseline["paired"] = baseline_pairings(baseline, result)


def _record(args: argparse.Namespace, result: dict[str, Any], started: float) -> None:
    """The summary and the JSON so far (after every finished run, so that a cut session still
    leaves its figures)."""
    _refresh(result, started)
    if args.json_out:
        write_result(args.json_out, result, "bench/learning_signal.py")


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work_dir)
    started = time.perf_counter()
    previous = load_previous(args.previous, args)
    result: dict[str, Any] = {"model": args.model, "config": vars(args).copy(), "mappo": {},
                              "ablation": {}}
    earlier = earlier_warm_starts(previous)
    sft = warm_start(args, work, earlier)
    carried_mappo, carried_ablation = carried_runs(previous, args.previous)
    result["warm_start"] = sft
    # the warm starts of earlier sessions (carried-over runs were paired with them), once each
    seen = {sft["weights_sha256"]}
    result["earlier_warm_starts"] = []
    for warm in earlier:
        key = warm.get("weights_sha256") or f"{warm['model']} {warm['test']['f1']}"
        if key not in seen:
            seen.add(key)
            result["earlier_warm_starts"].append(warm)
    print(f"[warm start] test F1 {100 * sft['test']['f1']:.1f}", flush=True)
    # a carried run is re-read from the work folder only when this invocation asks for it
    # (its seed or agent); one it does not ask for is kept as recorded, never dropped
    asked = {str(seed) for seed in args.seeds}
    for seed, carried in carried_mappo.items():
        if seed not in asked or not (work / f"mappo_seed{seed}" / RESULT).is_file():
            print(f"[seed {seed}] carried over from {args.previous}", flush=True)
            result["mappo"][seed] = carried
    result["ablation"].update({agent: run for agent, run in carried_ablation.items()
                               if agent not in args.ablation
                               or not (work / f"only_{agent}" / RESULT).is_file()})
    _record(args, result, started)
    for seed in args.seeds:
        if str(seed) in result["mappo"]:
            continue
        run_result = mappo_run(args, work, f"mappo_seed{seed}", seed, args.agents, sft["model"])
        run_result["paired"] = paired_gain(sft["per_question_f1"], run_result["per_question_f1"])
        run_result["warm_start"] = warm_start_ref(sft)
        result["mappo"][str(seed)] = run_result
        print(f"[seed {seed}] test F1 {100 * run_result['test']['f1']:.1f} "
              f"(gain {100 * run_result['paired']['gain']:+.1f} "
              f"+- {100 * run_result['paired']['gain_se']:.1f})", flush=True)
        _record(args, result, started)
    for agent in args.ablation:
        if agent in result["ablation"]:
            continue
        run_result = mappo_run(args, work, f"only_{agent}", args.seeds[0], agent, sft["model"])
        run_result["paired"] = paired_gain(sft["per_question_f1"], run_result["per_question_f1"])
        run_result["warm_start"] = warm_start_ref(sft)
        result["ablation"][agent] = run_result
        print(f"[only {agent}] test F1 {100 * run_result['test']['f1']:.1f}", flush=True)
        _record(args, result, started)
    earlier_baselines = list((previous or {}).get("baselines", {}).values())
    result["baselines"] = {name: run for name, run in (previous or {}).get("baselines", {}).items()
                           if name not in map(baseline_name, args.baselines)}
    for spec in args.baselines:
        result["baselines"][baseline_name(spec)] = baseline_run(args, work, spec, sft,
                                                                earlier_baselines)
        _record(args, result, started)
    _record(args, result, started)
    return result


def _scoring_lines(result: dict[str, Any]) -> list[str]:
    """What the F1 / EM / Acc columns were scored with (the eval runs here use the default
    profile; a summary written before profiles were recorded used it too)."""
    from mmoa.metrics import get_profile

    runs = [result["warm_start"], *result.get("earlier_warm_starts", []),
            *result["mappo"].values(), *result["ablation"].values()]
    labels = dict.fromkeys(r["test"].get("scoring", "mmoa") for r in runs)
    return [f"scoring {get_profile(label).describe()}" for label in labels]


def format_table(result: dict[str, Any]) -> str:
    header = (f"{'run':<24}{'F1':>6}{'+-SE':>6}{'EM':>6}{'Acc':>6}{'gain':>7}{'+-SE':>6}"
              f"{'cand rec':>9}{'S prec':>7}{'S rec':>7}{'S sel':>6}{'G words':>8}"
              f"  {'warm start':<12}")
    lines = [header, "-" * len(header)]

    def tag(warm: dict[str, Any]) -> str:
        digest = warm.get("weights_sha256")
        return digest[:12] if digest else "(no digest)"

    def row(name: str, test: dict[str, Any], paired: dict[str, float] | None,
            warm: dict[str, Any]) -> str:
        gain = percent(paired["gain"]) if paired else "-"
        gain_se = percent(paired["gain_se"]) if paired else "-"
        words = test.get("mean_answer_words")
        selected = test.get("mean_selected")
        return (f"{name:<24}{percent(test['f1']):>6}{percent(test.get('f1_se')):>6}"
                f"{percent(test['em']):>6}{percent(test['acc']):>6}{gain:>7}{gain_se:>6}"
                f"{percent(test.get('candidate_support_recall')):>9}"
                f"{percent(test.get('selector_support_precision')):>7}"
                f"{percent(test.get('selector_support_recall')):>7}"
                f"{'-' if selected is None else f'{selected:.2f}':>6}"
                f"{'-' if words is None else f'{words:.2f}':>8}  {tag(warm):<12}")

    for warm in [result["warm_start"], *result.get("earlier_warm_starts", [])]:
        lines.append(row("warm start (SFT)", warm["test"], None, warm))
    for seed, r in result["mappo"].items():
        lines.append(row(f"MAPPO seed {seed}", r["test"], r["paired"], r["warm_start"]))
    for agent, r in result["ablation"].items():
        lines.append(row(f"MAPPO only {agent}", r["test"], r["paired"], r["warm_start"]))
    baselines = result.get("baselines", {})
    for b in baselines.values():
        lines.append(row(f"{b['mode']} K={b['k']} (warm start)", b["test"], None, b))
    s = result["summary"]
    lines.append("-" * len(header))
    for b in baselines.values():
        gains = ", ".join(
            f"{name.replace('_', ' ')} {percent(g['gain'])} +- {percent(g['gain_se'])}"
            for name, g in b.get("paired", {}).items())
        lines.append(f"over {b['mode']} K={b['k']} (paired, F1): {gains or '-'}")
    lines.extend(_scoring_lines(result))
    verdict = "pending" if s["target_met"] is None else s["target_met"]
    spread = s.get("mean_gain_se_over_seeds")
    spread_text = "" if spread is None else " +- " + percent(spread)
    lines.append(f"MAPPO above SFT in {s['seeds_above_sft']} of {s['seeds']} seeds, mean gain "
                 f"{percent(s['mean_gain'])}{spread_text} F1 "
                 f"(+- its standard error over seeds); target met: {verdict}")
    pooled = s.get("pooled_gain_current_warm_start")
    if pooled and pooled["seeds"] > 1:
        lines.append(f"seeds {', '.join(pooled['seed_names'])} from the same warm start, each "
                     f"question's gain averaged over them: {percent(pooled['gain'])} +- "
                     f"{percent(pooled['gain_se'])} F1 over {pooled['n']} questions")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    parser.add_argument("--base-model", help="the model the warm start begins from "
                        "(default: models/smollm2-135m-instruct, or the tiny model's pt save)")
    parser.add_argument("--warm-start", dest="warm_start",
                        help="use this SFT model as the warm start instead of training one")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ablation", nargs="*", default=list(AGENTS), choices=AGENTS,
                        help="agents optimised alone from the warm start (default: all three)")
    parser.add_argument("--retriever-url", dest="retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--algorithm", choices=["ppo", "grpo"], default="ppo",
                        help="the RL runs' algorithm: the model's MAPPO config (ppo) or its GRPO "
                        "config (grpo: 4 questions x 4 rollouts a step, no value head)")
    parser.add_argument("--agents", default=",".join(AGENTS),
                        help="the agents the seeds' MAPPO runs optimise (default: all three)")
    parser.add_argument("--eval-file", dest="eval_file", default="data/demo/test.jsonl")
    parser.add_argument("--eval-retriever-url", dest="eval_retriever_url",
                        help="the server of the evaluation file's corpus, when it is not the "
                        "training world's (default: --retriever-url)")
    parser.add_argument("--max-eval", dest="max_eval", type=int,
                        help="evaluate on the first N questions only")
    parser.add_argument("--k", type=int, default=5, help="candidates per question (as the demo)")
    parser.add_argument("--scoring", choices=sorted(SCORING_PROFILES),
                        help="the evaluations' scoring profile (default: the evaluator's, mmoa; "
                        "hotpotqa on real HotpotQA files)")
    parser.add_argument("--baselines", nargs="*", default=[], metavar="rag:K",
                        type=lambda spec: parse_baseline(spec) and spec,
                        help="the warm start as one-shot rag with K candidates on the same "
                        "questions, paired with the warm start and every seed (e.g. rag:5 rag:1)")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument("--work-dir", default="saves/learning_signal")
    parser.add_argument("--sft", dest="sft_overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="an override of the SFT run only (repeatable)")
    parser.add_argument("--mappo", dest="mappo_overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="an override of every MAPPO run (repeatable)")
    parser.add_argument("--json-out", help="also write the JSON here")
    parser.add_argument("--previous", help="a JSON of this bench whose finished runs are carried "
                        "over (default: the --json-out file; 'none' for none)")
    parser.add_argument("--report", metavar="JSON", help="print the summary and the table of "
                        "this bench's JSON and exit (nothing is run; the summary is recomputed)")
    parser.add_argument("overrides", nargs="*",
                        help="key=value overrides for every training run (e.g. bf16=true)")
    args = parser.parse_args()
    for option, items in (("override", args.overrides), ("--sft", args.sft_overrides),
                          ("--mappo", args.mappo_overrides)):
        check_overrides(items, option)
    if args.report:
        recorded = load_json_or_exit(args.report, WHAT, RESULT_KEYS)
        kept = recorded.get("summary", {})
        _refresh(recorded, time.perf_counter())
        recorded["summary"] = {**kept, **recorded["summary"]}
        recorded["summary"].pop("seconds_this_invocation", None)
        print(json.dumps(recorded["summary"], indent=2))
        print()
        print(format_table(recorded))
        return
    if args.previous is None:
        args.previous = args.json_out
    elif args.previous == "none":
        args.previous = None
    import torch

    from mmoa.precision import resolve_precision, train_overrides

    args.precision = resolve_precision(args.precision)
    # first, so that an explicit bf16=... among the overrides wins
    args.overrides = [*train_overrides(args.precision, torch.cuda.is_available()),
                      *args.overrides]
    result = run(args)
    print(json.dumps(result, indent=2))
    print()
    print(format_table(result))


if __name__ == "__main__":
    main()
