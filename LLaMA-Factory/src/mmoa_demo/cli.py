"""The demo's data builders as commands: ``demo-world``, ``pretrain`` and ``known-split``.

They are ``mmoa-cli data demo-world`` (and so on) where this package is installed: the
distribution declares :func:`register` as a plugin of the ``data`` group (entry point group
``mmoa.cli.data`` in pyproject.toml, read by :mod:`mmoa.cli.plugins`), so the library never
imports this package. They also run without the entry point, as ``python -m mmoa_demo
<command>`` and through the thin scripts ``data_builders/make_demo_world.py``,
``make_pretrain_text.py`` and ``decision_known_split.py`` (which the demo and the GPU check run
from a source tree where no distribution metadata may exist).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

#: Lines added to the ``data`` group's examples.
EXAMPLES = (
    "  mmoa-cli data demo-world --out data/demo\n"
    "  mmoa-cli data demo-world --out data/demo_hard --hard\n"
    "  mmoa-cli data pretrain --exclude-corpus data/demo/corpus.jsonl\n"
    "  mmoa-cli data known-split --model_name_or_path models/smollm2-135m-instruct \\\n"
    "      --template smollm2 --world_dir data/demo --out data/demo_decision\n"
)


def _cmd_demo_world(args: argparse.Namespace) -> int:
    from mmoa_demo.world import (
        DISTRACTOR_SHARE,
        HARD_NAMESAKES_PER_ENTITY,
        DemoWorldConfig,
        DemoWorldError,
        generate_demo_world,
        write_demo_world,
    )

    namesakes = args.namesakes_per_entity
    if namesakes is None:
        namesakes = HARD_NAMESAKES_PER_ENTITY if args.hard else 0
    config = DemoWorldConfig(
        n_passages=args.n_passages, n_train=args.n_train, n_dev=args.n_dev, n_test=args.n_test,
        seed=args.seed,
        distractor_share=DISTRACTOR_SHARE if args.distractor_share is None
        else args.distractor_share,
        namesakes_per_entity=namesakes,
    )
    try:
        world = generate_demo_world(config)
    except DemoWorldError as err:
        print(f"mmoa-cli data demo-world: error: {err} (nothing was written)", file=sys.stderr)
        return 2
    files = write_demo_world(world, args.out)
    stats = world.stats
    print(f"demo world (seed {config.seed}) written to {args.out}:")
    namesake_note = (f", {stats['namesake_passages']} namesakes of {stats['asked_entities']} "
                     f"asked entities" if "namesake_passages" in stats else "")
    print(f"  corpus   {stats['passages']} passages "
          f"({stats['distractor_passages']} distractors{namesake_note}) -> {files['corpus']}")
    for split, count in stats["questions"].items():
        kinds = ", ".join(f"{t} {n}" for t, n in stats["question_types"][split].items())
        print(f"  {split:<8} {count} questions ({kinds}) -> {files[split]}")
    return 0


def _cmd_known_split(args: argparse.Namespace) -> int:
    from mmoa_demo.known_split import run_known_split

    return run_known_split(args)


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from mmoa_demo.pretrain_text import run

    return run(args)


def _add_demo_world(commands: argparse._SubParsersAction) -> None:
    demo = commands.add_parser(
        "demo-world",
        help="generate the seeded synthetic encyclopedia and QA splits (demo)",
        description=(
            "Generate the demo world: a seeded synthetic encyclopedia (corpus.jsonl) with "
            "one-hop, bridge, comparison and yes/no questions (train/dev/test.jsonl)."
        ),
        epilog="example: mmoa-cli data demo-world --out data/demo --n-passages 2000 --seed 42",
    )
    demo.add_argument("--out", default="data/demo", help="output folder (default: data/demo)")
    demo.add_argument("--n-passages", type=int, default=2000,
                      help="corpus size, namesakes not counted (default: 2000)")
    demo.add_argument("--n-train", type=int, default=2000, help="train questions (default: 2000)")
    demo.add_argument("--n-dev", type=int, default=200, help="dev questions (default: 200)")
    demo.add_argument("--n-test", type=int, default=200, help="test questions (default: 200)")
    demo.add_argument("--seed", type=int, default=42, help="random seed (default: 42)")
    hard = demo.add_argument_group(
        "harder retrieval (opt-in; without these options the world is the default one, byte "
        "for byte)")
    hard.add_argument("--hard", action="store_true",
                      help="preset: 3 namesake passages per asked entity (as "
                           "--namesakes-per-entity 3), so a question's top 10 holds plausible "
                           "but wrong passages")
    hard.add_argument("--namesakes-per-entity", type=int, default=None, metavar="N",
                      help="namesake passages (same surname, title or name, other facts) added "
                           "per entity that a question asks about, on top of --n-passages "
                           "(0-6; default 0, 3 with --hard)")
    hard.add_argument("--distractor-share", type=float, default=None, metavar="SHARE",
                      help="share of --n-passages that are generic distractors (0-0.9; default "
                           "0.3)")
    demo.set_defaults(handler=_cmd_demo_world)


def _add_known_split(commands: argparse._SubParsersAction) -> None:
    from mmoa_demo.known_split import add_known_split_arguments

    known = commands.add_parser(
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


def _add_pretrain(commands: argparse._SubParsersAction) -> None:
    from mmoa_demo.pretrain_text import build_arg_parser

    pretrain = commands.add_parser(
        "pretrain", parents=[build_arg_parser()], add_help=False, conflict_handler="resolve",
        help="write the tiny demo model's pre-training text (other demo worlds, for stage: pt)",
        epilog="example: mmoa-cli data pretrain --exclude-corpus data/demo/corpus.jsonl",
    )
    pretrain.set_defaults(handler=_cmd_pretrain)


def _add_commands(commands: argparse._SubParsersAction) -> None:
    _add_demo_world(commands)
    _add_known_split(commands)
    _add_pretrain(commands)


def register(parser: argparse.ArgumentParser, commands: argparse._SubParsersAction) -> None:
    """The ``mmoa.cli.data`` plugin: add the demo's builders to ``mmoa-cli data`` (and their
    examples to the group's help, before its closing "Run ..." line)."""
    _add_commands(commands)
    epilog = parser.epilog or ""
    head, sep, tail = epilog.rpartition("\nRun ")
    parser.epilog = f"{head}\n{EXAMPLES.rstrip()}{sep}{tail}" if sep else epilog + EXAMPLES


def build_parser(prog: str = "python -m mmoa_demo") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="The demo's data builders (the same as 'mmoa-cli data ...').",
        epilog="examples:\n" + EXAMPLES.replace("mmoa-cli data", prog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_commands(parser.add_subparsers(dest="command", metavar="<command>", required=True))
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "python -m mmoa_demo") -> int:
    """Run one demo builder: ``main(["demo-world", "--out", "data/demo"])``."""
    args = build_parser(prog).parse_args(list(sys.argv[1:] if argv is None else argv))
    return args.handler(args)


def run_command(command: str, argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """One builder as a script of its own (``data_builders/make_demo_world.py``): its usage,
    help and errors name ``prog``, not ``python -m mmoa_demo <command>``."""
    commands = next(a for a in build_parser()._actions
                    if isinstance(a, argparse._SubParsersAction))
    parser = commands.choices[command]
    if prog is not None:
        parser.prog = prog
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    return args.handler(args)
