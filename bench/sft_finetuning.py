"""Warm start by full fine-tuning or by LoRA: seconds per SFT step, peak memory and the loss
reached after the same steps, on the demo's own SFT config.

Each variant runs LLaMA-Factory's SFT stage (``run_exp``, what ``run_sft.sh`` runs) in its own
process, so its peak resident memory is its own; the first step is left out of the step times
(allocations, the first packed batch). Both see the same packed rows in the same order (same
seed, same data); LoRA uses the learning rate usual for adapters (``--lora-lr``), since at full
fine-tuning's 5e-5 an adapter hardly moves in a few steps.

Needs the demo SFT data (``python data_builders/qr_s_g_sft_data_alpaca.py ... --name demo_sft``).

    python bench/sft_finetuning.py --model models/smollm2-135m-instruct --steps 6 \\
        --keep-full saves/bench/sft6 --json-out bench/results/sft_finetuning.json

Prints one JSON object and a table.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))
VARIANTS = ("full", "lora")


def _config(args: argparse.Namespace, output: str) -> dict:
    """The demo SFT config with the bench's overrides; nothing else differs from a real run."""
    config = yaml.safe_load((ROOT / args.config).read_text())
    config.update({"model_name_or_path": args.model, "output_dir": output,
                   "max_steps": args.steps, "logging_steps": 1, "plot_loss": False,
                   "save_strategy": "no", "report_to": "none", "dataset_dir": args.dataset_dir,
                   "finetuning_type": args.variant})
    if args.variant == "lora":
        config.update({"lora_rank": args.lora_rank, "lora_alpha": 2 * args.lora_rank,
                       "lora_target": "all", "learning_rate": args.lora_lr})
    config["bf16"] = args.precision == "bf16"
    if args.precision == "bf16":
        config["use_cpu"] = True  # bf16 autocast on the CPU (transformers needs use_cpu)
    return config


def run_variant(args: argparse.Namespace) -> dict:
    """One SFT run in this process; step times from a callback, losses from the trainer."""
    from llamafactory.train.tuner import run_exp
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.marks: list[float] = []
            self.losses: list[float] = []
            self.trainable = 0
            self.total = 0

        def on_train_begin(self, _args, _state, _control, model=None, **_kw):
            self.trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
            self.total = sum(p.numel() for p in model.parameters())
            self.marks.append(time.perf_counter())

        def on_step_end(self, *_a, **_kw):
            self.marks.append(time.perf_counter())

        def on_log(self, _args, _state, _control, logs=None, **_kw):
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

    clock = StepClock()
    with tempfile.TemporaryDirectory() as scratch:
        # --keep-full: the full variant's model stays, a short warm start for other benches
        keep = args.keep_full if args.variant == "full" and args.keep_full else None
        run_exp(_config(args, keep or scratch), callbacks=[clock])
    steps = [b - a for a, b in zip(clock.marks, clock.marks[1:], strict=False)]
    measured = steps[1:] or steps
    return {"variant": args.variant, "steps": len(steps),
            "seconds_per_step": round(sum(measured) / len(measured), 2),
            "step_seconds": [round(s, 2) for s in steps],
            "losses": [round(x, 4) for x in clock.losses],
            "final_loss": clock.losses[-1] if clock.losses else None,
            "trainable_parameters": clock.trainable, "parameters": clock.total,
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "learning_rate": _config(args, "-")["learning_rate"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="LLaMA-Factory/examples/demo/smollm2_full_sft.yaml")
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--dataset_dir", default="data")
    parser.add_argument("--steps", type=int, default=6, help="SFT steps per variant")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--lora-lr", type=float, default=2e-4)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--keep-full", metavar="DIR",
                        help="save the full fine-tuning variant's model there")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # child process
    parser.add_argument("--json-out")
    args = parser.parse_args()

    if args.variant:
        print("RESULT " + json.dumps(run_variant(args)), flush=True)
        return
    rows = []
    for variant in args.variants:
        command = [sys.executable, __file__, "--variant", variant, "--config", args.config,
                   "--model", args.model, "--dataset_dir", args.dataset_dir,
                   "--steps", str(args.steps), "--precision", args.precision,
                   "--lora-rank", str(args.lora_rank), "--lora-lr", str(args.lora_lr)]
        if args.keep_full:
            command += ["--keep-full", args.keep_full]
        done = subprocess.run(command, cwd=ROOT, text=True, stdout=subprocess.PIPE, check=True)
        rows.append(json.loads(next(line for line in done.stdout.splitlines()
                                    if line.startswith("RESULT "))[len("RESULT "):]))
    import torch

    report = {"device": "cpu", "threads": torch.get_num_threads(), "config": args.config,
              "model": args.model, "precision": args.precision, "steps": args.steps,
              "variants": rows}
    if len(rows) == 2:
        report["lora_over_full_step_time"] = round(
            rows[1]["seconds_per_step"] / rows[0]["seconds_per_step"], 3)
    table = [f"\n{'variant':<8}{'s/step':>9}{'peak RSS MiB':>14}{'trainable':>13}"
             f"{'final loss':>12}"]
    for row in rows:
        table.append(f"{row['variant']:<8}{row['seconds_per_step']:>9.2f}"
                     f"{row['peak_rss_mib']:>14.1f}{row['trainable_parameters']:>13,}"
                     f"{row['final_loss'] or float('nan'):>12.4f}")
    from bench_runs import report_result  # a sibling: bench/ is first on sys.path

    report_result(report, "\n".join(table), args.json_out, "bench/sft_finetuning.py")


if __name__ == "__main__":
    main()
