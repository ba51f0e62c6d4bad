"""What choosing the documents could earn: the Generator on each question's candidates under
fixed selection rules, beside what it earns reading all of them.

Every Selector result on real text is measured against ``rag`` with K = 5 (the Generator reads
all the candidates) and K = 1 (the top one). Whether any Selector can beat both with a given
Generator is a question about the Generator: if it answers as well from five documents as from
the gold ones among them, no choice of documents pays, whatever the Selector learns. This bench
answers it without training anything: on the very candidates an evaluation retrieved (its
``predictions.jsonl``), it runs the Generator of ``--model`` greedily on the documents that
each rule keeps and scores the answers as the evaluation did:

* ``all``: every candidate (``rag`` K; with the evaluation's batch size, generation limit and
  precision its answers are the evaluation's, a check the table shows);
* ``top1`` / ``top2``: the first one or two (``top1`` is ``rag`` K = 1's document);
* ``title``: the title rule of ``bench/selector_discrimination.py`` (the candidates whose whole
  title the question names, else the top one): a reading of the documents with no model;
* ``gold``: the oracle, the gold candidates among the K in retrieval order (the top one where
  none is gold): the most a Selector could earn on these candidates with this Generator;
* ``marginal@T`` for each ``--inclusion RESULT@T``: a Selector's beliefs from a
  ``selector_discrimination.py`` result on the same candidates (the candidates whose inclusion
  probability reaches T, the top one where none does), read by this ``--model``'s Generator.

Each rule's F1 +- SE and EM, its documents, gold precision and recall, and its paired F1 gain
+- SE over ``all`` and over ``top1`` on the same questions::

    python bench/selection_ceiling.py --model <the warm start> --template smollm2 \\
        --predictions <its rag K = 5 evaluation>/predictions.jsonl \\
        --corpus data/hotpotqa_distractor/corpus.jsonl \\
        --data-file ../shared/data/hotpotqa_distractor_1k/hotpot_distractor_dev.json \\
        --precision bf16 --json-out bench/results/selection_ceiling_distractor_dev.json

Prints one JSON object and a table; ``--json-out`` writes the JSON too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_runs import fail, publish  # noqa: E402
from selector_discrimination import (  # noqa: E402
    candidate_title,
    candidates_parser,
    check_candidates_args,
    marginal_selection,
    question_inputs,
    read_candidates_inputs,
    selection_summary,
    title_overlap,
    title_rule_selection,
)

from mmoa.data.support import GoldSupport  # noqa: E402
from mmoa.metrics import DEFAULT_PROFILE, SCORING_PROFILES  # noqa: E402

SCRIPT = "bench/selection_ceiling.py"
#: The fixed rules, in the table's order.
RULES = ("all", "top1", "top2", "title", "gold")
#: The rows the paired gains are taken over.
REFERENCES = ("all", "top1")

def gold_rule(gold: Sequence[bool]) -> list[int]:
    """The oracle: the gold candidates in retrieval order, the top one where none is gold (an
    empty context would measure the Generator without documents, not a selection)."""
    return [i for i, g in enumerate(gold) if g] or [0]


def fixed_selection(rule: str, question: str, titles: Sequence[str],
                    gold: Sequence[bool]) -> list[int]:
    """The candidates ``rule`` keeps for one question."""
    k = len(titles)
    if rule == "all":
        return list(range(k))
    if rule == "top1":
        return [0]
    if rule == "top2":
        return list(range(min(2, k)))
    if rule == "title":
        return title_rule_selection([title_overlap(question, t) for t in titles])
    if rule == "gold":
        return gold_rule(gold)
    raise ValueError(f"unknown rule {rule!r}; choose one of {', '.join(RULES)}")


def marginal_or_top(inclusion: Sequence[float], threshold: float) -> list[int]:
    """A Selector's marginal rule at ``threshold``, the top candidate where it keeps none."""
    return marginal_selection(inclusion, threshold) or [0]


def parse_inclusion(spec: str) -> tuple[Path, float]:
    """``RESULT@T`` -> (the result file, the threshold)."""
    path, sep, threshold = spec.rpartition("@")
    if not sep or not path:
        raise ValueError(f"--inclusion {spec!r}: expected RESULT.json@THRESHOLD")
    try:
        value = float(threshold)
    except ValueError:
        raise ValueError(f"--inclusion {spec!r}: the threshold {threshold!r} is not a number"
                         ) from None
    if not 0.0 < value <= 1.0:
        raise ValueError(f"--inclusion {spec!r}: the threshold must lie in (0, 1]")
    return Path(path), value


