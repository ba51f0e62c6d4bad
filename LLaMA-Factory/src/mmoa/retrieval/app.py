"""Flask application: the two retrieval APIs, a health endpoint and strict input checking.

* ``POST /search``   - the original MMOA-RAG API: ``{"questions": [str], "N": int}`` ->
  ``[{"question": str, "top_k_docs": ["title\\ntext", ...]}]`` in request order.
* ``POST /retrieve`` - the FlashRAG / Search-R1 API: ``{"queries": [str], "topk": int,
  "return_scores": bool}`` -> ``{"result": [[{"document": {"id", "contents"}, "score"}]]}``
  (without scores: ``{"result": [[{"id", "contents"}]]}``, as Search-R1 does).
* ``GET /health``    - corpus size, dimension, encoder, index type, uptime, counters, limits.

Every failure is a JSON object ``{"error": <kind>, "message": <what was wrong>, "status": n}``
with a 4xx code for bad input; one bad request never disturbs the requests beside it.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import ClientDisconnected, HTTPException

from mmoa.retrieval.batcher import MicroBatcher, Scheduler
from mmoa.retrieval.index import Retriever

logger = logging.getLogger(__name__)

ENDPOINTS = ("POST /search", "POST /retrieve", "GET /health")
_PROTECTED = {"/search", "/retrieve"}


@dataclass(frozen=True)
class ServerLimits:
    """Bounds that keep one client from monopolising the shared encoder and index."""

    max_queries: int = 64
    max_k: int = 100
    max_body_bytes: int = 1 << 20
    max_query_chars: int = 2048
    request_timeout_s: float = 60.0


@dataclass(frozen=True)
class AppConfig:
    limits: ServerLimits = field(default_factory=ServerLimits)
    #: Bearer token required on /search and /retrieve when set (``/health`` stays open).
    token: str | None = None
    #: ``N`` when a /search request leaves it out (the original server's default).
    default_n: int = 10
    #: ``topk`` when a /retrieve request leaves it out (Search-R1's default).
    default_topk: int = 3


class ApiError(Exception):
    """A client error with the HTTP status to answer it with."""

    def __init__(self, status: int, message: str, kind: str = "bad_request") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


# ------------------------------------------------------------------------------ parsing


def parse_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise ApiError(400, "empty request body; expected a JSON object")
    try:
        body = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as err:
        raise ApiError(400, f"request body is not UTF-8 ({err.reason} at byte {err.start})"
                       ) from err
    except json.JSONDecodeError as err:
        raise ApiError(400, f"request body is not valid JSON: {err.msg} at line {err.lineno} "
                            f"column {err.colno}") from err
    except RecursionError as err:
        raise ApiError(400, "request body is nested too deeply") from err
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise ApiError(400, f"request body cannot be read: {err}") from err
    if not isinstance(body, dict):
        raise ApiError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_queries(body: dict[str, Any], name: str, limits: ServerLimits) -> list[str]:
    if name not in body:
        raise ApiError(400, f"field '{name}' missing; expected a list of query strings")
    queries = body[name]
    if not isinstance(queries, list):
        raise ApiError(400, f"field '{name}' must be a list of strings, "
                            f"got {type(queries).__name__}")
    if not queries:
        raise ApiError(400, f"field '{name}' is an empty list; send at least one query")
    if len(queries) > limits.max_queries:
        raise ApiError(400, f"field '{name}' has {len(queries)} queries; at most "
                            f"{limits.max_queries} per request (split the batch)")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise ApiError(400, f"{name}[{i}] must be a string, got {type(query).__name__}")
        if not query.strip():
            raise ApiError(400, f"{name}[{i}] is empty")
        try:
            query.encode("utf-8")
        except UnicodeEncodeError as err:  # a lone surrogate such as "\ud800"
            raise ApiError(400, f"{name}[{i}] is not valid Unicode (lone surrogate at "
                                f"character {err.start})") from err
        if len(query) > limits.max_query_chars:
            raise ApiError(400, f"{name}[{i}] has {len(query)} characters; at most "
                                f"{limits.max_query_chars}")
    return queries


def parse_k(body: dict[str, Any], name: str, default: int, limits: ServerLimits) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"field '{name}' must be an integer, got {type(value).__name__}")
    if not 1 <= value <= limits.max_k:
        raise ApiError(400, f"field '{name}' = {value}; expected 1 <= {name} <= {limits.max_k}")
    return value


def parse_bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"field '{name}' must be true or false, got {type(value).__name__}")
    return value


def _read_at_most(stream: Any, limit: int) -> bytes:
    """Up to ``limit`` bytes of ``stream`` (a read may return fewer bytes than asked)."""
    chunks: list[bytes] = []
    size = 0
    while size < limit and (chunk := stream.read(min(limit - size, 1 << 16))):
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


# --------------------------------------------------------------------------------- app


class _Counters:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.queries = 0
        self.client_errors = 0

    def served(self, n_queries: int) -> None:
        with self._lock:
            self.requests += 1
            self.queries += n_queries

    def rejected(self) -> None:
        with self._lock:
            self.client_errors += 1


def _json(payload: Any, status: int = 200) -> Response:
    return Response(json.dumps(payload, ensure_ascii=False), status=status,
                    mimetype="application/json")


def _error(status: int, message: str, kind: str) -> Response:
    response = _json({"error": kind, "message": message, "status": status}, status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="mmoa-retriever"'
    return response


def create_app(retriever: Retriever, scheduler: Scheduler,
               config: AppConfig | None = None) -> Flask:
    """The WSGI application around an opened retriever and its scheduler (batched or not)."""
    config = config or AppConfig()
    limits = config.limits
    app = Flask("mmoa.retrieval")
    app.config["MAX_CONTENT_LENGTH"] = limits.max_body_bytes
    started = time.monotonic()
    counters = _Counters()
    description = retriever.describe()

    def run_search(queries: Sequence[str], k: int) -> tuple[Any, Any]:
        try:
            return scheduler.search(queries, k, timeout=limits.request_timeout_s)
        except TimeoutError as err:
            raise ApiError(503, f"{err}; the server is overloaded", "timeout") from err

    def read_body() -> dict[str, Any]:
        try:
            raw = _read_raw_body()
        except (TimeoutError, ClientDisconnected) as err:
            # The server's read deadline (mmoa.retrieval.worker), which Werkzeug's input
            # stream reports as a disconnected client (400) raised while handling it.
            timeout = err if isinstance(err, TimeoutError) else err.__context__
            if isinstance(timeout, TimeoutError):
                raise ApiError(408, str(timeout), "request_timeout") from err
            raise
        except (ApiError, HTTPException):
            raise
        except Exception as err:
            # The WSGI server decodes the body's framing while the app reads it, and fails on
            # the client's bytes (gunicorn: an invalid chunk size or chunk terminator, a
            # client gone mid-chunk). That is bad input, not our fault: it was a 500 with a
            # traceback (found by bench/server_probe.py).
            raise ApiError(400, f"malformed request body ({type(err).__name__}: {err})"
                           ) from err
        return parse_body(raw)

    def _read_raw_body() -> bytes:
        length = request.content_length
        if length is not None and length > limits.max_body_bytes:
            _drain(length)
            raise ApiError(413, f"request body of {length} bytes exceeds the limit of "
                                f"{limits.max_body_bytes} bytes", "payload_too_large")
        # A chunked body has no Content-Length: read one byte past the limit to tell.
        raw = _read_at_most(request.stream, limits.max_body_bytes + 1)
        if len(raw) > limits.max_body_bytes:
            raise ApiError(413, f"request body exceeds the limit of {limits.max_body_bytes} "
                                "bytes", "payload_too_large")
        return raw

    def _drain(length: int) -> None:
        # Read (and drop) a moderately oversized body so the client, still sending, gets the
        # 413 instead of a reset connection; anything huge is cut off.
        if length <= 16 * limits.max_body_bytes:
            stream = request.environ["wsgi.input"]
            while length > 0 and (chunk := stream.read(min(length, 1 << 16))):
                length -= len(chunk)

    @app.before_request
    def check_token() -> Response | None:
        if config.token is None or request.path not in _PROTECTED:
            return None
        header = request.headers.get("Authorization", "")
        scheme, _, supplied = header.partition(" ")
        if scheme.lower() != "bearer" or not supplied:
            counters.rejected()
            return _error(401, "missing bearer token: send 'Authorization: Bearer <token>'",
                          "unauthorized")
        if not hmac.compare_digest(supplied.strip().encode(), config.token.encode()):
            counters.rejected()
            return _error(401, "invalid bearer token", "unauthorized")
        return None

    @app.post("/search")
    def search() -> Response:
        body = read_body()
        queries = parse_queries(body, "questions", limits)
        k = parse_k(body, "N", config.default_n, limits)
        _, rows = run_search(queries, k)
        docs = retriever.passages(rows)
        counters.served(len(queries))
        return _json([{"question": q, "top_k_docs": [p.contents for p in d]}
                      for q, d in zip(queries, docs, strict=True)])

    @app.post("/retrieve")
    def retrieve() -> Response:
        body = read_body()
        queries = parse_queries(body, "queries", limits)
        k = parse_k(body, "topk", config.default_topk, limits)
        with_scores = parse_bool(body, "return_scores", False)
        scores, rows = run_search(queries, k)
        docs = retriever.passages(rows)
        result = []
        for passages, row_scores, row_ids in zip(docs, scores, rows, strict=True):
            items = [{"id": p.id, "contents": p.contents} for p in passages]
            if with_scores:
                kept = [float(s) for s, r in zip(row_scores, row_ids, strict=True) if r >= 0]
                items = [{"document": d, "score": s} for d, s in zip(items, kept, strict=True)]
            result.append(items)
        counters.served(len(queries))
        return _json({"result": result})

    @app.get("/health")
    def health() -> Response:
        return _json({
            "status": "ok", **description,
            "uptime_s": round(time.monotonic() - started, 1),
            "requests_served": counters.requests, "queries_served": counters.queries,
            "client_errors": counters.client_errors,
            "micro_batching": isinstance(scheduler, MicroBatcher),
            "batching": scheduler.stats.to_json(), "limits": asdict(limits),
            "auth": config.token is not None,
        })

    @app.errorhandler(ApiError)
    def api_error(err: ApiError) -> Response:
        counters.rejected()
        return _error(err.status, err.message, err.kind)

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        counters.rejected()
        status = err.code or 500
        if status == 404:
            message = f"unknown path {request.path}; endpoints: {', '.join(ENDPOINTS)}"
        elif status == 405:
            message = f"method {request.method} not allowed on {request.path}; endpoints: " \
                      f"{', '.join(ENDPOINTS)}"
        elif status == 413:
            message = f"request body exceeds the limit of {limits.max_body_bytes} bytes"
        else:
            message = err.description or err.name
        return _error(status, message, err.name.lower().replace(" ", "_"))

    @app.errorhandler(Exception)
    def internal_error(err: Exception) -> Response:
        logger.exception("request to %s failed", request.path)
        return _error(500, f"internal error: {type(err).__name__}: {err}", "internal_error")

    return app
