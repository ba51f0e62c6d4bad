"""The trainable query encoder and the frozen passage vectors it is scored against.

The policy embeds queries exactly as the server's :class:`~mmoa.retrieval.encoder.Encoder`
does (same tokenizer settings, same :func:`~mmoa.retrieval.encoder.pool_hidden`), but with
gradients, and in eval mode (no dropout): the PPO ratio compares two evaluations of the same
weights, and dropout noise would show up as a policy change. Passage vectors are read from the
index that the server serves (``index.faiss``, never re-encoded), so the scores recomputed here
are the server's scores up to float rounding.
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmoa.retrieval.encoder import (
    EncoderConfig,
    check_missing_tensors,
    check_tokenizer,
    pool_hidden,
    resolve_model_path,
)
from mmoa.retrieval.index import INDEX_FILE, META_FILE, IndexMeta, encoder_config_from_meta

#: Files of a sentence-transformers folder that ``save_pretrained`` does not write; copied from
#: the source encoder so a checkpoint stays loadable by sentence-transformers too.
_SENTENCE_TRANSFORMERS_FILES = ("modules.json", "config_sentence_transformers.json",
                                "sentence_bert_config.json", "1_Pooling")


class QueryEncoderPolicy(torch.nn.Module):
    """A transformers encoder (optionally wrapped in a peft LoRA) that embeds queries."""

    def __init__(self, config: EncoderConfig, finetuning: str = "lora", lora_rank: int = 32,
                 lora_alpha: int = 64, lora_dropout: float = 0.0,
                 lora_targets: Sequence[str] = ("query", "key", "value"),
                 device: str | torch.device = "cpu", sample_texts: Sequence[str] = ()
                 ) -> None:
        """``sample_texts`` (the run's questions) prove the tokenizer on real words.

        The encoder folder gets the checks the server's reload makes once it has loaded one
        (:func:`~mmoa.retrieval.encoder.check_missing_tensors`,
        :func:`~mmoa.retrieval.encoder.check_tokenizer`; an ``EncoderFolderError`` naming the
        file): without tokenizer files transformers builds a fallback tokenizer that turns the
        words into its unknown token, and a run trained every query to one vector, exit 0,
        recall 0.00."""
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        self.config = config
        self.source = resolve_model_path(config.model)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.source))
        model, info = AutoModel.from_pretrained(str(self.source), output_loading_info=True)
        check_missing_tensors(sorted(info.get("missing_keys") or ()), self.source)
        check_tokenizer(self.tokenizer, model.get_input_embeddings().num_embeddings,
                        config.max_length, self.source,
                        {p.name for p in self.source.iterdir() if p.is_file()}, sample_texts)
        self.finetuning = finetuning
        if finetuning == "lora":
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                              target_modules=list(lora_targets), bias="none")
            try:
                model = get_peft_model(model, lora)
            except ValueError as err:
                raise ValueError(f"retriever_lora_target {list(lora_targets)}: {err}") from err
        elif finetuning != "full":
            raise ValueError(f"finetuning must be 'lora' or 'full', got {finetuning!r}")
        self.model = model.to(device)
        self.model.eval()
        self.device = torch.device(device)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def embed(self, queries: Sequence[str]) -> torch.Tensor:
        """``[n, d]`` float32 query vectors, differentiable in the encoder's weights."""
        prefix = self.config.query_prefix
        texts = [prefix + q for q in queries] if prefix else list(queries)
        batch = self.tokenizer(texts, padding=True, truncation=True,
                               max_length=self.config.max_length, return_tensors="pt")
        batch = {k: v.to(self.device) for k, v in batch.items()}
        hidden = self.model(**batch).last_hidden_state
        return pool_hidden(hidden, batch["attention_mask"], self.config)

    # ------------------------------------------------------------------ saving, resuming

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The trained weights only (LoRA matrices, or the whole encoder): what resume loads."""
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()
                if k in names}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.trainable_state()) - set(state)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} trained tensors (e.g. "
                             f"{sorted(missing)[0]}); was it written with another "
                             f"retriever_finetuning or LoRA setting?")
        self.model.load_state_dict(state, strict=False)

    def save_encoder(self, folder: Path) -> None:
        """A plain transformers (and sentence-transformers) encoder folder with the trained
        weights (LoRA merged), loadable by the server's reload, ``build_index.py --encoder``
        and :class:`~mmoa.retrieval.encoder.Encoder`. ``folder`` must not exist yet (the
        caller writes into a temporary folder and renames it)."""
        model = self.model
        if self.finetuning == "lora":
            model = copy.deepcopy(model).merge_and_unload()
        model.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
        for name in _SENTENCE_TRANSFORMERS_FILES:
            source = self.source / name
            if source.is_dir():
                shutil.copytree(source, folder / name)
            elif source.is_file():
                shutil.copy2(source, folder / name)


def policy_config(index_dir: Path, encoder: str | None) -> EncoderConfig:
    """The index's encoder configuration (pooling, prefixes, ...), at ``encoder`` if given."""
    return encoder_config_from_meta(IndexMeta.read(Path(index_dir) / META_FILE), encoder)


class DocumentVectors:
    """The frozen passage vectors of an index folder, looked up by corpus row.

    ``index.faiss`` is memory-mapped where Faiss allows it (flat indexes), so a large index is
    not read into the trainer's memory; only the pool rows of each step are reconstructed.
    """

    def __init__(self, index_dir: Path) -> None:
        import faiss

        path = Path(index_dir) / INDEX_FILE
        if not path.is_file():
            raise FileNotFoundError(f"retriever_index: {path} not found (the index folder the "
                                    f"server serves)")
        try:
            index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        except RuntimeError:
            index = faiss.read_index(str(path))
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None:
            ivf.make_direct_map()
        self.index = index
        self.dim = int(index.d)
        self.size = int(index.ntotal)

    def get(self, rows: Sequence[int]) -> np.ndarray:
        """``[len(rows), dim]`` float32 vectors of the given corpus rows."""
        keys = np.asarray(rows, dtype=np.int64)
        if keys.size and (keys.min() < 0 or keys.max() >= self.size):
            raise ValueError(f"corpus rows must lie in 0..{self.size - 1}")
        try:
            return np.asarray(self.index.reconstruct_batch(keys), dtype=np.float32)
        except RuntimeError as err:
            raise ValueError(f"this index type cannot return its stored vectors ({err}); "
                             f"the retriever_rl stage needs a Flat, IVF or HNSW index") from err


def pool_tensors(vectors: DocumentVectors, pool_rows: Sequence[Sequence[int]],
                 device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Padded ``[n, P, d]`` pool vectors and their ``[n, P]`` validity mask."""
    width = max((len(r) for r in pool_rows), default=0)
    out = torch.zeros((len(pool_rows), width, vectors.dim), dtype=torch.float32)
    valid = torch.zeros((len(pool_rows), width), dtype=torch.bool)
    flat = [r for rows in pool_rows for r in rows]
    looked_up = torch.from_numpy(vectors.get(flat)) if flat else torch.zeros((0, vectors.dim))
    start = 0
    for i, rows in enumerate(pool_rows):
        out[i, :len(rows)] = looked_up[start:start + len(rows)]
        valid[i, :len(rows)] = True
        start += len(rows)
    return out.to(device), valid.to(device)
