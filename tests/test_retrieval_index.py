"""Encoder, index builder, metadata checks and the in-process Retriever."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mmoa.fileio import sha256_file
from mmoa.retrieval.builder import BuildConfig, build_index
from mmoa.retrieval.builder import main as build_main
from mmoa.retrieval.encoder import (
    DEFAULT_ENCODER,
    Encoder,
    EncoderConfig,
    preset,
    resolve_model_path,
)
from mmoa.retrieval.index import (
    FaissOptions,
    IndexMeta,
    IndexMismatchError,
    IndexMissingError,
    Retriever,
    read_index_header,
    validate_index_dir,
)
from tests.retrieval_fixtures import (  # encoder_threads: autouse, module-wide
    demo_index,
    demo_retriever,
    encoder_threads,  # noqa: F401
)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory: pytest.TempPathFactory) -> Encoder:
    return demo_retriever(tmp_path_factory).encoder


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_index(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Retriever:
    return demo_retriever(tmp_path_factory)


# ------------------------------------------------------------------------------ encoder


def test_default_encoder_equals_sentence_transformers(encoder: Encoder) -> None:
    from sentence_transformers import SentenceTransformer

    texts = ["Who directed Crimson Bridge?", "a", "Bifield is a city in Lorkania " * 30]
    model = SentenceTransformer(str(resolve_model_path(DEFAULT_ENCODER)), device="cpu")
    want = model.encode(texts, convert_to_numpy=True)
    got = encoder.encode_queries(texts)
    assert got.shape == (3, 384) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_input_order_is_kept_whatever_the_lengths(encoder: Encoder) -> None:
    texts = ["long text " * 40, "short", "medium length text here", "x"]
    together = encoder.encode(texts, batch_size=2)
    alone = np.concatenate([encoder.encode([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=2e-5)
    assert encoder.encode([]).shape == (0, 384)


def test_pooling_normalisation_and_prefixes_change_vectors(encoder: Encoder) -> None:
    path = str(resolve_model_path(DEFAULT_ENCODER))
    text = ["capital of Moristan"]
    cls = Encoder(EncoderConfig(path, pooling="cls", normalize=False, device="cpu"))
    raw = Encoder(EncoderConfig(path, pooling="mean", normalize=False, device="cpu"))
    e5 = Encoder(preset("e5", model=path, device="cpu"))
    mean_norm = encoder.encode(text)
    mean_raw = raw.encode(text)
    np.testing.assert_allclose(mean_raw / np.linalg.norm(mean_raw), mean_norm, atol=1e-5)
    assert abs(np.linalg.norm(mean_raw) - 1.0) > 1e-3  # Contriever-style: not normalised
    assert not np.allclose(cls.encode(text), mean_raw, atol=1e-3)
    # e5 prepends "query: " to queries and "passage: " to passages.
    np.testing.assert_allclose(e5.encode_queries(text), e5.encode(["query: " + text[0]]),
                               atol=1e-6)
    np.testing.assert_allclose(e5.encode_passages(text), e5.encode(["passage: " + text[0]]),
                               atol=1e-6)
    assert e5.identity()["query_prefix"] == "query: "


def test_presets_and_bad_configs() -> None:
    assert preset("contriever").pooling == "mean" and not preset("contriever").normalize
    assert preset("bge").pooling == "cls" and preset("bge").query_prefix
    assert preset("minilm", batch_size=8).batch_size == 8
    with pytest.raises(ValueError, match="unknown encoder preset"):
        preset("word2vec")
    with pytest.raises(ValueError, match="pooling must be one of"):
        EncoderConfig(pooling="max")
    with pytest.raises(FileNotFoundError, match="never downloaded"):
        Encoder(preset("contriever"))  # hub id, no local folder


# ------------------------------------------------------------------------------ builder


def test_built_index_folder_and_metadata(index_dir: Path, reference: Retriever) -> None:
    meta = IndexMeta.read(index_dir / "meta.json")
    assert meta.factory == "Flat" and meta.metric == "inner_product" and meta.dim == 384
    assert meta.n_vectors == meta.corpus_size == len(reference.corpus) == 400
    assert meta.encoder["name"] == DEFAULT_ENCODER and meta.encoder["pooling"] == "mean"
    assert meta.encoder["normalize"] is True and len(meta.corpus_checksum) == 64
    assert read_index_header(index_dir / "index.faiss")[1:] == (384, 400, 0)
    # the sha256 of every other file of the folder, as it lies on disk
    assert meta.files == {name: sha256_file(index_dir / name) for name in
                          ("corpus/manifest.json", "corpus/passages.arrow", "index.faiss")}


def test_flat_search_is_exact_inner_product(reference: Retriever) -> None:
    vectors = reference.index.reconstruct_n(0, reference.index.ntotal)  # the stored vectors
    sample = reference.corpus.get([0, 57, 399])
    np.testing.assert_allclose(  # ...are the passages' encodings, row by row
        reference.encoder.encode_passages([p.encoder_text for p in sample]),
        vectors[[0, 57, 399]], atol=1e-4)
    queries = ["Who directed Crimson Bridge?", "When was Bifield founded?"]
    scores, rows = reference.search(queries, 5)
    brute = reference.encoder.encode_queries(queries) @ vectors.T
    for q in range(2):
        want = np.argsort(-brute[q])[:5]
        np.testing.assert_allclose(scores[q], brute[q][want], atol=1e-4)
        assert set(rows[q]) == set(want) or np.allclose(np.sort(brute[q][rows[q]]),
                                                        np.sort(brute[q][want]), atol=1e-4)


def test_search_many_equals_separate_searches(reference: Retriever) -> None:
    a, b, c = ["capital of Moristan", "Crimson Bridge"], ["founded in 1155"], ["studio"]
    together = reference.search_many([(a, 3), (b, 5), (c, 3)])
    for (queries, k), (scores, rows) in zip([(a, 3), (b, 5), (c, 3)], together, strict=True):
        want_scores, want_rows = reference.search(queries, k)
        assert rows.shape == (len(queries), k)
        np.testing.assert_allclose(scores, want_scores, atol=1e-4)
        np.testing.assert_array_equal(rows, want_rows)


def test_retrieve_returns_passages_and_drops_missing_hits(reference: Retriever) -> None:
    hits = reference.retrieve(["capital of Moristan"], 3)
    assert len(hits[0]) == 3 and hits[0][0][1] >= hits[0][1][1] >= hits[0][2][1]
    many = reference.retrieve(["x"], 450)  # more than the 400 passages: -1 rows dropped
    assert len(many[0]) == 400


@pytest.fixture(scope="module")
def small_corpus(index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 150 demo passages: enough to train small IVF/PQ/SQ indexes, quick to encode."""
    lines = (index_dir.parent / "world" / "corpus.jsonl").read_text().splitlines()[:150]
    path = tmp_path_factory.mktemp("small") / "corpus.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("factory", ["HNSW16", "SQ8", "IVF4,PQ16x4"])
