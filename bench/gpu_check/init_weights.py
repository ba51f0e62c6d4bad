"""Random, seeded weights for a model folder that holds only its config and tokenizer.

    python bench/gpu_check/init_weights.py --model DIR --kind causal_lm|encoder [--seed 42]
        [--device cuda --dtype bfloat16]

The GPU check's bundle cannot carry real weights (SmolLM2's 98 MB GGUF, MiniLM's 88 MB, in a call
of 64 MiB), so the check runs every stage on the real architectures with random weights: shapes,
memory and kernels are the real ones, the answers are not. Writes the weights into ``DIR``
(``model.safetensors``, or its shards and index where ``save_pretrained`` splits a large model;
atomically: the files are moved in only once all are written; the folder's config and tokenizer
files are left as they are, except the config's dtype, set to the dtype the weights were saved
in) and prints the parameter count. A folder that already has weights is left alone.

The config's dtype matters because transformers loads a model in it when the caller names none
(as llamafactory does for an fp32 run): a published config says ``bfloat16``, and float32
weights under it would be loaded and computed in bf16, which on a CPU without AVX-512 BF16 is
emulated and many times slower (the dry run's 8B-shape miniature: 13 s a step instead of
well under one).

``--device`` / ``--dtype``: where and in which dtype the weights are made. The recipe-shape check
(``recipe_shapes.py``) makes Llama-3-8B-sized models on the GPU directly in bf16 (16 GB: seconds
there, many minutes on a CPU); the default (CPU, float32) is what the check's small models use.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from mmoa.fileio import atomic_write_json

#: Files of the folder that ``save_pretrained`` rewrites but that belong to the folder (its own
#: config and generation config stay as they were written, but for the config's dtype).
KEPT_FILES = frozenset({"config.json", "generation_config.json"})
DTYPES = ("float32", "bfloat16", "float16")
#: The config keys transformers reads the default load dtype from (``dtype`` since 4.56).
CONFIG_DTYPE_KEYS = ("torch_dtype", "dtype")


def record_dtype(model_dir: Path, dtype: str) -> None:
    """Set ``config.json``'s dtype to ``dtype``: the keys it has, else ``torch_dtype``."""
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    for key in [k for k in CONFIG_DTYPE_KEYS if k in config] or [CONFIG_DTYPE_KEYS[0]]:
        config[key] = dtype
    atomic_write_json(path, config)


def has_weights(model_dir: Path) -> bool:
    return (model_dir / "model.safetensors").is_file() or \
        (model_dir / "model.safetensors.index.json").is_file()


def init_weights(model_dir: Path, kind: str, seed: int, device: str = "cpu",
                 dtype: str = "float32") -> int:
    """The folder's model with random weights from ``seed``, made on ``device`` in ``dtype``
    and saved there; its parameter count, or -1 when the folder already had weights."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    if has_weights(model_dir):
        return -1
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {DTYPES}")
    config = AutoConfig.from_pretrained(str(model_dir))
    torch.manual_seed(seed)  # every device's generator (CUDA's too)
    factory = AutoModelForCausalLM if kind == "causal_lm" else AutoModel
    with torch.device(device):
        model = factory.from_config(config, dtype=getattr(torch, dtype))
    count = sum(p.numel() for p in model.parameters())
    if device != "cpu":
        model.to("cpu")  # safetensors writes host memory
    with tempfile.TemporaryDirectory(dir=model_dir, prefix=".init_") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        written = [p for p in Path(tmp).iterdir()
                   if p.suffix == ".safetensors" or p.name == "model.safetensors.index.json"]
        if not any(p.suffix == ".safetensors" for p in written):
            raise RuntimeError(f"save_pretrained wrote no safetensors file in {tmp}")
        record_dtype(model_dir, dtype)
        # the shards first, the file that names them (or the single file) last: a folder
        # interrupted here has no index and so no weights, and is made again
        for path in sorted(written, key=lambda p: p.name in ("model.safetensors",
                                                             "model.safetensors.index.json")):
            if path.name not in KEPT_FILES:
                shutil.move(str(path), model_dir / path.name)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, action="append",
                        help="model folder (repeatable)")
    parser.add_argument("--kind", choices=("causal_lm", "encoder"), required=True,
                        action="append", help="one per --model")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--device", default="cpu", help="where the weights are made (cpu, "
                        "cuda, cuda:1 ...; default cpu)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="dtype of the weights made and saved (default float32)")
    args = parser.parse_args(argv)
    if len(args.model) != len(args.kind):
        parser.error("give one --kind per --model")
    for model_dir, kind in zip(args.model, args.kind, strict=True):
        if not (model_dir / "config.json").is_file():
            print(f"init_weights.py: error: {model_dir} has no config.json", file=sys.stderr)
            return 2
        started = time.time()
        n = init_weights(model_dir, kind, args.seed, args.device, args.dtype)
        state = "kept (weights already there)" if n < 0 else \
            f"{n / 1e6:.1f}M parameters ({args.dtype} on {args.device}, " \
            f"{time.time() - started:.1f} s)"
        print(f"[init_weights] {model_dir} ({kind}): {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
