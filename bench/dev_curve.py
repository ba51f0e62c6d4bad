"""Dev curve of a MAPPO / GRPO run: dev F1 at every checkpoint, to choose its number of steps.

A run (stage ``mappo``: ``llamafactory-cli train ... save_steps=N``, or ``learning_signal.py``'s
``mappo_run``) writes ``checkpoint-N/`` folders into its ``output_dir`` every ``save_steps`` and
the final model into ``output_dir`` itself. This bench evaluates each of them on a dev file with
the evaluation every three-agent figure of the benches goes through (``learning_signal.evaluate``:
greedy ``qr_s_g``, the RL config's generation limits, the scoring profile of ``side_by_side.py``)
and reports, per step: dev F1 +- SE, EM, the agents' statistics of the evaluation summary, and the
paired F1 gain over step 0 (``--warm-start``, the model the run started from) on the same
questions. The best step on dev (highest F1; the earliest of equal ones) is named in the JSON and
the table, and a PNG plots F1 with its SE band against the step.

A checkpoint is evaluated as it is: ``save_policy`` writes the policy's weights, its config and
the tokenizer into every ``checkpoint-N`` (beside the value head, optimiser and RNG state the
evaluation ignores), so the evaluator loads it like any saved model. A LoRA run's checkpoints
are adapters over the model the run started from: give that model as ``--warm-start``.

The curve needs the checkpoints: train with a ``save_total_limit`` large enough to keep every one
you want on the curve (``save_total_limit: 0`` or unset keeps all), or run this bench with
``--follow`` while the run trains, so each checkpoint is evaluated before rotation removes it.
``learning_signal.mappo_run`` deletes a run's checkpoints once it has trained (its bench reports
only the final model) unless asked to keep them (``side_by_side.py --keep-checkpoints``); else
start the run by hand, or follow it.

Resumable: each evaluated step is kept in ``<work-dir>/step-<N>/point.json`` with the SHA-256 of
the weights it evaluated, and a rerun evaluates only what is new (a step whose model's weights
changed, a run trained again into the same folder, is evaluated again). A work folder holds one
curve: a rerun with another run, dev file, ``--max-eval``, K, scoring, model or precision is
refused (give another ``--work-dir``). ``--every N`` evaluates step 0, the final model and the
checkpoints whose step is a multiple of N only, a coarse curve that a later run without it (or
with a smaller N) fills in. ``--follow`` polls the run folder for new checkpoints
until the run's final model is written (its ``trainer_state.json``, the last file a finished run
writes), evaluates that too and stops.

Needs a running retrieval server over the dev file's corpus::

    bash run_server.sh --index data/demo/index &
    llamafactory-cli train LLaMA-Factory/examples/demo/smollm2_full_mappo.yaml \\
        model_name_or_path=saves/smollm2/full/sft output_dir=saves/smollm2/full/mappo \\
        save_steps=5 save_total_limit=0 &
    python bench/dev_curve.py --run-dir saves/smollm2/full/mappo --eval-file data/demo/dev.jsonl \\
        --warm-start saves/smollm2/full/sft --model smollm2 --max-eval 100 --follow \\
        --json-out bench/results/dev_curve_demo_smollm2.json

Prints a table (and writes the JSON and the plot after every evaluated step).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import learning_signal
from bench_runs import (
    add_precision_option,
    fail,
    load_json_or_exit,
    model_arguments,
    paired_gain,
    per_question_f1,
    percent,
    write_result,
)
from side_by_side import SCORING_PROFILES

from mmoa.fileio import atomic_write_json
from mmoa.train.mappo.checkpoint_files import checkpoint_step

SCRIPT = "bench/dev_curve.py"
POINT = "point.json"
SETTINGS = "settings.json"
#: The statistics of the evaluation summary (``learning_signal.summary``) each point reports.
STATISTICS = ("f1", "f1_se", "em", "acc", "num_questions", "candidate_support_recall",
              "mean_subquestions", "selector_support_precision", "selector_support_recall",
              "mean_selected", "selector_most_common_share", "mean_answer_words")
#: The settings a work folder's points were evaluated with: a rerun must use the same ones.
SETTING_KEYS = ("run_dir", "eval_file", "max_eval", "k", "scoring", "model", "precision",
                "algorithm")


@dataclass(frozen=True)
class ModelPoint:
    """One model of the curve: its step, where it comes from and its folder."""

    step: int
    source: str  # "warm_start", "checkpoint" or "final"
    path: Path


def checkpoints(run_dir: Path) -> list[ModelPoint]:
    """The run's ``checkpoint-N`` folders by N (numerically: checkpoint-10 after checkpoint-9).

    A checkpoint folder appears whole or not at all (the trainer writes it in a hidden staging
    folder and renames it), so every one listed is complete."""
    found = [(step, path) for path in run_dir.iterdir()
             if path.is_dir() and (step := checkpoint_step(path)) is not None]
    return [ModelPoint(step, "checkpoint", path) for step, path in sorted(found)]


def final_model(run_dir: Path, saved: list[ModelPoint]) -> ModelPoint | None:
    """The run's final model at its last step, once the run has written it: its
    ``trainer_state.json`` is the last file a finished run writes, after the weights. A final
    model older than a checkpoint beside it is an earlier run's, left in a reused output
    folder: not this run's end (None)."""
    state = run_dir / "trainer_state.json"
    if not state.is_file():
        return None
    newest = max((p.path.stat().st_mtime for p in saved), default=0.0)
    if state.stat().st_mtime < newest:
        return None
    return ModelPoint(int(json.loads(state.read_text())["global_step"]), "final", run_dir)


