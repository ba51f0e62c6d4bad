"""Selector decoding benchmark: cost of the grammar-constrained logits processor.

The processor runs once per generated token for a whole batch and must know, for every row,
which tokens keep the selection well-formed. The naive way checks every grammar-compatible token
of the vocabulary against the row's text at every call; the processor remembers the answer per
text, because rows keep reaching the same few prefixes ("Document", "Document0,", ...).

Both replay the same real Selector outputs (the ``raw_outputs.selector`` of an evaluation's
predictions.jsonl), in batches as the pipeline decodes them: at each step every row is given its
next token, so both variants see exactly the texts a real run reaches. The replayed token must be
allowed at every step (checked), and both variants must allow the same tokens.

    python bench/selector_decoding.py --predictions outputs/demo/eval_sft/predictions.jsonl \
        --tokenizer saves/tiny-llama3/full/sft --k 5

Prints one JSON object and a table; --json-out writes the JSON too.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))

from transformers import AutoTokenizer  # noqa: E402

from mmoa.agents.constrained import SelectorLogitsProcessor, _candidate_tokens  # noqa: E402


class UncachedSelectorLogitsProcessor(SelectorLogitsProcessor):
    """The baseline: re-checks every candidate token at every call."""

    def allowed_tokens(self, generated_text: str) -> list[int]:
        return self._check_candidates(generated_text)


def _replay(processor: SelectorLogitsProcessor, rows: list[list[int]], vocab: int,
            eos: int) -> tuple[float, int, list[list[int]]]:
    """Feed the rows' tokens step by step; returns seconds inside the processor, calls and, per
    call, the allowed-token count of every row (to compare the variants)."""
    prompt_length = 1
    width = max(len(r) for r in rows) + 1
    padded = [r + [eos] * (width - len(r)) for r in rows]
    ids = torch.zeros((len(rows), prompt_length), dtype=torch.long)
    scores = torch.zeros((len(rows), vocab))
    inside, calls, allowed_counts = 0.0, 0, []
    for step in range(width):
        start = time.perf_counter()
        masked = processor(ids, scores)
        inside += time.perf_counter() - start
        calls += 1
        allowed = masked > float("-inf")
        nxt = torch.tensor([row[step] for row in padded])
        if not allowed[torch.arange(len(rows)), nxt].all():
            raise SystemExit(f"a replayed selector token is not allowed at step {step}")
        allowed_counts.append(allowed.sum(dim=1).tolist())
        ids = torch.cat([ids, nxt[:, None]], dim=1)
    return inside, calls, allowed_counts


def run(args: argparse.Namespace) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    eos = tokenizer.eos_token_id
    vocab = len(tokenizer)
    texts = [json.loads(line)["raw_outputs"]["selector"]
             for line in Path(args.predictions).read_text().splitlines() if line.strip()]
    encoded = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    batches = [encoded[i:i + args.batch] for i in range(0, len(encoded), args.batch)]
    _candidate_tokens(tokenizer)  # built once per tokenizer by both; not part of a call
    results, seen = {}, {}
    for name, cls in (("uncached", UncachedSelectorLogitsProcessor),
                      ("cached", SelectorLogitsProcessor)):
        seconds = calls = 0
        counts = []
        for _ in range(args.repeats):
            # One processor per batch, as the pipeline builds one per generate call.
            for rows in batches:
                s, c, allowed = _replay(cls(tokenizer, args.k, 1, [eos]), rows, vocab, eos)
                seconds += s
                calls += c
                counts.append(allowed)
        seen[name] = counts
        results[name] = {"calls": calls, "ms_per_call": 1000 * seconds / calls,
                         "seconds_per_pass": seconds / args.repeats}
    if seen["cached"] != seen["uncached"]:
        raise SystemExit("the cached processor allowed different tokens than the uncached one")
    return {
        "predictions": args.predictions, "outputs": len(texts), "tokenizer": args.tokenizer,
        "vocab": vocab, "grammar_tokens": len(_candidate_tokens(tokenizer)), "k": args.k,
        "batch": args.batch, "results": results,
        "speedup": results["uncached"]["ms_per_call"] / results["cached"]["ms_per_call"],
        "same_allowed_tokens": True,
    }


def _table(report: dict) -> str:
    lines = [f"Selector logits processor, {report['outputs']} replayed outputs, K={report['k']}, "
             f"batch {report['batch']}, {report['grammar_tokens']} grammar tokens of "
             f"{report['vocab']}",
             f"{'variant':<10} {'calls':>6} {'ms/call':>9} {'s/pass':>8}"]
    for name, row in report["results"].items():
        lines.append(f"{name:<10} {row['calls']:>6} {row['ms_per_call']:>9.3f} "
                     f"{row['seconds_per_pass']:>8.3f}")
    lines.append(f"speed-up of the cache: {report['speedup']:.1f}x (same allowed tokens)")
    return "\n".join(lines)


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--predictions", default="outputs/demo/eval_sft/predictions.jsonl",
                        help="an evaluation's predictions.jsonl (qr_s_g mode)")
    parser.add_argument("--tokenizer", default="saves/tiny-llama3/full/sft")
    parser.add_argument("--k", type=int, default=5, help="candidates (ids 0..k-1)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="passes over the outputs")
    parser.add_argument("--json-out")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    report = run(args)
    from bench_runs import report_result  # a sibling: bench/ is first on sys.path

    report_result(report, _table(report), args.json_out, "bench/selector_decoding.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
