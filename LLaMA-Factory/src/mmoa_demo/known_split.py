"""The decision agent's mixed splits: questions the model knows, and the world's questions.

SmartRAG's point is that a policy should not pay for retrieval when it already knows the answer.
The demo world's questions can only be answered by retrieval (a synthetic encyclopedia), so the
demo needs a second group the pre-trained model answers without documents. Which questions those
are depends on the model, so it is measured:

1. the bundled general-knowledge questions (:mod:`mmoa_demo.general_knowledge`) are split, with a
   seed, into train / dev / test parts;
2. the zero-shot model answers the train and dev parts closed book: greedy, the decision prompt
   with the answer forced (``DecisionAgentPipeline(policy="never")``, the very prompt the agent
   is trained and evaluated with), judged by ``correct_metric``: ``contains`` (default: the
   normalised gold answer's words appear, as whole words and in order, in the normalised
   prediction, since the model's short-answer format is only taught later by SFT; a plain
   substring test would count the symbol "I" of iodine in "I do not know") or ``em``;
3. the ``known`` group of train and of dev is the questions it answered correctly there (so the
   SFT labels come from measured correctness);
4. the test part is never measured: the categories whose dev accuracy reaches
   ``min_category_accuracy`` are chosen on dev, and all their test questions join the test
   ``known`` group (the per-category rule chosen on dev, applied blind to test);
5. each split mixes its known questions with the demo world's questions of the same split
   (group ``world``), shuffled with the seed, and is written atomically with a report
   (``known_split.json``: the dev accuracy per category, the counts, the model, the seed).
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mmoa.data.records import QARecord
from mmoa.fileio import atomic_dir, atomic_write_json, atomic_write_jsonl
from mmoa.metrics import DEFAULT_PROFILE, contains_answer_words, score_answer
from mmoa_demo.general_knowledge import KnowledgeQuestion, general_knowledge_questions

SPLITS = ("train", "dev", "test")
CORRECT_METRICS = ("contains", "em")
#: ``questions -> predictions`` (closed book), one per question in order.
Answerer = Callable[[Sequence[str]], list[str]]


@dataclass
class KnownSplitConfig:
    seed: int = 42
    #: Shares of the general-knowledge questions in the train and dev parts (test: the rest).
    train_share: float = 0.5
    dev_share: float = 0.25
    correct_metric: str = "contains"
    min_category_accuracy: float = 0.5
    scoring: str = DEFAULT_PROFILE

    def validate(self) -> None:
        if not (self.train_share > 0 and self.dev_share > 0
                and self.train_share + self.dev_share < 1):
            raise ValueError(f"train_share and dev_share must be > 0 with a sum < 1 (the rest "
                             f"is test), got {self.train_share} and {self.dev_share}")
        if self.correct_metric not in CORRECT_METRICS:
            raise ValueError(f"correct_metric must be one of {', '.join(CORRECT_METRICS)}, got "
                             f"{self.correct_metric!r}")
        if not 0 <= self.min_category_accuracy <= 1:
            raise ValueError(f"min_category_accuracy must be in [0, 1], got "
                             f"{self.min_category_accuracy}")


def answered(prediction: str, golds: Sequence[str], metric: str = "contains",
             scoring: str = DEFAULT_PROFILE) -> bool:
    """Whether a closed-book prediction counts as knowing the answer (see the module)."""
    if metric == "em":
        return bool(score_answer(prediction, list(golds), profile=scoring).em)
    return contains_answer_words(prediction, list(golds), scoring)


def split_pool(pool: Sequence[KnowledgeQuestion], config: KnownSplitConfig
               ) -> dict[str, list[KnowledgeQuestion]]:
    """The seeded train / dev / test parts, each category split in the same shares (so every
    category has dev questions to be judged by)."""
    by_category: dict[str, list[KnowledgeQuestion]] = defaultdict(list)
    for q in pool:
        by_category[q.category].append(q)
    rng = random.Random(config.seed)
    parts: dict[str, list[KnowledgeQuestion]] = {s: [] for s in SPLITS}
    for category in sorted(by_category):
        items = list(by_category[category])
        rng.shuffle(items)
        n_train = round(len(items) * config.train_share)
        n_dev = max(1, round(len(items) * config.dev_share))
        parts["train"] += items[:n_train]
        parts["dev"] += items[n_train: n_train + n_dev]
        parts["test"] += items[n_train + n_dev:]
    return parts


def _record(q: KnowledgeQuestion, group: str) -> QARecord:
    return QARecord(id=q.id, question=q.question, answers=list(q.answers), type=q.category,
                    group=group)


def build_known_split(pool: Sequence[KnowledgeQuestion],
                      world: dict[str, Sequence[QARecord]], answer: Answerer,
                      config: KnownSplitConfig
                      ) -> tuple[dict[str, list[QARecord]], dict[str, Any]]:
    """The mixed splits and the report. ``answer`` is the zero-shot model, asked only about the
    train and dev parts."""
    config.validate()
    parts = split_pool(pool, config)
    correct: dict[str, list[bool]] = {}
    predictions: dict[str, list[str]] = {}
    for split in ("train", "dev"):
        questions = parts[split]
        predictions[split] = answer([q.question for q in questions])
        if len(predictions[split]) != len(questions):
            raise ValueError(f"the answerer returned {len(predictions[split])} predictions for "
                             f"{len(questions)} {split} questions")
        correct[split] = [answered(p, q.answers, config.correct_metric, config.scoring)
                          for q, p in zip(questions, predictions[split], strict=True)]
    totals: Counter[str] = Counter(q.category for q in parts["dev"])
    hits: Counter[str] = Counter(q.category for q, ok in zip(parts["dev"], correct["dev"],
                                                             strict=True) if ok)
    dev_accuracy = {c: hits[c] / totals[c] for c in sorted(totals)}
    chosen = sorted(c for c, acc in dev_accuracy.items() if acc >= config.min_category_accuracy)
    known = {split: [_record(q, "known") for q, ok in zip(parts[split], correct[split],
                                                           strict=True) if ok]
             for split in ("train", "dev")}
    known["test"] = [_record(q, "known") for q in parts["test"] if q.category in chosen]
    rng = random.Random(config.seed + 1)
    splits: dict[str, list[QARecord]] = {}
    for split in SPLITS:
        worlds = [QARecord.from_dict({**r.to_dict(), "group": "world"}) for r in
                  world.get(split, [])]
        mixed = known[split] + worlds
        rng.shuffle(mixed)
        splits[split] = mixed
    report = {
        "config": asdict(config),
        "pool": {s: len(parts[s]) for s in SPLITS},
        "zero_shot_accuracy": {s: sum(correct[s]) / max(1, len(correct[s]))
                               for s in ("train", "dev")},
        "dev_accuracy_by_category": dev_accuracy,
        "test_categories_chosen_on_dev": chosen,
        "counts": {s: {"known": len(known[s]), "world": len(splits[s]) - len(known[s])}
                   for s in SPLITS},
        "dev_predictions": [{"id": q.id, "prediction": p, "correct": ok}
                            for q, p, ok in zip(parts["dev"], predictions["dev"],
                                                correct["dev"], strict=True)],
    }
    return splits, report


def write_known_split(splits: dict[str, list[QARecord]], report: dict[str, Any],
                      out_dir: str | Path) -> Path:
    """``train/dev/test.jsonl`` and ``known_split.json``, the folder replaced as a whole."""
    out = Path(out_dir)
    with atomic_dir(out) as tmp:
        for split, records in splits.items():
            atomic_write_jsonl(tmp / f"{split}.jsonl", [r.to_dict() for r in records])
        atomic_write_json(tmp / "known_split.json", report)
    return out


def model_answerer(model_name_or_path: str, template: str, batch_size: int = 16,
                   max_new_tokens: int = 24, progress: bool = True) -> Answerer:
    """The zero-shot model closed book: greedy, the decision prompt with ``[Answer]`` forced
    (the decision agent's ``never`` policy), so the measurement uses the agent's own prompt."""
    from tqdm.auto import tqdm

    from mmoa.agents.decision_agent import DecisionAgentPipeline
    from mmoa.modeling import load_for_inference

    model, tokenizer = load_for_inference(model_name_or_path, template)
    pipeline = DecisionAgentPipeline(model, tokenizer, template, None, policy="never",
                                     max_new_tokens=max_new_tokens)

    def answer(questions: Sequence[str]) -> list[str]:
        out: list[str] = []
        for start in tqdm(range(0, len(questions), batch_size), desc="closed-book answers",
                          unit="batch", disable=not progress):
            out.extend(t.answer for t in pipeline.run(questions[start: start + batch_size]))
        return out

    return answer


def add_known_split_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model_name_or_path", required=True,
                        help="the zero-shot model to measure (e.g. models/smollm2-135m-instruct)")
    parser.add_argument("--template", default="llama3", help="its template (smollm2 for SmolLM2)")
    parser.add_argument("--world_dir", default="data/demo",
                        help="the demo world whose train/dev/test.jsonl join as group 'world'")
    parser.add_argument("--out", default="data/demo_decision", help="output folder")
    defaults = KnownSplitConfig()
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--correct_metric", default=defaults.correct_metric,
                        choices=CORRECT_METRICS,
                        help="what counts as answered: contains (the gold answer's words "
                             "appear in order; default) or em")
    parser.add_argument("--min_category_accuracy", type=float,
                        default=defaults.min_category_accuracy,
                        help="dev accuracy a category needs for its test questions to join the "
                             "test 'known' group (default 0.5)")
    parser.add_argument("--max_world", type=int,
                        help="use at most N world questions per split (default: all)")
    parser.add_argument("--batch_size", type=int, default=16)


def run_known_split(args: argparse.Namespace) -> int:
    """``mmoa-cli data known-split``."""
    from mmoa.data.loaders import load_qa

    config = KnownSplitConfig(seed=args.seed, correct_metric=args.correct_metric,
                              min_category_accuracy=args.min_category_accuracy)
    try:
        config.validate()
        world_dir = Path(args.world_dir)
        world = {s: load_qa(world_dir / f"{s}.jsonl", "demo")[: args.max_world]
                 for s in SPLITS}
        if not Path(args.model_name_or_path).is_dir():
            raise FileNotFoundError(f"{args.model_name_or_path}: no model folder")
    except (ValueError, FileNotFoundError) as err:
        print(f"mmoa-cli data known-split: error: {err} (nothing was written)", file=sys.stderr)
        return 2
    answer = model_answerer(args.model_name_or_path, args.template, args.batch_size)
    splits, report = build_known_split(general_knowledge_questions(), world, answer, config)
    report["model"] = str(args.model_name_or_path)
    out = write_known_split(splits, report, args.out)
    print(f"zero-shot accuracy closed book: train {report['zero_shot_accuracy']['train']:.2f}, "
          f"dev {report['zero_shot_accuracy']['dev']:.2f}")
    print("test categories chosen on dev: " + (", ".join(report["test_categories_chosen_on_dev"])
                                               or "none"))
    for split in SPLITS:
        counts = report["counts"][split]
        print(f"  {split}: {counts['known']} known + {counts['world']} world")
    print(f"wrote {out}/train.jsonl, dev.jsonl, test.jsonl and known_split.json")
    return 0
