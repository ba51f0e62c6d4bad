"""What several command groups share: the handler type, the QA-source and retrieval-server
options, the script-backed sub-commands and the one-line report of a bad config."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], int]
#: The ``add_subparsers`` action a command group adds its commands to.
Commands = argparse._SubParsersAction

DEFAULT_RETRIEVER_URL = "http://127.0.0.1:8000"


def add_qa_source_arguments(parser: argparse.ArgumentParser) -> None:
    """Where a data builder reads its questions (``load_qa_from_args`` reads them)."""
    parser.add_argument("--data_file", help="a QA file (HotpotQA, 2Wiki, AmbigQA, FlashRAG, "
                        "NQ-open, PopQA or demo format)")
    parser.add_argument("--data_format", default="auto", help="its format (default: detect)")
    parser.add_argument("--dataset", help="or: a QA set registered in dataset_info.json")
    parser.add_argument("--dataset_dir", default="data",
                        help="folder of dataset_info.json, where the output goes (default data)")
    parser.add_argument("--max_samples", type=int, help="use only the first N questions")
    add_ambigqa_argument(parser)


AMBIGQA_HELP = (
    "gold answers of an AmbigQA file: nq_answer (default; the NQ-open answers, as MMOA-RAG "
    "scores AmbigQA; needs the full AmbigNQ release), nq_answer_joined (the original code's "
    "single ', '-joined string) or union (every annotation's answers)")


def add_ambigqa_argument(parser: argparse.ArgumentParser) -> None:
    from mmoa.data.loaders import AMBIGQA_ANSWER_SETS, DEFAULT_AMBIGQA_ANSWERS

    parser.add_argument("--ambigqa_answers", default=DEFAULT_AMBIGQA_ANSWERS,
                        choices=AMBIGQA_ANSWER_SETS, help=AMBIGQA_HELP)


def add_retriever_arguments(parser: argparse.ArgumentParser, *, hint: bool = False) -> None:
    """``--retriever_url`` and ``--retriever_token`` of a command that queries the server;
    ``hint``: the help also says how to start it."""
    how = "bash run_server.sh --index DIR; " if hint else ""
    parser.add_argument("--retriever_url", default=DEFAULT_RETRIEVER_URL,
                        help=f"the running retrieval server ({how}default "
                             f"{DEFAULT_RETRIEVER_URL})")
    parser.add_argument("--retriever_token", help="bearer token of the retrieval server")


def load_qa_from_args(args: argparse.Namespace) -> list:
    """The questions that :func:`add_qa_source_arguments`' options name."""
    from mmoa.data.registry import load_dataset_records

    return load_dataset_records(args.dataset, args.dataset_dir, args.data_file,
                                args.data_format, args.max_samples,
                                ambigqa_answers=args.ambigqa_answers)


def with_config_errors(command: str, run: Callable[[], int]) -> int:
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


def add_script_command(commands: Commands, name: str, script_parser: argparse.ArgumentParser,
                       handler: Handler, help_text: str, description: str | None,
                       examples: str | None) -> argparse.ArgumentParser:
    """A sub-command whose options are exactly those of an existing script's parser.

    The script's parser is the parent, so ``--help`` lists the same options and defaults; the
    handler gets the parsed namespace (or, for :data:`mmoa.cli.SCRIPT_COMMANDS`, the raw
    arguments for the script's own ``main``: the same checks, environment variables and exit
    codes as the script).
    """
    command = commands.add_parser(
        name, parents=[script_parser], add_help=False, help=help_text, description=description,
        epilog=examples, formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",
    )
    command.set_defaults(handler=handler)
    return command
