"""``mmoa-cli data``: the warm-start SFT data of each pipeline and the MAPPO prompt set.

The builders' options come from their config dataclasses (:mod:`mmoa.cli.options`); the two
multi-turn agents' builders (``search-sft``, ``decision-sft``) share one parser builder and one
run. Demo-only builders (the demo world, the tiny model's pre-training text, the decision
agent's known split) are not the library's: the ``mmoa_demo`` package adds them to this group
through the ``mmoa.cli.data`` entry point (:mod:`mmoa.cli.plugins`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Any

from mmoa.cli.common import (
    Commands,
    Handler,
    add_qa_source_arguments,
    add_retriever_arguments,
    load_qa_from_args,
)
from mmoa.cli.options import FIELD_DEFAULT, Option, add_config_options, config_from_args
from mmoa.cli.plugins import add_plugin_commands

_NAME = Option("dataset name to register", default=FIELD_DEFAULT)
_NO_SEGMENT = Option("one sample per trajectory (train it with mask_history: false)",
                     flag="--no_segment", negate=True)

#: ``data sft``: the fields of ``SFTBuildConfig`` on the command line.
SFT_OPTIONS: Mapping[str, Option] = {
    "name": _NAME,
    "label_source": Option("Selector labels: answer-word overlap (heuristic) or gold supporting "
                           "passages (by passage id, or by title for HotpotQA / 2Wiki)",
                           default=FIELD_DEFAULT),
    "k": Option("candidates per question", default=FIELD_DEFAULT),
    "candidate_order": Option("the Selector's candidates: shuffled (MMOA-RAG: positives at "
                              "random positions) or ranked (the retrieval order the pipeline "
                              "shows at rollout and evaluation, rank prior kept)",
                              default=FIELD_DEFAULT),
    "seed": Option("seed of the candidate shuffling", default=FIELD_DEFAULT),
}

#: ``data search-sft``: the fields of ``SearchSFTConfig``.
SEARCH_SFT_OPTIONS: Mapping[str, Option] = {
    "name": _NAME,
    "top_k": Option("documents per query", default=FIELD_DEFAULT),
    "max_queries": Option("queries per search", default=FIELD_DEFAULT),
    "max_turns": Option("most search turns of a trajectory", default=FIELD_DEFAULT),
    "query_mode": Option("multi (default): independent hops in one search; single: one query "
                         "per search turn (the single-query baseline)", choices=("multi", "single"),
                         default=FIELD_DEFAULT, show_default=False),
    "segment": _NO_SEGMENT,
    "require_support": Option("keep trajectories whose information misses a gold passage",
                              flag="--keep_unsupported", negate=True),
}

#: ``data decision-sft``: the fields of ``DecisionSFTConfig``.
DECISION_SFT_OPTIONS: Mapping[str, Option] = {
    "name": _NAME,
    "top_k": Option("documents per search", default=FIELD_DEFAULT),
    "max_searches": Option("most searches of a trajectory", default=FIELD_DEFAULT),
    "segment": _NO_SEGMENT,
    "require_support": Option("keep trajectories whose documents miss a gold passage",
                              flag="--keep_unsupported", negate=True),
}

#: Fields that the QA-source options give (``--dataset_dir``) or that stay internal.
_NOT_OPTIONS = ("dataset_dir", "request_size")


def _fail(command: str, err: Exception) -> int:
    print(f"mmoa-cli data {command}: error: {err} (nothing was written)", file=sys.stderr)
    return 2


def _connected_client(args: argparse.Namespace) -> Any:
    from mmoa.retrieval.client import RetrievalClient

    client = RetrievalClient(args.retriever_url, token=args.retriever_token)
    client.health()
    return client


def _cmd_sft_data(args: argparse.Namespace) -> int:
    from mmoa.data.sft_builder import (
        SFTBuildConfig,
        build_sft_records,
        load_rewrites,
        write_sft_dataset,
    )

    try:
        records = load_qa_from_args(args)
        rewrites = load_rewrites(args.rewrites_file) if args.rewrites_file else {}
        client = _connected_client(args)
        config = config_from_args(SFTBuildConfig, args, SFT_OPTIONS, dataset_dir=args.dataset_dir)
        sft_records, report = build_sft_records(records, client, config, rewrites)
    except (ValueError, KeyError, FileNotFoundError, ConnectionError) as err:
        return _fail("sft", err)
    write_sft_dataset(sft_records, config, report)
    print("\n".join(report.lines()))
    print(f"  registered as {args.name!r} in {args.dataset_dir}/dataset_info.json")
    return 0


def _trajectory_sft_handler(command: str, config_cls: type, options: Mapping[str, Option],
                            build: Callable[[], Callable[..., tuple[list, Any]]]) -> Handler:
    """The run of a multi-turn agent's SFT builder: load the questions, build the trajectories
    against the live server, write them as ShareGPT data (``build`` imports the builder, so
    the parser stays light)."""

    def run(args: argparse.Namespace) -> int:
        from mmoa.data.search_agent_sft import write_search_sft_dataset

        try:
            records = load_qa_from_args(args)
            client = _connected_client(args)
            config = config_from_args(config_cls, args, options, dataset_dir=args.dataset_dir)
            samples, report = build()(records, client, config)
            if not samples:
                raise ValueError("no trajectory could be built (see the skipped counts: "
                                 f"{dict(report.skipped)})")
        except (ValueError, KeyError, FileNotFoundError, ConnectionError) as err:
            return _fail(command, err)
        write_search_sft_dataset(samples, config, report)
        print("\n".join(report.lines()))
        print(f"  registered as {args.name!r} (sharegpt) in {args.dataset_dir}/dataset_info.json")
        return 0

    return run


def _add_trajectory_sft_command(kinds: Commands, command: str, config_cls: type,
                                options: Mapping[str, Option],
                                build: Callable[[], Callable[..., tuple[list, Any]]], *,
                                help_text: str, description: str, example: str) -> None:
    """``data search-sft`` and ``data decision-sft``: the same sources, server options, config
    options and run; only the config and the builder differ."""
    parser = kinds.add_parser(command, help=help_text, description=description,
                              epilog=f"example: {example}")
    add_qa_source_arguments(parser)
    add_retriever_arguments(parser)
    add_config_options(parser, config_cls, options, exclude=_NOT_OPTIONS)
    parser.set_defaults(handler=_trajectory_sft_handler(command, config_cls, options, build))


def _search_builder() -> Callable[..., tuple[list, Any]]:
    from mmoa.data.search_agent_sft import build_search_sft_records

    return build_search_sft_records


def _decision_builder() -> Callable[..., tuple[list, Any]]:
    from mmoa.data.decision_agent_sft import build_decision_sft_records

    return build_decision_sft_records


def _cmd_toa_data(args: argparse.Namespace) -> int:
    from mmoa.synthesis.command import run_toa_command

    return run_toa_command(args, load_qa_from_args)


def _cmd_qr_rewrites(args: argparse.Namespace) -> int:
    from mmoa.synthesis.rewrite_command import run_rewrite_command

    return run_rewrite_command(args, load_qa_from_args)


def _cmd_mappo_data(args: argparse.Namespace) -> int:
    from mmoa.data.sft_builder import write_mappo_dataset

    try:
        records = load_qa_from_args(args)
        path = write_mappo_dataset(records, args.dataset_dir, args.name)
    except (ValueError, KeyError, FileNotFoundError) as err:
        return _fail("mappo", err)
    print(f"MAPPO prompt set: {len(records)} questions -> {path}")
    print(f"  registered as {args.name!r} in {args.dataset_dir}/dataset_info.json")
    return 0


def add_data_commands(commands: Commands) -> None:
    from mmoa.data.decision_agent_sft import DecisionSFTConfig
    from mmoa.data.search_agent_sft import SearchSFTConfig
    from mmoa.data.sft_builder import SFTBuildConfig

    data = commands.add_parser(
        "data", help="build datasets (SFT data, MAPPO data; the demo's world and texts)",
        description=("Build the warm-start SFT data or the MAPPO prompt set (and, with the "
                     "demo package, the demo world and the tiny model's pre-training text)."),
        epilog=(
            "examples:\n"
            "  mmoa-cli data sft --data_file data/demo/train.jsonl --name demo_sft \\\n"
            "      --retriever_url http://127.0.0.1:8000\n"
            "  mmoa-cli data mappo --data_file data/demo/train.jsonl --name demo_mappo\n"
            "  mmoa-cli data toa --data_file data/demo/train.jsonl --name demo_toa_sft \\\n"
            "      --model name=smol,path=models/smollm2-135m-instruct,template=smollm2\n"
            "  mmoa-cli data qr-rewrites --data_file train.json --output rewrites.json \\\n"
            "      --model name=smol,path=models/smollm2-135m-instruct,template=smollm2\n"
            "  mmoa-cli data search-sft --data_file data/demo/train.jsonl \\\n"
            "      --name demo_search_sft --retriever_url http://127.0.0.1:8000\n"
            "  mmoa-cli data decision-sft --data_file data/demo_decision/train.jsonl \\\n"
            "      --name demo_decision_sft --retriever_url http://127.0.0.1:8000\n"
            "Run 'mmoa-cli data <dataset> --help' for the options of one builder."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    kinds = data.add_subparsers(dest="data_command", metavar="<dataset>", required=True)

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
    add_qa_source_arguments(sft)
    add_retriever_arguments(sft, hint=True)
    sft.add_argument("--rewrites_file", help="Rewrite-Retrieve-Read rewrites (source/target)")
    add_config_options(sft, SFTBuildConfig, SFT_OPTIONS, exclude=_NOT_OPTIONS)
    sft.set_defaults(handler=_cmd_sft_data)

    _add_trajectory_sft_command(
        kinds, "search-sft", SearchSFTConfig, SEARCH_SFT_OPTIONS, _search_builder,
        help_text="build the search agent's format-learning SFT data (needs the retrieval "
                  "server)",
        description=(
            "Build ShareGPT SFT trajectories of the multi-turn search agent from each "
            "question's known hops (demo world decomposition, or HotpotQA supporting titles) "
            "with the documents the live server retrieves, segmented per model turn as RAG-R1 "
            "does, and register them in dataset_info.json (docs/search_agent.md)."
        ),
        example=("mmoa-cli data search-sft --data_file data/demo/train.jsonl "
                 "--name demo_search_sft --retriever_url http://127.0.0.1:8000"),
    )
    _add_trajectory_sft_command(
        kinds, "decision-sft", DecisionSFTConfig, DECISION_SFT_OPTIONS, _decision_builder,
        help_text="build the decision agent's warm-start SFT data (needs the retrieval server)",
        description=(
            "Build ShareGPT SFT trajectories of the retrieve-or-answer decision agent: a direct "
            "[Answer] for the records of group 'known' (the model answers them closed book), "
            "[Search] then [Answer] after the live server's documents for the others; "
            "segmented per model turn (docs/decision_agent.md)."
        ),
        example=("mmoa-cli data decision-sft --data_file data/demo_decision/train.jsonl "
                 "--name demo_decision_sft --retriever_url http://127.0.0.1:8000"),
    )

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
    add_qa_source_arguments(toa)
    add_toa_arguments(toa)
    toa.set_defaults(handler=_cmd_toa_data)

    from mmoa.synthesis.rewrite_command import add_rewrite_arguments

    rewrites = kinds.add_parser(
        "qr-rewrites",
        help="synthesise Query Rewriter labels that retrieve more gold passages than the "
             "question (needs the retrieval server and gold supporting passages)",
        description=(
            "For every question, sample rewrites (sub-question sets) from local models with TOA "
            "or best-of-N, score each by the gold supporting passages among the K candidates "
            "its sub-questions retrieve from the live server, and keep the best where it beats "
            "the question alone. Writes a Rewrite-Retrieve-Read rewrites file for 'data sft "
            "--rewrites_file' and a report (docs/real_workflow.md)."
        ),
        epilog=(
            "example: mmoa-cli data qr-rewrites --data_file train.json "
            "--output data/hotpotqa_distractor/qr_rewrites.json "
            "--model name=smol,path=models/smollm2-135m-instruct,template=smollm2 "
            "--model name=careful,path=models/smollm2-135m-instruct,template=smollm2,"
            "variant=careful --samples_per_model 4 --k 5 --compare"
        ),
    )
    add_qa_source_arguments(rewrites)
    add_rewrite_arguments(rewrites)
    rewrites.set_defaults(handler=_cmd_qr_rewrites)

    mappo = kinds.add_parser(
        "mappo",
        help="build the MAPPO prompt set (questions with every gold answer)",
        epilog="example: mmoa-cli data mappo --data_file data/demo/train.jsonl --name demo_mappo",
    )
    add_qa_source_arguments(mappo)
    mappo.add_argument("--name", default="demo_mappo", help="dataset name to register")
    mappo.set_defaults(handler=_cmd_mappo_data)
    add_plugin_commands("data", data, kinds)
