"""The proof a reloaded query encoder gives before the server swaps it in.

A folder can pass every file check and still load an encoder that cannot work: NaN weights
(every vector NaN: Faiss answers every search with no hit, a 200 with empty lists), weights
that transformers filled at random, a tokenizer of another model. The server used to install
whatever loaded and find out from its users. Now the new encoder first answers the index's own
*canary queries*: the texts of a few passages spread over the corpus, searched as queries.
Its vectors must be finite, of the index's dimension and not all alike (different passages,
different vectors), every canary must get hits with finite scores, and enough canaries must
find their own passage among the top hits: at least a quarter as many as the encoder the
server started with finds (its figure is measured once, through the serving path). A trained
query encoder (the HARR stage) keeps finding them; a random one finds almost none.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Canary passages (evenly spread over the corpus) and the hits searched per canary.
CANARY_COUNT = 24
CANARY_K = 10
#: Longest canary text in characters (the tokenizer truncates anyway; this bounds the work).
CANARY_CHARS = 1000
#: A new encoder must find at least this share of what the start encoder finds.
CANARY_SHARE = 0.25

VectorSearch = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


class EncoderCanaryError(ValueError):
    """The loaded encoder failed the canary: ``reason`` says which check."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class CanaryResult:
    """What the canary found: ``hits`` of ``of`` canaries found their own passage."""

    hits: int
    of: int
    required: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"self_hits": self.hits, "canaries": self.of, "required": self.required,
                "seconds": round(self.seconds, 3)}


def canary_rows(n_rows: int, count: int = CANARY_COUNT) -> list[int]:
    """``count`` corpus rows spread evenly (deterministic: the same for every reload)."""
    if n_rows <= 0:
        return []
    count = min(count, n_rows)
    return sorted({int(i * n_rows / count) for i in range(count)})


def self_hits(rows: Sequence[int], ids: np.ndarray) -> int:
    """How many canaries (row ``rows[i]``'s text) found their own row among ``ids[i]``."""
    return sum(int(row in set(int(x) for x in found)) for row, found in zip(rows, ids,
                                                                            strict=True))


def required_hits(baseline: int | None) -> int:
    """Self-hits a new encoder needs: a quarter of the start encoder's (none when unknown)."""
    return math.ceil(CANARY_SHARE * baseline) if baseline else 0


def prove_encoder(encoder: Any, rows: Sequence[int], texts: Sequence[str], dim: int,
                  search: VectorSearch, baseline: int | None) -> CanaryResult:
    """Run the canary with ``encoder`` (an unserved :class:`~mmoa.retrieval.encoder.Encoder`)
    against the index (``search(vectors, k)``); raise :class:`EncoderCanaryError` naming the
    check that failed."""
    started = time.monotonic()
    try:
        vectors = encoder.encode_queries(list(texts))
    except Exception as err:  # what the weights/tokenizer make torch raise
        raise EncoderCanaryError(f"encoding the canary passages failed: "
                                 f"{type(err).__name__}: {err}") from err
    if vectors.shape != (len(texts), dim):
        raise EncoderCanaryError(f"vectors of shape {tuple(vectors.shape)}, expected "
                                 f"({len(texts)}, {dim})")
    finite = np.isfinite(vectors).all(axis=1)
    if not finite.all():
        raise EncoderCanaryError(f"{int((~finite).sum())} of {len(texts)} canary vectors hold "
                                 f"NaN or infinite values (NaN weights or config values?)")
    norms = np.linalg.norm(vectors, axis=1)
    if (norms == 0).any():
        raise EncoderCanaryError(f"{int((norms == 0).sum())} canary vectors are all zeros")
    if len(texts) > 1:
        spread = float(np.abs(vectors - vectors[0]).max())
        if spread <= 1e-6 * float(norms.max()):
            raise EncoderCanaryError(f"all {len(texts)} different canary passages give the "
                                     f"same vector (the encoder ignores its input)")
    scores, ids = search(np.ascontiguousarray(vectors, dtype=np.float32), CANARY_K)
    if (ids[:, 0] < 0).any():
        raise EncoderCanaryError(f"{int((ids[:, 0] < 0).sum())} canary searches found no "
                                 f"passage at all")
    if not np.isfinite(scores[ids >= 0]).all():
        raise EncoderCanaryError("canary searches gave scores that are not finite")
    hits = self_hits(rows, ids)
    need = required_hits(baseline)
    if hits < need:
        raise EncoderCanaryError(
            f"only {hits} of {len(rows)} canary passages, searched by their own text, found "
            f"themselves in the top {CANARY_K} (the encoder the server started with: "
            f"{baseline}; at least {need} needed): weights or tokenizer do not match the "
            f"index's passage vectors (random or missing weights, another model's tokenizer?)")
    return CanaryResult(hits, len(rows), need, time.monotonic() - started)
