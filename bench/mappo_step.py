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
import threading
import time
from pathlib import Path

import psutil
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))


def _config(args: argparse.Namespace, output: str) -> dict:
    """The MAPPO config measured: ``--config`` (the demo's by default) with the bench's
    overrides; nothing else differs from a real run of that config."""
    config = yaml.safe_load((ROOT / args.config).read_text())
    config.update({
        "output_dir": output, "overwrite_output_dir": True, "report_to": "none",
        # one warm-up and --steps measured steps per cache, on one trainer
        "max_steps": (args.steps + 1) * len(args.generation_cache), "save_steps": 0,
        "logging_steps": 1, "plot_loss": False,
        "mappo_retriever_url": args.retriever_url, "dataset_dir": args.dataset_dir,
    })
    if args.model:
        config["model_name_or_path"] = args.model
    if args.finetuning_type:
        config["finetuning_type"] = args.finetuning_type
        if args.finetuning_type == "lora":
            config.setdefault("lora_rank", 16)
            config.setdefault("lora_target", "all")
    for key in ("ppo_epochs", "learning_rate"):
        if getattr(args, key) is not None:
            config[key] = getattr(args, key)
    for override in args.set:  # --set key=value: any other key of the config
        key, _, value = override.partition("=")
        config[key] = yaml.safe_load(value)
    if args.questions:
        # one generate call per agent for the whole step, as in the demo configs; under grpo
        # a question's group counts mappo_group_size pipelines (rows)
        from mmoa.train.mappo.args import split_mappo_args

        group = split_mappo_args(config)[0].rollouts_per_question
        config["mappo_questions_per_rollout"] = args.questions
        config["mappo_rollout_batch_size"] = args.questions * group
    on_gpu = torch.cuda.is_available()
    config["bf16"] = args.precision == "bf16"
    if args.precision == "bf16" and not on_gpu:
        config["use_cpu"] = True  # bf16 autocast on the CPU (transformers needs use_cpu)
    return config


def _caches(value: str) -> list[str]:
    """``--generation_cache``: a comma-separated list of known caches."""
    from mmoa.agents.generation_cache import check_generation_cache

    caches = [c.strip() for c in value.split(",") if c.strip()]
    try:
        for cache in caches:
            check_generation_cache(cache)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if not caches or len(set(caches)) != len(caches):
        raise argparse.ArgumentTypeError(f"give distinct cache names, got {value!r}")
    return caches


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_gpu_mb() -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def _rss_mb() -> float:
    return psutil.Process(os.getpid()).memory_info().rss / 2**20


