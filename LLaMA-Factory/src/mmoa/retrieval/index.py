"""Index folder: layout, metadata, validation and the in-process :class:`Retriever`.

An index folder holds three things that are only meaningful together::

    <index_dir>/index.faiss   Faiss index; vector i is corpus row i (inner-product metric)
    <index_dir>/corpus/       memory-mapped Arrow corpus store (see ``corpus.py``)
    <index_dir>/meta.json     encoder identity, pooling, dim, metric, factory, corpus size/checksum

Loading cross-checks all three and the encoder that will embed the queries, and refuses any
mismatch with a message saying which field differs: a query encoder that is not the one the
passages were encoded with does not fail, it just returns plausible-looking wrong passages.
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mmoa.retrieval.corpus import CorpusStore, Passage
from mmoa.retrieval.encoder import DEFAULT_ENCODER, Encoder, EncoderConfig, describe_encoder

logger = logging.getLogger(__name__)

INDEX_FILE = "index.faiss"
CORPUS_DIR = "corpus"
META_FILE = "meta.json"
META_VERSION = 1
METRIC = "inner_product"
#: The encoder fields that change the vectors; all must match between build and serve.
ENCODER_CHECKED_FIELDS = ("fingerprint", "dim", "pooling", "normalize", "query_prefix",
                          "passage_prefix", "max_length")


class IndexLoadError(RuntimeError):
    """Base class of the errors raised while opening an index folder."""


class IndexMissingError(IndexLoadError):
    """A file of the index folder is missing or unreadable."""


class IndexMismatchError(IndexLoadError):
    """The index, corpus, metadata or query encoder do not belong together."""


# ------------------------------------------------------------------------------- metadata


@dataclass
class IndexMeta:
    """Contents of ``meta.json``."""

    factory: str
    dim: int
    n_vectors: int
    corpus_size: int
    corpus_checksum: str
    encoder: dict[str, Any]
    metric: str = METRIC
    version: int = META_VERSION
    build: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version, "factory": self.factory, "metric": self.metric,
            "dim": self.dim, "n_vectors": self.n_vectors, "corpus_size": self.corpus_size,
            "corpus_checksum": self.corpus_checksum, "encoder": self.encoder,
            "build": self.build,
        }

    @classmethod
    def read(cls, path: Path) -> IndexMeta:
        if not path.is_file():
            raise IndexMissingError(f"{path}: index metadata missing; is this an index folder "
                                    f"written by data_builders/build_index.py?")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise IndexMissingError(f"{path}: not valid JSON ({err.msg})") from err
        required = ("factory", "dim", "n_vectors", "corpus_size", "corpus_checksum", "encoder")
        missing = [k for k in required if k not in raw]
        if missing:
            raise IndexMissingError(f"{path}: fields {missing} missing")
        if raw.get("version", META_VERSION) != META_VERSION:
            raise IndexMismatchError(f"{path}: metadata version {raw.get('version')} is not "
                                     f"{META_VERSION}; rebuild the index")
        if raw.get("metric", METRIC) != METRIC:
            raise IndexMismatchError(f"{path}: metric {raw.get('metric')!r}, expected {METRIC!r}")
        return cls(str(raw["factory"]), int(raw["dim"]), int(raw["n_vectors"]),
                   int(raw["corpus_size"]), str(raw["corpus_checksum"]), dict(raw["encoder"]),
                   str(raw.get("metric", METRIC)), META_VERSION, dict(raw.get("build", {})))


def read_index_header(path: Path) -> tuple[str, int, int, int] | None:
    """``(fourcc, d, ntotal, metric_type)`` from a Faiss file's header, without loading it.

    Every float index written by Faiss starts with the same header; reading 37 bytes lets the
    launcher reject a wrong index in milliseconds instead of after loading tens of GB.
    Returns ``None`` for layouts it does not know (binary indexes).
    """
    with path.open("rb") as handle:
        head = handle.read(37)
    if len(head) < 37:
        return None
    fourcc, d, ntotal, _, _, _, metric = struct.unpack_from("<4siqqq?i", head)
    if not (0 < d < 1 << 20 and 0 <= ntotal < 1 << 40 and metric in (0, 1)):
        return None
    return fourcc.decode("latin-1"), d, ntotal, metric


# ---------------------------------------------------------------------------- validation


def encoder_config_from_meta(meta: IndexMeta, model: str | None = None, **runtime: Any
                             ) -> EncoderConfig:
    """The encoder configuration an index was built with, optionally at another model path.

    ``runtime`` may set ``batch_size``, ``device`` and ``fp16``, which do not change vectors.
    """
    enc = meta.encoder
    return EncoderConfig(
        model=model or str(enc.get("path", DEFAULT_ENCODER)),
        pooling=str(enc.get("pooling", "mean")), normalize=bool(enc.get("normalize", True)),
        query_prefix=str(enc.get("query_prefix", "")),
        passage_prefix=str(enc.get("passage_prefix", "")),
        max_length=int(enc.get("max_length", 256)),
    ).with_overrides(**runtime)


def compare_encoder(meta: IndexMeta, identity: dict[str, Any]) -> list[str]:
    """Human-readable differences between the index's encoder and ``identity``."""
    problems = []
    for key in ENCODER_CHECKED_FIELDS:
        built, now = meta.encoder.get(key), identity.get(key)
        if key == "dim" and now is None:
            continue
        if built != now:
            problems.append(f"encoder {key}: index built with {built!r}, server would use {now!r}")
    return problems


