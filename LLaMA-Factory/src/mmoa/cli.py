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


def _cmd_demo_world(args: argparse.Namespace) -> int:
    from mmoa.data.demo_world import (
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


def _add_data_commands(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="build datasets (demo world, ...)")
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
    _add_data_commands(commands)
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