class PeakRSS:
    """Highest resident memory of this process while active, sampled every ``interval`` s.

    ``ru_maxrss`` is one high-water mark for the whole process, so it would also count the
    baseline's whole-sequence logits; sampling lets the bench report the MAPPO steps' own peak
    (what ``ppo`` vs ``grpo`` or full vs LoRA change) and nothing else."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self.peak_mb = 0.0
        self._active = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._active.is_set():
                self.peak_mb = max(self.peak_mb, _rss_mb())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        self.peak_mb = max(self.peak_mb, _rss_mb())
        self._active.set()
        return self

    def __exit__(self, *exc) -> None:
        self._active.clear()
        self.peak_mb = max(self.peak_mb, _rss_mb())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def run_mappo_steps(args: argparse.Namespace
                    ) -> tuple[dict[str, list[dict]], dict[str, float], object]:
    """Runs the trainer's own step (``MappoTrainer._train_step``) and reads its phase timings:
    for each KV cache of ``--generation_cache`` in turn, on one trainer (one model load), one
    warm-up step (allocations, the first retrieval, the compilation of the static cache's
    decoding on CUDA) and ``--steps`` measured steps, each followed by its baseline."""
    from mmoa.train.mappo.learner import PPOLearner
    from mmoa.train.mappo.workflow import build_mappo_trainer

    with tempfile.TemporaryDirectory() as out:
        trainer, _, _ = build_mappo_trainer(_config(args, out))
        learner = PPOLearner(trainer.model, trainer.optimizer, trainer.ppo_config,
                             trainer._pad_id(), generator=torch.Generator().manual_seed(0))
        captured: list = []
        make_samples = trainer.make_samples

        def capture(records, traces):  # keeps each step's samples for the baseline
            samples, logs = make_samples(records, traces)
            captured.append(samples)
            return samples, logs

        trainer.make_samples = capture
        runs: dict[str, list[dict]] = {}
        warmups: dict[str, float] = {}
        peak = PeakRSS()
        step = 0
        for cache in args.generation_cache:
            trainer.mappo_args.mappo_generation_cache = cache  # read by each step's rollout
            logs = runs[cache] = []
            peak.peak_mb = 0.0
            for measured in range(args.steps + 1):  # the first one warms up
                if torch.cuda.is_available():
                    torch.cuda.reset_peak_memory_stats()
                with peak:
                    step_logs = trainer._train_step(step, learner)
                    _sync()
                step += 1
                if measured == 0:  # what the warm-up costs (the compilation, with static)
                    warmups[cache] = step_logs["time/step"]
                    continue
                step_samples = captured[-1]
                # The baseline runs right after, on the same samples, so both see the same
                # machine, and generates with the same cache.
                baseline = None if args.skip_baseline else baseline_seconds(
                    trainer, [step_samples], trainer.ppo_config.ppo_epochs,
                    trainer.ppo_config.mini_batch_size, cache)[0]
                logs.append({
                    "step": step_logs["time/step"], "generate": step_logs["time/generate"],
                    "retrieve": step_logs["time/retrieve"],
                    "rollout_other": step_logs["time/rollout"]
                    - step_logs["time/generate"] - step_logs["time/retrieve"],
                    "score": step_logs["time/score"], "update": step_logs["time/update"],
                    "baseline": baseline,
                    "tokens": sum(len(x.prompt_ids) + len(x.response_ids)
                                  for x in step_samples),
                    "response_tokens": sum(len(x.response_ids) for x in step_samples),
                    "samples": len(step_samples),
                    "answer_f1": step_logs.get("answer_f1", float("nan")),
                    "peak_rss_mb": peak.peak_mb, "peak_gpu_mb": _peak_gpu_mb()})
            # each cache's figures as soon as they are in (a run cut short still shows them)
            print(json.dumps({"generation_cache": cache, "warmup_step_s": warmups[cache],
                              **summarise(logs, args.skip_baseline)}), flush=True)
        peak.close()
        return runs, warmups, trainer


def baseline_seconds(trainer, samples_per_step: list, ppo_epochs: int, mini_batch: int,
                     cache: str = "dynamic") -> list[float]:
    """Plain generate (with the KV cache ``cache``) + ppo_epochs x forward/backward on the
    same tokens, per step."""
    from mmoa.agents.generation_cache import cache_kwargs
    from mmoa.train.mappo.samples import collate, minibatches

    model = trainer.accelerator.unwrap_model(trainer.model)
    policy = model.policy
    # generates with the weights the trainer's rollouts use (its copy in the compute dtype,
    # where it makes one), and trains the policy itself
    rollout_policy = trainer.rollout_policy(policy)
    pad = trainer._pad_id()
    out = []
    for samples in samples_per_step:
        start = time.perf_counter()
        policy.eval()
        rollout_policy.eval()
        with trainer.accelerator.autocast(), torch.no_grad():
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
                device = next(rollout_policy.parameters()).device
                rollout_policy.generate(
                    input_ids=ids.to(device), attention_mask=mask.to(device),
                    max_new_tokens=new, min_new_tokens=new, do_sample=True, pad_token_id=pad,
                    **cache_kwargs(cache, rollout_policy))
        policy.train()
        # Plain fwd/bwd as a naive loop writes it: the model's whole forward, logits over
        # every position, mini-batches padded to their longest row.
        for _ in range(ppo_epochs):
            for indices in minibatches(len(samples), mini_batch):
                batch = collate([samples[i] for i in indices], pad).to(
                    next(policy.parameters()).device)
                with trainer.accelerator.autocast():
                    logits = policy(input_ids=batch.input_ids,
                                    attention_mask=batch.attention_mask).logits
                    loss = logits.float().logsumexp(-1).mean()
                loss.backward()
        policy.zero_grad(set_to_none=True)
        _sync()
        out.append(time.perf_counter() - start)
    return out


def reference_memory(model_path: str) -> dict:
    """Resident memory of the policy with the adapter-disabled reference vs a second copy.

    The copy is made with ``deepcopy`` so its weights are really allocated (two
    ``from_pretrained`` calls could share the memory-mapped safetensors pages)."""
    import copy

    from transformers import AutoModelForCausalLM

    gc.collect()
    before = _rss_mb()
    policy = AutoModelForCausalLM.from_pretrained(model_path)
    policy = copy.deepcopy(policy)  # materialise the weights (no mmap-shared pages)
    gc.collect()
    with_adapter_reference = _rss_mb() - before
    reference = copy.deepcopy(policy)
    with_copy = _rss_mb() - before
    param_mb = sum(p.numel() * p.element_size() for p in reference.parameters()) / 2**20
    del policy, reference
    gc.collect()
    return {"adapter_disabled_reference_mb": round(with_adapter_reference, 1),
            "separate_reference_copy_mb": round(with_copy, 1),
            "reference_parameters_mb": round(param_mb, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="LLaMA-Factory/examples/demo/smollm2_full_mappo.yaml",
                        help="the MAPPO config measured (default: the demo's)")
    parser.add_argument("--model", help="model_name_or_path (default: the config's)")
    parser.add_argument("--finetuning_type", choices=["full", "lora"],
                        help="default: the config's (lora: rank 16 on all linear layers)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16",
                        help="bf16: autocast (on a CPU with use_cpu); fp32: plain")
    parser.add_argument("--dataset_dir", default="data")
    parser.add_argument("--retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--steps", type=int, default=3, help="measured steps (after 1 warm-up)")
    parser.add_argument("--questions", type=int, help="questions per step (default: config)")
    parser.add_argument("--ppo_epochs", type=int, help="default: the config's")
    parser.add_argument("--learning_rate", type=float, help="default: the config's")
    parser.add_argument("--skip_memory", action="store_true",
                        help="skip the reference-memory comparison")
    parser.add_argument("--skip_baseline", action="store_true",
                        help="time and memory of the MAPPO steps only (e.g. ppo vs grpo)")
    parser.add_argument("--generation_cache", type=_caches, default=["dynamic"],
                        help="KV cache(s) of the rollouts' generate calls, comma-separated "
                             "(dynamic, static, auto), measured in turn on one trainer "
                             "(default dynamic)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one more key of the config (repeatable), e.g. "
                             "mappo_max_new_tokens_qr=8")
    parser.add_argument("--json-out")
    args = parser.parse_args()

    runs, warmups, trainer = run_mappo_steps(args)
    config = _config(args, "-")
    model_path = config["model_name_or_path"]
    memory = {} if args.skip_memory else reference_memory(model_path)
    per_cache = {cache: {**summarise(logs, args.skip_baseline),
                         "warmup_step_s": round(warmups[cache], 3)}
                 for cache, logs in runs.items()}
    first = per_cache[args.generation_cache[0]]
    result = {
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "threads": torch.get_num_threads(),
        "config": args.config, "model": model_path,
        "algorithm": trainer.mappo_args.mappo_algorithm,
        "finetuning_type": config["finetuning_type"], "precision": args.precision,
        "questions_per_step": trainer.questions_per_step,
        "ppo_epochs": trainer.ppo_config.ppo_epochs,
        "forward_batch_size": trainer.ppo_config.forward_batch_size,
        "overrides": list(args.set),
        "measured_steps": args.steps,
        "target_overhead_ratio": 1.3,
        # the first cache's figures at the top level (the JSON's layout before caches were
        # compared); every cache's under "generation_caches"
        "generation_cache": args.generation_cache[0],
        **first,
        "generation_caches": per_cache,
        "memory": memory,
    }
    if len(per_cache) > 1 and "dynamic" in per_cache:
        # per response token: the caches' steps sample different answers, of other lengths
        result["generate_speedup_vs_dynamic"] = {
            cache: round(_generate_per_token(per_cache["dynamic"]) / _generate_per_token(figures),
                         3)
            for cache, figures in per_cache.items() if cache != "dynamic"}
    print(json.dumps(result, indent=2))
    print()
    caches = list(per_cache)
    print(f"{'phase':<16}" + "".join(f"{c:>12}" for c in caches) + "   (seconds a step)")
    for key in first["phases_s"]:
        print(f"{key:<16}" + "".join(f"{per_cache[c]['phases_s'][key]:>12.3f}" for c in caches))
    print(f"{'MAPPO step':<16}" + "".join(f"{per_cache[c]['mappo_step_s']:>12.3f}"
                                          for c in caches))
    print(f"{'warm-up step':<16}" + "".join(f"{per_cache[c]['warmup_step_s']:>12.3f}"
                                            for c in caches) + "   (first step of each cache)")
    if not args.skip_baseline:
        print(f"{'baseline':<16}" + "".join(f"{per_cache[c]['baseline_step_s']:>12.3f}"
                                            for c in caches)
              + "   (generate + fwd/bwd, same tokens, same cache)")
        print(f"{'overhead':<16}" + "".join(f"{per_cache[c]['overhead_ratio']:>12.3f}"
                                            for c in caches) + "   (target <= 1.3)")
    print(f"{'peak RSS (MB)':<16}" + "".join(f"{per_cache[c]['peak_step_rss_mb']:>12.1f}"
                                             for c in caches) + "   (during the MAPPO steps)")
    if first["peak_step_gpu_mb"]:
        print(f"{'peak GPU (MB)':<16}" + "".join(
            f"{per_cache[c]['peak_step_gpu_mb'] or 0:>12.1f}" for c in caches))
    if memory:
        print(f"reference memory: adapter-disabled {memory['adapter_disabled_reference_mb']} MB"
              f" vs separate copy {memory['separate_reference_copy_mb']} MB "
              f"(+{memory['reference_parameters_mb']} MB of parameters)")
    if args.json_out:
        from bench_runs import write_result  # a sibling: bench/ is first on sys.path

        write_result(args.json_out, result, "bench/mappo_step.py")


def _generate_per_token(figures: dict) -> float:
    """Generation seconds per response token of a step."""
    return figures["phases_s"]["generate"] / max(figures["response_tokens_per_step"], 1)


def summarise(logs: list[dict], skip_baseline: bool) -> dict:
    """Mean phase seconds, baseline and overhead of one cache's measured steps."""
    logs = [dict(log) for log in logs]
    peaks = {k: max((log.pop(k) or 0.0) for log in logs) or None
             for k in ("peak_rss_mb", "peak_gpu_mb")}
    baselines = [log.pop("baseline") for log in logs]
    mean = {k: sum(log[k] for log in logs) / len(logs) for k in logs[0]}
    baseline = None if skip_baseline else sum(baselines) / len(baselines)
    tokens = {k: mean.pop(k) for k in ("tokens", "response_tokens", "samples", "answer_f1")}
    return {
        "samples_per_step": round(tokens["samples"]),
        "mappo_step_s": round(mean["step"], 3),
        "phases_s": {k: round(v, 3) for k, v in mean.items() if k != "step"},
        "baseline_step_s": baseline and round(baseline, 3),
        "overhead_ratio": baseline and round(mean["step"] / baseline, 3),
        "tokens_per_step": round(tokens["tokens"]),
        "response_tokens_per_step": round(tokens["response_tokens"]),
        "rollout_answer_f1": round(tokens["answer_f1"], 4),
        # highest over the warm-up and measured steps (the baseline excluded); process-wide
        # resident memory on a CPU, allocated CUDA memory on a GPU
        "peak_step_rss_mb": round(peaks["peak_rss_mb"], 1),
        "peak_step_gpu_mb": peaks["peak_gpu_mb"] and round(peaks["peak_gpu_mb"], 1),
    }


if __name__ == "__main__":
    main()