def validate_index_dir(
    index_dir: Path, encoder: EncoderConfig | None = None, verify_corpus: bool = False,
    model: str | None = None,
) -> tuple[IndexMeta, EncoderConfig]:
    """Check an index folder without loading the index or the encoder weights.

    Raises :class:`IndexMissingError` or :class:`IndexMismatchError` with every problem found.
    Returns the metadata and the encoder configuration to serve with: ``encoder`` if given
    (it must match), else the recorded one, at the folder ``model`` when that is given (for an
    index built on another machine).
    """
    index_dir = Path(index_dir)
    if not index_dir.is_dir():
        raise IndexMissingError(f"{index_dir}: index folder not found "
                                f"(build one with data_builders/build_index.py)")
    meta = IndexMeta.read(index_dir / META_FILE)
    index_path = index_dir / INDEX_FILE
    if not index_path.is_file():
        raise IndexMissingError(f"{index_path}: Faiss index file missing")
    try:
        corpus = CorpusStore(index_dir / CORPUS_DIR)
    except (FileNotFoundError, ValueError) as err:
        raise IndexMissingError(str(err)) from err

    problems: list[str] = []
    header = read_index_header(index_path)
    if header is not None:
        _, d, ntotal, metric = header
        if d != meta.dim:
            problems.append(f"{index_path}: dimension {d}, meta.json says {meta.dim}")
        if ntotal != meta.n_vectors:
            problems.append(f"{index_path}: {ntotal} vectors, meta.json says {meta.n_vectors}")
        if metric != 0:
            problems.append(f"{index_path}: metric is not inner product")
    if meta.n_vectors != meta.corpus_size:
        problems.append(f"meta.json: {meta.n_vectors} vectors for {meta.corpus_size} passages")
    if len(corpus) != meta.corpus_size:
        problems.append(f"corpus store has {len(corpus)} passages, meta.json {meta.corpus_size}")
    if corpus.checksum != meta.corpus_checksum:
        problems.append(f"corpus checksum {corpus.checksum[:12]}… differs from the one the index "
                        f"was built on ({meta.corpus_checksum[:12]}…)")
    if verify_corpus and not problems:
        actual = corpus.compute_checksum(progress=True)
        if actual != meta.corpus_checksum:
            problems.append(f"corpus rows hash to {actual[:12]}…, meta.json says "
                            f"{meta.corpus_checksum[:12]}…; the store was modified")

    serve_config = encoder_config_from_meta(meta, model) if encoder is None else encoder
    try:
        identity = describe_encoder(serve_config)
    except FileNotFoundError as err:
        raise IndexMissingError(
            f"query encoder: {err}. The index was built with {meta.encoder.get('path')!r}; "
            f"pass the local folder of the same model with --encoder"
        ) from err
    problems += compare_encoder(meta, identity)
    if problems:
        raise IndexMismatchError(f"{index_dir}: refusing to serve this index:\n  - "
                                 + "\n  - ".join(problems))
    return meta, serve_config


