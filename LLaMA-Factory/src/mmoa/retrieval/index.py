"""Index folder: layout, metadata, validation and the in-process :class:`Retriever`.

An index folder holds three things that are only meaningful together::

    <index_dir>/index.faiss   Faiss index; vector i is corpus row i (inner-product metric)
    <index_dir>/corpus/       memory-mapped Arrow corpus store (see ``corpus.py``)
    <index_dir>/meta.json     encoder identity, pooling, dim, metric, factory, corpus size/checksum,
                              and the sha256 of every other file of the folder

Loading cross-checks all three and the encoder that will embed the queries, and refuses any
mismatch with a message saying which field differs: a query encoder that is not the one the
passages were encoded with does not fail, it just returns plausible-looking wrong passages.
Damaged files fail the same way (64 flipped bytes inside index.faiss still load, and change
the top-1 passage), so loading also re-hashes every file against the sha256 recorded at build
time, unless the caller skips it for an index too big to read through at every start.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from mmoa.fileio import sha256_file
from mmoa.retrieval.canary import (
    CANARY_CHARS,
    CANARY_K,
    CanaryResult,
    canary_rows,
    prove_encoder,
    self_hits,
)
from mmoa.retrieval.corpus import CorpusStore, Passage
from mmoa.retrieval.encoder import (
    DEFAULT_ENCODER,
    Encoder,
    EncoderConfig,
    EncoderFolderError,
    check_loaded,
    check_model_folder,
    check_parameters,
    describe_encoder,
    folder_identity,
    resolve_model_path,
    stage_model_folder,
    staging_folder,
)

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


class EncoderChangedError(EncoderFolderError):
    """The folder the server started with no longer holds the index's encoder."""


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
    #: sha256 of every file of the folder but meta.json, by path relative to the folder;
    #: empty for an index built before checksums were recorded.
    files: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version, "factory": self.factory, "metric": self.metric,
            "dim": self.dim, "n_vectors": self.n_vectors, "corpus_size": self.corpus_size,
            "corpus_checksum": self.corpus_checksum, "encoder": self.encoder,
            "build": self.build, "files": self.files,
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
                   str(raw.get("metric", METRIC)), META_VERSION, dict(raw.get("build", {})),
                   _read_file_checksums(path, raw.get("files", {})))


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def _read_file_checksums(path: Path, files: Any) -> dict[str, str]:
    """meta.json's ``files``: relative paths inside the folder mapped to sha256 hex digests."""
    if not isinstance(files, dict):
        raise IndexMissingError(f"{path}: field 'files' must map file names to sha256 digests, "
                                f"got {type(files).__name__}")
    for name, digest in files.items():
        parts = Path(name).parts
        if not parts or Path(name).is_absolute() or ".." in parts:
            raise IndexMissingError(f"{path}: field 'files' names {name!r}, which is not a "
                                    f"file inside the index folder")
        if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
            raise IndexMissingError(f"{path}: files[{name!r}] is not a sha256 hex digest")
    return dict(files)


# ------------------------------------------------------------------------------ checksums


def index_file_checksums(index_dir: Path) -> dict[str, str]:
    """sha256 of every file in ``index_dir`` except meta.json (which will record them)."""
    index_dir = Path(index_dir)
    files = sorted(p for p in index_dir.rglob("*")
                   if p.is_file() and p != index_dir / META_FILE)
    return {p.relative_to(index_dir).as_posix(): sha256_file(p) for p in files}