def load_inclusion(path: Path) -> dict[str, list[float]]:
    """Question id -> inclusion probabilities, from a ``selector_discrimination.py`` result."""
    result = json.loads(path.read_text(encoding="utf-8"))
    rows = result.get("per_question")
    if not isinstance(rows, list) or not rows or not all(
            isinstance(row, dict) and "inclusion" in row and "id" in row for row in rows):
        raise ValueError("not a bench/selector_discrimination.py result with its per-question "
                         "rows")
    return {row["id"]: row["inclusion"] for row in rows}


def rule_figures(rows: list[dict[str, Any]], rule: str) -> dict[str, Any]:
    """F1 and EM (+- SE), the selection summary and the paired gains over the references."""
    from mmoa.evaluation import paired_gain, standard_error

    f1 = [row["rules"][rule]["f1"] for row in rows]
    em = [row["rules"][rule]["em"] for row in rows]
    figures = {
        "f1": round(fmean(f1), 4), "f1_se": round(standard_error(f1) or 0.0, 4),
        "em": round(fmean(em), 4),
        **selection_summary([row["rules"][rule]["selected"] for row in rows],
                            [row["gold"] for row in rows]),
    }
    for reference in REFERENCES:
        if reference != rule:
            gain = paired_gain({r["id"]: r["rules"][reference]["f1"] for r in rows},
                               {r["id"]: r["rules"][rule]["f1"] for r in rows})
            figures[f"gain_over_{reference}"] = round(gain["gain"], 4)
            figures[f"gain_over_{reference}_se"] = round(gain["gain_se"], 4)
    return figures


def evaluation_settings(predictions: Path) -> dict[str, Any]:
    """The evaluation's own settings from the ``metrics.json`` beside its predictions (empty
    when there is none)."""
    metrics = predictions.parent / "metrics.json"
    if not metrics.is_file():
        return {}
    return json.loads(metrics.read_text(encoding="utf-8")).get("config", {})


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from mmoa.agents.pipeline import GenerationSettings, RagPipeline, Trace
    from mmoa.defaults import MAX_NEW_TOKENS
    from mmoa.metrics import score_answer
    from mmoa.modeling import load_for_inference
    from mmoa.precision import autocast, device_type_of, resolve_precision

    settings_of_eval = evaluation_settings(Path(args.predictions))
    max_new_tokens = args.max_new_tokens or int(settings_of_eval.get(
        "max_new_tokens_generator", MAX_NEW_TOKENS["generator"]))
    scoring = args.scoring or settings_of_eval.get("scoring", DEFAULT_PROFILE)
    batch_size = args.batch_size or int(settings_of_eval.get("batch_size", 16))
    rows, records, corpus = read_candidates_inputs(args)
    beliefs: list[tuple[str, dict[str, list[float]], float]] = []
    for path, threshold in map(parse_inclusion, args.inclusion):
        try:
            beliefs.append((f"marginal@{threshold:g}", load_inclusion(path), threshold))
        except ValueError as err:  # a JSON error is one too
            fail(f"--inclusion {path}: {err}")

    questions: list[dict[str, Any]] = []
    skipped = 0
    for row in rows:
        record = records.get(row["id"])
        support = GoldSupport.of(record) if record is not None else None
        if support is None:
            skipped += 1
            continue
        candidates, gold = question_inputs(row, corpus, support)
        titles = [candidate_title(c) for c in candidates]
        selections = {rule: fixed_selection(rule, row["question"], titles, gold)
                      for rule in RULES}
        for name, inclusion, threshold in beliefs:
            if row["id"] not in inclusion or len(inclusion[row["id"]]) != len(candidates):
                fail(f"{name}: question {row['id']!r} is not in its result with these "
                     f"{len(candidates)} candidates; give the result measured on these "
                     "predictions")
            selections[name] = marginal_or_top(inclusion[row["id"]], threshold)
        questions.append({"id": row["id"], "question": row["question"], "record": record,
                          "candidates": candidates, "gold": gold, "selections": selections})
    if not questions:
        fail("no question has gold supporting paragraphs in --data-file")

    precision = resolve_precision(args.precision)
    model, tokenizer = load_for_inference(args.model, args.template, precision=precision,
                                          use_cpu=args.use_cpu)
    settings = GenerationSettings(max_new_tokens={**MAX_NEW_TOKENS,
                                                  "generator": max_new_tokens})
    # the Generator alone: the candidates and each rule's selection are set on the traces
    generator = RagPipeline(model, tokenizer, args.template, None, mode="g", settings=settings,
                            batch_size=batch_size)
    rule_names = [*RULES, *(name for name, _, _ in beliefs)]
    out_rows = [{"id": q["id"], "gold": q["gold"], "rules": {}} for q in questions]
    started = time.perf_counter()
    with autocast(precision, device_type_of(model)):
        for rule in tqdm(rule_names, desc="rules", unit="rule"):
            for offset in range(0, len(questions), batch_size):
                batch = questions[offset: offset + batch_size]
                traces = [Trace(question=q["question"], subquestions=[q["question"]],
                                candidates=list(q["candidates"]),
                                selected=q["selections"][rule]) for q in batch]
                generator.answer(traces)
                outs = out_rows[offset: offset + batch_size]
                for q, trace, out in zip(batch, traces, outs, strict=True):
                    scores = score_answer(trace.answer, q["record"].answers, profile=scoring)
                    out["rules"][rule] = {"selected": trace.selected, "answer": trace.answer,
                                          "f1": scores.f1, "em": scores.em}
    seconds = time.perf_counter() - started
    return {
        "bench": SCRIPT, "model": str(args.model), "predictions": str(args.predictions),
        "data_file": str(args.data_file), "precision": precision, "scoring": scoring,
        "max_new_tokens_generator": max_new_tokens, "batch_size": batch_size,
        "questions": len(out_rows), "skipped_without_gold": skipped,
        "evaluation_f1": _evaluation_f1(rows, [q["id"] for q in questions]),
        "rules": {rule: rule_figures(out_rows, rule) for rule in rule_names},
        "seconds": round(seconds, 1),
        "per_question": out_rows,
    }


