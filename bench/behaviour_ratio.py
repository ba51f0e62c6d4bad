"""How far the scored policy is from the sampled one, before and after scoring at the rollout
temperature.

Rolls out one batch of MAPPO prompts with the trainer's pipeline (sampling at ``--temperature``,
top-p as given, the Selector under its grammar), recording each token's log-prob under the
distribution it was drawn from, then scores the same tokens as the learner's old log-probs
twice: at temperature 1 (what MAPPO did before) and at the sampling temperature (what it does
now). For every token ``r = p_scored / p_sampled``; the table gives its mean, spread and range
per agent. With top-p 1 and no grammar, ``r`` is 1 up to float noise when the temperatures
agree; top-p and the grammar lower it where they cut the support.

``--tis-cap C`` scores with truncated importance sampling on (``mappo_tis_cap: C``): each run
then also reports the weights the learner would put on every token's policy loss,
``min(r, C)`` (``tis_mean``, ``tis_min``, and ``capped``, the share of tokens the cap cut), from
the same code path as training (``PPOLearner.prepare``, ``tis_stats``).

Needs a running retrieval server (bash run_server.sh --index data/demo/index)::

    python bench/behaviour_ratio.py --model saves/smollm2-135m/full/sft --template smollm2 \\
        --json-out bench/results/behaviour_ratio.json
    python bench/behaviour_ratio.py --model saves/smollm2-135m/full/grpo --template smollm2 \\
        --tis-cap 2 --json-out bench/results/behaviour_ratio_tis.json

Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))


def measure(args: argparse.Namespace) -> dict:
    from mmoa.agents.pipeline import GenerationSettings, RagPipeline
    from mmoa.data.loaders import load_qa
    from mmoa.modeling import load_for_inference
    from mmoa.retrieval.client import RetrievalClient
    from mmoa.train.mappo.learner import (
        PolicyWithValue,
        PPOConfig,
        PPOLearner,
        behaviour_ratio_stats,
        tis_stats,
    )
    from mmoa.train.mappo.samples import Sample
    from mmoa.train.mappo.value_head import ValueHead

    model, tokenizer = load_for_inference(Path(args.model), args.template)
    model.float().eval()
    questions = [r.question for r in load_qa(Path(args.data_file), "demo")[: args.questions]]
    client = RetrievalClient(args.retriever_url)
    results: dict = {"model": args.model, "questions": len(questions),
                     "temperature": args.temperature, "tis_cap": args.tis_cap, "runs": {}}
    for top_p in args.top_p:
        torch.manual_seed(args.seed)
        settings = GenerationSettings(
            do_sample=True, temperature=args.temperature, top_p=top_p, top_k=0,
            max_new_tokens={"qr": 64, "selector": 32, "generator": 32},
            constrained_selector=True, record_logprobs=True)
        pipeline = RagPipeline(model, tokenizer, args.template, client, k=args.k,
                               settings=settings)
        started = time.perf_counter()
        traces = pipeline.run(questions)
        rollout_s = time.perf_counter() - started
        samples = [Sample(call.agent, call.prompt_ids, call.response_ids, 0.0,
                          call.sampling_logprobs)
                   for trace in traces for call in trace.calls.values()]
        for scoring_temperature in (1.0, args.temperature):
            policy = PolicyWithValue(model, ValueHead(model.config.hidden_size),
                                     ref_model=copy.copy(model),
                                     temperature=scoring_temperature)
            learner = PPOLearner(policy, torch.optim.SGD(policy.parameters(), lr=0.0),
                                 PPOConfig(tis_cap=args.tis_cap),
                                 pad_id=tokenizer.pad_token_id
                                 if tokenizer.pad_token_id is not None
                                 else tokenizer.eos_token_id)
            rollout = learner.prepare(samples)
            stats = behaviour_ratio_stats(rollout)
            stats.update({f"behaviour_ratio/{k.replace('/', '_')}": v
                          for k, v in tis_stats(rollout).items()})
            name = f"top_p={top_p:g}, scored at T={scoring_temperature:g}"
            results["runs"][name] = {k.removeprefix("behaviour_ratio/"): round(v, 5)
                                     for k, v in stats.items()}
            results["runs"][name]["tokens"] = sum(len(s.response_ids) for s in samples)
            results["runs"][name]["rollout_s"] = round(rollout_s, 1)
    return results


def table(results: dict) -> str:
    tis = results.get("tis_cap") is not None
    lines = [f"{'run':<34} {'mean':>7} {'std':>7} {'min':>7} {'max':>7} "
             f"{'qr':>7} {'sel':>7} {'gen':>7} {'tokens':>7}"
             + (f" {'tis_mean':>8} {'tis_min':>8} {'capped':>7}" if tis else "")]
    for name, row in results["runs"].items():
        line = (f"{name:<34} {row['mean']:>7.4f} {row['std']:>7.4f} {row['min']:>7.4f} "
                f"{row['max']:>7.4f} {row.get('qr', float('nan')):>7.4f} "
                f"{row.get('selector', float('nan')):>7.4f} "
                f"{row.get('generator', float('nan')):>7.4f} {row['tokens']:>7}")
        if tis:
            line += (f" {row.get('tis_weight_mean', float('nan')):>8.4f}"
                     f" {row.get('tis_weight_min', float('nan')):>8.4f}"
                     f" {row.get('tis_capped_fraction', float('nan')):>7.4f}")
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="saves/smollm2-135m/full/sft")
    parser.add_argument("--template", default="smollm2")
    parser.add_argument("--data-file", dest="data_file", default="data/demo/train.jsonl")
    parser.add_argument("--retriever-url", dest="retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--temperature", type=float, default=0.95)
    parser.add_argument("--top-p", dest="top_p", type=float, nargs="+", default=[0.9, 1.0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tis-cap", dest="tis_cap", type=float, default=None,
                        help="also report the truncated importance sampling weights "
                             "min(r, cap) the learner would use (mappo_tis_cap)")
    parser.add_argument("--json-out", dest="json_out")
    args = parser.parse_args()
    results = measure(args)
    from bench_runs import report_result  # a sibling: bench/ is first on sys.path

    report_result(results, table(results), args.json_out, "bench/behaviour_ratio.py")


if __name__ == "__main__":
    main()
