"""Does the Selector read its candidates, or only their positions?

On real text the Selector settles on one selection whatever the question (the top two
candidates, later the top one), and its precision and recall of the gold paragraphs then sit on
the line between those constants. A credit change can only turn that into a per-question choice
if the model's preferences depend on the documents at all. This bench measures that, from the
model alone, on the very candidates an evaluation showed it:

for each question of the evaluation's ``predictions.jsonl``, every selection the Selector could
write in canonical form (each subset of its K candidates in ascending order, ``Document0,
Document3``, the empty one included: 2^K texts) is scored by teacher forcing, the response
tokens and the end of turn under the Selector's prompt, and the scores are normalised over those
2^K selections into a distribution ``q``. (The grammar-constrained decoder also allows other
orders; their mass is left out, so ``q`` is the model's preference among the canonical
selections.) From ``q``:

* the **inclusion probability** of candidate i, ``m_i = sum of q(S) over the S holding i``;
* the **content AUC**: at each rank position r, the probability that a gold candidate there has
  a higher ``m_r`` than a non-gold candidate there (ties count half), pooled over the positions
  with each position weighted by its pairs. Within one position the rank prior is the same for
  both, so 0.5 means the model's choice at a position does not depend on whether the document
  there is gold: it reads positions, not contents. The **pooled AUC** (all candidates together)
  mixes the position with the content and is shown beside it;
* the **label**: the gold candidates in ascending order (the SFT label of ``--label_source
  supporting``): its probability under ``q`` and its rank among the 2^K selections;
* the **argmax** selection per question: how often each is chosen, its precision and recall of
  the gold candidates beside the top candidate's alone (``rag`` K = 1 as a Selector), and its
  agreement with the evaluation's greedy selection;
* the **marginal rule** at each of ``--thresholds``: keep the candidates whose inclusion
  probability reaches the threshold, the same figures. Where the content AUC is above 0.5 but
  the argmax is a constant, this rule shows whether the beliefs the greedy text hides would
  make a per-question choice, with no training.

The baseline is in the figures themselves: any choice made from positions alone has a content
AUC of 0.5, whatever the positions it prefers. Beside it, a reference that reads the documents
with no model at all, to show how much a trivial reading of them separates gold from the rest:
each candidate's **title overlap**, the share of its title's content words (stop words and
punctuation dropped, as the SFT builder's heuristic labels drop them) that the question holds,
with its content AUC and the **title rule**: keep the candidates whose whole title is in the
question, else the top candidate.

Reads the predictions (candidate ids and order), the corpus the server was built from (their
texts: ``id``, ``title``, ``text`` or ``contents``) and the data file (gold supporting
paragraphs)::

    python bench/selector_discrimination.py --model saves/d70/work/sft-train-<key>/sft \\
        --template smollm2 --predictions <eval dir>/predictions.jsonl \\
        --corpus data/hotpotqa_distractor/corpus.jsonl \\
        --data-file ../shared/data/hotpotqa_distractor_1k/hotpot_distractor_dev.json \\
        --json-out saves/d70/selector_discrimination_sft.json

Prints one JSON object and a table; ``--json-out`` writes the JSON too.
"""

from __future__ import annotations

import argparse
import copy
import itertools
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

from mmoa.agents.candidates import Candidate  # noqa: E402
from mmoa.agents.prompts import format_selection, selector_prompt  # noqa: E402
from mmoa.data.sft_builder import STOP_WORDS  # noqa: E402
from mmoa.data.support import GoldSupport  # noqa: E402
from mmoa.fileio import read_jsonl  # noqa: E402

SCRIPT = "bench/selector_discrimination.py"
#: 2^K selections are scored per question: beyond this K the count (and the batch) explodes.
MAX_K = 8
#: Selections scored in one batch over the prompt's cached keys and values.
CHUNK = 32
#: Inclusion-probability thresholds of the marginal rule (:func:`marginal_selection`).
THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7)


# -- the formulas -----------------------------------------------------------------------------

