"""fp32 vs bf16 on this machine: matrix-product throughput at a real model's shapes, and greedy
``qr_s_g`` evaluation questions per second.

Why: bf16 autocast is only a gain where the hardware computes bf16 natively (AVX-512 BF16 / AMX
on a CPU, or a GPU); elsewhere it is emulated and slower. ``mmoa.precision`` decides from the CPU
flags and, where they promise native bf16, a probe of matrix products
(``mmoa.precision.bf16_matmul_speedup``); this bench measures what that rule stands on. The
matrix products are the probe's, ``mmoa.precision.linear_layer_gflops``: SmolLM2-135M's MLP
(576 x 1,536) for 512 tokens, forward (``x W^T``) and the two backward products; the
evaluation runs the real pipeline (``mmoa.evaluation.evaluate``) on the first
``--questions`` questions of a QA file against a running retrieval server.

    python bench/precision_throughput.py --model saves/smollm2-135m/full/sft --questions 8

Prints one JSON object and a table; --json-out writes the JSON too.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch


def cpu_model_name() -> str | None:
    """The CPU's model name from ``/proc/cpuinfo`` (the figures differ between CPUs that share
    their flags), or ``None`` where the file is absent."""
    path = Path("/proc/cpuinfo")
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines
                 if line.startswith("model name")), None)


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

    from mmoa.precision import (
        bf16_matmul_speedup,
        cpu_has_bf16,
        linear_layer_gflops,
        resolve_precision,
    )

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    result = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "cpu_model": cpu_model_name(),
        "threads": torch.get_num_threads(), "cpu_native_bf16": cpu_has_bf16(),
        "auto_resolves_to": resolve_precision("auto"),
        "bf16_speedup_probe": round(bf16_matmul_speedup(), 3) if cpu_has_bf16() else None,
        "matmul_gflops": {p: linear_layer_gflops(dtypes[p]) for p in args.precisions},
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
          f"(native bf16 on this CPU: {result['cpu_native_bf16']}; the probe's bf16 speedup: "
          f"{result['bf16_speedup_probe']})")
    if args.json_out:
        from bench_runs import write_result  # a sibling: bench/ is first on sys.path

        write_result(args.json_out, result, "bench/precision_throughput.py")


if __name__ == "__main__":
    main()
