"""``mmoa-cli``: the single command-line entry point of the project.

Sub-commands are registered by the modules that own them, so this file stays a thin dispatcher.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import mmoa

Handler = Callable[[argparse.Namespace], int]


def _cmd_version(_: argparse.Namespace) -> int:
    print(f"mmoa {mmoa.__version__}")
    return 0


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
    version = commands.add_parser("version", help="print the package version")
    version.set_defaults(handler=_cmd_version)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