def model_points(run_dir: Path, warm_start: Path | None) -> tuple[list[ModelPoint], bool]:
    """Every model of the curve by step (step 0: ``warm_start``), and whether the run's final
    model is among them. The final model has the weights of the checkpoint of its step where
    one was saved (the trainer saves one at the last step): that step is listed once, as its
    checkpoint, so a curve followed during training keeps the point it already has."""
    saved = checkpoints(run_dir)
    points = ([ModelPoint(0, "warm_start", warm_start)] if warm_start else []) + saved
    final = final_model(run_dir, saved)
    if final is not None and final.step not in {p.step for p in points}:
        points.append(final)
    return sorted(points, key=lambda p: p.step), final is not None


def thinned(points: list[ModelPoint], complete: bool, every: int | None) -> list[ModelPoint]:
    """The points a coarse curve evaluates: step 0, the final model (its own point or, where
    the run is complete, its last checkpoint) and the steps that are multiples of ``every``
    (all of them without it). A later run with a smaller ``every`` (or none) fills in the
    steps between, keeping what was evaluated."""
    if not every:
        return points
    last = points[-1].step if complete and points else None
    return [p for p in points
            if p.step % every == 0 or p.source != "checkpoint" or p.step == last]


def best_step(points: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The point with the highest dev F1; the earliest of equal ones (fewer steps, less drift
    from the warm start, for the same figure). None without points."""
    if not points:
        return None
    return min(points, key=lambda p: (-p["dev"]["f1"], p["step"]))


def with_gains(points: list[dict[str, Any]], per_question: dict[int, dict[str, float]]
               ) -> list[dict[str, Any]]:
    """Each point with its paired F1 gain over step 0 (the same questions; ``None`` where
    there is no step 0)."""
    base = per_question.get(0)
    return [{**p, "paired": None if base is None or p["step"] == 0
             else paired_gain(base, per_question[p["step"]])} for p in points]


# -- evaluation --------------------------------------------------------------------------------

class Curve:
    """One work folder's points: which are kept, which must be evaluated, and evaluating them."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work_dir)
        self.digests: dict[tuple[Path, int], str] = {}
        self.eval_args = argparse.Namespace(
            model=args.model, algorithm=args.algorithm, eval_file=args.eval_file, k=args.k,
            retriever_url=args.retriever_url, eval_retriever_url=None,
            precision=args.precision, max_eval=args.max_eval,
            scoring=SCORING_PROFILES[args.scoring])

    def settings(self) -> dict[str, Any]:
        return {key: getattr(self.args, key) for key in SETTING_KEYS}

    def check_settings(self) -> None:
        """Refuse a work folder whose points were evaluated otherwise (before anything is
        written); record the settings in a new one."""
        path = self.work / SETTINGS
        if path.is_file():
            kept = load_json_or_exit(path, "a dev_curve work folder's settings")
            for key, ours in self.settings().items():
                if kept.get(key) != ours:
                    fail(f"{self.work} holds a curve evaluated with {key}={kept.get(key)!r}, "
                         f"this run asks for {ours!r}: give another --work-dir")
        else:
            self.work.mkdir(parents=True, exist_ok=True)
            atomic_write_json(path, self.settings())

    def digest(self, path: Path) -> str:
        """The weights' SHA-256 (``learning_signal.weights_digest``), hashed once a process
        for each folder as it is (a poll does not hash every checkpoint again)."""
        weights = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
        key = (path, max((w.stat().st_mtime_ns for w in weights), default=0))
        if key not in self.digests:
            self.digests[key] = learning_signal.weights_digest(path)
        return self.digests[key]

    def kept(self, point: ModelPoint) -> dict[str, Any] | None:
        """The step's evaluation kept in the work folder, if it evaluated these weights."""
        path = self.work / f"step-{point.step}" / POINT
        if not path.is_file():
            return None
        record = load_json_or_exit(path, "an evaluated step of a dev curve (remove it to "
                                         "evaluate the step again)", {"dev": dict})
        if record.get("weights_sha256") != self.digest(point.path):
            print(f"[step {point.step}] {point.path} holds other weights than the ones "
                  "evaluated: evaluating it again", flush=True)
            return None
        return record

    def evaluate(self, point: ModelPoint) -> dict[str, Any]:
        """``learning_signal.evaluate`` of the point's model on the dev file, kept."""
        folder = self.work / f"step-{point.step}"
        eval_dir = folder / "eval"
        if eval_dir.exists():  # an evaluation cut short: start it afresh
            shutil.rmtree(eval_dir)
        print(f"[step {point.step}] evaluating {point.path} ({point.source})", flush=True)
        started = time.perf_counter()
        base = self.args.warm_start if point.source != "warm_start" else None
        metrics = learning_signal.evaluate(point.path, self.eval_args, eval_dir, base=base)
        record = {"step": point.step, "source": point.source, "model": str(point.path),
                  "weights_sha256": self.digest(point.path),
                  "dev": learning_signal.summary(metrics, eval_dir),
                  "per_question_f1": per_question_f1(eval_dir),
                  "seconds": round(time.perf_counter() - started, 1)}
        atomic_write_json(folder / POINT, record)
        return record

    def kept_points(self) -> dict[int, dict[str, Any]]:
        """Every step evaluated in the work folder, its model present or not (a checkpoint
        rotated away after its evaluation keeps its point)."""
        found: dict[int, dict[str, Any]] = {}
        for path in self.work.glob(f"step-*/{POINT}"):
            record = load_json_or_exit(path, "an evaluated step of a dev curve", {"dev": dict})
            found[int(record["step"])] = record
        return found


def curve_result(args: argparse.Namespace, records: dict[int, dict[str, Any]],
                 complete: bool) -> dict[str, Any]:
    """The JSON: the settings, one entry per step (the summary's figures and the paired gain
    over step 0), the best step and whether the run's final model is on the curve."""
    ordered = [records[step] for step in sorted(records)]
    points = with_gains(
        [{"step": r["step"], "source": r["source"], "model": r["model"],
          "dev": {key: r["dev"].get(key) for key in STATISTICS},
          "scoring": r["dev"].get("scoring"), "eval_dir": r["dev"].get("eval_dir")}
         for r in ordered],
        {r["step"]: r["per_question_f1"] for r in ordered})
    best = best_step(points)
    return {"bench": "dev_curve", "config": vars(args).copy(), "points": points,
            "best": None if best is None else {
                "step": best["step"], "source": best["source"], "model": best["model"],
                "f1": best["dev"]["f1"], "f1_se": best["dev"]["f1_se"],
                "paired": best["paired"]},
            "final_model_evaluated": complete}


# -- output ------------------------------------------------------------------------------------

def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_table(result: dict[str, Any]) -> str:
    """One row per step; ``*`` marks the best step on dev."""
    header = (f"{'step':>6} {'from':<11}{'F1':>6}{'+-SE':>6}{'EM':>6}{'gain':>7}{'+-SE':>6}"
              f"{'cand rec':>9}{'sub-q':>6}{'S prec':>7}{'S rec':>7}{'S sel':>6}"
              f"{'S same':>7}")
    lines = [header, "-" * len(header)]
    best = (result["best"] or {}).get("step")
    for p in result["points"]:
        d, paired = p["dev"], p["paired"] or {}
        mark = "*" if p["step"] == best else " "
        lines.append(
            f"{p['step']:>5}{mark} {p['source']:<11}{percent(d['f1']):>6}{percent(d['f1_se']):>6}"
            f"{percent(d['em']):>6}{percent(paired.get('gain')):>7}{percent(paired.get('gain_se')):>6}"
            f"{percent(d['candidate_support_recall']):>9}{_num(d['mean_subquestions']):>6}"
            f"{percent(d['selector_support_precision']):>7}{percent(d['selector_support_recall']):>7}"
            f"{_num(d['mean_selected']):>6}{percent(d.get('selector_most_common_share')):>7}")
    lines.append("-" * len(header))
    if result["best"] is None:
        lines.append("no step evaluated yet")
        return "\n".join(lines)
    b = result["best"]
    gain = "" if b["paired"] is None else (f", {percent(b['paired']['gain'])} +- "
                                           f"{percent(b['paired']['gain_se'])} over step 0")
    lines.append(f"best step on dev: {b['step']} (F1 {percent(b['f1'])} +- {percent(b['f1_se'])}"
                 f"{gain}); gain: paired per-question F1 over step 0 (the warm start)")
    if not result["final_model_evaluated"]:
        lines.append("the run's final model is not on the curve yet (not written, or "
                     "--follow not given)")
    return "\n".join(lines)


def write_plot(result: dict[str, Any], path: Path) -> None:
    """Dev F1 (percent) against the step with its standard-error band; the best step marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    steps = [p["step"] for p in points]
    f1 = [100 * p["dev"]["f1"] for p in points]
    se = [100 * (p["dev"]["f1_se"] or 0.0) for p in points]
    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    axes.fill_between(steps, [f - s for f, s in zip(f1, se, strict=True)],
                      [f + s for f, s in zip(f1, se, strict=True)], color="#4c72b0", alpha=0.2,
                      label="+- standard error")
    axes.plot(steps, f1, marker="o", color="#4c72b0", label="dev F1")
    if result["best"] is not None:
        best = result["best"]
        axes.plot([best["step"]], [100 * best["f1"]], marker="*", markersize=14,
                  color="#dd8452", linestyle="none", label=f"best: step {best['step']}")
    axes.set_xlabel("MAPPO step (0: warm start)")
    axes.set_ylabel("dev F1 (%)")
    run = "/".join(Path(result["config"]["run_dir"]).parts[-2:])
    axes.set_title(f"dev curve of {run} "
                   f"({Path(result['config']['eval_file']).name})", fontsize=9)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_outputs(result: dict[str, Any], args: argparse.Namespace) -> None:
    write_result(args.json_out, result, SCRIPT)
    if result["points"]:
        write_plot(result, Path(args.plot))


# -- main --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", dest="run_dir", required=True,
                        help="the MAPPO / GRPO run's output_dir (checkpoint-N folders inside)")
    parser.add_argument("--eval-file", dest="eval_file", required=True,
                        help="the dev file: the demo's JSONL or a HotpotQA JSON file")
    parser.add_argument("--retriever-url", dest="retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", choices=sorted(learning_signal.MODELS), default="smollm2",
                        help="the model family: its template and generation limits")
    parser.add_argument("--algorithm", choices=["ppo", "grpo"], default="ppo",
                        help="whose config's generation limits the evaluation uses")
    parser.add_argument("--k", type=int, default=5, help="candidates per question")
    parser.add_argument("--scoring", choices=sorted(SCORING_PROFILES), default="demo",
                        help="demo: the evaluator's default; hotpotqa: the official script")
    add_precision_option(parser, default="auto")
    parser.add_argument("--max-eval", dest="max_eval", type=int,
                        help="evaluate on the first N dev questions only")
    parser.add_argument("--warm-start", dest="warm_start",
                        help="the model the run started from: evaluated as step 0, the base of "
                             "the paired gains (and of a LoRA run's adapters)")
    parser.add_argument("--work-dir", dest="work_dir",
                        help="where each step's evaluation is kept (default: <run-dir>-dev_curve)")
    parser.add_argument("--json-out", dest="json_out",
                        help="the JSON (default <work-dir>/dev_curve.json)")
    parser.add_argument("--plot", help="the PNG (default: the JSON's path, .png)")
    parser.add_argument("--every", type=int,
                        help="evaluate only the checkpoints whose step is a multiple of N (and "
                             "step 0 and the final model): a coarse curve first, filled in by a "
                             "later run without it (default: every checkpoint)")
    parser.add_argument("--follow", action="store_true",
                        help="keep polling for new checkpoints until the run's final model is "
                             "written, then evaluate it and stop")
    parser.add_argument("--poll-seconds", dest="poll_seconds", type=float, default=60.0,
                        help="with --follow: seconds between looks at the run folder")
    parser.add_argument("--max-wait", dest="max_wait", type=float,
                        help="with --follow: stop (exit status 1) after this many seconds "
                             "without a new checkpoint (default: wait for the final model)")
    return parser


def resolve(args: argparse.Namespace) -> None:
    """Absolute paths (the evaluation runs from the repository root) and the precision; a
    missing run folder, dev file or warm start is one line and exit status 2, before anything
    is written."""
    for key in ("run_dir", "eval_file", "warm_start", "work_dir", "json_out", "plot"):
        if getattr(args, key):
            setattr(args, key, str(Path(getattr(args, key)).resolve()))
    if not Path(args.run_dir).is_dir():
        fail(f"--run-dir {args.run_dir}: no such folder (a MAPPO run's output_dir)")
    if not Path(args.eval_file).is_file():
        fail(f"--eval-file {args.eval_file}: no such file")
    if args.warm_start and not Path(args.warm_start).is_dir():
        fail(f"--warm-start {args.warm_start}: no such folder")
    if args.max_eval is not None and args.max_eval < 1:
        fail(f"--max-eval {args.max_eval}: give a number of questions >= 1")
    if args.every is not None and args.every < 1:
        fail(f"--every {args.every}: give a number of steps >= 1")
    if args.poll_seconds <= 0:
        fail(f"--poll-seconds {args.poll_seconds}: give a positive number of seconds")
    args.work_dir = args.work_dir or f"{args.run_dir.rstrip('/')}-dev_curve"
    args.json_out = args.json_out or str(Path(args.work_dir) / "dev_curve.json")
    args.plot = args.plot or str(Path(args.json_out).with_suffix(".png"))
    from mmoa.precision import resolve_precision

    args.precision = resolve_precision(args.precision)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate every step not evaluated yet; with ``--follow``, until the final model is."""
    run_dir = Path(args.run_dir)
    warm = Path(args.warm_start) if args.warm_start else None
    points, complete = model_points(run_dir, warm)
    if not args.follow and not any(p.source != "warm_start" for p in points):
        fail(f"--run-dir {run_dir}: no checkpoint-N folder and no final model in it (trained "
             "with a save_total_limit that kept none? --follow waits for them)")
    points = thinned(points, complete, args.every)
    for point in points:  # LoRA adapters without the model they were trained from
        try:
            model_arguments(point.path, args.warm_start)
        except SystemExit as err:
            fail(f"{err} (--warm-start)")
    curve = Curve(args)
    curve.check_settings()
    evaluated = 0
    last_new = time.monotonic()
    while True:
        records = curve.kept_points()
        for point in points:
            record = curve.kept(point)
            if record is None:
                record = curve.evaluate(point)
                evaluated += 1
                last_new = time.monotonic()
                records[point.step] = record
                print(f"[step {point.step}] dev F1 {percent(record['dev']['f1'])} +- "
                      f"{percent(record['dev']['f1_se'])}", flush=True)
                write_outputs(curve_result(args, records, False), args)
        result = curve_result(args, records, complete)
        write_outputs(result, args)
        if complete or not args.follow:
            break
        waited = time.monotonic() - last_new
        if args.max_wait is not None and waited > args.max_wait:
            print(f"[follow] no new checkpoint in {run_dir} for {waited:.0f} s (--max-wait "
                  f"{args.max_wait:.0f}): stopping; the curve so far is in {args.json_out}",
                  file=sys.stderr, flush=True)
            raise SystemExit(1)
        steps = ", ".join(str(s) for s in sorted(records)) or "none"
        print(f"[follow] waiting for new checkpoints of {run_dir} (steps on the curve: {steps}; "
              f"the final model is not written yet); next look in {args.poll_seconds:.0f} s",
              flush=True)
        time.sleep(args.poll_seconds)
        points, complete = model_points(run_dir, warm)
        points = thinned(points, complete, args.every)
    result["evaluated_this_invocation"] = evaluated
    return result


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    resolve(args)
    result = run(args)
    print()
    print(format_table(result))
    print(f"\n{result['evaluated_this_invocation']} step(s) evaluated by this invocation; "
          f"JSON {args.json_out}, plot {args.plot}")


if __name__ == "__main__":
    main()
