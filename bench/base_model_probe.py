"""Can a pre-trained tiny model copy and read? Two probes on the evaluation world's text.

The warm start and MAPPO can only improve answers that depend on the documents if the base model
already copies from its context. This bench measures that before any SFT, for one or more base
models side by side (the first is the baseline of the table):

* **copy**: a list of 8 evaluation-world titles, then the same list again (the pre-training copy
  drill's format); the share of the repeated tokens the model predicts (teacher-forced argmax);
* **reading**: each dev one-hop question as a pre-training reading drill (its supporting passage
  and one random passage of the evaluation world, then the question and its sub-question,
  ``Answer:``); the share answered exactly with greedy decoding.

The evaluation world never appears in the pre-training text (its titles are excluded), so both
probes measure copying and reading, not memory. Usage::

    python bench/base_model_probe.py saves/tiny-llama3/pt [other base models ...]

Prints one JSON object and a table; --json-out writes the JSON too.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def copy_probe(model, tokenizer, titles: list[str], n_lists: int, seed: int) -> float:
    """Share of the repeated list's tokens predicted from what precedes them."""
    import torch

    from mmoa.data.pretrain_text import copy_drill

    rng = random.Random(seed)
    hit = total = 0
    for _ in range(n_lists):
        first, second = copy_drill(rng.sample(titles, 8)).split("\nThe same names again:")
        prefix = tokenizer(first + "\nThe same names again:", add_special_tokens=False).input_ids
        repeat = tokenizer(second, add_special_tokens=False).input_ids
        ids = [tokenizer.bos_token_id, *prefix, *repeat]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0]
        start = 1 + len(prefix)
        predicted = logits[start - 1: len(ids) - 1].argmax(-1).tolist()
        hit += sum(p == g for p, g in zip(predicted, ids[start:], strict=True))
        total += len(ids) - start
    return hit / total


def reading_probe(model, tokenizer, questions: list[dict], corpus: dict[str, dict],
                  seed: int) -> tuple[float, list[dict]]:
    """Exact-match share of greedy answers to one-hop questions written as reading drills."""
    import torch

    from mmoa.data.pretrain_text import reading_drill

    rng = random.Random(seed)
    ids = sorted(corpus)
    correct = 0
    examples = []
    for question in questions:
        passages = [corpus[question["supporting_ids"][0]], corpus[rng.choice(ids)]]
        rng.shuffle(passages)
        text = reading_drill(question, passages)
        prompt = text[: text.rindex("\nAnswer: ") + len("\nAnswer:")]
        encoded = tokenizer(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**encoded, max_new_tokens=12, do_sample=False,
                                 pad_token_id=tokenizer.eos_token_id)
        answer = tokenizer.decode(out[0, encoded.input_ids.shape[1]:],
                                  skip_special_tokens=True).split("\n")[0].strip()
        right = any(answer.lower() == gold.lower() for gold in question["answers"])
        correct += right
        if len(examples) < 5:
            examples.append({"question": question["question"], "answer": answer,
                             "gold": question["answers"][0]})
    return correct / max(len(questions), 1), examples


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mmoa.fileio import iter_jsonl

    corpus = {row["id"]: row for _, row in iter_jsonl(args.corpus)}
    titles = sorted({row["title"] for row in corpus.values()})
    questions = [row for _, row in iter_jsonl(args.questions)
                 if row.get("type") == "one_hop" and row.get("supporting_ids")]
    result: dict = {"models": {}, "config": vars(args).copy()}
    for path in args.models:
        started = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        copy = copy_probe(model, tokenizer, titles, args.copy_lists, args.seed)
        reading, examples = reading_probe(model, tokenizer, questions, corpus, args.seed)
        result["models"][path] = {"copy": copy, "reading_em": reading,
                                  "reading_questions": len(questions),
                                  "reading_examples": examples,
                                  "seconds": time.perf_counter() - started}
    return result


def print_table(result: dict) -> None:
    rows = list(result["models"].items())
    base_copy, base_read = rows[0][1]["copy"], rows[0][1]["reading_em"]
    print(f"{'model':<48} {'copy %':>8} {'reading EM %':>13} {'vs first':>16}")
    for path, m in rows:
        delta = f"{100 * (m['copy'] - base_copy):+.1f} / {100 * (m['reading_em'] - base_read):+.1f}"
        print(f"{path[-48:]:<48} {100 * m['copy']:>8.1f} {100 * m['reading_em']:>13.1f} "
              f"{delta:>16}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", help="base model folders (the first is the baseline)")
    parser.add_argument("--corpus", default="data/demo/corpus.jsonl")
    parser.add_argument("--questions", default="data/demo/dev.jsonl")
    parser.add_argument("--copy-lists", type=int, default=60, help="copy-probe lists")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2))
    print_table(result)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