def test_other_factories_build_train_and_load(tmp_path: Path, factory: str,
                                              small_corpus: Path, encoder: Encoder) -> None:
    out = tmp_path / "idx"
    # SQ8 trains on the whole corpus (vectors reused for adding), IVF on a 120-passage sample.
    train_size = {"HNSW16": 0, "SQ8": 150, "IVF4,PQ16x4": 120}[factory]
    meta = build_index(BuildConfig(corpus=str(small_corpus), output=str(out), factory=factory,
                                   train_size=120 if factory.startswith("IVF") else 100_000,
                                   progress=False))
    assert meta.factory == factory and meta.n_vectors == 150
    assert meta.build["train_size"] == train_size
    params = {"nprobe": 4} if factory.startswith("IVF") else {"ef_search": 32} \
        if factory.startswith("HNSW") else {}
    retriever = Retriever.load(out, faiss_options=FaissOptions(**params))
    query = "capital of Moristan"
    hits = retriever.retrieve([query], 3)
    assert len(hits[0]) == 3
    if factory != "IVF4,PQ16x4":  # HNSW is exact here, SQ8 within quantisation error
        exact = encoder.encode_passages([p.encoder_text for p, _ in hits[0]]) @ \
            encoder.encode_queries([query])[0]
        np.testing.assert_allclose([s for _, s in hits[0]], exact, atol=0.02)


