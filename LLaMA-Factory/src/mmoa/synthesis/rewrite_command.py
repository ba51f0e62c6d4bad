"""``mmoa-cli data qr-rewrites``: Query Rewriter labels from the live retriever (arguments and
the run; the CLI and ``data_builders/qr_rewrites_data.py`` only dispatch here).

See :mod:`mmoa.synthesis.qr_rewrites` for what a label is. The command writes the rewrites file
that ``mmoa-cli data sft --rewrites_file`` reads and a JSON report; with ``--compare`` it also
runs the other search method at the same budget and reports both, per model call.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from mmoa.defaults import MAX_NEW_TOKENS
from mmoa.fileio import DataFormatError, atomic_write_json
from mmoa.synthesis.command import METHOD_CHOICES as METHODS  # light: no model library
from mmoa.synthesis.command import (
    add_sampler_arguments,
    add_sampling_arguments,
    add_search_budget_arguments,
)

#: Questions searched together and kept as one resumable chunk.
REWRITE_CHUNK_SIZE = 64


def add_rewrite_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``mmoa-cli data qr-rewrites`` (the QA source flags are added by the caller)."""
    parser.add_argument("--output", required=True,
                        help="the rewrites file to write (JSON, Rewrite-Retrieve-Read source / "
                             "target; only the questions that got a better rewrite)")
    parser.add_argument("--report", help="the JSON report (default: OUTPUT with _report.json)")
    add_sampler_arguments(parser, "a sampler")
    parser.add_argument("--method", default="toa", choices=METHODS,
                        help="the search whose labels are written (default toa)")
    parser.add_argument("--compare", action="store_true",
                        help="also run the other method at the same budget and report both")
    add_search_budget_arguments(parser, "question")
    parser.add_argument("--k", type=int, default=5,
                        help="candidates the sub-questions are merged into and scored over "
                             "(the pipeline's K; default 5)")
    add_sampling_arguments(parser, "seed of sampling and tie-breaking")
    parser.add_argument("--max_new_tokens_qr", type=int, default=MAX_NEW_TOKENS["qr"],
                        help=f"new tokens of a rewrite (default {MAX_NEW_TOKENS['qr']})")
    parser.add_argument("--chunk_size", type=int, default=REWRITE_CHUNK_SIZE,
                        help="questions searched together and kept as one resumable chunk "
                             f"(default {REWRITE_CHUNK_SIZE})")
    parser.add_argument("--cache_dir", help="where finished chunks are kept (default: OUTPUT "
                        "with _chunks; a rerun of the same command resumes from them)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")


def run_rewrite_command(args: argparse.Namespace,
                        records_loader: Callable[[argparse.Namespace], list]) -> int:
    """Search, label, write the rewrites file and the report, print the summary."""
    from mmoa.retrieval.client import RetrievalClient
    from mmoa.synthesis.chunks import model_fingerprint
    from mmoa.synthesis.policies import LocalModelPolicy, ModelSpec
    from mmoa.synthesis.qr_rewrites import rewrite_rows, search_rewrites, summarise
    from mmoa.synthesis.rewards import QRRecallReward
    from mmoa.synthesis.search import SearchConfig

    prefix = "mmoa-cli data qr-rewrites: error:"
    output = Path(args.output)
    try:
        specs = [ModelSpec.parse(text) for text in args.model]
        search = SearchConfig(samples_per_model=args.samples_per_model, alpha=args.alpha,
                              tau=args.tau, width_limit=args.width_limit, seed=args.seed,
                              progress=not args.no_progress)
        search.validate(len(specs))
        if args.k < 1 or args.chunk_size < 1 or args.batch_size < 1 \
                or args.max_new_tokens_qr < 1:
            raise ValueError("--k, --chunk_size, --batch_size and --max_new_tokens_qr must be "
                             f">= 1, got {args.k}, {args.chunk_size}, {args.batch_size} and "
                             f"{args.max_new_tokens_qr}")
        if output.suffix != ".json":
            raise ValueError(f"--output {output}: the rewrites file must end in .json")
        records = records_loader(args)
        if not records:
            raise ValueError("no question to synthesise rewrites for")
        from mmoa.data.support import GoldSupport

        without = [r.id for r in records if GoldSupport.of(r) is None]
        if without:
            raise ValueError(f"{len(without)} of {len(records)} records name no gold supporting "
                             f"passages (first: {without[0]!r}); the rewrites are scored by them")
        client = RetrievalClient(args.retriever_url, token=args.retriever_token)
        client.health()
        max_new = {**MAX_NEW_TOKENS, "qr": args.max_new_tokens_qr}
        policy = LocalModelPolicy(specs, batch_size=args.batch_size, max_new_tokens=max_new,
                                  seed=args.seed, precision=args.precision)
    except (ValueError, KeyError, FileNotFoundError, ConnectionError, DataFormatError) as err:
        print(f"{prefix} {err} (nothing was written)", file=sys.stderr)
        return 2

    from dataclasses import asdict

    reward = QRRecallReward(client, k=args.k)
    settings = {"samples_per_model": args.samples_per_model, "alpha": args.alpha,
                "tau": args.tau, "width_limit": args.width_limit, "k": args.k,
                "seed": args.seed, "batch_size": args.batch_size,
                "max_new_tokens_qr": args.max_new_tokens_qr,
                "precision": policy.resolved_precision, "retriever_url": args.retriever_url,
                "models": [{**asdict(s), "files": model_fingerprint(s.model_name_or_path)}
                           for s in specs]}
    cache = Path(args.cache_dir or output.with_name(output.stem + "_chunks"))
    print(f"finished chunks of {args.chunk_size} questions are kept in {cache} (a rerun of "
          "this command resumes from them)")
    methods = [args.method] + ([m for m in METHODS if m != args.method] if args.compare else [])
    runs = {m: search_rewrites(records, policy, reward, m, search, chunk_size=args.chunk_size,
                               cache_dir=cache, settings=settings) for m in methods}
    kept = runs[args.method]
    rows = rewrite_rows(kept)
    atomic_write_json(output, rows)
    summaries = {m: summarise(run) for m, run in runs.items()}
    report = {"questions": len(records), "models": [s.name for s in specs], "k": args.k,
              "method": args.method, "output": str(output), "rewrites_written": len(rows),
              "settings": {k: v for k, v in settings.items() if k != "models"},
              "summaries": summaries,
              "labels": {m: [asdict(x) for x in run.labels] for m, run in runs.items()}}
    report_path = Path(args.report or output.with_name(output.stem + "_report.json"))
    atomic_write_json(report_path, report)
    print(format_summary(summaries))
    print(f"rewrites of {len(rows)} questions ({args.method}) -> {output}")
    print(f"report -> {report_path}")
    return 0


def format_summary(summaries: dict[str, dict]) -> str:
    """One line per method: the share improved, the recalls, the recall at a few budgets."""
    lines = ["method      questions  improved   question recall  label recall  recall by calls"]
    for method, s in summaries.items():
        curve = s["recall_by_calls"]
        marks = sorted({1, max(1, len(curve) // 2), len(curve)})
        by_calls = ", ".join(f"{n}: {100 * curve[n - 1]:.1f}" for n in marks)
        lines.append(f"{method:<11} {s['questions']:>9}  {100 * s['improved_share']:>6.1f} %"
                     f"  {100 * s['question_recall']:>14.1f} %  {100 * s['label_recall']:>10.1f} %"
                     f"  {by_calls}")
    return "\n".join(lines)