def verify_index_files(index_dir: Path, meta: IndexMeta, progress: bool = False) -> None:
    """Re-hash the files that meta.json records and refuse any that changed since the build.

    Raises :class:`IndexMissingError` for a recorded file that is gone or unreadable and
    :class:`IndexMismatchError`, in one line naming the files, for any whose sha256 differs.
    Reads the whole index (sha256 at about 1.3 GB/s: 50 s for 65 GB), so a bar shows above
    1 GiB.
    """
    index_dir = Path(index_dir)
    paths = {name: index_dir / name for name in sorted(meta.files)}
    sizes = {}
    for name, path in paths.items():
        try:
            sizes[name] = path.stat().st_size
        except OSError as err:
            raise IndexMissingError(f"{path}: {err.strerror or err}; meta.json records its "
                                    f"sha256, so it belongs to the index") from err
    total = sum(sizes.values())
    changed: list[tuple[Path, str, str]] = []
    with tqdm(total=total, unit="B", unit_scale=True, desc="verifying index sha256",
              disable=not progress or total < 1 << 30) as bar:
        for name, path in paths.items():
            try:
                actual = sha256_file(path, on_read=bar.update)
            except OSError as err:
                raise IndexMissingError(f"{path}: cannot be read ({err.strerror or err})"
                                        ) from err
            if actual != meta.files[name]:
                changed.append((path, actual, meta.files[name]))
    if len(changed) == 1:
        path, actual, recorded = changed[0]
        raise IndexMismatchError(
            f"{path}: sha256 {actual[:12]}… differs from {recorded[:12]}… recorded in "
            f"{META_FILE} at build time; the file is damaged or was changed after the build "
            f"(rebuild the index; the server's --skip-checksums serves it unverified)")
    if changed:
        raise IndexMismatchError(
            f"{', '.join(str(p) for p, _, _ in changed)}: sha256 differs from the one recorded "
            f"in {META_FILE} at build time; the files are damaged or were changed after the "
            f"build (rebuild the index; the server's --skip-checksums serves it unverified)")


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
    model: str | None = None, verify_checksums: bool = True, progress: bool = False,
) -> tuple[IndexMeta, EncoderConfig]:
    """Check an index folder without loading the index or the encoder weights.

    Raises :class:`IndexMissingError` or :class:`IndexMismatchError` with every problem found.
    ``verify_checksums`` re-hashes the files against meta.json's ``files`` (see
    :func:`verify_index_files`; nothing to do for an index built before they were recorded),
    after the checks that take milliseconds have passed.
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
    except EncoderFolderError as err:
        raise IndexMissingError(f"query encoder: {err}") from err
    problems += compare_encoder(meta, identity)
    if problems:
        raise IndexMismatchError(f"{index_dir}: refusing to serve this index:\n  - "
                                 + "\n  - ".join(problems))
    if verify_checksums:
        verify_index_files(index_dir, meta, progress)
    return meta, serve_config


def unverified_warning(index_dir: Path) -> str:
    """What to say when an index records no file checksums (built before they were)."""
    return (f"{Path(index_dir) / META_FILE} records no sha256 of the index files (built before "
            f"checksums were recorded), so damaged files cannot be detected; rebuild the index "
            f"with data_builders/build_index.py to record them")


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
                 corpus: CorpusStore, placement: str = "cpu", start_model: str | None = None
                 ) -> None:
        self.index_dir = index_dir
        self.meta = meta
        self.encoder = encoder
        #: The encoder folder the server started with (``--encoder`` or the one recorded in
        #: meta.json): what a reload without a path restores.
        self.start_model = start_model or encoder.config.model
        self.index = index
        self.corpus = corpus
        self.placement = placement
        #: One Faiss search at a time: the micro-batcher's and a reload's canary (GPU indexes
        #: are not thread-safe).
        self._index_lock = threading.Lock()
        #: Canaries the start encoder finds (:mod:`mmoa.retrieval.canary`); measured once.
        self.canary_baseline: int | None = None
        self._canary: tuple[list[int], list[str]] | None = None

    @classmethod
    def load(cls, index_dir: str | os.PathLike[str], encoder: EncoderConfig | None = None,
             faiss_options: FaissOptions | None = None, verify_corpus: bool = False,
             model: str | None = None, verify_checksums: bool = True,
             **encoder_runtime: Any) -> Retriever:
        """Validate and open an index folder.

        ``encoder`` defaults to the configuration recorded at build time (``model`` relocates
        its weights folder); ``encoder_runtime`` (``batch_size``, ``device``, ``fp16``) tunes
        it without changing the vectors. ``verify_checksums=False`` skips re-hashing the files
        (the server's worker does, since its launcher has just verified them).
        """
        import faiss

        index_dir = Path(index_dir)
        meta, config = validate_index_dir(index_dir, encoder, verify_corpus, model,
                                          verify_checksums)
        if verify_checksums and not meta.files:
            logger.warning("%s", unverified_warning(index_dir))
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
        return cls(index_dir, meta, enc, index, corpus, placement, config.model)

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
            scores, ids = self.search_vectors(vectors[rows], k)
            offset = 0
            for i in members:
                n = int(bounds[i + 1] - bounds[i])
                results[i] = (scores[offset:offset + n], ids[offset:offset + n])
                offset += n
        return results  # type: ignore[return-value]

    def search_vectors(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Faiss search of ready vectors (one search at a time)."""
        with self._index_lock:
            return self.index.search(np.ascontiguousarray(vectors, dtype=np.float32), k)

    def canary_inputs(self) -> tuple[list[int], list[str]]:
        """The canary passages' corpus rows and texts (:mod:`mmoa.retrieval.canary`)."""
        if self._canary is None:
            rows = canary_rows(len(self.corpus))
            texts = [p.encoder_text[:CANARY_CHARS] for p in self.corpus.get(rows)]
            self._canary = rows, texts
        return self._canary

    def measure_canary_baseline(self, ids: np.ndarray | None = None) -> int:
        """How many canaries the serving encoder finds: from ``ids`` (the canary texts
        searched through the server's own path, so no second thread uses the serving encoder)
        or, in-process, by searching now."""
        rows, texts = self.canary_inputs()
        if ids is None:
            ids = self.search(texts, CANARY_K)[1]
        self.canary_baseline = self_hits(rows, ids)
        return self.canary_baseline

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

    def load_encoder(self, model: str | None = None, deadline: float | None = None
                     ) -> tuple[Encoder, dict[str, Any]]:
        """Check, load and prove the query encoder at ``model`` without serving it.

        ``None`` means the encoder the server started with (``--encoder``, else the folder
        recorded in meta.json), which must still have the fingerprint the index records
        (:class:`EncoderChangedError` otherwise). The query encoder's RL stage trains the query
        side only: the passage vectors in ``index.faiss`` stay as built, so the new weights
        must produce vectors of the same dimension, pooling, normalisation and prefixes (all
        taken from meta.json here, so only the weights change).

        In order, every step able to refuse: the folder's files are copied into a private
        folder, each opened without blocking and checked to be a regular file on its open
        descriptor (:func:`~mmoa.retrieval.encoder.stage_model_folder`: a FIFO swapped in after
        the listing cannot block the load); the copy is checked (size bounds, sane config, no
        NaN in it, safetensors only from a client:
        :func:`~mmoa.retrieval.encoder.check_model_folder`); the weights must hold the
        parameters the config describes (counted on the meta device, before any memory is
        spent); transformers loads from the copy; no tensor may be missing and the tokenizer
        must be the weights' own (:func:`~mmoa.retrieval.encoder.check_loaded`); finally the
        canary (:func:`~mmoa.retrieval.canary.prove_encoder`). ``deadline``
        (``time.monotonic()``) bounds the copy. Raises :class:`EncoderFolderError` naming the
        file, or :class:`~mmoa.retrieval.canary.EncoderCanaryError`; returns the encoder and
        its identity (with the canary's figures under ``canary``).
        """
        restore = model is None
        folder = self.start_model if restore else str(model)
        current = self.encoder.config
        config = encoder_config_from_meta(self.meta, folder).with_overrides(
            batch_size=current.batch_size, device=current.device, fp16=current.fp16)
        try:
            path = resolve_model_path(folder) if folder == DEFAULT_ENCODER else Path(folder)
        except (ImportError, OSError) as err:
            raise EncoderFolderError(folder, f"cannot be found ({err})") from err
        if self.canary_baseline is None:
            self.measure_canary_baseline()
        stage = staging_folder()
        try:
            staged = stage_model_folder(path, stage, untrusted=not restore, deadline=deadline)
            checked = check_model_folder(path, untrusted=not restore,
                                         expected_dim=self.meta.dim,
                                         device=str(self.encoder.device), content=stage)
            recorded = self.meta.encoder.get("fingerprint")
            if restore and recorded and checked.fingerprint != recorded:
                raise EncoderChangedError(checked.path, (
                    f"fingerprint {checked.fingerprint} differs from the index's encoder "
                    f"({recorded}): the folder the server started with was changed since; put "
                    f"the index's encoder back there or restart the server with --encoder"))
            check_parameters(stage, checked)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError("the reload deadline passed before the weights were loaded")
            encoder = Encoder(config, safetensors_only=not restore, load_from=stage)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        if encoder.dim != self.meta.dim:
            raise EncoderFolderError(checked.path, f"gives {encoder.dim}-d vectors, the index "
                                                   f"holds {self.meta.dim}-d vectors")
        rows, texts = self.canary_inputs()
        check_loaded(encoder, checked.path, set(staged), texts)
        canary: CanaryResult = prove_encoder(encoder, rows, texts, self.meta.dim,
                                             self.search_vectors, self.canary_baseline)
        identity = folder_identity(config, checked, encoder.dim)
        return encoder, {**identity, "canary": canary.to_json()}

    def install_encoder(self, encoder: Encoder) -> None:
        """Serve ``encoder`` from the next batch on (a batch under way finishes with the old
        one: ``search_many`` reads the attribute once)."""
        self.encoder = encoder

    def reload_encoder(self, model: str | None = None) -> dict[str, Any]:
        """:meth:`load_encoder`, then :meth:`install_encoder`; returns the new identity."""
        encoder, identity = self.load_encoder(model)
        self.install_encoder(encoder)
        return identity

    def describe(self) -> dict[str, Any]:
        return {"corpus_size": len(self.corpus), "dim": self.meta.dim,
                # the folder as the server was started with it (``--index DIR``), so that a
                # client (the web UI's server check) can say which index it is talking to
                "index_path": str(self.index_dir),
                # the index's identity as meta.json records it (a client that reads the same
                # folder, the retriever_rl trainer, checks it serves this very index)
                "corpus_checksum": self.meta.corpus_checksum,
                "index_checksum": self.meta.files.get(INDEX_FILE),
                "index_type": self.meta.factory, "index_class": type(self.index).__name__,
                "placement": self.placement, "metric": self.meta.metric,
                "encoder": {"name": self.encoder.name, "path": str(self.encoder.model_path),
                            "pooling": self.encoder.config.pooling,
                            "normalize": self.encoder.config.normalize,
                            "query_prefix": self.encoder.config.query_prefix,
                            "device": str(self.encoder.device)}}