# ------------------------------------------------------------------------------- faiss


@dataclass(frozen=True)
class FaissOptions:
    """How the index is placed and searched at serving time."""

    gpu: str = "auto"          # auto | on | off
    fp16: bool = False         # GPU copies store vectors in float16 (half the memory)
    shard: bool = False        # several GPUs: split the index instead of replicating it
    nprobe: int | None = None  # IVF: lists visited per query
    ef_search: int | None = None  # HNSW: search breadth
    omp_threads: int | None = None


def make_index(factory: str, dim: int) -> Any:
    """``faiss.index_factory`` with the inner-product metric and a clear error."""
    import faiss

    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise ValueError(f"invalid Faiss factory string {factory!r}: "
                         f"{str(err).splitlines()[-1]}") from err
    if isinstance(index, faiss.IndexIDMap | faiss.IndexIDMap2):
        raise ValueError(f"factory {factory!r}: IDMap is not supported; vector i is corpus row i")
    return index


def faiss_gpu_count() -> int:
    import faiss

    if not hasattr(faiss, "StandardGpuResources"):
        return 0
    return int(faiss.get_num_gpus())


def place_index(index: Any, options: FaissOptions) -> tuple[Any, str]:
    """Move the index to GPU(s) when wanted and possible; returns (index, placement)."""
    import faiss

    if options.omp_threads:
        faiss.omp_set_num_threads(options.omp_threads)
    n_gpus = faiss_gpu_count() if options.gpu != "off" else 0
    if options.gpu == "on" and n_gpus == 0:
        raise RuntimeError("--faiss-gpu on, but this faiss build has no GPU support or no GPU "
                           "is visible (install faiss-gpu instead of faiss-cpu)")
    placement = "cpu"
    if n_gpus:
        try:
            if n_gpus == 1:
                opts = faiss.GpuClonerOptions()
                opts.useFloat16 = options.fp16
                index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index, opts)
            else:
                opts = faiss.GpuMultipleClonerOptions()
                opts.useFloat16 = options.fp16
                opts.shard = options.shard
                index = faiss.index_cpu_to_all_gpus(index, co=opts)
            placement = f"gpu x{n_gpus}" + (" fp16" if options.fp16 else "")
        except RuntimeError as err:  # e.g. HNSW has no GPU implementation
            if options.gpu == "on":
                raise
            logger.warning("index stays on CPU: %s", str(err).splitlines()[-1])
    params = faiss.GpuParameterSpace() if placement != "cpu" else faiss.ParameterSpace()
    for name, value in (("nprobe", options.nprobe), ("efSearch", options.ef_search)):
        if value is not None:
            try:
                params.set_index_parameter(index, name, value)
            except RuntimeError as err:
                raise ValueError(f"cannot set {name}={value} on this index type: "
                                 f"{str(err).splitlines()[-1]}") from err
    return index, placement


# ---------------------------------------------------------------------------- retriever


