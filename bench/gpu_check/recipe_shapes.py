"""The 8B recipes at their real shape: the optional ``<shape>_*`` stages of ``run_check.py``.

    bash bench/gpu_check/run_check.sh --deadline 470 \
        --stages llama3_8b_model,llama3_8b_sft,llama3_8b_mappo,llama3_8b_grpo     # the H200
    python bench/gpu_check/run_check.py --dry-run --stages llama3_8b_mappo ...     # CPU, mini

What a user needs before renting a GPU for ``LLaMA-Factory/examples/real/llama3_lora_*.yaml`` is
the memory and the time of those configs at 8B. No 8B weights can reach the device machine (64
MiB a call, no network), so a model folder with the **published configuration** of
Llama-3-8B-Instruct (or Qwen2.5-7B-Instruct) is made there: its ``config.json`` and
``generation_config.json`` as published (:data:`SHAPES`), a tokenizer made here from the demo
world's text whose vocabulary has exactly the real model's layout (byte-level BPE, filler tokens
up to the first special id, the real special tokens at their real ids, the chat template of the
configs' ``template``), and random seeded weights made on the GPU directly in bf16
(``init_weights.py``). The three real configs then run through the project's own trainers with
small overrides (a few steps, no checkpoints, the demo world's data and retrieval server that the
check builds): SFT through ``run_sft.sh``; MAPPO and GRPO through the trainer's own step as
``bench/mappo_step.py`` runs it (one model load: each KV cache in turn, the phases generate /
retrieve / score / update, rollout tokens per second), and after MAPPO's steps a sweep of the
rollout batch (``mappo_questions_per_rollout`` questions generated together) up to the largest
that fits, bounded in time. Peak CUDA memory: the check's per-process probe, and for MAPPO /
GRPO the steps' own peak (``steps_memory``: the bench resets CUDA's peak before each step, so
the probe's last record holds only the last phase's).

Random weights never stop early: every turn writes its full token budget (100 / 32 / 100 new
tokens), so generation time and KV memory are **upper bounds** of a trained model's. The demo
world's passages are shorter than Wikipedia's 100-word passages, so prompts are shorter than on
real HotpotQA (the figures record the tokens a step saw; scale by prompt length).

``--shape-scale mini`` (the CPU dry run's default) runs the SAME stages with a miniature of each
shape: the same vocabulary, tokenizer, special ids, model type and attention layout (GQA ratio,
biases, tied or not), 2 layers of width 64-112, and the configs' batch sizes cut down.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
REAL = "LLaMA-Factory/examples/real"
RECIPES = {"sft": f"{REAL}/llama3_lora_sft.yaml", "mappo": f"{REAL}/llama3_lora_mappo.yaml",
           "grpo": f"{REAL}/llama3_lora_grpo.yaml"}
SEED = 42
MIB = 1 << 20
#: BPE merges learnt from the demo world before the filler tokens (the world has fewer words:
#: the trainer stops where no pair is frequent enough).
BPE_VOCAB = 16_000

# --------------------------------------------------------------------------------------------
# the published configurations

#: meta-llama/Meta-Llama-3-8B-Instruct, config.json as published on the Hugging Face Hub
#: (https://huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct/blob/main/config.json); the
#: MMOA-RAG paper's backbone (8,030,261,248 parameters).
LLAMA3_8B_INSTRUCT_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128009, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 128256,
}
#: ... and its generation_config.json (same page's folder).
LLAMA3_8B_INSTRUCT_GENERATION: dict[str, Any] = {
    "bos_token_id": 128000, "eos_token_id": [128001, 128009], "do_sample": True,
    "temperature": 0.6, "max_length": 4096, "top_p": 0.9,
}
#: Qwen/Qwen2.5-7B-Instruct, config.json as published on the Hugging Face Hub
#: (https://huggingface.co/Qwen/Qwen2.5-7B-Instruct/blob/main/config.json; 7,615,616,512
#: parameters, q/k/v projections with biases: the qwen2 architecture).
QWEN2_5_7B_INSTRUCT_CONFIG: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584,
    "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 32768,
    "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
    "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
    "vocab_size": 152064,
}
#: ... and its generation_config.json.
QWEN2_5_7B_INSTRUCT_GENERATION: dict[str, Any] = {
    "bos_token_id": 151643, "pad_token_id": 151643, "do_sample": True,
    "eos_token_id": [151645, 151643], "repetition_penalty": 1.05, "temperature": 0.7,
    "top_p": 0.8, "top_k": 20,
}

#: Llama-3's pre-tokeniser regex (``mmoa_demo.tiny_model`` copies it) and Qwen2's (the same
#: but one digit a piece).
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _llama3_specials() -> tuple[tuple[str, bool], ...]:
    """Meta-Llama-3's 256 special tokens, ids 128000-128255 in order (Llama-3, not 3.1: no
    ``<|eom_id|>``; LLaMA-Factory's llama3 template adds it as a stop word, as with the real
    tokenizer)."""
    named = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>",
             7: "<|end_header_id|>", 9: "<|eot_id|>"}
    out, reserved = [], 0
    for offset in range(256):
        if offset in named:
            out.append((named[offset], True))
        else:
            out.append((f"<|reserved_special_token_{reserved}|>", True))
            reserved += 1
    return tuple(out)


#: Qwen2.5's 22 added tokens from id 151643 (special or not, as its tokenizer_config.json).
QWEN2_5_SPECIALS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True),
    ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False),
    ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)

#: ChatML as LLaMA-Factory's ``qwen`` template writes it (its default system prompt).
QWEN_CHAT_TEMPLATE = """
{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. '
        + 'You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if not (loop.first and message['role'] == 'system') %}
        {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
""".strip()


@dataclass(frozen=True)
class ModelShape:
    """One real model's shape: its published configs and its tokenizer's layout."""

    name: str
    title: str
    source: str
    config: dict[str, Any]
    generation: dict[str, Any]
    #: LLaMA-Factory template the real configs use with this model
    template: str
    split_pattern: str
    #: id of the first special token; ids below it are BPE tokens and fillers
    first_special_id: int
    specials: tuple[tuple[str, bool], ...]
    bos_token: str | None
    eos_token: str
    pad_token: str | None
    #: the tokenizer prepends bos to an encoded text (Llama-3 does, Qwen2 does not)
    adds_bos: bool
    chat_template: str
    #: the published parameter count (checked against the config by the tests)
    num_parameters: int

    @property
    def tokenizer_size(self) -> int:
        return self.first_special_id + len(self.specials)


def _llama3_chat_template() -> str:
    from mmoa_demo.tiny_model import LLAMA3_CHAT_TEMPLATE

    return LLAMA3_CHAT_TEMPLATE


SHAPES: dict[str, ModelShape] = {
    "llama3_8b": ModelShape(
        "llama3_8b", "Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B-Instruct",
        LLAMA3_8B_INSTRUCT_CONFIG, LLAMA3_8B_INSTRUCT_GENERATION, "llama3", LLAMA3_SPLIT,
        128000, _llama3_specials(), "<|begin_of_text|>", "<|eot_id|>", None, True, "llama3",
        8_030_261_248),
    "qwen2_5_7b": ModelShape(
        "qwen2_5_7b", "Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
        QWEN2_5_7B_INSTRUCT_CONFIG, QWEN2_5_7B_INSTRUCT_GENERATION, "qwen", QWEN2_SPLIT,
        151643, QWEN2_5_SPECIALS, None, "<|im_end|>", "<|endoftext|>", False,
        QWEN_CHAT_TEMPLATE, 7_615_616_512),
}


def chat_template(shape: ModelShape) -> str:
    return _llama3_chat_template() if shape.chat_template == "llama3" else shape.chat_template


#: The miniature's head size, layers: width = heads / kv-heads x 16 (64 for Llama-3, 112 for
#: Qwen2.5), one key/value head.
MINI_HEAD_DIM = 16
MINI_LAYERS = 2


def miniature_config(config: dict[str, Any]) -> dict[str, Any]:
    """The same model at a toy size: vocabulary, model type, attention layout (query heads per
    key/value head), MLP ratio, biases, norms, rope and tying kept; one key/value head of 16,
    2 layers."""
    heads = config["num_attention_heads"] // config["num_key_value_heads"]
    hidden = heads * MINI_HEAD_DIM
    mini = dict(config)
    mini.update({
        "hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": 1,
        "intermediate_size": round(hidden * config["intermediate_size"]
                                   / config["hidden_size"]),
        "num_hidden_layers": MINI_LAYERS,
    })
    if "max_window_layers" in mini:
        mini["max_window_layers"] = MINI_LAYERS
    return mini


# --------------------------------------------------------------------------------------------
# the model folder


def build_tokenizer(shape: ModelShape, texts: list[str], extra_texts: list[str],
                    bpe_vocab: int = BPE_VOCAB) -> Any:
    """A byte-level BPE learnt from ``texts`` (+ the prompts' wording, weighted as the tiny
    model's), filler tokens ``<rN>`` up to the shape's first special id, then its special tokens
    at their real ids: ``len(tokenizer)`` is the real tokenizer's. The fillers are ordinary
    tokens no merge produces: encoding never yields them, a random model samples them (and
    they decode to text, as a real model's rare tokens do)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    from mmoa_demo.tiny_model import CHAT_HEADER_TEXTS, TinyModelConfig

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(shape.split_pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(bpe_vocab, shape.first_special_id),
                                  min_frequency=2, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)

    def weighted():
        yield from texts
        for _ in range(TinyModelConfig.extra_text_weight):
            yield from CHAT_HEADER_TEXTS
            yield from extra_texts

    backend.train_from_iterator(weighted(), trainer=trainer)
    state = json.loads(backend.to_str())
    vocab: dict[str, int] = state["model"]["vocab"]
    learnt = len(vocab)
    for index in range(learnt, shape.first_special_id):
        vocab[f"<r{index}>"] = index
    backend = Tokenizer.from_str(json.dumps(state))
    for token, special in shape.specials:  # one at a time: each gets the next id
        added = AddedToken(token, special=special, normalized=False)
        if special:
            backend.add_special_tokens([added])
        else:
            backend.add_tokens([added])
    first, last = shape.specials[0][0], shape.specials[-1][0]
    if backend.token_to_id(first) != shape.first_special_id or \
            backend.token_to_id(last) != shape.tokenizer_size - 1:
        raise RuntimeError(f"{shape.name}: special ids {backend.token_to_id(first)}.."
                           f"{backend.token_to_id(last)}, expected {shape.first_special_id}.."
                           f"{shape.tokenizer_size - 1}")
    if shape.adds_bos:
        bos_id = backend.token_to_id(shape.bos_token)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{shape.bos_token} $A", pair=f"{shape.bos_token} $A {shape.bos_token}:1 $B:1",
            special_tokens=[(shape.bos_token, bos_id)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=shape.bos_token, eos_token=shape.eos_token,
        pad_token=shape.pad_token, clean_up_tokenization_spaces=False,
        model_max_length=shape.config["max_position_embeddings"])
    tokenizer.chat_template = chat_template(shape)
    tokenizer.init_kwargs["mmoa_bpe_tokens"] = learnt
    return tokenizer


def demo_texts(texts_dir: Path) -> tuple[list[str], list[str]]:
    from mmoa_demo.tiny_model import default_extra_texts, default_text_files, texts_from_jsonl

    return texts_from_jsonl(default_text_files(texts_dir)), default_extra_texts()


def make_model_folder(shape: ModelShape, scale: str, texts_dir: Path, out: Path, device: str,
                      dtype: str, seed: int = SEED) -> dict[str, Any]:
    """``out``: the shape's config (or its miniature), generation config and tokenizer, then
    random weights made on ``device`` in ``dtype``; returns what was made and how long it
    took."""
    import shutil

    sys.path.insert(0, str(HERE))
    from init_weights import init_weights

    started = time.time()
    config = dict(shape.config) if scale == "full" else miniature_config(shape.config)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    texts, extra = demo_texts(texts_dir)
    tokenizer = build_tokenizer(shape, texts, extra)
    tokenizer.save_pretrained(out)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(shape.generation, indent=2) + "\n")
    tokenizer_s = time.time() - started
    count = init_weights(out, "causal_lm", seed, device, dtype)
    weights_bytes = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    return {
        "shape": shape.name, "title": shape.title, "source": shape.source, "scale": scale,
        "template": shape.template, "config": {k: config[k] for k in (
            "model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
            "num_attention_heads", "num_key_value_heads", "vocab_size")},
        "num_parameters": count, "published_parameters": shape.num_parameters,
        "tokenizer_size": len(tokenizer), "bpe_tokens": tokenizer.init_kwargs["mmoa_bpe_tokens"],
        "weights_device": device, "weights_dtype": dtype,
        "weights_gib": round(weights_bytes / 2**30, 3),
        "tokenizer_s": round(tokenizer_s, 2),
        "init_and_save_s": round(time.time() - started - tokenizer_s, 2),
    }


# --------------------------------------------------------------------------------------------
# MAPPO / GRPO at the shape: the trainer's own step, then the rollout-batch sweep


def _bench_module(name: str) -> Any:
    bench = ROOT / "bench"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location(f"_gpu_check_{name}", bench / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cuda_peaks() -> dict[str, float] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return {"max_allocated_mib": round(torch.cuda.max_memory_allocated() / MIB, 1),
            "max_reserved_mib": round(torch.cuda.max_memory_reserved() / MIB, 1)}


def _steps_memory() -> dict[str, float] | None:
    """What the caching allocator holds right after the measured steps (it never gives memory
    back unless emptied, so this is what the steps reserved) and the card's size."""
    import torch

    if not torch.cuda.is_available():
        return None
    return {"reserved_after_steps_mib": round(torch.cuda.memory_reserved() / MIB, 1),
            "device_total_mib": round(torch.cuda.get_device_properties(0).total_memory / MIB)}


def _reset_peaks() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def rollout_tokens_per_s(figures: dict[str, Any]) -> float | None:
    generate = figures["phases_s"].get("generate") or 0.0
    return round(figures["response_tokens_per_step"] / generate, 1) if generate > 0 else None


def sweep_rollouts(trainer: Any, questions: list[int], budget_s: float, cache: str
                   ) -> dict[str, Any]:
    """The largest rollout batch that fits: for each number of questions ``q`` (ascending),
    one rollout of the step's pipeline with every agent's ``generate`` over all ``q``
    questions at once (``mappo_rollout_batch_size`` = ``q`` x the group), its seconds, tokens
    and peak CUDA memory. Stops at the first out-of-memory, or before a ``q`` whose rollout
    would not end within ``budget_s`` (projected from the last one, linear in ``q``).

    Only the rollout grows with the batch: scoring and the update run in passes of
    ``mappo_forward_batch_size`` and ``per_device_train_batch_size`` samples whatever
    ``mappo_questions_per_rollout`` is; their peak is the measured steps'."""
    import torch

    group = trainer.mappo_args.rollouts_per_question
    saved = (trainer.questions_per_step, trainer.mappo_args.mappo_rollout_batch_size,
             trainer.mappo_args.mappo_generation_cache)
    trainer.mappo_args.mappo_generation_cache = cache
    rows: list[dict[str, Any]] = []
    started = time.time()
    stopped = "every size asked for ran"
    try:
        for q in sorted(set(questions)):
            left = budget_s - (time.time() - started)
            last = rows[-1] if rows else None
            if last is not None:
                projected = last["rollout_s"] * q / last["questions"]
                if projected > left:
                    stopped = (f"time: {q} questions would take about {projected:.0f} s, "
                               f"{left:.0f} s of the sweep's budget left")
                    break
            trainer.questions_per_step = q
            trainer.mappo_args.mappo_rollout_batch_size = q * group
            records = trainer.step_records(0)
            _reset_peaks()
            t0 = time.perf_counter()
            try:
                with trainer.accelerator.autocast():
                    traces, timings = trainer.rollout(records)
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            except torch.OutOfMemoryError as err:
                rows.append({"questions": q, "status": "oom", "error": str(err)[:300],
                             **(_cuda_peaks() or {})})
                stopped = f"out of memory at {q} questions"
                _reset_peaks()
                break
            seconds = time.perf_counter() - t0
            samples, _ = trainer.make_samples(records, traces)
            response = sum(len(s.response_ids) for s in samples)
            rows.append({
                "questions": q, "rows_per_generate": q * group, "status": "ok",
                "rollout_s": round(seconds, 3), "generate_s": round(timings.generate, 3),
                "retrieve_s": round(timings.retrieve, 3), "samples": len(samples),
                "prompt_tokens": sum(len(s.prompt_ids) for s in samples),
                "response_tokens": response,
                "rollout_tokens_per_s": round(response / timings.generate, 1)
                if timings.generate > 0 else None,
                **(_cuda_peaks() or {})})
            del traces, samples
    finally:
        (trainer.questions_per_step, trainer.mappo_args.mappo_rollout_batch_size,
         trainer.mappo_args.mappo_generation_cache) = saved
    fitted = [r["questions"] for r in rows if r["status"] == "ok"]
    return {"cache": cache, "budget_s": budget_s, "wall_s": round(time.time() - started, 1),
            "rows": rows, "largest_fitting_questions": max(fitted) if fitted else None,
            "stopped": stopped}


def sweep_vs_steps(sweep: dict[str, Any], per_cache: dict[str, dict[str, Any]],
                   rollout_batch: int) -> dict[str, Any]:
    """The sweep's cache against the steps' caches, per response token, at the steps' own
    generate batch (the sweep's row with ``rollout_batch`` rows a generate call), and the step
    time the sweep's cache would give (the steps' score and update, that generate)."""
    row = next((r for r in sweep["rows"] if r["status"] == "ok"
                and r["rows_per_generate"] == rollout_batch and r["response_tokens"]), None)
    if row is None:
        return {}
    per_token = row["generate_s"] / row["response_tokens"]
    out: dict[str, Any] = {"sweep_cache_at_recipe_batch": {
        "cache": sweep["cache"], "rows_per_generate": rollout_batch,
        "generate_s_per_response_token": round(per_token, 5),
        "rollout_tokens_per_s": row["rollout_tokens_per_s"]}}
    for cache, figures in per_cache.items():
        if cache == sweep["cache"] or not figures["response_tokens_per_step"]:
            continue
        theirs = figures["phases_s"]["generate"] / figures["response_tokens_per_step"]
        out["sweep_cache_at_recipe_batch"][f"generate_speedup_{cache}"] = round(
            per_token / theirs, 3) if theirs > 0 else None
        out["sweep_cache_at_recipe_batch"][f"step_s_estimate_vs_{cache}"] = round(
            figures["mappo_step_s"] - figures["phases_s"]["generate"]
            + per_token * figures["response_tokens_per_step"], 3)
    return out


def run_rl(args: argparse.Namespace) -> dict[str, Any]:
    """MAPPO (or GRPO) at the shape: ``bench/mappo_step.py``'s measured steps on one trainer,
    each KV cache in turn, then :func:`sweep_rollouts`."""
    mappo_step = _bench_module("mappo_step")
    caches = mappo_step._caches(args.generation_cache)
    bench_args = argparse.Namespace(
        config=args.config, model=args.model, finetuning_type=None, precision=args.precision,
        dataset_dir=args.dataset_dir, retriever_url=args.retriever_url, steps=args.steps,
        questions=None, ppo_epochs=None, learning_rate=None, skip_memory=True,
        skip_baseline=not args.baseline, generation_cache=caches,
        set=[f"template={args.template}", f"dataset={args.dataset}", *args.set])
    started = time.time()
    _reset_peaks()
    runs, warmups, trainer = mappo_step.run_mappo_steps(bench_args)
    steps_memory = _steps_memory()
    per_cache = {}
    for cache, logs in runs.items():
        figures = {**mappo_step.summarise(logs, bench_args.skip_baseline),
                   "warmup_step_s": round(warmups[cache], 3)}
        figures["rollout_tokens_per_s"] = rollout_tokens_per_s(figures)
        figures["steps_per_hour"] = round(3600 / figures["mappo_step_s"], 1) \
            if figures["mappo_step_s"] else None
        per_cache[cache] = figures
    result: dict[str, Any] = {
        "config": args.config, "model_template": args.template, "overrides": bench_args.set,
        "algorithm": trainer.mappo_args.mappo_algorithm,
        "questions_per_step": trainer.questions_per_step,
        "rollout_batch_size": trainer.mappo_args.mappo_rollout_batch_size,
        "samples_per_step": next(iter(per_cache.values()))["samples_per_step"],
        "ppo_epochs": trainer.ppo_config.ppo_epochs,
        "mini_batch_size": trainer.ppo_config.mini_batch_size,
        "forward_batch_size": trainer.ppo_config.forward_batch_size,
        "precision": args.precision, "measured_steps": args.steps,
        "generation_caches": per_cache,
        # the bench resets CUDA's peak before every step (so does the sweep before every row):
        # the steps' own peak, and what the allocator held after them, are these
        "steps_memory": steps_memory and {
            **steps_memory, "max_step_allocated_mib": max(
                (f["peak_step_gpu_mb"] or 0.0 for f in per_cache.values()), default=None)},
        "steps_wall_s": round(time.time() - started, 1),
    }
    if "dynamic" in per_cache and len(per_cache) > 1:
        result["generate_speedup_vs_dynamic"] = {
            cache: round(mappo_step._generate_per_token(per_cache["dynamic"])
                         / mappo_step._generate_per_token(figures), 3)
            for cache, figures in per_cache.items() if cache != "dynamic"}
    if args.sweep:
        sweep = result["sweep"] = sweep_rollouts(trainer, args.sweep, args.sweep_budget_s,
                                                 args.sweep_cache)
        result.update(sweep_vs_steps(sweep, per_cache,
                                     trainer.mappo_args.mappo_rollout_batch_size))
    import torch

    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        result["device_memory_mib"] = {"total": round(total / MIB),
                                       "free_at_end": round(free / MIB)}
    return result


# --------------------------------------------------------------------------------------------
# the stages of run_check.py


@dataclass(frozen=True)
class ShapeScale:
    """The overrides of the real configs at one scale of the check."""

    name: str
    #: SFT: LLaMA-Factory keys after the recipe's
    sft: tuple[str, ...]
    #: MAPPO / GRPO: ``--set`` keys of the measured trainer, and its measured steps
    mappo: tuple[str, ...]
    grpo: tuple[str, ...]
    steps: int
    mappo_caches: str
    grpo_caches: str
    sweep: tuple[int, ...]
    sweep_budget_s: float
    sweep_cache: str = "dynamic"


#: The GPU: the recipes as they are (LoRA rank 8 on all linear layers, micro-batch 4 x 8
#: accumulation, 32 MAPPO questions = 96 samples, 8 x 4 GRPO pipelines, K = 10, 100 / 32 / 100
#: new tokens); a few steps, no checkpoints, fewer data-loading workers. MAPPO's steps use the
#: static KV cache (the default on CUDA; one warm-up step with the compilation, one measured);
#: the dynamic cache is measured by the sweep's first row, a rollout with the recipe's own
#: generate batch (16 rows), which costs far less than two more full steps.
FULL = ShapeScale(
    "full",
    sft=("max_steps=4", "logging_steps=1", "save_steps=100000", "preprocessing_num_workers=4",
         "dataloader_num_workers=2", "include_num_input_tokens_seen=true"),
    mappo=(), grpo=(), steps=1, mappo_caches="static", grpo_caches="static",
    sweep=(16, 32, 64, 128, 256, 512, 1024), sweep_budget_s=75.0)
#: The CPU dry run: the same stages, a miniature model, one or two questions, a few tokens.
_MINI_RL = ("per_device_train_batch_size=2", "gradient_accumulation_steps=1", "ppo_epochs=1",
            "mappo_max_new_tokens_qr=8", "mappo_max_new_tokens_selector=6",
            "mappo_max_new_tokens_generator=6", "mappo_top_k=5")
MINI = ShapeScale(
    "mini",
    sft=("max_steps=2", "logging_steps=1", "save_steps=100000", "preprocessing_num_workers=1",
         "dataloader_num_workers=0", "per_device_train_batch_size=2",
         "gradient_accumulation_steps=1", "include_num_input_tokens_seen=true"),
    mappo=(*_MINI_RL, "mappo_questions_per_rollout=2", "mappo_rollout_batch_size=2"),
    grpo=(*_MINI_RL, "mappo_questions_per_rollout=1", "mappo_group_size=2",
          "mappo_rollout_batch_size=2"),
    steps=1, mappo_caches="static,dynamic", grpo_caches="dynamic", sweep=(1, 2, 4),
    sweep_budget_s=30.0)
SCALES = {"full": FULL, "mini": MINI}


def shape_scale(run: Any) -> ShapeScale:
    """The run's scale (``--shape-scale``, default mini on the dry run, full on a GPU), with
    ``--sweep-questions`` / ``--sweep-budget-s`` where given."""
    name = getattr(run.args, "shape_scale", None) or (
        "mini" if run.device == "cpu" else "full")
    scale = SCALES[name]
    sweep = getattr(run.args, "sweep_questions", None)
    budget = getattr(run.args, "sweep_budget_s", None)
    if sweep is not None:
        scale = replace(scale, sweep=tuple(int(q) for q in sweep.split(",") if q.strip()))
    if budget is not None:
        scale = replace(scale, sweep_budget_s=float(budget))
    return scale


def model_folder(run: Any, shape: ModelShape) -> Path:
    return run.work / "models" / f"shape-{shape.name}"


def _python(*args: Any) -> list[str]:
    return [sys.executable, *map(str, args)]


def _model_cmd(shape: ModelShape) -> Callable[[Any], tuple[list[str], str]]:
    def command(run: Any) -> tuple[list[str], str]:
        dtype = "bfloat16" if run.precision == "bf16" else "float32"
        return _python(HERE / "recipe_shapes.py", "model", "--shape", shape.name, "--scale",
                       shape_scale(run).name, "--texts", run.demo, "--out",
                       model_folder(run, shape), "--device", run.device, "--dtype", dtype,
                       "--seed", SEED, "--json-out",
                       run.work / f"{shape.name}_model.json"), ""
    return command


def _sft_cmd(shape: ModelShape) -> Callable[[Any], tuple[list[str], str]]:
    def command(run: Any) -> tuple[list[str], str]:
        return ["bash", "LLaMA-Factory/run_sft.sh", RECIPES["sft"], f"seed={SEED}",
                f"model_name_or_path={model_folder(run, shape)}", f"template={shape.template}",
                "dataset=demo_sft", f"dataset_dir={run.data}",
                f"output_dir={run.saves(f'{shape.name}_sft')}", *run.train_precision,
                *shape_scale(run).sft], ""
    return command


def _rl_cmd(shape: ModelShape, kind: str) -> Callable[[Any], tuple[list[str], str]]:
    def command(run: Any) -> tuple[list[str], str]:
        scale = shape_scale(run)
        sets = (scale.mappo if kind == "mappo" else scale.grpo) + tuple(
            getattr(run.args, "shape_set", None) or ())
        sweep = () if kind != "mappo" or not scale.sweep else (
            "--sweep", ",".join(map(str, scale.sweep)), "--sweep-budget-s",
            scale.sweep_budget_s, "--sweep-cache", scale.sweep_cache)
        return _python(
            HERE / "recipe_shapes.py", "rl", "--config", RECIPES[kind], "--model",
            model_folder(run, shape), "--template", shape.template, "--dataset_dir", run.data,
            "--retriever_url", run.url, "--precision",
            "bf16" if run.precision == "bf16" else "fp32", "--steps", scale.steps,
            "--generation_cache", scale.mappo_caches if kind == "mappo" else scale.grpo_caches,
            *sweep, *(a for s in sets for a in ("--set", s)),
            "--json-out", run.work / f"{shape.name}_{kind}.json"), ""
    return command


def _cuda_processes(run: Any, stage: str) -> list[dict[str, Any]]:
    """The probe's CUDA records of a stage's processes (``probe/sitecustomize.py``), the
    allocator's retries and out-of-memory count included."""
    folder = run.work / "probes"
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("stage") != stage or not record.get("cuda_initialized"):
            continue
        out.append({k: record.get(k) for k in (
            "pid", "max_memory_allocated", "max_memory_reserved", "total_memory",
            "num_alloc_retries", "num_ooms")})
    return out


def _json_details(path_of: Callable[[Any], Path], key: str
                  ) -> Callable[[Any, Any], None]:
    def after(run: Any, result: Any) -> None:
        path = path_of(run)
        try:
            result.details[key] = json.loads(path.read_text())
        except (OSError, ValueError):
            result.details[key] = None
        result.details["shape_scale"] = shape_scale(run).name
        result.details["cuda_processes"] = _cuda_processes(run, result.name)
    return after


def trainer_log_records(path: Path) -> list[dict[str, Any]]:
    """The records of a ``trainer_log.jsonl`` (none where it is missing); a line cut off by a
    stopped run is passed over. One reader for this module's and run_check.py's stages."""
    records = []
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def sft_figures(output_dir: Path) -> dict[str, Any]:
    """LLaMA-Factory's own figures of an SFT run: its trainer log per step and its
    train_results.json; the steady step time from the log's elapsed times (whole seconds)
    after the first step."""
    # a step's line has a loss (the closing summary does not)
    log = [record for record in trainer_log_records(output_dir / "trainer_log.jsonl")
           if record.get("loss") is not None]
    out: dict[str, Any] = {"steps_logged": len(log)}
    results = output_dir / "train_results.json"
    if results.is_file():
        with contextlib.suppress(ValueError):
            out["train_results"] = json.loads(results.read_text())

    def seconds(text: str) -> float:
        parts = [float(x) for x in str(text).split(":")]
        return sum(v * 60 ** i for i, v in enumerate(reversed(parts)))

    if len(log) >= 2 and all("elapsed_time" in r for r in log):
        first, last = log[0], log[-1]
        steps = last["current_steps"] - first["current_steps"]
        if steps > 0:
            out["step_s_after_first"] = round(
                (seconds(last["elapsed_time"]) - seconds(first["elapsed_time"])) / steps, 2)
    tokens = [r for r in log if "total_tokens" in r]
    if tokens:
        out["tokens_seen"] = tokens[-1]["total_tokens"]
        out["tokens_per_step"] = round(tokens[-1]["total_tokens"]
                                       / max(tokens[-1]["current_steps"], 1))
    out["loss"] = [r.get("loss") for r in log]
    return out


def _sft_details(shape: ModelShape) -> Callable[[Any, Any], None]:
    def after(run: Any, result: Any) -> None:
        figures = sft_figures(run.saves(f"{shape.name}_sft"))
        runtime = (figures.get("train_results") or {}).get("train_runtime")
        steps = figures["steps_logged"]
        if runtime and steps:
            figures["step_s_with_first"] = round(runtime / steps, 2)
        step = figures.get("step_s_after_first") or figures.get("step_s_with_first")
        if step:
            figures["steps_per_hour"] = round(3600 / step, 1)
        result.details["sft"] = figures
        result.details["shape_scale"] = shape_scale(run).name
        result.details["cuda_processes"] = _cuda_processes(run, result.name)
    return after


def stage_specs() -> list[dict[str, Any]]:
    """The optional stages for ``run_check.py``'s ``Stage(**spec)``: per shape its model
    folder, SFT, MAPPO (with the KV caches and the sweep) and GRPO."""
    specs: list[dict[str, Any]] = []
    for shape in SHAPES.values():
        name = shape.name
        specs += [
            dict(name=f"{name}_model", weight=3, expects_gpu=True, needs=("world",),
                 command=_model_cmd(shape), optional=True,
                 after=_json_details(lambda r, n=name: r.work / f"{n}_model.json", "model")),
            dict(name=f"{name}_sft", weight=5, expects_gpu=True,
                 needs=("sft_data", f"{name}_model"), command=_sft_cmd(shape), optional=True,
                 after=_sft_details(shape)),
            dict(name=f"{name}_mappo", weight=14, expects_gpu=True,
                 needs=("mappo_data", "server", f"{name}_model"), command=_rl_cmd(shape, "mappo"),
                 optional=True,
                 after=_json_details(lambda r, n=name: r.work / f"{n}_mappo.json", "recipe")),
            dict(name=f"{name}_grpo", weight=6, expects_gpu=True,
                 needs=("mappo_data", "server", f"{name}_model"), command=_rl_cmd(shape, "grpo"),
                 optional=True,
                 after=_json_details(lambda r, n=name: r.work / f"{n}_grpo.json", "recipe")),
        ]
    return specs


# --------------------------------------------------------------------------------------------
# the planning table


@dataclass
class PlanRow:
    recipe: str
    peak_allocated_gib: float | None = None
    peak_reserved_gib: float | None = None
    step_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def steps_per_hour(self) -> float | None:
        return round(3600 / self.step_s, 1) if self.step_s else None


def plan_rows(summary: dict[str, Any]) -> list[PlanRow]:
    """One row per shape stage of a check's summary: peak CUDA memory of its processes and the
    seconds a step (MAPPO/GRPO: the static cache's measured step where measured)."""
    rows = []
    for stage in summary.get("stages", []):
        name = stage["name"]
        if not any(name.startswith(f"{s}_") for s in SHAPES) or name.endswith("_model"):
            continue
        row = PlanRow(name)
        if stage.get("peak_cuda_allocated_mib") is not None:
            row.peak_allocated_gib = round(stage["peak_cuda_allocated_mib"] / 1024, 1)
            row.peak_reserved_gib = round((stage.get("peak_cuda_reserved_mib") or 0) / 1024, 1)
        details = stage.get("details", {})
        if "sft" in details:
            row.step_s = details["sft"].get("step_s_after_first") or \
                details["sft"].get("step_s_with_first")
        recipe = details.get("recipe") or {}
        memory = recipe.get("steps_memory") or {}
        if memory.get("max_step_allocated_mib"):  # the steps' own peak (see run_rl)
            row.peak_allocated_gib = round(memory["max_step_allocated_mib"] / 1024, 1)
            row.peak_reserved_gib = round(memory["reserved_after_steps_mib"] / 1024, 1)
        caches = recipe.get("generation_caches") or {}
        for cache in ("static", "dynamic"):
            if cache in caches:
                row.step_s = caches[cache]["mappo_step_s"]
                row.extra = {"cache": cache, **caches[cache]["phases_s"],
                             "rollout_tokens_per_s": caches[cache].get("rollout_tokens_per_s")}
                break
        if "sweep" in recipe:
            row.extra["largest_rollout_questions"] = recipe["sweep"]["largest_fitting_questions"]
        rows.append(row)
    return rows


def paper_hours(step_s: float, questions: int = 90_447, questions_per_step: int = 32,
                gpus: int = 8) -> dict[str, float]:
    """The paper's MAPPO setting projected: one epoch over ``questions`` HotpotQA training
    questions, ``questions_per_step`` per GPU and step on ``gpus`` GPUs (one process each,
    every process rolling out its own questions, so a step takes about one GPU's step time):
    steps = ceil(questions / (questions_per_step x gpus)), hours = steps x step_s / 3600. The
    paper's authors report about one day on 8 A800s (reference/mmoa-rag.md, issue #5)."""
    steps = math.ceil(questions / (questions_per_step * gpus))
    return {"steps": steps, "hours": round(steps * step_s / 3600, 2), "gpus": gpus}


def print_table(summary: dict[str, Any]) -> None:
    print(f"{'recipe stage':22s} {'alloc GiB':>9s} {'resv GiB':>9s} {'s/step':>8s} "
          f"{'steps/h':>8s}  more")
    for row in plan_rows(summary):
        def fmt(value: Any, width: int) -> str:
            return f"{'-' if value is None else value:>{width}}"
        print(f"{row.recipe:22s} {fmt(row.peak_allocated_gib, 9)} {fmt(row.peak_reserved_gib, 9)}"
              f" {fmt(row.step_s, 8)} {fmt(row.steps_per_hour, 8)}  "
              f"{json.dumps(row.extra) if row.extra else ''}")


# --------------------------------------------------------------------------------------------
# command line


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    model = sub.add_parser("model", help="make a shape's model folder with random weights")
    model.add_argument("--shape", choices=tuple(SHAPES), required=True)
    model.add_argument("--scale", choices=("full", "mini"), default="full")
    model.add_argument("--texts", type=Path, required=True,
                       help="folder of *.jsonl files the tokenizer learns from (the demo world)")
    model.add_argument("--out", type=Path, required=True)
    model.add_argument("--device", default="cpu")
    model.add_argument("--dtype", default="float32")
    model.add_argument("--seed", type=int, default=SEED)
    model.add_argument("--json-out", type=Path)
    rl = sub.add_parser("rl", help="MAPPO or GRPO steps of a real config at the shape")
    rl.add_argument("--config", required=True)
    rl.add_argument("--model", required=True)
    rl.add_argument("--template", required=True)
    rl.add_argument("--dataset", default="demo_mappo")
    rl.add_argument("--dataset_dir", required=True)
    rl.add_argument("--retriever_url", required=True)
    rl.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    rl.add_argument("--steps", type=int, default=1, help="measured steps per cache (after one "
                    "warm-up step each)")
    rl.add_argument("--generation_cache", default="static,dynamic")
    rl.add_argument("--baseline", action="store_true",
                    help="also time plain generate + forward/backward on the same tokens")
    rl.add_argument("--sweep", type=lambda v: [int(q) for q in v.split(",") if q.strip()],
                    default=[], help="questions per rollout to try, e.g. 32,64,128")
    rl.add_argument("--sweep-budget-s", type=float, default=100.0)
    rl.add_argument("--sweep-cache", default="dynamic")
    rl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    rl.add_argument("--json-out", type=Path)
    table = sub.add_parser("table", help="the planning table of a check's summary JSON")
    table.add_argument("summary", type=Path)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    for folder in (ROOT / "LLaMA-Factory" / "src", ROOT):
        if str(folder) not in sys.path:
            sys.path.insert(0, str(folder))
    if args.command == "table":
        summary = json.loads(args.summary.read_text())
        print_table(summary.get("result", summary))
        return 0
    if args.command == "model":
        result = make_model_folder(SHAPES[args.shape], args.scale, args.texts, args.out,
                                   args.device, args.dtype, args.seed)
    else:
        result = run_rl(args)
    text = json.dumps(result, indent=1)
    print(text, flush=True)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
