"""A second query encoder for the reload probes and tests: a copy of a MiniLM folder with its
last layer perturbed.

Why: a reload is only observable when the new encoder scores differently; a perturbed copy has
the same dimension, pooling and tokenizer as the index's encoder (so the server accepts it) and
other scores, often another top-k. One definition, for ``server_probe.py`` and the tests.
"""

from __future__ import annotations

import shutil
from pathlib import Path

#: What is not copied: the ONNX export the torch encoder never reads.
SKIP_ONNX = shutil.ignore_patterns("onnx", "*.onnx")


def perturbed_encoder(source: Path, out: Path, *, seed: int = 0, scale: float = 0.05) -> Path:
    """Write ``source``'s encoder to ``out`` with ``scale`` x N(0, 1) noise (generator seeded with
    ``seed``) added to every parameter of its last layer; returns ``out``. An existing ``out``
    is replaced."""
    import torch
    from transformers import AutoModel

    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out, ignore=SKIP_ONNX)
    model = AutoModel.from_pretrained(str(source))
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for param in model.encoder.layer[-1].parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))
    model.save_pretrained(str(out))
    return out
