"""Pre-training text for the tiny demo model: encyclopedias of *other* demo worlds.

A real RAG pipeline starts from a base model that can already read: copy a name from its context,
follow "X was born in Y". A randomly initialised 4M-parameter model cannot, and learning that
from the SFT data alone takes far longer than the demo's CPU budget (the warm start then only
learns the output formats and answers "no" to everything). So the tiny model gets a short
language-model pre-training (LLaMA-Factory's ``stage: pt``) first, like any base model.

The text comes from demo worlds generated with other seeds, never from the evaluation world:
the model learns the language of the encyclopedia and how to copy from context, not the facts the
demo questions ask about. Passages whose title also exists in the evaluation world are dropped,
so no entity of the evaluation world is described in the pre-training text. The tiny model's
tokenizer is trained on this text too (run_demo.sh): evaluation-world names are then spelled with
sub-word pieces the model has seen, as a real tokenizer spells new names. A tokenizer trained on
the evaluation world itself gives each of its names one token of its own, which no training text
outside that entity's passage ever uses: the model cannot learn to write it (41 % of the test
answers' tokens were such tokens), however well it learns to read.

Plain passages alone do not teach copying fast enough: after 300 steps a probe (predict a
passage's title where the text repeats it) is right for 6 % of tokens. Real pre-training corpora
are full of text that repeats what came before (lists, quotes, question-answer pages); two kinds of
such records are added, both built from the other worlds:

* reading drills: a question's supporting passages (and one distractor), then the question, its
  sub-questions and its answer, as on a reading-comprehension page;
* copy drills: a list of names, then the same list again, the pattern from which small
  transformers learn "induction" (find the earlier occurrence, copy what followed it).

By default a copy drill lists titles of the other worlds. Those recur from drill to drill, and a
tiny model learns to complete them from memory rather than to copy: with ``fresh_copy_names`` the
names are drawn afresh for every drill (:func:`mmoa_demo.world.fresh_names`), so only
copying predicts the repeat.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from mmoa.agents.candidates import doc_text
from mmoa.data.registry import register_datasets
from mmoa.fileio import atomic_write_jsonl, iter_jsonl
from mmoa_demo.world import DemoWorldConfig, fresh_names, generate_demo_world

#: Seeds of the pre-training worlds; the demo world itself uses 42 by default.
DEFAULT_SEEDS = (1001, 1002, 1003)


def reading_drill(question: dict[str, Any], passages: Sequence[dict[str, str]]) -> str:
    """Passages (as the agents' prompts show documents), then the question, its sub-questions
    and its answer."""
    documents = "\n\n".join(doc_text(p) for p in passages)
    steps = "; ".join(question.get("decomposition") or [question["question"]])
    return (f"{documents}\n\nQuestion: {question['question']}\nSub-questions: {steps}\n"
            f"Answer: {question['answers'][0]}")


def copy_drill(names: Sequence[str]) -> str:
    """A list of names and the same list again."""
    listed = ", ".join(names)
    return f"Names: {listed}.\nThe same names again: {listed}."


def text_kind(text: str) -> str:
    """``passage``, ``reading`` or ``copy``: which kind of record a pre-training text is."""
    if text.startswith("Names: "):
        return "copy"
    return "reading" if "\nSub-questions: " in text else "passage"


def build_pretrain_texts(
    seeds: Sequence[int] = DEFAULT_SEEDS,
    n_passages: int = 2000,
    exclude_titles: Iterable[str] = (),
    shuffle_seed: int = 0,
    drills: bool = True,
    copy_drills_per_passage: int = 1,
    fresh_copy_names: bool = False,
) -> list[dict[str, str]]:
    """``{"text": ...}`` records from one demo world per seed, without the excluded titles.

    With ``drills``, each world also gives one reading drill per question (as many questions as
    passages) and ``copy_drills_per_passage`` copy drills per passage, of the world's titles or,
    with ``fresh_copy_names``, of names drawn afresh for each drill.
    """
    excluded = set(exclude_titles)
    rng = random.Random(shuffle_seed)
    texts = []
    for seed in seeds:
        world = generate_demo_world(DemoWorldConfig(
            n_passages=n_passages, n_train=n_passages if drills else 0, n_dev=0,
            n_test=0 if drills else 1, seed=seed,
        ))
        kept = [p for p in world.corpus if p["title"] not in excluded]
        texts.extend({"text": doc_text(p)} for p in kept)
        if not drills or not kept:
            continue
        by_id = {p["id"]: p for p in kept}
        for question in world.splits["train"]:
            support_ids = question.get("supporting_ids") or []
            if not support_ids or not all(i in by_id for i in support_ids):
                continue  # no supporting passage, or an excluded entity is involved
            passages = [*(by_id[i] for i in support_ids), rng.choice(kept)]
            rng.shuffle(passages)
            texts.append({"text": reading_drill(question, passages)})
        titles = [p["title"] for p in kept]
        for _ in range(len(kept) * copy_drills_per_passage):
            names = (fresh_names(rng, 8) if fresh_copy_names
                     else rng.sample(titles, min(len(titles), 8)))
            texts.append({"text": copy_drill(names)})
    rng.shuffle(texts)
    return texts


def write_pretrain_dataset(
    texts: Sequence[dict[str, str]], dataset_dir: str | Path, name: str
) -> Path:
    """Write ``<dataset_dir>/<name>.jsonl`` and register it for LLaMA-Factory's ``pt`` stage.

    JSON Lines, so that ``models/make_tiny_model.py --text-files`` can train the tokenizer on it.
    """
    if not texts:
        raise ValueError("no pre-training text left (every passage was excluded)")
    path = Path(dataset_dir) / f"{name}.jsonl"
    atomic_write_jsonl(path, texts)
    register_datasets(dataset_dir, {name: {"file_name": path.name, "columns": {"prompt": "text"}}})
    return path


def build_arg_parser() -> argparse.ArgumentParser:
    """Options of ``data_builders/make_pretrain_text.py`` and ``mmoa-cli data pretrain``."""
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
    parser.add_argument("--no-drills", action="store_true",
                        help="plain passages only (no reading or copy drills)")
    parser.add_argument("--copy-drills", type=int, default=1, metavar="N",
                        help="copy drills per passage (default 1)")
    parser.add_argument("--fresh-copy-names", action="store_true",
                        help="copy drills list names drawn afresh for every drill instead of "
                        "the worlds' titles (nothing to memorise: only copying predicts them)")
    parser.add_argument("--exclude-corpus", help="corpus.jsonl of the evaluation world: its "
                        "titles are left out of the pre-training text")
    return parser


def run(args: argparse.Namespace) -> int:
    """Build, write and register the text for parsed :func:`build_arg_parser` options."""
    excluded: set[str] = set()
    if args.exclude_corpus:
        excluded = {row["title"] for _, row in iter_jsonl(args.exclude_corpus)}
    texts = build_pretrain_texts(args.seeds, args.n_passages, excluded,
                                 drills=not args.no_drills,
                                 copy_drills_per_passage=args.copy_drills,
                                 fresh_copy_names=args.fresh_copy_names)
    path = write_pretrain_dataset(texts, args.dataset_dir, args.name)
    kinds = Counter(text_kind(t["text"]) for t in texts)
    print(f"pre-training text from worlds {args.seeds}: {len(texts)} records "
          f"({kinds['passage']} passages, {kinds['reading']} reading drills, "
          f"{kinds['copy']} copy drills; "
          f"{len(excluded)} evaluation-world titles excluded) -> {path}")
    print(f"  registered as {args.name!r} in {args.dataset_dir}/dataset_info.json")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_arg_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
