"""Could a fixed, learnable rewriting rule raise the Query Rewriter's candidate recall?

The Query Rewriter copies the question on real text, and its synthesised labels (sampled
rewrites kept where they beat the question: ``mmoa-cli data qr-rewrites``) improve only a small
share of the training questions, each in its own way. A 135 M model learns a pattern it sees on
most records far more easily than a per-question judgement. The most learnable rewrites are
extractive: the question's own spans (the entities it names, quoted titles) as extra
sub-questions, which a model only has to copy. This bench asks whether such a rule would pay
before anyone trains for it, with the live retriever and no model:

for each question, its **spans** are the quoted strings and the runs of capitalised words (a
leading question word left out; ``of``, ``the``, ``and`` and a few other short words joined
inside a run, as in "Hook and Ladder"), the first ``--max-spans`` of them. Each **rule** turns a
question into sub-questions, which are retrieved and merged into the K candidates exactly as the
pipeline merges them, and scored by the recall of the record's gold supporting passages among
them:

* ``question``: the question alone (what the copying QR retrieves: the bar);
* ``question+spans``: the question, then each span;
* ``question+first span`` and ``question+two spans``: the question, then the first one or two;
* ``spans``: the spans alone (the question where it has none).

A rule is applied to every question the same way, so its gain is what a QR that learnt it would
bring. Beside the rules, the **best of them per question** (an oracle: it reads the gold
passages) bounds what a per-question choice among these rewrites could reach, and the share of
questions it improves is comparable with the synthesised labels' share.

Needs the retrieval server over the corpus of the data file::

    python bench/qr_span_rewrites.py \\
        --data-file ../shared/data/hotpotqa_distractor_1k/hotpot_distractor_train.json \\
        --retriever-url http://127.0.0.1:8010 --k 5 \\
        --json-out bench/results/qr_span_rewrites_distractor_train.json

Prints one JSON object and a table; ``--json-out`` writes the JSON too.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_runs import fail, publish  # noqa: E402

from mmoa.agents.candidates import merge_candidates  # noqa: E402
from mmoa.agents.prompts import MAX_SUBQUESTIONS  # noqa: E402
from mmoa.data.support import GoldSupport  # noqa: E402
from mmoa.evaluation import paired_gain  # noqa: E402

SCRIPT = "bench/qr_span_rewrites.py"
#: Words a question starts with that are capitalised only because they start it.
QUESTION_WORDS = frozenset({
    "what", "who", "whom", "whose", "which", "when", "where", "why", "how", "is", "are", "was",
    "were", "did", "do", "does", "in", "the", "this", "that", "name"})
#: Short words that join two capitalised words into one name ("Hook and Ladder", "Bank of
#: America"); elsewhere they end a run.
JOINERS = frozenset({"of", "the", "and", "de", "du", "la", "le", "van", "von", "da", "in",
                     "for", "on", "a", "an", "to", "&", "y"})
#: Spans shorter than this (in characters) are dropped: "A", "US" alone retrieve noise.
MIN_SPAN_CHARS = 3
_TOKEN = re.compile(r"[\w'’\-.&]+|[^\w\s]")

Rule = Callable[[str, list[str]], list[str]]
#: The rules, each a function of (question, spans) -> sub-questions; ``question`` first.
RULES: dict[str, Rule] = {
    "question": lambda q, spans: [q],
    "question+spans": lambda q, spans: [q, *spans],
    "question+first span": lambda q, spans: [q, *spans[:1]],
    "question+two spans": lambda q, spans: [q, *spans[:2]],
    "spans": lambda q, spans: list(spans) or [q],
}


def question_spans(question: str, max_spans: int) -> list[str]:
    """The quoted strings, then the runs of capitalised words (or numbers) of ``question``,
    stripped of edge punctuation, without repeats or ones shorter than MIN_SPAN_CHARS; the
    first ``max_spans``."""
    found = re.findall(r'"([^"]+)"', question)
    tokens = _TOKEN.findall(question)
    run: list[str] = []

    def close() -> None:
        while run and run[-1].lower() in JOINERS:  # "Bank of" -> "Bank"
            run.pop()
        if run:
            found.append(" ".join(run))
        run.clear()

    for i, token in enumerate(tokens):
        name_word = (token[:1].isupper() or token[:1].isdigit()) \
            and not (i == 0 and token.lower() in QUESTION_WORDS)
        joins_a_name = bool(run) and token.lower() in JOINERS and i + 1 < len(tokens) \
            and tokens[i + 1][:1].isupper()
        if name_word or joins_a_name:
            run.append(token)
        else:
            close()
    close()
    spans: list[str] = []
    for span in found:
        span = span.strip(" .,?!;:'\"")
        if len(span) >= MIN_SPAN_CHARS and span not in spans and span != question.strip():
            spans.append(span)
    return spans[:max_spans]


def rule_subquestions(question: str, spans: list[str]) -> dict[str, list[str]]:
    """Each rule's sub-questions for one question, at most MAX_SUBQUESTIONS (the QR's limit)."""
    return {name: rule(question, spans)[:MAX_SUBQUESTIONS] for name, rule in RULES.items()}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from mmoa.data.loaders import load_qa
    from mmoa.retrieval.client import RetrievalClient

    records = load_qa(args.data_file)
    if args.max_questions:
        records = records[:args.max_questions]
    supports = [GoldSupport.of(r) for r in records]
    missing = [r.id for r, s in zip(records, supports, strict=True) if s is None]
    if missing:
        fail(f"{len(missing)} of {len(records)} records name no gold supporting passages "
             f"(first: {missing[0]!r}); the rules are scored by them")
    client = RetrievalClient(args.retriever_url)
    try:
        client.health()
    except ConnectionError as err:
        fail(f"--retriever-url {args.retriever_url}: {err}")
    started = time.perf_counter()
    spans = [question_spans(r.question, args.max_spans) for r in records]
    plans = [rule_subquestions(r.question, s) for r, s in zip(records, spans, strict=True)]
    queries = list(dict.fromkeys(q for plan in plans for qs in plan.values() for q in qs))
    ranked: dict[str, Any] = {}
    for start in range(0, len(queries), args.request_size):
        chunk = queries[start:start + args.request_size]
        ranked.update(zip(chunk, client.search_documents(chunk, args.k), strict=True))
    recalls: dict[str, dict[str, float]] = {name: {} for name in RULES}
    best: dict[str, float] = {}
    per_question = []
    for record, support, plan, found in zip(records, supports, plans, spans, strict=True):
        row = {name: support.recall(merge_candidates([ranked[q] for q in qs], args.k))
               for name, qs in plan.items()}
        for name, value in row.items():
            recalls[name][record.id] = value
        best[record.id] = max(row.values())
        per_question.append({"id": record.id, "spans": found, "recall": row})
    return summarise(recalls, best, per_question, time.perf_counter() - started, args)


def summarise(recalls: dict[str, dict[str, float]], best: dict[str, float],
              per_question: list[dict[str, Any]], seconds: float,
              args: argparse.Namespace) -> dict[str, Any]:
    """Each rule's mean recall and its paired gain over the question alone; the per-question
    best of the rules and the share of questions it improves."""
    base = recalls["question"]
    n = len(base)
    rules = {}
    for name, values in recalls.items():
        entry: dict[str, Any] = {"recall": round(sum(values.values()) / n, 4)}
        if name != "question":
            gain = paired_gain(base, values)
            entry.update(gain=round(gain["gain"], 4), gain_se=round(gain["gain_se"], 4),
                         better=sum(values[q] > base[q] for q in base),
                         worse=sum(values[q] < base[q] for q in base))
        rules[name] = entry
    oracle = paired_gain(base, best)
    return {
        "bench": SCRIPT, "data_file": str(args.data_file), "k": args.k,
        "max_spans": args.max_spans, "questions": n,
        "with_spans": sum(bool(row["spans"]) for row in per_question),
        "rules": rules,
        "best_of_rules": {"recall": round(sum(best.values()) / n, 4),
                          "gain": round(oracle["gain"], 4), "gain_se": round(oracle["gain_se"], 4),
                          "improved": sum(best[q] > base[q] for q in base)},
        "seconds": round(seconds, 1),
        "per_question": per_question,
    }


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['questions']} questions ({result['with_spans']} with spans), K = "
             f"{result['k']}, {result['seconds']} s",
             "rule                  recall   gain +- SE (vs question)   better / worse"]
    for name, entry in result["rules"].items():
        gain = (f"{100 * entry['gain']:+.1f} +- {100 * entry['gain_se']:.1f}"
                if "gain" in entry else "-")
        counts = f"{entry['better']} / {entry['worse']}" if "better" in entry else "-"
        lines.append(f"{name:<20}  {100 * entry['recall']:5.1f} %  {gain:>24}   {counts}")
    oracle = result["best_of_rules"]
    lines.append(f"{'best rule per question':<20}  {100 * oracle['recall']:5.1f} %  "
                 f"{100 * oracle['gain']:+17.1f} +- {100 * oracle['gain_se']:.1f}   "
                 f"{oracle['improved']} improved (oracle: reads the gold passages)")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-file", dest="data_file", required=True,
                        help="QA records with gold supporting passages (HotpotQA layout)")
    parser.add_argument("--retriever-url", dest="retriever_url", required=True,
                        help="the retrieval server over that data's corpus")
    parser.add_argument("--k", type=int, default=5, help="candidates (the pipeline's K)")
    parser.add_argument("--max-spans", dest="max_spans", type=int, default=3,
                        help="spans of a question used by the rules (default 3)")
    parser.add_argument("--max-questions", dest="max_questions", type=int, default=None)
    parser.add_argument("--request-size", dest="request_size", type=int, default=64,
                        help="queries per retrieval request")
    parser.add_argument("--json-out", dest="json_out", default=None)
    args = parser.parse_args(argv)
    if not Path(args.data_file).is_file():
        fail(f"--data-file {args.data_file}: no such file")
    for name in ("k", "max_spans", "request_size", "max_questions"):
        value = getattr(args, name)
        if value is not None and value < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    publish(measure(args), args.json_out, SCRIPT, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
