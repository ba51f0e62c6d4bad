"""``mmoa-cli``: the single command-line entry point of the project.

One module per command group (:mod:`~mmoa.cli.train`, :mod:`~mmoa.cli.data`,
:mod:`~mmoa.cli.model`, :mod:`~mmoa.cli.eval`, :mod:`~mmoa.cli.servers`); options that are a
config's fields are generated from the dataclass (:mod:`~mmoa.cli.options`), and installed
packages may add commands to a group (:mod:`~mmoa.cli.plugins`: the demo's ``data demo-world``).
This module only builds the parser and dispatches. Each group imports what it runs lazily, so
``mmoa-cli --help`` starts without torch or transformers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import mmoa
from mmoa.cli.common import Handler
from mmoa.cli.data import add_data_commands
from mmoa.cli.eval import EVAL_EXAMPLE, add_eval_command, compare_entry
from mmoa.cli.model import add_model_commands
from mmoa.cli.servers import add_index_command, add_serve_command, add_webui_command
from mmoa.cli.train import add_export_command, add_train_command

__all__ = ["EVAL_EXAMPLE", "SCRIPT_COMMANDS", "build_parser", "compare_entry", "main",
           "run_script"]

#: Sub-commands whose arguments go, unchanged, to an existing script's ``main``.
SCRIPT_COMMANDS = ("serve", "index")


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
    version = commands.add_parser("version", help="print the package version",
                                  epilog="example: mmoa-cli version")
    version.set_defaults(handler=_cmd_version)
    add_train_command(commands)
    add_export_command(commands)
    add_data_commands(commands)
    add_model_commands(commands)
    add_eval_command(commands)
    add_webui_command(commands)
    add_serve_command(commands)
    add_index_command(commands)
    return parser


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
