"""Can a pre-trained tiny model copy and read? Two probes on the evaluation world's text.

The warm start and MAPPO can only improve answers that depend on the documents if the base model
already copies from its context. This bench measures that before any SFT, for one or more base
models side by side (the first is the baseline of the table):

* **copy**: a list of 8 evaluation-world titles, then the same list again (the pre-training copy
  drill's format); the share of the repeated tokens the model predicts (teacher-forced argmax);
* **reading**: each dev one-hop question shown its supporting passage and one random passage of
  the evaluation world, answered with greedy decoding (exact-match share), in two forms: as a
  pre-training reading drill (plain text ending in ``Answer:``) and as the Generator's chat prompt
  (:func:`mmoa.agents.prompts.generator_prompt` through the chat template), which is what the
  pipeline asks of a warm-started model; and, between the two, the Generator's user message as
  plain text followed by ``Answer:`` (same documents and question, no chat turn). A base model is
  not expected to answer in the chat form.

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


def _greedy_answer(model, prompt_ids: list[int], stop_ids: list[int], tokenizer) -> str:
    """Greedy decoding of at most 16 tokens, cut to its first line and parsed as the Generator's
    answer (``**answer**`` or plain)."""
    import torch

    from mmoa.agents.parsers import parse_answer

    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                             do_sample=False, eos_token_id=stop_ids,
                             pad_token_id=tokenizer.eos_token_id)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True).strip()
    return parse_answer(text.split("\n")[0]).answer


def reading_probe(model, tokenizer, questions: list[dict], corpus: dict[str, dict],
                  seed: int, template: str) -> dict:
    """Exact-match shares of greedy answers to one-hop questions, each shown its supporting
    passage and one random passage, in two forms: as a pre-training reading drill (plain text
    ending in ``Answer:``) and as the Generator's chat prompt (what the pipeline asks)."""
    from mmoa.agents.candidates import doc_text
    from mmoa.agents.prompts import generator_prompt
    from mmoa.agents.render import PromptRenderer
    from mmoa.data.pretrain_text import reading_drill

    renderer = PromptRenderer(tokenizer, template)
    # Pre-training ends every record with a special token (which one depends on the template's
    # fix of the tokenizer): a drill's answer ends at any special token.
    record_end = sorted({i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
                        | set(tokenizer.all_special_ids))
    rng = random.Random(seed)
    ids = sorted(corpus)
    correct = {"drill": 0, "generator": 0, "generator_text": 0}
    examples = []
    for question in questions:
        passages = [corpus[question["supporting_ids"][0]], corpus[rng.choice(ids)]]
        rng.shuffle(passages)
        text = reading_drill(question, passages)
        drill_prompt = text[: text.rindex("\nAnswer: ") + len("\nAnswer:")]
        chat_prompt = generator_prompt(question["question"], [doc_text(p) for p in passages])
        answers = {
            "drill": _greedy_answer(model, tokenizer(drill_prompt).input_ids,
                                    record_end, tokenizer),
            "generator": _greedy_answer(model, renderer.prompt_ids(chat_prompt),
                                        renderer.stop_token_ids, tokenizer),
            # The Generator's user message as plain text, answered after "Answer:": the same
            # documents and question outside the chat turn.
            "generator_text": _greedy_answer(model, tokenizer(chat_prompt.user + "\nAnswer:")
                                             .input_ids, record_end, tokenizer),
        }
        for form, answer in answers.items():
            correct[form] += any(answer.lower() == g.lower() for g in question["answers"])
        if len(examples) < 5:
            examples.append({"question": question["question"], "gold": question["answers"][0],
                             **answers})
    n = max(len(questions), 1)
    return {"reading_em": correct["drill"] / n, "generator_reading_em": correct["generator"] / n,
            "generator_text_reading_em": correct["generator_text"] / n,
            "reading_questions": len(questions), "reading_examples": examples}


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
        reading = reading_probe(model, tokenizer, questions, corpus, args.seed, args.template)
        result["models"][path] = {"copy": copy, **reading,
                                  "seconds": time.perf_counter() - started}
    return result


COLUMNS = (("copy", "copy %"), ("reading_em", "drill EM %"),
           ("generator_text_reading_em", "G text EM %"), ("generator_reading_em", "G chat EM %"))


def print_table(result: dict) -> None:
    rows = list(result["models"].items())
    first = rows[0][1]
    print(f"{'model':<40}" + "".join(f" {title:>15}" for _, title in COLUMNS))
    for path, m in rows:
        cells = [f"{100 * m[key]:.1f} ({100 * (m[key] - first[key]):+.1f})" for key, _ in COLUMNS]
        print(f"{path[-40:]:<40}" + "".join(f" {cell:>15}" for cell in cells))
    print("(in brackets: the difference to the first model; G text: the Generator's user message "
          "as plain text + 'Answer:'; G chat: the Generator's chat prompt)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", help="base model folders (the first is the baseline)")
    parser.add_argument("--corpus", default="data/demo/corpus.jsonl")
    parser.add_argument("--questions", default="data/demo/dev.jsonl")
    parser.add_argument("--copy-lists", type=int, default=60, help="copy-probe lists")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--template", default="llama3",
                        help="LLaMA-Factory chat template of the Generator prompt")
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
