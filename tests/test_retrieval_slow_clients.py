"""Clients the retrieval server must survive: stalled, trickling, idle, TLS, malformed HTTP.

One real server (gunicorn subprocess on a loopback port) with 4 request threads and a read
timeout of 1.5 s, so that a handful of stalled clients is enough to hold every thread and the
module still runs in a few seconds. Each wait below has a generous bound that only stops a
hung test; no test asserts how long anything took.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.retrieval_fixtures import (
    ServerProcess,
    demo_index,
    encoder_threads,  # noqa: F401  (autouse, module-wide)
)

pytestmark = pytest.mark.slow
THREADS = 4
READ_TIMEOUT = 1.5
#: How long a test waits for something that should happen after about READ_TIMEOUT seconds
#: (a stalled server would never answer; this only stops the test from hanging).
GUARD_S = 30.0
SEARCH = json.dumps({"questions": ["capital of Moristan"], "N": 2}).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    index = demo_index(tmp_path_factory)
    log = tmp_path_factory.mktemp("slow_clients") / "server.log"
    env = {"MMOA_RETRIEVER_READ_TIMEOUT": str(READ_TIMEOUT),
           "MMOA_RETRIEVER_THREADS": str(THREADS), "MMOA_RETRIEVER_ACCESS_LOG": "off"}
    proc = ServerProcess(["--index", str(index), "--device", "cpu"], env=env, log_path=log)
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def connect(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=GUARD_S)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def parse_response(raw: bytes) -> tuple[int, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip()
               for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, json.loads(body)


def normal_search(server: ServerProcess) -> list[str]:
    response = requests.post(server.url + "/search", data=SEARCH, timeout=GUARD_S,
                             headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    return response.json()[0]["top_k_docs"]


def stalled_body(server: ServerProcess) -> socket.socket:
    """Headers that announce a 100-byte body, then 12 bytes of it, then nothing."""
    sock = connect(server)
    sock.sendall(b"POST /search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"questions\"")
    return sock


def test_stalled_clients_do_not_freeze_the_server(server: ServerProcess) -> None:
    """More stalled clients than threads: a normal client is still answered, and the stalled
    ones get a JSON 408 and lose their connection (they were held for minutes)."""
    expected = normal_search(server)
    stalled = [stalled_body(server) for _ in range(THREADS + 2)]
    try:
        time.sleep(0.2)  # let them take every thread
        assert normal_search(server) == expected
        for sock in stalled:
            status, headers, payload = parse_response(read_until_closed(sock))
            assert status == 408, payload
            assert headers["content-type"] == "application/json"
            assert payload["error"] == "request_timeout"
            assert f"within {READ_TIMEOUT:g} s" in payload["message"]
    finally:
        for sock in stalled:
            sock.close()
    assert normal_search(server) == expected


def test_trickled_headers_are_cut_off(server: ServerProcess) -> None:
    """Headers sent a few bytes at a time never finish before the deadline: every read
    succeeds, but the request as a whole must arrive within the read timeout."""
    head = b"POST /search HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 200
    with connect(server) as sock:
        with contextlib.suppress(OSError):  # the server may close while we still send
            for start in range(0, len(head), 4):
                sock.sendall(head[start:start + 4])
                time.sleep(0.1)  # 200+ bytes at 40 B/s: ~5 s, past the 1.5 s deadline
        status, headers, payload = parse_response(read_until_closed(sock))
    assert status == 408 and headers["connection"] == "close"
    assert payload == {"error": "request_timeout", "status": 408,
                       "message": f"request not received in full within {READ_TIMEOUT:g} s"}


def test_idle_connections_do_not_hold_threads(server: ServerProcess) -> None:
    """Connections that send nothing wait in the event loop; the server closes them later."""
    idle = [connect(server) for _ in range(2 * THREADS)]
    try:
        time.sleep(0.2)
        assert normal_search(server)
        for sock in idle:
            assert read_until_closed(sock) == b""
    finally:
        for sock in idle:
            sock.close()


def client_hello() -> bytes:
    """The first flight of a real TLS client (a ClientHello record)."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_tls_on_the_plain_port_is_answered(server: ServerProcess) -> None:
    """An https:// URL pointed at this plain-HTTP port: a JSON 400 saying so, at once (the
    ClientHello was held unanswered)."""
    hello = client_hello()
    assert hello[:2] == b"\x16\x03"
    with connect(server) as sock:
        sock.sendall(hello)
        status, _, payload = parse_response(read_until_closed(sock))
    assert status == 400
    assert "plain HTTP" in payload["message"] and "http://" in payload["message"]
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"https://127.0.0.1:{server.port}/health", timeout=GUARD_S, verify=False)
    assert normal_search(server)