def _evaluation_f1(rows: Sequence[dict[str, Any]], ids: Sequence[str]) -> float | None:
    """The evaluation's own mean F1 over ``ids`` (what ``all`` should reproduce), from its
    prediction rows."""
    by_id = {row["id"]: row for row in rows}
    scores = [by_id[i].get("scores", {}).get("f1") for i in ids]
    if any(s is None for s in scores):
        return None
    return round(fmean(scores), 4)


def table(result: dict[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}"

    def gain(figures: dict[str, Any], reference: str) -> str:
        key = f"gain_over_{reference}"
        return "" if key not in figures else \
            f"{100 * figures[key]:+.1f} +- {100 * figures[key + '_se']:.1f}"

    lines = [f"{result['questions']} questions; the evaluation's own F1 "
             f"{pct(result['evaluation_f1'])} (the `all` rule reproduces it with its settings)",
             "| rule | F1 +- SE | EM | documents | precision / recall | vs all | vs top1 |",
             "| --- | ---: | ---: | ---: | --- | --- | --- |"]
    for rule, f in result["rules"].items():
        lines.append(f"| {rule} | {pct(f['f1'])} +- {pct(f['f1_se'])} | {pct(f['em'])} | "
                     f"{f['documents']:.2f} | {pct(f['precision'])} % / {pct(f['recall'])} % | "
                     f"{gain(f, 'all')} | {gain(f, 'top1')} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = candidates_parser(__doc__.split("\n\n")[0], "the Generator's model folder")
    parser.add_argument("--inclusion", action="append", default=[], metavar="RESULT@T",
                        help="a selector_discrimination.py result on the same candidates and a "
                             "threshold: adds that Selector's marginal rule (repeatable)")
    parser.add_argument("--max-new-tokens", dest="max_new_tokens", type=int, default=None,
                        help="the Generator's limit (default: the evaluation's)")
    parser.add_argument("--batch-size", dest="batch_size", type=int, default=None,
                        help="questions a generate call (default: the evaluation's)")
    parser.add_argument("--scoring", choices=sorted(SCORING_PROFILES), default=None,
                        help="the scoring profile (default: the evaluation's, else the "
                             f"evaluator's, {DEFAULT_PROFILE})")
    args = parser.parse_args(argv)
    check_candidates_args(args)
    for spec in args.inclusion:
        try:
            path, _ = parse_inclusion(spec)
        except ValueError as err:
            fail(str(err))
        if not path.is_file():
            fail(f"--inclusion {spec}: no such file {path}")
    for name in ("max_new_tokens", "batch_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    publish(measure(args), args.json_out, SCRIPT, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