def test_bad_factory_and_existing_output(tmp_path: Path, index_dir: Path) -> None:
    corpus = index_dir.parent / "world" / "corpus.jsonl"
    with pytest.raises(ValueError, match="invalid Faiss factory string 'Nonsense12'"):
        build_index(BuildConfig(corpus=str(corpus), output=str(tmp_path / "a"),
                                factory="Nonsense12", progress=False))
    assert not (tmp_path / "a").exists()  # nothing half-written
    with pytest.raises(FileExistsError, match="--overwrite"):
        build_index(BuildConfig(corpus=str(corpus), output=str(index_dir), progress=False))


def test_failed_rebuild_keeps_the_previous_index(tmp_path: Path, index_dir: Path) -> None:
    out = tmp_path / "idx"
    shutil.copytree(index_dir, out)
    before = (out / "meta.json").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "title": "T", "text": "x"}\n{"id": "2", "title": 3}\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: field 'title' must be a string"):
        build_index(BuildConfig(corpus=str(bad), output=str(out), overwrite=True,
                                progress=False))
    assert (out / "meta.json").read_text() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".idx")]


def test_build_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f"T{i}\ntext {i}"}) + "\n"
                              for i in range(30)))
    code = build_main(["--corpus", str(corpus), "--output", str(tmp_path / "idx"),
                       "--factory", "Flat", "--no-progress", "--batch-size", "8"])
    assert code == 0
    assert "30 passages, Flat, dim 384" in capsys.readouterr().out
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["build"]["format"] == "flashrag"
    code = build_main(["--corpus", str(tmp_path / "missing.jsonl"), "--output",
                       str(tmp_path / "idx2"), "--no-progress"])
    assert code == 2
    assert "corpus file not found" in capsys.readouterr().err


# ---------------------------------------------------------------------------- validation


def tampered(index_dir: Path, tmp_path: Path, **changes: Any) -> Path:
    copy = tmp_path / "index"
    shutil.copytree(index_dir, copy)
    meta = json.loads((copy / "meta.json").read_text())
    for key, value in changes.items():
        if key.startswith("encoder_"):
            meta["encoder"][key.removeprefix("encoder_")] = value
        else:
            meta[key] = value
    (copy / "meta.json").write_text(json.dumps(meta))
    return copy


@pytest.mark.parametrize(("changes", "message"), [
    ({"dim": 768}, "dimension 384, meta.json says 768"),
    ({"n_vectors": 401}, "400 vectors, meta.json says 401"),
    ({"corpus_size": 399}, "corpus store has 400 passages, meta.json 399"),
    ({"corpus_checksum": "f" * 64}, "corpus checksum"),
    ({"encoder_fingerprint": "0" * 16}, "encoder fingerprint"),
    ({"encoder_dim": 768}, "encoder dim: index built with 768"),
])
def test_mismatched_metadata_is_refused(index_dir: Path, tmp_path: Path,
                                        changes: dict[str, Any], message: str) -> None:
    with pytest.raises(IndexMismatchError, match="refusing to serve") as info:
        validate_index_dir(tampered(index_dir, tmp_path, **changes))
    assert message in str(info.value)


def test_query_encoder_must_match_the_build(index_dir: Path, tmp_path: Path) -> None:
    path = str(resolve_model_path(DEFAULT_ENCODER))
    _, config = validate_index_dir(index_dir, EncoderConfig(path))  # same weights: fine
    assert config.model == path
    with pytest.raises(IndexMismatchError, match="encoder pooling: index built with 'mean'"):
        validate_index_dir(index_dir, EncoderConfig(path, pooling="cls"))
    with pytest.raises(IndexMismatchError, match="encoder query_prefix"):
        validate_index_dir(index_dir, preset("e5", model=path))