def canonical_selections(k: int) -> list[tuple[int, ...]]:
    """Every subset of ``range(k)`` in ascending order, the empty one first, by size then
    lexicographically: the texts a Selector writes in canonical form."""
    return [s for size in range(k + 1) for s in itertools.combinations(range(k), size)]


def normalise(logprobs: Sequence[float]) -> list[float]:
    """``softmax(logprobs)``: the distribution the scores give over the scored selections."""
    top = max(logprobs)
    weights = [math.exp(x - top) for x in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def inclusion(selections: Sequence[tuple[int, ...]], q: Sequence[float], k: int) -> list[float]:
    """``m_i``: the probability under ``q`` that candidate i is selected."""
    m = [0.0] * k
    for selection, p in zip(selections, q, strict=True):
        for i in selection:
            m[i] += p
    return m


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """The probability that a positive scores above a negative, ties counting half (the
    Mann-Whitney U over ``len(positives) * len(negatives)``); ``None`` without both kinds."""
    if not positives or not negatives:
        return None
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


def stratified_auc(scores: Sequence[Sequence[float]], gold: Sequence[Sequence[bool]]
                   ) -> tuple[float | None, list[dict[str, Any]]]:
    """The AUC of gold against non-gold candidates within each position (column) of ``scores``
    (one row per question), and their mean weighted by each position's pairs: positions where
    every candidate is gold, or none is, carry no pair and no weight."""
    width = max((len(row) for row in scores), default=0)
    per_position, weighted, pairs_total = [], 0.0, 0
    for r in range(width):
        pos = [row[r] for row, g in zip(scores, gold, strict=True) if len(row) > r and g[r]]
        neg = [row[r] for row, g in zip(scores, gold, strict=True) if len(row) > r and not g[r]]
        value, pairs = auc(pos, neg), len(pos) * len(neg)
        per_position.append({"position": r, "gold": len(pos), "other": len(neg),
                             "auc": None if value is None else round(value, 4)})
        if value is not None:
            weighted += value * pairs
            pairs_total += pairs
    return (weighted / pairs_total if pairs_total else None), per_position


def precision_recall(selection: Sequence[int], gold: Sequence[bool]
                     ) -> tuple[float | None, float | None]:
    """Gold precision (``None`` for an empty selection) and recall (``None`` without gold
    candidates) of ``selection`` over candidates flagged ``gold``."""
    hits = sum(gold[i] for i in selection)
    total = sum(gold)
    return (hits / len(selection) if selection else None), (hits / total if total else None)


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` without punctuation, stop words and one-letter words."""
    words = "".join(ch if ch.isalnum() else " " for ch in text.lower()).split()
    return {w for w in words if len(w) > 1 and w not in STOP_WORDS}


def title_overlap(question: str, title: str) -> float:
    """The share of the title's content words found in the question (0 for a title without
    any): 1.0 when the question names the document's title."""
    title_words = content_words(title)
    if not title_words:
        return 0.0
    return len(title_words & content_words(question)) / len(title_words)


def title_rule_selection(overlaps: Sequence[float]) -> list[int]:
    """The title rule: the candidates whose whole title is in the question, else the top one."""
    return [i for i, x in enumerate(overlaps) if x >= 1.0] or [0]


def candidate_title(candidate: Candidate) -> str:
    """The document's ``title``, else the first line of its text (a plain-string document)."""
    doc = candidate.doc
    if isinstance(doc, dict) and isinstance(doc.get("title"), str) and doc["title"]:
        return doc["title"]
    return candidate.text.split("\n", 1)[0]


# -- the model --------------------------------------------------------------------------------

@torch.no_grad()
def response_logprobs(model: Any, prompt_ids: Sequence[int],
                      responses: Sequence[Sequence[int]], chunk: int = CHUNK) -> list[float]:
    """``log p(response | prompt)`` for each response: the prompt is run once and its cache
    shared (copied per chunk of responses, which are right-padded: a pad after a response's
    last token cannot change the logits of its earlier tokens under the causal mask)."""
    device = next(model.parameters()).device
    prefill = model(input_ids=torch.tensor([list(prompt_ids)], device=device), use_cache=True)
    first = torch.log_softmax(prefill.logits[0, -1].float(), dim=-1)
    out: list[float] = []
    for start in range(0, len(responses), chunk):
        part = responses[start:start + chunk]
        if any(not r for r in part):
            raise ValueError("every response needs at least one token (its end of turn)")
        width = max(len(r) for r in part)
        cache = copy.deepcopy(prefill.past_key_values)
        cache.batch_repeat_interleave(len(part))
        tokens = torch.tensor([list(r) + [r[-1]] * (width - len(r)) for r in part], device=device)
        logits = model(input_ids=tokens, past_key_values=cache, use_cache=False).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        for row, response in enumerate(part):
            total = float(first[response[0]])
            for t in range(1, len(response)):
                total += float(logp[row, t - 1, response[t]])
            out.append(total)
    return out


# -- the bench --------------------------------------------------------------------------------

def question_inputs(row: dict[str, Any], corpus: dict[str, dict[str, Any]],
                    support: GoldSupport) -> tuple[list[Candidate], list[bool]]:
    """The candidates the Selector saw for ``row`` (texts from the corpus, in the evaluation's
    order) and which of them are gold."""
    candidates = []
    for c in row["candidates"]:
        if c.get("id") not in corpus:
            fail(f"candidate id {c.get('id')!r} of question {row['id']!r} is not in the corpus: "
                 "give the corpus the server was built from")
        candidates.append(Candidate(corpus[c["id"]], int(c.get("subquestion", 0)),
                                    int(c.get("rank", 0))))
    return candidates, [support.matches(c) for c in candidates]


def read_candidates_inputs(args: argparse.Namespace
                           ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """The inputs of :func:`candidates_parser`'s options: the evaluation's prediction rows (the
    first ``--max-questions``), the data file's records by id and the corpus by passage id."""
    from mmoa.data.loaders import load_qa

    rows = read_jsonl(args.predictions)
    if args.max_questions:
        rows = rows[:args.max_questions]
    records = {r.id: r for r in load_qa(args.data_file)}
    corpus = {str(d["id"]): d for d in read_jsonl(args.corpus)}
    return rows, records, corpus


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from mmoa.agents.render import PromptRenderer
    from mmoa.modeling import load_for_inference

    rows, records, corpus = read_candidates_inputs(args)
    model, tokenizer = load_for_inference(args.model, args.template, precision=args.precision,
                                          use_cpu=args.use_cpu)
    renderer = PromptRenderer(tokenizer, args.template)

    per_question, skipped = [], Counter()
    started = time.perf_counter()
    for row in tqdm(rows, desc="questions", unit="q"):
        record = records.get(row["id"])
        support = GoldSupport.of(record) if record is not None else None
        if support is None:
            skipped["no gold supporting paragraphs"] += 1
            continue
        k = len(row["candidates"])
        if not 1 <= k <= MAX_K:
            skipped[f"{k} candidates (1 to {MAX_K} scored)"] += 1
            continue
        candidates, gold = question_inputs(row, corpus, support)
        prompt = selector_prompt(row["question"], [c.text for c in candidates])
        selections = canonical_selections(k)
        encoded = [renderer.sft_ids(prompt, format_selection(s)) for s in selections]
        prompt_ids = encoded[0][0]
        if any(p != prompt_ids for p, _ in encoded):
            fail("the template encodes the Selector's prompt differently per response")
        q = normalise(response_logprobs(model, prompt_ids, [r for _, r in encoded]))
        best = max(range(len(q)), key=q.__getitem__)
        label = tuple(i for i in range(k) if gold[i])
        label_p = q[selections.index(label)]
        per_question.append({
            "id": row["id"], "k": k, "gold": gold,
            "inclusion": [round(v, 6) for v in inclusion(selections, q, k)],
            "argmax": list(selections[best]), "argmax_p": q[best],
            "label": list(label), "label_p": label_p,
            "label_rank": 1 + sum(p > label_p for p in q),
            "greedy": row.get("selected_ids"),
            "title_overlap": [round(title_overlap(row["question"], candidate_title(c)), 4)
                              for c in candidates],
        })
    seconds = time.perf_counter() - started
    if not per_question:
        fail(f"no question could be scored ({dict(skipped)})")
    return summarise(per_question, skipped, seconds, args)


def selection_summary(selections: Sequence[Sequence[int]], gold: Sequence[Sequence[bool]]
                      ) -> dict[str, Any]:
    """One decision rule's selections over the questions: documents kept, gold precision (mean
    over non-empty selections) and recall (mean over questions with a gold candidate), its
    choices from the most common, and the most common choice's share (1.0: a constant)."""
    pairs = [precision_recall(s, g) for s, g in zip(selections, gold, strict=True)]
    precisions = [p for p, _ in pairs if p is not None]
    recalls = [r for _, r in pairs if r is not None]
    choices = Counter(format_selection(s) or "(none)" for s in selections)
    return {
        "documents": round(sum(map(len, selections)) / len(selections), 3),
        "precision": round(sum(precisions) / len(precisions), 4) if precisions else None,
        "recall": round(sum(recalls) / len(recalls), 4) if recalls else None,
        "most_common_share": round(choices.most_common(1)[0][1] / len(selections), 4),
        "choices": dict(choices.most_common()),
    }


def marginal_selection(inclusion_probabilities: Sequence[float], threshold: float) -> list[int]:
    """The marginal rule: keep every candidate whose inclusion probability reaches
    ``threshold``. At 0.5 it is the keep/drop decision per candidate that the model thinks
    more likely right, which the greedy sequence is not: greedy follows the most probable
    *text*, so a second document included with probability 0.45 in one question and 0.05 in
    another is dropped from both, and a per-question difference in the model's beliefs never
    reaches the selection."""
    return [i for i, m in enumerate(inclusion_probabilities) if m >= threshold]


def summarise(per_question: list[dict[str, Any]], skipped: Counter, seconds: float,
              args: argparse.Namespace) -> dict[str, Any]:
    """The figures of the module docstring, from the per-question rows of :func:`measure`."""
    n = len(per_question)
    scores = [row["inclusion"] for row in per_question]
    gold = [row["gold"] for row in per_question]
    content_auc, per_position = stratified_auc(scores, gold)
    flat = [(m, x) for row, g in zip(scores, gold, strict=True)
            for m, x in zip(row, g, strict=True)]
    pooled = auc([m for m, x in flat if x], [m for m, x in flat if not x])
    greedy = [row for row in per_question if row["greedy"] is not None]
    return {
        "bench": SCRIPT,
        "model": str(args.model), "predictions": str(args.predictions),
        "data_file": str(args.data_file), "precision": args.precision,
        "questions": n, "skipped": dict(skipped),
        "gold_candidates_mean": round(sum(map(sum, gold)) / n, 3),
        "content_auc": None if content_auc is None else round(content_auc, 4),
        "content_auc_by_position": per_position,
        "pooled_auc": None if pooled is None else round(pooled, 4),
        "inclusion_mean_by_position": [
            round(sum(row[r] for row in scores if len(row) > r)
                  / max(1, sum(len(row) > r for row in scores)), 4)
            for r in range(max(len(row) for row in scores))],
        "label_p_mean": round(sum(row["label_p"] for row in per_question) / n, 4),
        "label_rank_mean": round(sum(row["label_rank"] for row in per_question) / n, 2),
        "label_is_argmax": round(sum(row["label_rank"] == 1 for row in per_question) / n, 4),
        "argmax": selection_summary([row["argmax"] for row in per_question], gold),
        "argmax_agrees_with_greedy": (round(sum(row["argmax"] == row["greedy"] for row in greedy)
                                      / len(greedy), 4) if greedy else None),
        "top1": selection_summary([[0]] * n, gold),
        "marginal": {f"{t:g}": selection_summary([marginal_selection(m, t) for m in scores],
                                                 gold)
                     for t in args.thresholds},
        "title_reference": title_reference([row["title_overlap"] for row in per_question], gold),
        "seconds": round(seconds, 1),
        "per_question": per_question,
    }


def title_reference(overlaps: Sequence[Sequence[float]], gold: Sequence[Sequence[bool]]
                    ) -> dict[str, Any]:
    """The no-model reference: the title overlap's content AUC (within position, as the
    model's) and the title rule's selections."""
    content_auc, per_position = stratified_auc(overlaps, gold)
    return {
        "content_auc": None if content_auc is None else round(content_auc, 4),
        "content_auc_by_position": per_position,
        "rule": selection_summary([title_rule_selection(x) for x in overlaps], gold),
    }


def table(result: dict[str, Any]) -> str:
    def show(value: Any) -> str:
        return "-" if value is None else f"{value}"

    lines = [
        f"questions {result['questions']}, gold candidates {result['gold_candidates_mean']} a "
        f"question, {result['seconds']} s",
        f"content AUC (within position) {show(result['content_auc'])}   pooled AUC "
        f"{show(result['pooled_auc'])}",
        "position  gold/other  AUC     mean inclusion",
    ]
    for entry, mean in zip(result["content_auc_by_position"],
                           result["inclusion_mean_by_position"], strict=True):
        lines.append(f"{entry['position']:>8}  {entry['gold']:>4}/{entry['other']:<5}  "
                     f"{show(entry['auc']):<6}  {mean}")
    lines += [
        f"label: mean probability {result['label_p_mean']}, mean rank {result['label_rank_mean']}"
        f", the argmax for {result['label_is_argmax']:.0%}; argmax = greedy for "
        f"{show(result['argmax_agrees_with_greedy'])}",
        "rule            documents  precision  recall  most common (share)",
    ]
    rules = [("argmax", result["argmax"]), ("top candidate", result["top1"])]
    rules += [(f"marginal >= {t}", summary) for t, summary in result["marginal"].items()]
    reference = result["title_reference"]
    rules.append(("title rule", reference["rule"]))
    for name, summary in rules:
        common = next(iter(summary["choices"]))
        lines.append(f"{name:<16}{summary['documents']:>9}  {show(summary['precision']):>9}  "
                     f"{show(summary['recall']):>6}  {common} ({summary['most_common_share']})")
    lines.append(f"no model, title overlap with the question: content AUC "
                 f"{show(reference['content_auc'])} (title rule above: the candidates whose "
                 "title is in the question, else the top one)")
    return "\n".join(lines)


def candidates_parser(description: str, model_help: str) -> argparse.ArgumentParser:
    """The options of a bench over an evaluation's candidates (this one and
    ``selection_ceiling.py``): the model, the predictions, the corpus and the data file they
    came from, how many questions, the precision and where the JSON goes."""
    from mmoa.precision import PRECISION_CHOICES

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True, help=model_help)
    parser.add_argument("--template", default="smollm2")
    parser.add_argument("--predictions", required=True,
                        help="an evaluation's predictions.jsonl (qr_s_g or rag: its candidates)")
    parser.add_argument("--corpus", required=True, help="the corpus.jsonl the server serves")
    parser.add_argument("--data-file", dest="data_file", required=True,
                        help="the evaluated data file (answers, gold supporting paragraphs)")
    parser.add_argument("--max-questions", dest="max_questions", type=int, default=None)
    parser.add_argument("--precision", choices=PRECISION_CHOICES, default="auto")
    parser.add_argument("--use-cpu", dest="use_cpu", action="store_true")
    parser.add_argument("--json-out", dest="json_out", default=None)
    return parser


def check_candidates_args(args: argparse.Namespace) -> None:
    """One-line errors for the inputs of :func:`candidates_parser` that are not there."""
    for name in ("predictions", "corpus", "data_file"):
        if not Path(getattr(args, name)).is_file():
            fail(f"--{name.replace('_', '-')} {getattr(args, name)}: no such file")
    if args.max_questions is not None and args.max_questions < 1:
        fail("--max-questions must be at least 1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = candidates_parser(__doc__.split("\n\n")[0], "the Selector's model folder")
    parser.add_argument("--thresholds", type=float, nargs="+", default=list(THRESHOLDS),
                        help="inclusion-probability thresholds of the marginal rule")
    args = parser.parse_args(argv)
    check_candidates_args(args)
    if any(not 0.0 < t <= 1.0 for t in args.thresholds):
        fail("--thresholds must lie in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    publish(measure(args), args.json_out, SCRIPT, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
