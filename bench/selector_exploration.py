"""What a Selector's rollouts try: its sampled selections at each rollout temperature, and how
much they give a reward on its own choice to work with.

MAPPO's Selector learns only from the selections it samples. On the distractor set the warm
start keeps the top two candidates greedily, and in a 40-step MAPPO run the sampled Selector left
them at only 2 of 40 steps, so its selection reward (``mappo_selector_selection_reward``, the F1
of its selection against the gold candidates) had almost nothing better to pay for. Whether a
higher rollout temperature for the Selector alone (``mappo_agent_temperature=selector=T``) would
change that is a question about the model's sampling distribution, which this bench answers in
minutes instead of a training run: on the very candidates an evaluation retrieved, it samples
``--samples`` selections per question at each of ``--temperatures`` (the rollout's top-p and
grammar mask, as MAPPO samples them), beside the greedy selection, and reports per temperature:

* ``documents``: selected documents, mean over the samples, and ``inclusion_by_position``: how
  often each rank position is selected;
* ``greedy_share``: the share of samples that are the greedy selection;
* ``selection_f1``: the selection reward's F1 (:func:`mmoa.train.mappo.agent_stats.
  selection_gold_f1`, the reward's own definition), mean over samples; ``best_of_samples``: the
  mean over questions of the best sample's F1;
* ``zero_variance_questions``: the share of questions whose samples all score the same F1 (the
  selection reward's advantage is then zero for all of them, as for a GRPO group without
  variance), and ``within_question_sd``: the mean standard deviation of F1 over a question's
  samples;
* ``beats_greedy_questions``: the share of questions where at least one sample's F1 is above the
  greedy selection's: a better choice the rollouts reach, which the reward can pay for.

Each question's prompt is run once and its keys and values shared by the samples (as
``bench/selector_discrimination.py`` does for its scores), so a temperature costs the decoding
of a few tokens per sample, not a prompt each.

Reads the predictions (candidate ids and order), the corpus the server was built from and the
data file (gold supporting paragraphs)::

    python bench/selector_exploration.py --model <the warm start> --template smollm2 \\
        --predictions <its rag K = 5 evaluation>/predictions.jsonl \\
        --corpus data/hotpotqa_distractor/corpus.jsonl \\
        --data-file ../shared/data/hotpotqa_distractor_1k/hotpot_distractor_dev.json \\
        --temperatures 0.95 1.25 1.5 2.0 --samples 8 --precision fp32 --json-out <file>

Prints one JSON object and a table; ``--json-out`` writes the JSON too.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_runs import fail, publish  # noqa: E402
from selector_discrimination import (  # noqa: E402
    candidates_parser,
    check_candidates_args,
    question_inputs,
    read_candidates_inputs,
)

from mmoa import defaults  # noqa: E402
from mmoa.agents.pipeline import Trace, response_text, response_until_stop  # noqa: E402
from mmoa.agents.prompts import format_selection, selector_prompt  # noqa: E402
from mmoa.data.support import GoldSupport  # noqa: E402
from mmoa.train.mappo.agent_stats import selection_gold_f1  # noqa: E402

SCRIPT = "bench/selector_exploration.py"
#: The Selector temperatures tried by default: the rollout's own, then higher ones.
TEMPERATURES = (defaults.ROLLOUT_TEMPERATURE, 1.25, 1.5, 2.0)


# -- the figures ------------------------------------------------------------------------------

def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def spread(values: Sequence[float]) -> float:
    """Population standard deviation (a group's spread, as its advantages see it)."""
    centre = sum(values) / len(values)
    return math.sqrt(sum((v - centre) ** 2 for v in values) / len(values))


def summarise_temperature(questions: Sequence[dict[str, Any]], key: str) -> dict[str, Any]:
    """The figures of the module docstring for the samples under ``key`` of each question row
    (``{"selections": [[...], ...], "f1": [...]}``; a question's ``greedy_f1``, ``k`` and
    ``greedy`` beside them). ``f1`` entries are ``None`` where no gold candidate was among the
    question's candidates (no selection can score): such questions are left out of the F1
    figures, as the reward leaves them out."""
    selections = [s for q in questions for s in q[key]["selections"]]
    width = max(q["k"] for q in questions)
    scored = [q for q in questions if q["greedy_f1"] is not None]
    positions = [sum(i in s for s in selections) / len(selections) for i in range(width)]
    choices = Counter(format_selection(s) or "(none)" for s in selections)
    return {
        "samples": len(selections),
        "documents": round(sum(map(len, selections)) / len(selections), 4),
        "inclusion_by_position": [round(p, 4) for p in positions],
        "greedy_share": round(sum(s == q["greedy"] for q in questions for s in q[key]["selections"])
                              / len(selections), 4),
        "most_common": dict(choices.most_common(5)),
        "selection_f1": _round(mean([f for q in scored for f in q[key]["f1"]])),
        "best_of_samples": _round(mean([max(q[key]["f1"]) for q in scored])),
        "zero_variance_questions": _round(mean([float(spread(q[key]["f1"]) == 0.0)
                                                for q in scored])),
        "within_question_sd": _round(mean([spread(q[key]["f1"]) for q in scored])),
        "beats_greedy_questions": _round(mean([float(max(q[key]["f1"]) > q["greedy_f1"])
                                               for q in scored])),
    }


def selection_f1(record: Any, question: str, candidates: Sequence[Any],
                 selection: list[int]) -> float | None:
    """The selection reward's F1 of ``selection`` (candidate positions) against the gold
    candidates, by the reward's own definition (``None`` without a gold candidate)."""
    return selection_gold_f1(record, Trace(question=question, candidates=list(candidates),
                                           selected=selection))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


# -- sampling ---------------------------------------------------------------------------------

@torch.no_grad()
def prefill(model: Any, prompt_ids: Sequence[int]) -> Any:
    """The keys and values of all but the prompt's last token, for
    :func:`shared_prompt_generate` (which leaves this cache as it was)."""
    device = next(model.parameters()).device
    return model(input_ids=torch.tensor([list(prompt_ids)[:-1]], device=device),
                 use_cache=True).past_key_values


@torch.no_grad()
def shared_prompt_generate(model: Any, prompt_ids: Sequence[int], prefilled: Any, rows: int,
                           **generate_kwargs: Any) -> list[list[int]]:
    """``rows`` continuations of one prompt with ``model.generate``, the prompt's keys and
    values computed once (``prefilled``, from :func:`prefill`): the cache is copied and repeated
    per row, and ``generate`` runs the prompt's last token and the new ones. Returns each row's
    new tokens (up to and including a stop token, when one came)."""
    device = next(model.parameters()).device
    prompt = torch.tensor([list(prompt_ids)], device=device)
    cache = copy.deepcopy(prefilled)
    cache.batch_repeat_interleave(rows)
    output = model.generate(input_ids=prompt.repeat(rows, 1),
                            attention_mask=torch.ones(rows, prompt.shape[1], dtype=torch.long,
                                                      device=device),
                            past_key_values=cache, use_cache=True, **generate_kwargs)
    stops = generate_kwargs.get("eos_token_id") or []
    return [response_until_stop(row, stops) for row in output[:, prompt.shape[1]:].tolist()]


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import LogitsProcessorList

    from mmoa.agents.constrained import SelectorLogitsProcessor
    from mmoa.agents.parsers import parse_selection
    from mmoa.agents.render import PromptRenderer
    from mmoa.modeling import load_for_inference

    rows, records, corpus = read_candidates_inputs(args)
    model, tokenizer = load_for_inference(args.model, args.template, precision=args.precision,
                                          use_cpu=args.use_cpu)
    renderer = PromptRenderer(tokenizer, args.template)
    stop_ids = renderer.stop_token_ids
    torch.manual_seed(args.seed)

    def decode(prompt_ids: list[int], cache: Any, k: int, rows: int, **sampling: Any
               ) -> list[list[int]]:
        processor = SelectorLogitsProcessor(tokenizer, k, len(prompt_ids), stop_ids)
        responses = shared_prompt_generate(
            model, prompt_ids, cache, rows, max_new_tokens=args.max_new_tokens,
            eos_token_id=stop_ids, pad_token_id=tokenizer.pad_token_id,
            logits_processor=LogitsProcessorList([processor]), **sampling)
        return [parse_selection(response_text(tokenizer, r, stop_ids), k).ids for r in responses]

    per_question, skipped = [], Counter()
    started = time.perf_counter()
    for row in tqdm(rows, desc="questions", unit="q"):
        record = records.get(row["id"])
        support = GoldSupport.of(record) if record is not None else None
        if support is None:
            skipped["no gold supporting paragraphs"] += 1
            continue
        candidates, gold = question_inputs(row, corpus, support)
        k = len(candidates)
        if k < 1:
            skipped["no candidates"] += 1
            continue
        prompt_ids = renderer.prompt_ids(selector_prompt(row["question"],
                                                         [c.text for c in candidates]))

        cache = prefill(model, prompt_ids)
        greedy = decode(prompt_ids, cache, k, 1, do_sample=False, temperature=None, top_p=None,
                        top_k=None)[0]
        entry: dict[str, Any] = {"id": row["id"], "k": k, "gold": gold, "greedy": greedy,
                                 "greedy_f1": selection_f1(record, row["question"],
                                                           candidates, greedy)}
        for temperature in args.temperatures:
            sampled = decode(prompt_ids, cache, k, args.samples, do_sample=True,
                             temperature=temperature, top_p=args.top_p, top_k=0)
            entry[f"T={temperature:g}"] = {
                "selections": sampled,
                "f1": None if entry["greedy_f1"] is None else
                [selection_f1(record, row["question"], candidates, s) for s in sampled]}
        per_question.append(entry)
    seconds = time.perf_counter() - started
    if not per_question:
        fail(f"no question could be measured ({dict(skipped)})")
    return summarise(per_question, skipped, seconds, args)


def summarise(per_question: list[dict[str, Any]], skipped: Counter, seconds: float,
              args: argparse.Namespace) -> dict[str, Any]:
    scored = [q for q in per_question if q["greedy_f1"] is not None]
    greedy_choices = Counter(format_selection(q["greedy"]) or "(none)" for q in per_question)
    return {
        "bench": SCRIPT,
        "model": str(args.model), "predictions": str(args.predictions),
        "data_file": str(args.data_file), "precision": args.precision,
        "top_p": args.top_p, "samples_per_question": args.samples, "seed": args.seed,
        "questions": len(per_question), "questions_with_gold_candidates": len(scored),
        "skipped": dict(skipped),
        "greedy": {"documents": round(sum(len(q["greedy"]) for q in per_question)
                                      / len(per_question), 4),
                   "most_common": dict(greedy_choices.most_common(5)),
                   "selection_f1": _round(mean([q["greedy_f1"] for q in scored]))},
        "temperatures": {f"{t:g}": summarise_temperature(per_question, f"T={t:g}")
                         for t in args.temperatures},
        "seconds": round(seconds, 1),
        "per_question": per_question,
    }


def table(result: dict[str, Any]) -> str:
    def show(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}"

    greedy = result["greedy"]
    lines = [f"questions {result['questions']} ({result['questions_with_gold_candidates']} with a "
             f"gold candidate), {result['samples_per_question']} samples each, top-p "
             f"{result['top_p']}, {result['seconds']} s",
             f"greedy: {greedy['documents']} documents, selection F1 {show(greedy['selection_f1'])}"
             f", most common {next(iter(greedy['most_common']))}",
             "T      documents  greedy share  selection F1  best of samples  zero-variance  "
             "beats greedy  inclusion by position"]
    for t, s in result["temperatures"].items():
        lines.append(f"{t:<6} {s['documents']:>9.2f}  {s['greedy_share']:>12.2f}  "
                     f"{show(s['selection_f1']):>12}  {show(s['best_of_samples']):>15}  "
                     f"{show(s['zero_variance_questions']):>13}  "
                     f"{show(s['beats_greedy_questions']):>12}  "
                     + " / ".join(f"{p:.2f}" for p in s["inclusion_by_position"]))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = candidates_parser(__doc__.split("\n\n")[0], "the Selector's model folder")
    parser.add_argument("--temperatures", type=float, nargs="+", default=list(TEMPERATURES),
                        help="Selector rollout temperatures to sample at")
    parser.add_argument("--samples", type=int, default=8, help="selections sampled per "
                        "question and temperature (default 8)")
    parser.add_argument("--top-p", dest="top_p", type=float, default=defaults.ROLLOUT_TOP_P,
                        help=f"the rollout's top-p (default {defaults.ROLLOUT_TOP_P})")
    parser.add_argument("--max-new-tokens", dest="max_new_tokens", type=int,
                        default=defaults.MAX_NEW_TOKENS["selector"])
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    check_candidates_args(args)
    from mmoa.config_values import check_temperature, check_top_p

    try:
        for t in args.temperatures:
            check_temperature("--temperatures", t)
        check_top_p("--top-p", args.top_p)
    except ValueError as err:
        fail(str(err))
    if args.samples < 2:
        fail("--samples must be at least 2 (a spread needs two samples)")
    if args.max_new_tokens < 1:
        fail("--max-new-tokens must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    publish(measure(args), args.json_out, SCRIPT, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