def test_missing_parts_are_reported(index_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(IndexMissingError, match="index folder not found"):
        validate_index_dir(tmp_path / "none")
    for part, message in (("index.faiss", "Faiss index file missing"),
                          ("meta.json", "index metadata missing"),
                          ("corpus/passages.arrow", "corpus store file missing")):
        copy = tmp_path / part.replace("/", "_")
        shutil.copytree(index_dir, copy)
        (copy / part).unlink()
        with pytest.raises(IndexMissingError, match=message):
            validate_index_dir(copy)
    moved = tampered(index_dir, tmp_path, encoder_path="/nowhere/contriever")
    with pytest.raises(IndexMissingError, match="pass the local folder of the same model"):
        validate_index_dir(moved)


def test_verify_corpus_rehashes_rows(index_dir: Path, tmp_path: Path) -> None:
    validate_index_dir(index_dir, verify_corpus=True)
    copy = tmp_path / "index"
    shutil.copytree(index_dir, copy)
    manifest = json.loads((copy / "corpus" / "manifest.json").read_text())
    manifest["checksum"] = "a" * 64  # store and meta agree, but not with the rows
    (copy / "corpus" / "manifest.json").write_text(json.dumps(manifest))
    meta = json.loads((copy / "meta.json").read_text())
    meta["corpus_checksum"] = "a" * 64
    (copy / "meta.json").write_text(json.dumps(meta))
    validate_index_dir(copy, verify_checksums=False)  # the fast check cannot see it
    with pytest.raises(IndexMismatchError, match="the store was modified"):
        validate_index_dir(copy, verify_corpus=True, verify_checksums=False)
    with pytest.raises(IndexMismatchError, match=r"manifest\.json: sha256"):
        validate_index_dir(copy)  # nor can a file changed after the build escape its sha256


def flip_bytes(path: Path, count: int = 64) -> None:
    """Invert ``count`` bytes in the middle of a file (inside the vectors of index.faiss)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + count] = bytes(b ^ 0xFF for b in data[middle:middle + count])
    path.write_bytes(bytes(data))


def test_damaged_index_file_is_refused(index_dir: Path, tmp_path: Path,
                                       reference: Retriever) -> None:
    """64 flipped bytes inside index.faiss keep its header and still load; only the sha256
    recorded at build time tells, and the refusal is one line naming the file."""
    copy = tmp_path / "index"
    shutil.copytree(index_dir, copy)
    flip_bytes(copy / "index.faiss")
    with pytest.raises(IndexMismatchError) as info:
        validate_index_dir(copy)
    message = str(info.value)
    assert message.startswith(f"{copy / 'index.faiss'}: sha256 ") and "\n" not in message
    assert "recorded in meta.json at build time" in message and "--skip-checksums" in message
    # unverified, it serves: the vectors of the middle of the corpus changed
    damaged = Retriever.load(copy, device="cpu", verify_checksums=False)
    rows = np.arange(150, 250)
    assert not np.array_equal(damaged.index.reconstruct_batch(rows),
                              reference.index.reconstruct_batch(rows))


def test_checksum_problems_of_the_metadata_and_missing_files(index_dir: Path,
                                                             tmp_path: Path) -> None:
    meta = json.loads((index_dir / "meta.json").read_text())
    gone = tampered(index_dir, tmp_path / "gone", files={**meta["files"], "extra.bin": "0" * 64})
    with pytest.raises(IndexMissingError, match=r"extra\.bin: No such file"):
        validate_index_dir(gone)
    for files, message in (([], "must map file names to sha256 digests"),
                           ({"../meta.json": "0" * 64}, "not a file inside the index folder"),
                           ({"index.faiss": "xyz"}, "is not a sha256 hex digest")):
        with pytest.raises(IndexMissingError, match=message):
            validate_index_dir(tampered(index_dir, tmp_path / message[:8], files=files))


def test_index_without_checksums_loads_with_a_warning(index_dir: Path, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """An index built before checksums were recorded is served, with a warning."""
    copy = tampered(index_dir, tmp_path)
    meta = json.loads((copy / "meta.json").read_text())
    del meta["files"]
    (copy / "meta.json").write_text(json.dumps(meta))
    assert validate_index_dir(copy)[0].files == {}
    with caplog.at_level("WARNING", logger="mmoa.retrieval.index"):
        Retriever.load(copy, device="cpu")
    assert "records no sha256 of the index files" in caplog.text


def test_faiss_gpu_on_without_gpu_is_a_clear_error(index_dir: Path) -> None:
    from mmoa.retrieval.index import faiss_gpu_count

    if faiss_gpu_count():
        pytest.skip("a GPU is visible")
    with pytest.raises(RuntimeError, match="faiss-gpu"):
        Retriever.load(index_dir, faiss_options=FaissOptions(gpu="on"))
