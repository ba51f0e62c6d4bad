"""Peak memory and time of one PPO forward/backward at a Selector-like prompt length: the LM
head over every position (what ``model(...).logits`` does, with a differentiable entropy) against
the learner's forward (LM head at the response positions only, entropy without a graph).

Each variant runs in its own process, so its peak resident memory (``ru_maxrss``) is its own;
the figure reported is the peak minus the resident size after loading the model and building
the batch. Defaults: SmolLM2-135M-Instruct (vocabulary 49,152), 4 samples of a 1,200-token
prompt (a Selector prompt with 5 documents is about 1,000-1,500 tokens) and a 16-token response.

    python bench/update_memory.py --model models/smollm2-135m-instruct \\
        --json-out bench/results/update_memory.json

Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))
VARIANTS = ("whole_sequence_logits", "response_positions")


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_variant(args: argparse.Namespace) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from mmoa.train.mappo.learner import PolicyWithValue
    from mmoa.train.mappo.ppo_math import entropy_from_logits, logprobs_from_logits
    from mmoa.train.mappo.samples import Sample, collate, gather_positions
    from mmoa.train.mappo.value_head import ValueHead

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.config.use_cache = False
    policy = PolicyWithValue(model, ValueHead(model.config.hidden_size), temperature=0.95)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(1)
    samples = [Sample("selector",
                      torch.randint(10, vocab, (args.prompt_tokens,), generator=generator).tolist(),
                      torch.randint(10, vocab, (args.response_tokens,),
                                    generator=generator).tolist(), 1.0)
               for _ in range(args.samples)]
    batch = collate(samples, pad_id=0)
    baseline = _rss_mib()
    started = time.perf_counter()
    if args.variant == "whole_sequence_logits":
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    output_hidden_states=True)
        logits = gather_positions(out.logits, batch.positions).float() / 0.95
        logprobs = logprobs_from_logits(logits, batch.response_ids)
        values = policy.v_head(gather_positions(out.hidden_states[-1], batch.positions))
        entropy = entropy_from_logits(logits)
    else:
        logprobs, values, entropy = policy(batch, with_entropy=True)
    loss = -(logprobs * batch.response_mask).sum() + values.float().pow(2).mean()
    loss.backward()
    seconds = time.perf_counter() - started
    assert entropy is not None
    return {"variant": args.variant, "seconds": round(seconds, 2),
            "peak_rss_over_baseline_mib": round(_rss_mib() - baseline, 1),
            "baseline_rss_mib": round(baseline, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt-tokens", dest="prompt_tokens", type=int, default=1200)
    parser.add_argument("--response-tokens", dest="response_tokens", type=int, default=16)
    parser.add_argument("--variant", choices=VARIANTS, help="run one variant in this process")
    parser.add_argument("--json-out", dest="json_out")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return
    rows = []
    for variant in VARIANTS:
        command = [sys.executable, __file__, "--variant", variant, "--model", args.model,
                   "--samples", str(args.samples), "--prompt-tokens", str(args.prompt_tokens),
                   "--response-tokens", str(args.response_tokens)]
        result = subprocess.run(command, capture_output=True, text=True, check=True)
        rows.append(json.loads(result.stdout.strip().splitlines()[-1]))
    report = {"model": args.model, "samples": args.samples, "prompt_tokens": args.prompt_tokens,
              "response_tokens": args.response_tokens, "variants": rows}
    table = [f"{'variant':<24} {'seconds':>8} {'peak MiB over baseline':>24}"]
    table += [f"{row['variant']:<24} {row['seconds']:>8.2f} "
              f"{row['peak_rss_over_baseline_mib']:>24.1f}" for row in rows]
    from bench_runs import report_result  # a sibling: bench/ is first on sys.path

    report_result(report, "\n".join(table), args.json_out, "bench/update_memory.py")


if __name__ == "__main__":
    main()
