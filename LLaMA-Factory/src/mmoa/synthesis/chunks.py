"""Resumable synthesis: the questions in chunks, each chunk's labels kept on disk.

A search over a real model takes hours on a CPU (every play is a sampled generation, and the
Selector's reward runs a Generator), so a run that is stopped must not start again from the
first question. :func:`synthesise_in_chunks` searches ``chunk_size`` questions at a time
(batched across them as :func:`~mmoa.synthesis.builder.synthesise` does) and writes each
finished chunk to ``<folder>/<method>/chunk-NNNN.pkl`` with the random states after it; a rerun
loads the chunks whose key matches and goes on from the first missing one, restoring the
random states, so a resumed run gives the labels an uninterrupted one gives.

The key is everything the labels depend on: the command's settings (models, budget, search
constants, rewards, generation limits, precision, chunk size), a fingerprint of each model's
files (a retrained checkpoint at the same path invalidates its chunks) and the chunk's
questions. A chunk with another key is searched again and overwritten. The files are this
command's own pickles, written atomically; the folder is local working state, never shared
data.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from mmoa.data.records import QARecord
from mmoa.data.sft_builder import DocumentSearcher
from mmoa.fileio import atomic_path
from mmoa.synthesis.builder import QuestionSynthesis, ToaBuildConfig, synthesise
from mmoa.synthesis.policies import LocalModelPolicy
from mmoa.synthesis.rewards import AgentRewards

__all__ = ["ChunkCache", "check_chunk_size", "model_fingerprint", "synthesise_in_chunks"]

#: Bumped when the pickled layout changes, so old chunks are searched again, not misread.
CACHE_FORMAT = 1


def model_fingerprint(path: str | Path) -> list[tuple[str, int, int]]:
    """Name, size and modification time of the files directly in a model folder (what changes
    when a checkpoint is retrained in place); empty for a path that is not a folder."""
    folder = Path(path)
    if not folder.is_dir():
        return []
    stats = [(f.name, f.stat()) for f in folder.iterdir() if f.is_file()]
    return sorted((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats)


def check_chunk_size(chunk_size: int) -> None:
    """The one check of a chunk size (the command calls it before any model loads)."""
    if chunk_size < 1:
        raise ValueError(f"--chunk_size must be >= 1, got {chunk_size}")


def _records_digest(records: Sequence[QARecord]) -> str:
    text = json.dumps([[r.id, r.question, list(r.answers)] for r in records], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class ChunkCache:
    """The finished chunks of one run: ``settings`` must be JSON-serialisable and hold
    everything but the questions (each chunk's key adds its questions' digest)."""

    folder: Path
    settings: dict[str, Any]

    def path(self, method: str, index: int) -> Path:
        return self.folder / method / f"chunk-{index:04d}.pkl"

    def _key(self, records: Sequence[QARecord]) -> str:
        text = json.dumps({"format": CACHE_FORMAT, "settings": self.settings,
                           "questions": _records_digest(records)}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    def load(self, method: str, index: int, records: Sequence[QARecord]
             ) -> tuple[list[QuestionSynthesis], dict[str, Any]] | None:
        """The chunk's labels and the random states after it, or ``None`` when it is missing,
        unreadable or was made with other settings."""
        path = self.path(method, index)
        if not path.is_file():
            return None
        try:
            with path.open("rb") as handle:
                saved = pickle.load(handle)  # this command's own local file
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            return None
        if not isinstance(saved, dict) or saved.get("key") != self._key(records):
            return None
        return saved["items"], saved["state"]

    def save(self, method: str, index: int, records: Sequence[QARecord],
             items: list[QuestionSynthesis], state: dict[str, Any]) -> None:
        path = self.path(method, index)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_bytes(pickle.dumps({"key": self._key(records), "items": items,
                                          "state": state}, protocol=pickle.HIGHEST_PROTOCOL))


def synthesise_in_chunks(
    records: Sequence[QARecord],
    policy: LocalModelPolicy,
    rewards: AgentRewards,
    retriever: DocumentSearcher,
    config: ToaBuildConfig,
    chunk_size: int,
    cache: ChunkCache | None = None,
    log: Callable[[str], None] = print,
) -> list[QuestionSynthesis]:
    """:func:`~mmoa.synthesis.builder.synthesise` over ``chunk_size`` questions at a time.

    The candidate shuffle is one stream over all questions (as in one call), each task's tree
    seed is its index among all questions, and the policy's sampling stream continues from
    chunk to chunk; a chunk loaded from ``cache`` restores the streams as they were after it.
    """
    check_chunk_size(chunk_size)
    policy.reseed(config.seed)
    shuffle = random.Random(config.seed)
    chunks = [records[i:i + chunk_size] for i in range(0, len(records), chunk_size)]
    out: list[QuestionSynthesis] = []
    for index, chunk in enumerate(chunks):
        cached = cache.load(config.method, index, chunk) if cache is not None else None
        if cached is not None:
            items, state = cached
            shuffle.setstate(state["shuffle"])
            policy.restore_sampling_state(state["sampling"])
            log(f"{config.method}: chunk {index + 1}/{len(chunks)} ({len(chunk)} questions) "
                f"loaded from {cache.path(config.method, index)}")
        else:
            start = index * chunk_size
            search = replace(config.search, seed=config.search.seed + start)
            items = synthesise(chunk, policy, rewards, retriever,
                               replace(config, search=search), rng=shuffle)
            if cache is not None:
                cache.save(config.method, index, chunk, items,
                           {"shuffle": shuffle.getstate(),
                            "sampling": policy.sampling_state()})
            if len(chunks) > 1:
                log(f"{config.method}: chunk {index + 1}/{len(chunks)} done "
                    f"({start + len(chunk)} of {len(records)} questions)")
        out.extend(items)
    return out
