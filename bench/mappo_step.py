"""MAPPO step benchmark: time per step by phase, overhead against plain generate + forward/backward
on the same tokens, and the memory the adapter-disabled reference saves.

Needs a running retrieval server (bash run_server.sh --index data/demo/index) and a MAPPO prompt
set (python data_builders/get_ppo_data_alpaca.py ...). Prints one JSON object and a table.

    python bench/mappo_step.py --model models/tiny-llama3 --steps 3

The baseline does, on exactly the prompts and response lengths of the measured MAPPO steps, what
any RL loop must do at least: one ``generate`` per agent batch (same prompts, same number of new
tokens, no retrieval, no parsing) and ``ppo_epochs`` forward/backward passes over the same
mini-batches. ``overhead = mappo_step / baseline``: everything MAPPO adds (retrieval, parsing,
rewards, the no-grad passes for old/reference log-probs and values, the value head).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))


def _config(args: argparse.Namespace, output: str, finetuning_type: str) -> dict:
    return {
        "stage": "mappo", "do_train": True, "model_name_or_path": args.model,
        "finetuning_type": finetuning_type, "lora_rank": 8, "lora_target": "all",
        "template": args.template, "dataset": args.dataset, "dataset_dir": args.dataset_dir,
        "output_dir": output, "overwrite_output_dir": True, "report_to": "none",
        "disable_gradient_checkpointing": True, "per_device_train_batch_size": args.mini_batch,
        "gradient_accumulation_steps": 1, "learning_rate": 1e-5, "max_steps": args.steps,
        "logging_steps": 1, "save_steps": 0, "ppo_epochs": args.ppo_epochs, "seed": 0,
        "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
        "mappo_retriever_url": args.retriever_url,
        "mappo_questions_per_rollout": args.questions, "mappo_rollout_batch_size": args.questions,
        "mappo_max_new_tokens_qr": 48, "mappo_max_new_tokens_selector": 32,
        "mappo_max_new_tokens_generator": 24,
    }


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _rss_mb() -> float:
    return psutil.Process(os.getpid()).memory_info().rss / 2**20


def run_mappo_steps(args: argparse.Namespace) -> tuple[list[dict], list, object]:
    from mmoa.train.mappo.learner import PPOLearner
    from mmoa.train.mappo.workflow import build_mappo_trainer

    with tempfile.TemporaryDirectory() as out:
        trainer, _, _ = build_mappo_trainer(_config(args, out, "lora"))
        learner = PPOLearner(trainer.model, trainer.optimizer, trainer.ppo_config,
                             trainer._pad_id(), generator=torch.Generator().manual_seed(0))
        logs, samples = [], []
        for step in range(args.steps + 1):  # step 0 warms up (allocations, first retrieval)
            start = time.perf_counter()
            records = trainer.step_records(step)
            traces, timings = trainer.rollout(records)
            t1 = time.perf_counter()
            step_samples, _ = trainer.make_samples(records, traces)
            rollout = learner.prepare(step_samples)
            _sync()
            t2 = time.perf_counter()
            learner.update(rollout)
            learner.update_kl(rollout)
            _sync()
            t3 = time.perf_counter()
            if step == 0:
                continue
            generate = timings["qr"] + timings["selector"] + timings["generator"]
            logs.append({"step": t3 - start, "generate": generate,
                         "retrieve": timings["retrieve"],
                         "rollout_other": (t1 - start) - generate - timings["retrieve"],
                         "score": t2 - t1, "update": t3 - t2})
            samples.append(step_samples)
        return logs, samples, trainer


def baseline_seconds(trainer, samples_per_step: list, ppo_epochs: int, mini_batch: int
                     ) -> list[float]:
    """Plain generate + ppo_epochs x forward/backward on the same tokens, per step."""
    from mmoa.train.mappo.samples import collate, minibatches

    model = trainer.accelerator.unwrap_model(trainer.model)
    policy = model.policy
    pad = trainer._pad_id()
    out = []
    for samples in samples_per_step:
        start = time.perf_counter()
        policy.eval()
        with torch.no_grad():
            for agent in ("qr", "selector", "generator"):
                group = [s for s in samples if s.agent == agent]
                if not group:
                    continue
                width = max(len(s.prompt_ids) for s in group)
                new = max(len(s.response_ids) for s in group)
                ids = torch.full((len(group), width), pad, dtype=torch.long)
                mask = torch.zeros_like(ids)
                for row, s in enumerate(group):
                    ids[row, width - len(s.prompt_ids):] = torch.tensor(s.prompt_ids)
                    mask[row, width - len(s.prompt_ids):] = 1
                device = next(policy.parameters()).device
                policy.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                max_new_tokens=new, min_new_tokens=new, do_sample=True,
                                pad_token_id=pad)
        policy.train()
        for _ in range(ppo_epochs):
            for indices in minibatches(len(samples), mini_batch):
                batch = collate([samples[i] for i in indices], pad).to(
                    next(policy.parameters()).device)
                logits = policy(input_ids=batch.input_ids,
                                attention_mask=batch.attention_mask).logits
                loss = logits.float().logsumexp(-1).mean()
                loss.backward()
        policy.zero_grad(set_to_none=True)
        _sync()
        out.append(time.perf_counter() - start)
    return out


def reference_memory(args: argparse.Namespace) -> dict:
    """Resident memory of the policy with the adapter-disabled reference vs a second copy."""
    from transformers import AutoModelForCausalLM

    gc.collect()
    before = _rss_mb()
    policy = AutoModelForCausalLM.from_pretrained(args.model)
    with_adapter_reference = _rss_mb() - before
    reference = AutoModelForCausalLM.from_pretrained(args.model)
    with_copy = _rss_mb() - before
    param_mb = sum(p.numel() * p.element_size() for p in reference.parameters()) / 2**20
    del policy, reference
    gc.collect()
    return {"adapter_disabled_reference_mb": round(with_adapter_reference, 1),
            "separate_reference_copy_mb": round(with_copy, 1),
            "reference_parameters_mb": round(param_mb, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny-llama3")
    parser.add_argument("--template", default="llama3")
    parser.add_argument("--dataset", default="demo_mappo")
    parser.add_argument("--dataset_dir", default="data")
    parser.add_argument("--retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--mini_batch", type=int, default=8)
    parser.add_argument("--ppo_epochs", type=int, default=2)
    parser.add_argument("--json-out")
    args = parser.parse_args()

    memory = reference_memory(args)
    logs, samples, trainer = run_mappo_steps(args)
    base = baseline_seconds(trainer, samples, args.ppo_epochs, args.mini_batch)
    mean = {k: sum(log[k] for log in logs) / len(logs) for k in logs[0]}
    baseline = sum(base) / len(base)
    result = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "threads": torch.get_num_threads(),
        "model": args.model, "questions_per_step": args.questions,
        "samples_per_step": len(samples[0]), "ppo_epochs": args.ppo_epochs,
        "mappo_step_s": round(mean["step"], 3),
        "phases_s": {k: round(v, 3) for k, v in mean.items() if k != "step"},
        "baseline_step_s": round(baseline, 3),
        "overhead_ratio": round(mean["step"] / baseline, 3),
        "target_overhead_ratio": 1.3,
        "memory": memory,
    }
    print(json.dumps(result, indent=2))
    print()
    print(f"{'phase':<16}{'seconds':>10}")
    for key, value in result["phases_s"].items():
        print(f"{key:<16}{value:>10.3f}")
    print(f"{'MAPPO step':<16}{result['mappo_step_s']:>10.3f}")
    print(f"{'baseline':<16}{result['baseline_step_s']:>10.3f}   (generate + fwd/bwd, same tokens)")
    print(f"{'overhead':<16}{result['overhead_ratio']:>10.3f}   (target <= 1.3)")
    print(f"reference memory: adapter-disabled {memory['adapter_disabled_reference_mb']} MB vs "
          f"separate copy {memory['separate_reference_copy_mb']} MB "
          f"(+{memory['reference_parameters_mb']} MB of parameters)")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
