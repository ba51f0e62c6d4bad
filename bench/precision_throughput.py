"""fp32 vs bf16 on this machine: matrix-product throughput at a real model's shapes, and greedy
``qr_s_g`` evaluation questions per second.

Why: bf16 autocast is only a gain where the hardware computes bf16 natively (AVX-512 BF16 / AMX
on a CPU, or a GPU); elsewhere it is emulated and slower. ``mmoa.precision`` decides from the CPU
flags; this bench measures what that rule stands on. The matrix products are those of
SmolLM2-135M's MLP (576 x 1,536) for 512 tokens, forward (``x W^T``) and the two backward
products; the evaluation runs the real pipeline (``mmoa.evaluation.evaluate``) on the first
``--questions`` questions of a QA file against a running retrieval server.

    python bench/precision_throughput.py --model saves/smollm2-135m/full/sft --questions 8

Prints one JSON object and a table; --json-out writes the JSON too.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch


def matmul_gflops(dtype: torch.dtype, tokens: int = 512, hidden: int = 576,
                  inner: int = 1536, repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of the forward and the two backward products of one linear layer."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=generator).to(dtype)
    w = torch.randn(inner, hidden, generator=generator).to(dtype)
    g = torch.randn(tokens, inner, generator=generator).to(dtype)
    flops = 2.0 * tokens * hidden * inner
    products = {"forward x@W^T": lambda: x @ w.t(), "grad input g@W": lambda: g @ w,
                "grad weight g^T@x": lambda: g.t() @ x}
    out = {}
    for name, product in products.items():
        product()  # warm-up
        start = time.perf_counter()
        for _ in range(repeats):
            product()
        seconds = (time.perf_counter() - start) / repeats
        out[name] = round(flops / seconds / 1e9, 2)
    return out


def evaluation_rate(args: argparse.Namespace, precision: str) -> dict[str, float]:
    from mmoa.evaluation import EvalConfig, evaluate

    with tempfile.TemporaryDirectory() as out:
        config = EvalConfig(model_name_or_path=args.model, template=args.template,
                            output_dir=out, data_file=args.data_file, k=args.k,
                            retriever_url=args.retriever_url, mode="qr_s_g",
                            max_samples=args.questions, batch_size=args.questions,
                            precision=precision, max_new_tokens_qr=48,
                            max_new_tokens_selector=24, max_new_tokens_generator=16)
        metrics = evaluate(config, progress=False)
    seconds = metrics["seconds"]
    return {"questions": metrics["num_questions"], "seconds": round(seconds["total"], 2),
            "questions_per_s": round(metrics["num_questions"] / seconds["total"], 4),
            **{f"{agent}_s": round(seconds[agent], 2)
               for agent in ("qr", "retrieve", "selector", "generator")},
            "f1": metrics["f1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="saves/smollm2-135m/full/sft")
    parser.add_argument("--template", default="smollm2")
    parser.add_argument("--data_file", default="data/demo/dev.jsonl")
    parser.add_argument("--retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"],
                        choices=["fp32", "bf16"])
    parser.add_argument("--skip-eval", action="store_true", help="matrix products only")
    parser.add_argument("--json-out")
    args = parser.parse_args()

    from mmoa.precision import cpu_has_bf16, resolve_precision

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    result = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "threads": torch.get_num_threads(), "cpu_native_bf16": cpu_has_bf16(),
        "auto_resolves_to": resolve_precision("auto"),
        "matmul_gflops": {p: matmul_gflops(dtypes[p]) for p in args.precisions},
        "evaluation": {} if args.skip_eval else
        {p: evaluation_rate(args, p) for p in args.precisions},
    }
    print(json.dumps(result, indent=2))
    print()
    print(f"{'precision':<10}{'fwd GFLOP/s':>12}{'bwd-in':>9}{'bwd-w':>9}{'eval q/s':>10}")
    for precision in args.precisions:
        mm = list(result["matmul_gflops"][precision].values())
        rate = result["evaluation"].get(precision, {}).get("questions_per_s")
        print(f"{precision:<10}{mm[0]:>12.1f}{mm[1]:>9.1f}{mm[2]:>9.1f}"
              f"{'-' if rate is None else f'{rate:.3f}':>10}")
    print(f"auto precision here: {result['auto_resolves_to']} "
          f"(native bf16 on this CPU: {result['cpu_native_bf16']})")
    if args.json_out:
        from bench_runs import write_result  # a sibling: bench/ is first on sys.path

        write_result(args.json_out, result, "bench/precision_throughput.py")


if __name__ == "__main__":
    main()
