"""Create the tiny demo model: a few-million-parameter Llama, tokenizer trained on the demo world.

The tokenizer is trained on every string of the given JSON Lines files (default: every *.jsonl
in data/demo/, i.e. the demo world's corpus and QA splits) plus the agents' prompt wording; the
model is randomly initialised with a seed; both are saved to one folder that loads offline with
AutoModelForCausalLM / AutoTokenizer and with llamafactory (`template: llama3`).

Example: python models/make_tiny_model.py --output-dir models/tiny-llama3 --seed 42
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from mmoa.fileio import iter_jsonl
from mmoa_demo.tiny_model import (
    DEFAULT_OUTPUT_DIR,
    DEFAULT_TEXT_DIR,
    TinyModelConfig,
    default_extra_texts,
    default_text_files,
    iter_strings,
    make_tiny_model,
    texts_from_jsonl,
)

FIELD_HELP: dict[str, str] = {
    "vocab_size": "target vocabulary size incl. 256 byte tokens and the special tokens",
    "min_frequency": "a pair must occur this often to become a BPE merge",
    "num_key_value_heads": "K/V heads (grouped-query attention)",
    "seed": "seed of the random weight initialisation",
    "extra_text_weight": "how many times each extra text is counted for the tokenizer",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--output-dir", type=Path, default=DEFAULT_OUTPUT_DIR, help="replaced atomically"
    )
    parser.add_argument(
        "--text-files",
        type=Path,
        nargs="+",
        default=None,
        help="JSONL files whose string values train the tokenizer; None: every *.jsonl in "
        "--text-dir",
    )
    parser.add_argument(
        "--text-dir",
        type=Path,
        default=DEFAULT_TEXT_DIR,
        help="used when --text-files is not given",
    )
    parser.add_argument(
        "--extra-text-files",
        type=Path,
        nargs="*",
        default=[],
        help="more texts counted with --extra-text-weight: the strings of a .jsonl file, or "
        "the whole content of any other file",
    )
    parser.add_argument(
        "--no-prompt-texts",
        action="store_true",
        help="leave out the agents' prompt wording (mmoa.agents.prompts.vocabulary_texts), "
        "which is otherwise counted with --extra-text-weight",
    )
    sizes = parser.add_argument_group("model and tokenizer sizes (TinyModelConfig)")
    for field in dataclasses.fields(TinyModelConfig):
        flag = "--" + field.name.replace("_", "-")
        help_text = FIELD_HELP.get(field.name, " ")
        if isinstance(field.default, bool):
            sizes.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=field.default, help=help_text
            )
        else:
            sizes.add_argument(
                flag, type=type(field.default), default=field.default, help=help_text
            )
    return parser


def read_extra_texts(paths: list[Path]) -> list[str]:
    texts: list[str] = []
    for path in paths:
        if path.suffix == ".jsonl":
            for _, record in iter_jsonl(path):
                texts.extend(iter_strings(record))
        else:
            texts.append(path.read_text(encoding="utf-8"))
    return texts


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = TinyModelConfig(
            **{f.name: getattr(args, f.name) for f in dataclasses.fields(TinyModelConfig)}
        )
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        files = args.text_files or default_text_files(args.text_dir)
        texts = texts_from_jsonl(files)
        extra_texts = [] if args.no_prompt_texts else default_extra_texts()
        extra_texts += read_extra_texts(args.extra_text_files)
    except (OSError, ValueError) as err:  # DataFormatError is a ValueError
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"training the tokenizer on {len(texts):,} strings from {len(files)} file(s)")
    info = make_tiny_model(texts, args.output_dir, config, extra_texts=extra_texts)
    print(info.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
