"""Pre-training text for the tiny demo model: encyclopedias of *other* demo worlds.

A real RAG pipeline starts from a base model that can already read: copy a name from its context,
follow "X was born in Y". A randomly initialised 4M-parameter model cannot, and learning that
from the SFT data alone takes far longer than the demo's CPU budget (the warm start then only
learns the output formats and answers "no" to everything). So the tiny model gets a short
language-model pre-training (LLaMA-Factory's ``stage: pt``) first, like any base model.

The text comes from demo worlds generated with other seeds, never from the evaluation world:
the model learns the language of the encyclopedia and how to copy from context, not the facts the
demo questions ask about. Passages whose title also exists in the evaluation world are dropped,
so no entity of the evaluation world is described in the pre-training text.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from mmoa.data.demo_world import DemoWorldConfig, generate_demo_world
from mmoa.data.registry import register_datasets
from mmoa.fileio import atomic_write_json, iter_jsonl

#: Seeds of the pre-training worlds; the demo world itself uses 42 by default.
DEFAULT_SEEDS = (1001, 1002, 1003)


def passage_text(passage: dict[str, str]) -> str:
    """A passage as the agents' prompts show documents: title line, then text."""
    return f"{passage['title']}\n{passage['text']}"


def build_pretrain_texts(
    seeds: Sequence[int] = DEFAULT_SEEDS,
    n_passages: int = 2000,
    exclude_titles: Iterable[str] = (),
    shuffle_seed: int = 0,
) -> list[dict[str, str]]:
    """``{"text": ...}`` records from one demo world per seed, without the excluded titles."""
    excluded = set(exclude_titles)
    texts = []
    for seed in seeds:
        world = generate_demo_world(
            DemoWorldConfig(n_passages=n_passages, n_train=0, n_dev=0, n_test=1, seed=seed)
        )
        texts.extend({"text": passage_text(p)} for p in world.corpus if p["title"] not in excluded)
    random.Random(shuffle_seed).shuffle(texts)
    return texts


def write_pretrain_dataset(
    texts: Sequence[dict[str, str]], dataset_dir: str | Path, name: str
) -> Path:
    """Write ``<dataset_dir>/<name>.json`` and register it for LLaMA-Factory's ``pt`` stage."""
    if not texts:
        raise ValueError("no pre-training text left (every passage was excluded)")
    path = Path(dataset_dir) / f"{name}.json"
    atomic_write_json(path, list(texts))
    register_datasets(dataset_dir, {name: {"file_name": path.name, "columns": {"prompt": "text"}}})
    return path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write the tiny model's pre-training text (demo worlds of other seeds) and "
        "register it in dataset_info.json for 'stage: pt'.",
        epilog="example: python data_builders/make_pretrain_text.py "
        "--exclude-corpus data/demo/corpus.jsonl",
    )
    parser.add_argument("--dataset-dir", default="data", help="folder of dataset_info.json")
    parser.add_argument("--name", default="demo_pt", help="dataset name to register")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS),
                        help="one pre-training world per seed (default: 1001 1002 1003)")
    parser.add_argument("--n-passages", type=int, default=2000, help="passages per world")
    parser.add_argument("--exclude-corpus", help="corpus.jsonl of the evaluation world: its "
                        "titles are left out of the pre-training text")
    args = parser.parse_args(argv)
    excluded: set[str] = set()
    if args.exclude_corpus:
        excluded = {row["title"] for _, row in iter_jsonl(args.exclude_corpus)}
    texts = build_pretrain_texts(args.seeds, args.n_passages, excluded)
    path = write_pretrain_dataset(texts, args.dataset_dir, args.name)
    print(f"pre-training text: {len(texts)} passages from worlds {args.seeds} "
          f"({len(excluded)} evaluation-world titles excluded) -> {path}")
    print(f"  registered as {args.name!r} in {args.dataset_dir}/dataset_info.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
