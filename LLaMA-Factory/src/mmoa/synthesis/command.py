"""``mmoa-cli data toa``: arguments and the run (the CLI and ``data_builders/toa_sft_data.py``
only dispatch here)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from mmoa.defaults import (
    MAX_NEW_TOKENS,
    TOA_ALPHA,
    TOA_CHUNK_SIZE,
    TOA_SAMPLES_PER_MODEL,
    TOA_SELECTOR_SUPPORT_WEIGHT,
    TOA_TAU,
)
from mmoa.fileio import DataFormatError, atomic_write_json
from mmoa.precision import PRECISION_CHOICES

METHOD_CHOICES = ("toa", "best_of_n")


def add_search_budget_arguments(parser: argparse.ArgumentParser, per: str) -> None:
    """The budget and TOA's constants, one definition for every command that searches
    (``data toa``, ``data qr-rewrites``); ``per`` names what one budget is spent on."""
    parser.add_argument("--samples_per_model", type=int, default=TOA_SAMPLES_PER_MODEL,
                        help=f"budget per {per} = samples_per_model x models "
                             f"(default {TOA_SAMPLES_PER_MODEL})")
    parser.add_argument("--alpha", type=float, default=TOA_ALPHA,
                        help=f"TOA's UCB exploration weight (default {TOA_ALPHA})")
    parser.add_argument("--tau", type=float, default=TOA_TAU,
                        help=f"TOA's reward squashing sigmoid(r / tau) (default {TOA_TAU})")
    parser.add_argument("--width_limit", type=int,
                        help="TOA: responses per layer before a model node may stop expanding "
                             "(default: budget / 3)")


def add_sampler_arguments(parser: argparse.ArgumentParser, role: str) -> None:
    """The live retrieval server and the local models that sample, one definition for every
    command that searches (``data toa``, ``data qr-rewrites``); ``role`` starts the help."""
    parser.add_argument("--retriever_url", default="http://127.0.0.1:8000",
                        help="the running retrieval server (default http://127.0.0.1:8000)")
    parser.add_argument("--retriever_token", help="bearer token of the retrieval server")
    parser.add_argument(
        "--model", action="append", required=True, metavar="SPEC",
        help=f"{role}, repeatable: name=NAME,path=DIR,template=T[,adapter=DIR]"
             "[,variant=plain|careful][,temperature=X][,top_p=Y]; specs of one checkpoint "
             "share its weights")


def add_sampling_arguments(parser: argparse.ArgumentParser, seed_help: str) -> None:
    """Seed, batch size and precision of the samplers' generation (as :func:`add_sampler_
    arguments`, one definition for both searching commands)."""
    parser.add_argument("--seed", type=int, default=42, help=seed_help)
    parser.add_argument("--batch_size", type=int, default=16,
                        help="most rows of one generate call (default 16)")
    parser.add_argument("--precision", default="auto", choices=PRECISION_CHOICES,
                        help="of the models' generation: auto (bf16 autocast where the hardware "
                             "has native bf16, as evaluation), bf16 or fp32")


def add_toa_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``mmoa-cli data toa`` (the QA source flags are added by the caller)."""
    parser.add_argument("--name", default="demo_toa_sft",
                        help="dataset name to register (DPO pairs: NAME_dpo)")
    add_sampler_arguments(parser, "a model of the search")
    parser.add_argument("--method", default="toa", choices=METHOD_CHOICES,
                        help="toa (default) or best_of_n at the same budget")
    parser.add_argument("--baselines", action="store_true",
                        help="also build the other method's data (NAME_<method>) and measure the "
                             "heuristic labels; all three go into the label-quality summary")
    add_search_budget_arguments(parser, "question and agent")
    parser.add_argument("--answerer", help="the model (a --model name) whose greedy Generator "
                        "scores the Selector's choices (default: the first model)")
    parser.add_argument("--support_weight", type=float, default=TOA_SELECTOR_SUPPORT_WEIGHT,
                        help="weight of the selection's F1 against the gold passages in the "
                             "Selector's reward (default "
                             f"{TOA_SELECTOR_SUPPORT_WEIGHT}; 0: F1 only)")
    parser.add_argument("--k", type=int, default=10, help="candidates per question (default 10)")
    add_sampling_arguments(parser, "seed of sampling, tie-breaking and candidate shuffling")
    for agent, tokens in MAX_NEW_TOKENS.items():
        parser.add_argument(f"--max_new_tokens_{agent}", type=int, default=tokens,
                            help=f"new tokens of a {agent} response (default {tokens})")
    parser.add_argument("--report", help="label-quality JSON (default "
                        "DATASET_DIR/NAME_label_quality.json)")
    parser.add_argument("--no_progress", action="store_true", help="no progress bars")
    parser.add_argument("--chunk_size", type=int, default=TOA_CHUNK_SIZE,
                        help="questions searched together and saved as one resumable chunk "
                             f"(default {TOA_CHUNK_SIZE})")
    parser.add_argument("--cache_dir", help="where finished chunks are kept, so a stopped run "
                        "resumes (default DATASET_DIR/NAME_toa_chunks)")
    parser.add_argument("--no_cache", action="store_true",
                        help="keep no chunks: a stopped run starts again")


def run_toa_command(args: argparse.Namespace,
                    records_loader: Callable[[argparse.Namespace], list]) -> int:
    """Run the search(es), write and register the datasets, print and write the summary."""
    from mmoa.retrieval.client import RetrievalClient
    from mmoa.synthesis.builder import ToaBuildConfig, wins_by_agent, write_datasets
    from mmoa.synthesis.chunks import ChunkCache, check_chunk_size, synthesise_in_chunks
    from mmoa.synthesis.policies import LocalModelPolicy, ModelSpec
    from mmoa.synthesis.quality import format_quality_table, heuristic_quality, label_quality
    from mmoa.synthesis.rewards import (
        AgentRewards,
        GeneratorF1Reward,
        QRRecallReward,
        SelectorReward,
    )
    from mmoa.synthesis.search import SearchConfig

    prefix = "mmoa-cli data toa: error:"
    try:
        specs = [ModelSpec.parse(text) for text in args.model]
        search = SearchConfig(samples_per_model=args.samples_per_model, alpha=args.alpha,
                              tau=args.tau, width_limit=args.width_limit, seed=args.seed,
                              progress=not args.no_progress)
        search.validate(len(specs))
        check_chunk_size(args.chunk_size)
        records = records_loader(args)
        if not records:
            raise ValueError("no question to synthesise data for")
        unanswered = [r.id for r in records if not r.answers]
        if unanswered:
            raise ValueError(f"{len(unanswered)} records have no gold answers (first: "
                             f"{unanswered[0]!r}); the rewards score against them")
        client = RetrievalClient(args.retriever_url, token=args.retriever_token)
        client.health()
        max_new = {a: getattr(args, f"max_new_tokens_{a}") for a in MAX_NEW_TOKENS}
        policy = LocalModelPolicy(specs, batch_size=args.batch_size, max_new_tokens=max_new,
                                  seed=args.seed, precision=args.precision)
        rewards = AgentRewards(
            qr=QRRecallReward(client, k=args.k),
            selector=SelectorReward(policy.answerer(args.answerer),
                                    support_weight=args.support_weight),
            generator=GeneratorF1Reward(),
        )
    except (ValueError, KeyError, FileNotFoundError, ConnectionError, DataFormatError) as err:
        print(f"{prefix} {err} (nothing was written)", file=sys.stderr)
        return 2

    cache = None
    if not args.no_cache:
        folder = Path(args.cache_dir or Path(args.dataset_dir) / f"{args.name}_toa_chunks")
        cache = ChunkCache(folder, _cache_settings(args, specs, policy.resolved_precision))
        print(f"finished chunks of {args.chunk_size} questions are kept in {folder} "
              "(a rerun of this command resumes from them)")
    methods = [args.method]
    if args.baselines:
        methods += [m for m in METHOD_CHOICES if m != args.method]
    budget = search.budget(len(specs))
    summary: dict[str, object] = {
        "questions": len(records), "models": [s.name for s in specs],
        "budget_per_question_and_agent": budget, "alpha": args.alpha, "tau": args.tau,
        "precision": policy.resolved_precision, "chunk_size": args.chunk_size,
        "datasets": {}, "label_quality": []}
    qualities = []
    for method in methods:
        name = args.name if method == args.method else f"{args.name}_{method}"
        config = ToaBuildConfig(dataset_dir=args.dataset_dir, name=name, k=args.k,
                                seed=args.seed, method=method, search=search)
        items = synthesise_in_chunks(records, policy, rewards, client, config,
                                     args.chunk_size, cache)
        written = write_datasets(items, args.dataset_dir, name)
        quality = label_quality(method, [i.record for i in items],
                                [i.candidates for i in items], [i.selected for i in items],
                                [i.answer for i in items])
        quality.wins = wins_by_agent(items)
        qualities.append(quality)
        summary["datasets"][method] = written  # type: ignore[index]
        print(f"{method}: SFT {written['sft_records']} -> {written['sft_file']} "
              f"(registered {name!r}); DPO pairs {written['dpo_pairs']} -> "
              f"{written['dpo_file']} (registered {written['dpo_name']!r}, ranking)")
        for agent, wins in quality.wins.items():
            print(f"  {agent:<9} winning model: "
                  + ", ".join(f"{m} {n}" for m, n in wins["wins"].items())
                  + f"; best is a refinement {wins['best_is_refinement']} of {wins['tasks']}"
                  f"; all responses tied {wins['all_tied']}")
    if args.baselines:
        qualities.insert(0, heuristic_quality(records, client, args.k, args.seed))
    summary["label_quality"] = [q.as_dict() for q in qualities]
    report = Path(args.report or Path(args.dataset_dir) / f"{args.name}_label_quality.json")
    atomic_write_json(report, summary)
    print(format_quality_table(qualities))
    print(f"label quality -> {report}")
    return 0


def _cache_settings(args: argparse.Namespace, specs: list, precision: str) -> dict:
    """Everything a chunk's labels depend on besides its questions (see
    :mod:`mmoa.synthesis.chunks`); ``precision`` as resolved on this machine."""
    from dataclasses import asdict

    from mmoa.synthesis.chunks import model_fingerprint

    names = ("samples_per_model", "alpha", "tau", "width_limit", "answerer", "support_weight",
             "k", "seed", "batch_size", "chunk_size", "retriever_url",
             *(f"max_new_tokens_{a}" for a in MAX_NEW_TOKENS))
    return {**{n: getattr(args, n) for n in names}, "precision": precision,
            "models": [{**asdict(s), "files": model_fingerprint(s.model_name_or_path),
                        "adapter_files": model_fingerprint(s.adapter_name_or_path or "")}
                       for s in specs]}