class Retriever:
    """Encoder + Faiss index + corpus store; the in-process search every server batch runs.

    Not itself thread-safe: the server serialises calls through its micro-batcher (or a lock).
    """

    def __init__(self, index_dir: Path, meta: IndexMeta, encoder: Encoder, index: Any,
                 corpus: CorpusStore, placement: str = "cpu") -> None:
        self.index_dir = index_dir
        self.meta = meta
        self.encoder = encoder
        self.index = index
        self.corpus = corpus
        self.placement = placement

    @classmethod
    def load(cls, index_dir: str | os.PathLike[str], encoder: EncoderConfig | None = None,
             faiss_options: FaissOptions | None = None, verify_corpus: bool = False,
             model: str | None = None, **encoder_runtime: Any) -> Retriever:
        """Validate and open an index folder.

        ``encoder`` defaults to the configuration recorded at build time (``model`` relocates
        its weights folder); ``encoder_runtime`` (``batch_size``, ``device``, ``fp16``) tunes
        it without changing the vectors.
        """
        import faiss

        index_dir = Path(index_dir)
        meta, config = validate_index_dir(index_dir, encoder, verify_corpus, model)
        config = config.with_overrides(**encoder_runtime)
        corpus = CorpusStore(index_dir / CORPUS_DIR)
        logger.info("loading %s (%s, %d vectors)", index_dir / INDEX_FILE, meta.factory,
                    meta.n_vectors)
        index = faiss.read_index(str(index_dir / INDEX_FILE))
        if index.d != meta.dim or index.ntotal != meta.n_vectors:
            raise IndexMismatchError(f"{index_dir / INDEX_FILE}: d={index.d}, "
                                     f"ntotal={index.ntotal}; meta.json says d={meta.dim}, "
                                     f"n={meta.n_vectors}")
        enc = Encoder(config)
        if enc.dim != meta.dim:
            raise IndexMismatchError(f"encoder {enc.name} gives {enc.dim}-d vectors, the index "
                                     f"holds {meta.dim}-d vectors")
        index, placement = place_index(index, faiss_options or FaissOptions())
        return cls(index_dir, meta, enc, index, corpus, placement)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Scores and corpus rows, both ``(len(queries), k)``; row -1 marks a missing hit."""
        return self.search_many([(queries, k)])[0]

    def search_many(self, requests: Sequence[tuple[Sequence[str], int]]
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Encode the queries of all ``requests`` as one batch, then search once per distinct k.

        Grouping by k (instead of one search at the largest k) keeps every request's result
        identical to searching it alone, also for HNSW where k widens the search.
        """
        queries = [q for qs, _ in requests for q in qs]
        vectors = self.encoder.encode_queries(queries)
        bounds = np.cumsum([0] + [len(qs) for qs, _ in requests])
        results: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(requests)
        for k in sorted({k for _, k in requests}):
            members = [i for i, (_, ki) in enumerate(requests) if ki == k]
            rows = np.concatenate([np.arange(bounds[i], bounds[i + 1]) for i in members])
            scores, ids = self.index.search(np.ascontiguousarray(vectors[rows]), k)
            offset = 0
            for i in members:
                n = int(bounds[i + 1] - bounds[i])
                results[i] = (scores[offset:offset + n], ids[offset:offset + n])
                offset += n
        return results  # type: ignore[return-value]

    def passages(self, rows: np.ndarray) -> list[list[Passage]]:
        """Passages for a ``(n, k)`` row matrix, dropping -1 (no hit)."""
        flat = [int(r) for r in rows.reshape(-1) if r >= 0]
        looked_up = iter(self.corpus.get(flat))
        return [[next(looked_up) for r in row if r >= 0] for row in rows]

    def retrieve(self, queries: Sequence[str], k: int) -> list[list[tuple[Passage, float]]]:
        """Top-``k`` ``(passage, score)`` pairs per query, best first."""
        scores, rows = self.search(queries, k)
        docs = self.passages(rows)
        return [list(zip(d, [float(s) for s, r in zip(sc, rw, strict=True) if r >= 0],
                         strict=True)) for d, sc, rw in zip(docs, scores, rows, strict=True)]

    def describe(self) -> dict[str, Any]:
        return {"corpus_size": len(self.corpus), "dim": self.meta.dim,
                "index_type": self.meta.factory, "index_class": type(self.index).__name__,
                "placement": self.placement, "metric": self.meta.metric,
                "encoder": {"name": self.encoder.name, "pooling": self.encoder.config.pooling,
                            "normalize": self.encoder.config.normalize,
                            "query_prefix": self.encoder.config.query_prefix,
                            "device": str(self.encoder.device)}}