MALFORMED = [
    pytest.param(b"GET /" + b"a" * 5000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
                 "request line too long", id="request-line-too-long"),
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\n"
                 + b"".join(b"X-H%d: v\r\n" % i for i in range(120)) + b"\r\n", 431,
                 "at most 100 fields", id="too-many-headers"),
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 9000 + b"\r\n\r\n", 431,
                 "request headers too many or too large", id="header-too-large"),
    pytest.param(b"GARBAGE\r\n\r\n", 400, "malformed HTTP request", id="malformed-request-line"),
    pytest.param(b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", 400, "malformed HTTP request",
                 id="bad-http-version"),
    pytest.param(b"GET /health HTTP/1.1\r\nHost: x\r\nBad Header: v\r\n\r\n", 400,
                 "malformed HTTP request", id="bad-header-name"),
]


@pytest.mark.parametrize(("raw", "status", "message"), MALFORMED)
def test_malformed_http_gets_a_json_error(server: ServerProcess, raw: bytes, status: int,
                                          message: str) -> None:
    """gunicorn's own parser errors, which it answers in HTML, come back as the app's JSON."""
    with connect(server) as sock:
        sock.sendall(raw)
        got_status, headers, payload = parse_response(read_until_closed(sock))
    assert got_status == status
    assert headers["content-type"] == "application/json"
    assert payload["status"] == status and message in payload["message"], payload
    assert set(payload) == {"error", "message", "status"}


CHUNKED_HEAD = (b"POST /search HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")


@pytest.mark.parametrize("body", [
    pytest.param(b"zz\r\nabc\r\n0\r\n\r\n", id="chunk-size-not-hex"),
    pytest.param(b"3\r\nabcXX0\r\n\r\n", id="chunk-without-terminator"),
])
def test_malformed_chunked_body_is_a_400(server: ServerProcess, body: bytes) -> None:
    """Broken chunk framing fails inside the app's body read (gunicorn decodes chunks lazily):
    a JSON 400 naming it, not a 500 with a traceback (found by bench/server_probe.py)."""
    with connect(server) as sock:
        sock.sendall(CHUNKED_HEAD + body)
        status, headers, payload = parse_response(read_until_closed(sock))
    assert status == 400, payload
    assert headers["content-type"] == "application/json"
    assert "malformed request body" in payload["message"], payload
    assert normal_search(server)


def test_read_timeout_option(monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from mmoa.retrieval.server import build_arg_parser, config_from_args

    def parse(argv: list[str]) -> Any:
        parser = build_arg_parser()
        return config_from_args(parser.parse_args(argv), parser)

    monkeypatch.delenv("MMOA_RETRIEVER_READ_TIMEOUT", raising=False)
    assert parse(["--index", "x"]).read_timeout == 10.0
    monkeypatch.setenv("MMOA_RETRIEVER_READ_TIMEOUT", "2.5")
    assert parse(["--index", "x"]).read_timeout == 2.5
    assert parse(["--index", "x", "--read-timeout", "30"]).read_timeout == 30.0
    for bad in ("0", "-1", "nan"):
        with pytest.raises(SystemExit) as info:
            parse(["--index", "x", "--read-timeout", bad])
        assert info.value.code == 2
        assert "--read-timeout" in capsys.readouterr().err
