"""Build an index folder from a corpus file: corpus store, Faiss index and metadata, atomically.

Peak memory is the index itself plus one chunk of passages and their vectors: the corpus is
streamed into the Arrow store first and then read back chunk by chunk from the memory map, so
a 21M-passage corpus never sits in Python memory. Everything is written into a temporary
sibling folder that replaces the target only when complete (``mmoa.fileio.atomic_dir``); an
interrupted build leaves any previous index untouched.
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from mmoa.fileio import DataFormatError, apply_umask_modes, atomic_dir, atomic_write_json
from mmoa.retrieval.corpus import (
    CORPUS_FORMATS,
    CorpusStore,
    detect_format,
    iter_corpus,
    write_corpus_store,
)
from mmoa.retrieval.encoder import PRESETS, Encoder, EncoderConfig, preset
from mmoa.retrieval.index import (
    CORPUS_DIR,
    INDEX_FILE,
    META_FILE,
    IndexMeta,
    index_file_checksums,
    make_index,
)

logger = logging.getLogger(__name__)


@dataclass
class BuildConfig:
    """Inputs of :func:`build_index`."""

    corpus: str
    output: str
    corpus_format: str = "auto"
    factory: str = "Flat"
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    #: Passages sampled to train the index (IVF centroids, PQ/SQ codebooks); capped at the corpus.
    train_size: int = 100_000
    #: Passages encoded and added per step; bounds the memory of the vectors in flight.
    chunk_size: int = 20_000
    seed: int = 0
    overwrite: bool = False
    progress: bool = True


def build_index(config: BuildConfig) -> IndexMeta:
    """Write ``config.output`` = {index.faiss, corpus/, meta.json}; returns the metadata.

    meta.json records the sha256 of every other file, which loading verifies.
    """
    import faiss

    out = Path(config.output)
    if out.exists() and not config.overwrite:
        raise FileExistsError(f"{out}: exists; pass --overwrite to replace it")
    fmt = detect_format(config.corpus) if config.corpus_format == "auto" else config.corpus_format
    started = time.perf_counter()
    with atomic_dir(out) as tmp:
        manifest = write_corpus_store(iter_corpus(config.corpus, fmt), tmp / CORPUS_DIR,
                                      source=str(config.corpus), progress=config.progress)
        store = CorpusStore(tmp / CORPUS_DIR)
        encoder = Encoder(config.encoder)
        index = make_index(config.factory, encoder.dim)
        train_n = 0
        bar = tqdm(total=len(store), desc=f"encode+add ({config.factory})", unit=" passages",
                   disable=not config.progress)
        if not index.is_trained:
            train_n = min(config.train_size, len(store))
            sample = store.sample(train_n, seed=config.seed)
            logger.info("training %s on %d sampled passages", config.factory, train_n)
            vectors = encoder.encode_passages([p.encoder_text for p in sample])
            try:
                index.train(vectors)
            except RuntimeError as err:
                raise ValueError(
                    f"training {config.factory!r} on {train_n} passages failed: "
                    f"{str(err).splitlines()[-1]} (use a smaller IVF list count or a larger "
                    f"--train-size / corpus)"
                ) from err
            if train_n == len(store):  # the sample is the corpus, in row order: reuse it
                index.add(vectors)
                bar.update(len(store))
            del vectors, sample
        if index.ntotal == 0:
            for _, passages in store.iter_batches(config.chunk_size):
                index.add(encoder.encode_passages([p.encoder_text for p in passages]))
                bar.update(len(passages))
        bar.close()
        faiss.write_index(index, str(tmp / INDEX_FILE))
        meta = IndexMeta(
            factory=config.factory, dim=encoder.dim, n_vectors=int(index.ntotal),
            corpus_size=len(store), corpus_checksum=manifest.checksum,
            encoder=encoder.identity(),
            build={"source": str(Path(config.corpus).resolve()), "format": fmt,
                   "train_size": train_n, "seed": config.seed,
                   "passage_text": "title + ' ' + text", "faiss_version": faiss.__version__,
                   "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                   "seconds": round(time.perf_counter() - started, 1)},
            # Read back from disk, so they are the bytes a server will load.
            files=index_file_checksums(tmp),
        )
        atomic_write_json(tmp / META_FILE, meta.to_json())
        apply_umask_modes(tmp)
    return meta


def add_encoder_arguments(parser: argparse.ArgumentParser, *, with_preset: bool = True) -> None:
    """Encoder options shared by the index builder and the server."""
    group = parser.add_argument_group("encoder")
    if with_preset:
        group.add_argument("--preset", choices=sorted(PRESETS), default="minilm",
                           help="pooling/normalisation/prefix defaults of a known retriever "
                                "(default: minilm = the bundled all-MiniLM-L6-v2)")
    group.add_argument("--encoder", dest="model", default=None,
                       help="local model folder (default: the preset's; minilm is bundled)")
    group.add_argument("--pooling", choices=("mean", "cls"), default=None)
    group.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                       help="L2-normalise vectors")
    group.add_argument("--query-prefix", default=None)
    group.add_argument("--passage-prefix", default=None)
    group.add_argument("--max-length", type=int, default=None)
    group.add_argument("--batch-size", type=int, default=None, help="encoder batch size")
    group.add_argument("--device", default=None, help="auto (GPU when present), cpu, cuda:0 ...")
    group.add_argument("--fp16", action="store_true", default=None,
                       help="half-precision encoder on GPU")


def encoder_overrides(args: argparse.Namespace) -> dict[str, object]:
    keys = ("model", "pooling", "normalize", "query_prefix", "passage_prefix", "max_length",
            "batch_size", "device", "fp16")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="build_index.py",
        description="Encode a passage corpus and write an index folder "
                    "(index.faiss + memory-mapped corpus/ + meta.json) for the retrieval server.",
    )
    parser.add_argument("--corpus", required=True,
                        help="passages: JSONL (id,title,text), FlashRAG JSONL (id,contents) or "
                             "DPR psgs_w100.tsv")
    parser.add_argument("--output", "-o", required=True, help="index folder to write")
    parser.add_argument("--format", dest="corpus_format", default="auto",
                        choices=("auto", *CORPUS_FORMATS))
    parser.add_argument("--factory", default="Flat",
                        help="Faiss index_factory string: Flat, HNSW32, SQ8, IVF4096,PQ64, ... "
                             "(inner-product metric)")
    parser.add_argument("--train-size", type=int, default=100_000,
                        help="passages sampled to train IVF/PQ/SQ indexes")
    parser.add_argument("--chunk-size", type=int, default=20_000,
                        help="passages encoded and added per step (bounds memory)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    parser.add_argument("--no-progress", action="store_true")
    add_encoder_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from mmoa.console import quiet_faiss_loader

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    quiet_faiss_loader()
    args = build_arg_parser().parse_args(argv)
    try:
        encoder = preset(args.preset, **encoder_overrides(args))
        config = BuildConfig(corpus=args.corpus, output=args.output,
                             corpus_format=args.corpus_format, factory=args.factory,
                             encoder=encoder, train_size=args.train_size,
                             chunk_size=args.chunk_size, seed=args.seed,
                             overwrite=args.overwrite, progress=not args.no_progress)
        meta = build_index(config)
    except (FileNotFoundError, FileExistsError, DataFormatError, ValueError) as err:
        print(f"build_index: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {args.output}: {meta.n_vectors} passages, {meta.factory}, dim {meta.dim}, "
          f"encoder {meta.encoder['name']} ({meta.build['seconds']} s)")
    return 0
