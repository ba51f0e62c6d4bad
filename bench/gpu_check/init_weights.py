"""Random, seeded weights for a model folder that holds only its config and tokenizer.

    python bench/gpu_check/init_weights.py --model DIR --kind causal_lm|encoder [--seed 42]

The GPU check's bundle cannot carry real weights (SmolLM2's 98 MB GGUF, MiniLM's 88 MB, in a call
of 64 MiB), so the check runs every stage on the real architectures with random weights: shapes,
memory and kernels are the real ones, the answers are not. Writes ``DIR/model.safetensors``
(atomically; the folder's config and tokenizer files are left as they are) and prints the
parameter count. A folder that already has weights is left alone.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path


def init_weights(model_dir: Path, kind: str, seed: int) -> int:
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    if (model_dir / "model.safetensors").is_file():
        return -1
    config = AutoConfig.from_pretrained(str(model_dir))
    torch.manual_seed(seed)
    factory = AutoModelForCausalLM if kind == "causal_lm" else AutoModel
    model = factory.from_config(config, dtype=torch.float32)
    with tempfile.TemporaryDirectory(dir=model_dir, prefix=".init_") as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        weights = Path(tmp) / "model.safetensors"
        if not weights.is_file():
            raise RuntimeError(f"save_pretrained wrote no model.safetensors in {tmp}")
        shutil.move(str(weights), model_dir / "model.safetensors")
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, action="append",
                        help="model folder (repeatable)")
    parser.add_argument("--kind", choices=("causal_lm", "encoder"), required=True,
                        action="append", help="one per --model")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args(argv)
    if len(args.model) != len(args.kind):
        parser.error("give one --kind per --model")
    for model_dir, kind in zip(args.model, args.kind, strict=True):
        if not (model_dir / "config.json").is_file():
            print(f"init_weights.py: error: {model_dir} has no config.json", file=sys.stderr)
            return 2
        n = init_weights(model_dir, kind, args.seed)
        state = "kept (weights already there)" if n < 0 else f"{n / 1e6:.1f}M parameters"
        print(f"[init_weights] {model_dir} ({kind}): {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
