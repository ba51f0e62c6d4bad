"""Flask application: the two retrieval APIs, a health endpoint and strict input checking.

* ``POST /search``   - the original MMOA-RAG API: ``{"questions": [str], "N": int}`` ->
  ``[{"question": str, "top_k_docs": ["title\\ntext", ...]}]`` in request order.
* ``POST /retrieve`` - the FlashRAG / Search-R1 API: ``{"queries": [str], "topk": int,
  "return_scores": bool}`` -> ``{"result": [[{"document": {"id", "contents"}, "score"}]]}``
  (without scores: ``{"result": [[{"id", "contents"}]]}``, as Search-R1 does).
* ``GET /health``    - corpus size, dimension, encoder, index type, uptime, counters, limits.
* ``POST /admin/reload_encoder`` - ``{"path": dir}`` (or ``{}`` for the index's own encoder):
  swap the query encoder for a checkpoint of the query encoder's RL stage; the passage
  vectors stay as built (see :meth:`Retriever.reload_encoder`).

``/search`` and ``/retrieve`` also do stochastic retrieval (HARR): with ``"sample": {"pool_size",
"alpha", "seed"}`` the ``N``/``topk`` documents are drawn in order, without replacement, from
``softmax(score / alpha)`` over the top ``pool_size`` candidates (``mmoa.retrieval.sampling``),
and each query's answer carries its Plackett-Luce ``logprob``, the pool's corpus rows and the
picks' positions in the pool. Without ``sample`` both endpoints are greedy, exactly as before.

Every failure is a JSON object ``{"error": <kind>, "message": <what was wrong>, "status": n}``
with a 4xx code for bad input; one bad request never disturbs the requests beside it.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import ClientDisconnected, HTTPException

from mmoa.retrieval.batcher import MicroBatcher, Scheduler
from mmoa.retrieval.canary import CANARY_K, EncoderCanaryError
from mmoa.retrieval.encoder import EncoderFolderError
from mmoa.retrieval.index import EncoderChangedError, Retriever
from mmoa.retrieval.sampling import (
    MAX_ALPHA,
    MAX_SEED,
    MIN_ALPHA,
    SampleSpec,
    query_rng,
    sample_pool,
)

logger = logging.getLogger(__name__)

RELOAD_PATH = "/admin/reload_encoder"
ENDPOINTS = ("POST /search", "POST /retrieve", "GET /health", f"POST {RELOAD_PATH}")
_PROTECTED = {"/search", "/retrieve", RELOAD_PATH}


@dataclass(frozen=True)
class ServerLimits:
    """Bounds that keep one client from monopolising the shared encoder and index."""

    max_queries: int = 64
    max_k: int = 100
    max_body_bytes: int = 1 << 20
    max_query_chars: int = 2048
    request_timeout_s: float = 60.0
    #: Longest an encoder reload may take; past it the old encoder keeps serving, the reload
    #: lock is freed and the load, if it ever ends, is dropped.
    reload_timeout_s: float = 300.0


@dataclass(frozen=True)
class AppConfig:
    limits: ServerLimits = field(default_factory=ServerLimits)
    #: Bearer token required on /search and /retrieve when set (``/health`` stays open).
    token: str | None = None
    #: ``N`` when a /search request leaves it out (the original server's default).
    default_n: int = 10
    #: ``topk`` when a /retrieve request leaves it out (Search-R1's default).
    default_topk: int = 3
    #: Folders under which a reload may name an encoder (empty: any folder the server reads).
    reload_roots: tuple[str, ...] = ()


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


#: The fields each endpoint's JSON body may have: anything else (``"n"`` for ``"N"``,
#: ``"top_k"`` for ``"topk"``) was silently ignored and gave a default answer.
SEARCH_FIELDS = ("questions", "N", "sample")
RETRIEVE_FIELDS = ("queries", "topk", "return_scores", "sample")
RELOAD_FIELDS = ("path",)


def check_fields(body: dict[str, Any], accepted: Sequence[str], where: str) -> None:
    """Refuse a body with fields other than ``accepted``, naming them and the accepted ones."""
    unknown = sorted(set(body) - set(accepted), key=str)
    if not unknown:
        return
    import difflib

    hints = []
    for name in unknown:
        folded = {a.lower(): a for a in accepted}
        close = folded.get(str(name).lower().replace("_", "")) or next(
            iter(difflib.get_close_matches(str(name), accepted, n=1, cutoff=0.6)), None)
        if close:
            hints.append(f"{name!r} -> {close!r}?")
    raise ApiError(400, f"unknown field(s) {unknown} in the body of {where}; accepted: "
                        f"{list(accepted)}" + (f" (did you mean {', '.join(hints)})"
                                               if hints else ""))


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


_SAMPLE_FIELDS = ("pool_size", "alpha", "seed", "query_offset")


def _sample_int(spec: dict[str, Any], name: str, low: int, high: int) -> int:
    value = spec[name]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"field 'sample.{name}' must be an integer, got "
                            f"{type(value).__name__}")
    if not low <= value <= high:
        raise ApiError(400, f"field 'sample.{name}' = {value}; expected {low} <= "
                            f"sample.{name} <= {high}")
    return value


def parse_sample(body: dict[str, Any], k: int, k_name: str, limits: ServerLimits
                 ) -> SampleSpec | None:
    """The ``sample`` object of a search request, or ``None`` (greedy) when it is absent.

    ``pool_size`` (default 30, at most the server's ``max_k``, at least ``k``), ``alpha`` (a
    positive number, default 0.05), ``seed`` (0..2**63-1; a fresh random one when absent, and
    the response says which, so any answer can be reproduced) and ``query_offset`` (>= 0).
    """
    spec = body.get("sample")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise ApiError(400, f"field 'sample' must be an object {{pool_size, alpha, seed}}, got "
                            f"{type(spec).__name__}")
    unknown = sorted(set(spec) - set(_SAMPLE_FIELDS))
    if unknown:
        raise ApiError(400, f"field 'sample' has unknown key(s) {unknown}; expected "
                            f"{list(_SAMPLE_FIELDS)}")
    values = {**asdict(SampleSpec()), "seed": secrets.randbelow(MAX_SEED + 1),
              **{key: value for key, value in spec.items() if value is not None}}
    pool_size = _sample_int(values, "pool_size", 1, limits.max_k)
    if k > pool_size:
        raise ApiError(400, f"field '{k_name}' = {k} exceeds sample.pool_size = {pool_size}; "
                            f"the sampled documents are drawn from the pool")
    alpha = values["alpha"]
    # compared as given (an int of 400 digits has no float), NaN and inf fail the comparison
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) \
            or not MIN_ALPHA <= alpha <= MAX_ALPHA:
        shown = (f"an integer of {len(str(abs(alpha)))} digits"
                 if isinstance(alpha, int) and abs(alpha) > 10**20 else repr(alpha))
        raise ApiError(400, f"field 'sample.alpha' must be a positive number in "
                            f"{MIN_ALPHA:g}..{MAX_ALPHA:g}, got {shown}")
    seed = _sample_int(values, "seed", 0, MAX_SEED)
    offset = _sample_int(values, "query_offset", 0, MAX_SEED)
    return SampleSpec(pool_size, float(alpha), seed, offset)


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
    text = json.dumps(payload, ensure_ascii=False)
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate quoted from the request: escape it
        body = json.dumps(payload).encode("ascii")
    return Response(body, status=status, mimetype="application/json")


def parse_reload_path(body: dict[str, Any]) -> str | None:
    """The reload's ``path``: absent/None (the start encoder) or a usable folder name.

    ``"\\ud800"`` (a lone surrogate, valid JSON) cannot be a file name: it reached ``os.stat``
    and the answer's encoding and came back as a 500 with a traceback."""
    path = body.get("path")
    if path is None:
        return None
    if not isinstance(path, str) or not path.strip():
        raise ApiError(400, "field 'path' must be the folder of a query encoder checkpoint "
                            "(a non-empty string), or absent for the index's own encoder")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError as err:
        raise ApiError(400, f"field 'path' is not valid Unicode (lone surrogate at character "
                            f"{err.start}); expected a folder name") from err
    if "\0" in path:
        raise ApiError(400, "field 'path' holds a NUL character; expected a folder name")
    if len(path) > 4096:
        raise ApiError(400, f"field 'path' has {len(path)} characters; a folder name has at "
                            f"most 4096")
    return path


def _error(status: int, message: str, kind: str) -> Response:
    response = _json({"error": kind, "message": message, "status": status}, status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="mmoa-retriever"'
    return response


def _token_forms(token: str) -> tuple[bytes, ...]:
    """The header bytes that carry ``token``: UTF-8, and latin-1 where it has that form."""
    forms = [token.encode("utf-8")]
    with contextlib.suppress(UnicodeEncodeError):
        forms.append(token.encode("latin-1"))
    return tuple(dict.fromkeys(forms))


def _check_reload_root(path: str, roots: Sequence[str]) -> None:
    """Refuse (403) a reload folder outside ``--reload-root`` (links resolved first)."""
    from pathlib import Path

    try:
        target = Path(path).expanduser().resolve()
    except (OSError, ValueError, RuntimeError) as err:
        raise ApiError(400, f"field 'path' {path!r} cannot be resolved ({err})") from err
    if not any(target.is_relative_to(Path(root).expanduser().resolve()) for root in roots):
        raise ApiError(403, f"field 'path' {path!r} is outside the folders this server may "
                            f"load encoders from (--reload-root: {list(roots)})", "forbidden")


def create_app(retriever: Retriever, scheduler: Scheduler,
               config: AppConfig | None = None) -> Flask:
    """The WSGI application around an opened retriever and its scheduler (batched or not)."""
    config = config or AppConfig()
    limits = config.limits
    app = Flask("mmoa.retrieval")
    app.config["MAX_CONTENT_LENGTH"] = limits.max_body_bytes
    # "/admin//reload_encoder" was answered with an HTML 308 to the merged path: no redirects,
    # an unknown path is a JSON 404 like any other.
    app.url_map.merge_slashes = False
    started = time.monotonic()
    counters = _Counters()
    reload_lock = threading.Lock()
    reloads = {"count": 0, "path": None}
    abandoned: list[threading.Thread] = []  # reloads that passed the time bound
    token_forms = _token_forms(config.token) if config.token is not None else ()

    def run_search(queries: Sequence[str], k: int) -> tuple[Any, Any]:
        try:
            return scheduler.search(queries, k, timeout=limits.request_timeout_s)
        except TimeoutError as err:
            raise ApiError(503, f"{err}; the server is overloaded", "timeout") from err

    def ranked(queries: Sequence[str], k: int, spec: SampleSpec | None
               ) -> tuple[list[list[tuple[int, float]]], list[dict[str, Any]] | None]:
        """Per query, the ``(corpus row, score)`` pairs to answer with, and for a sampled
        request the per-query sampling record (``logprob``, ``pool_rows``, ``picks``)."""
        if spec is None:
            scores, rows = run_search(queries, k)
            return [[(int(r), float(s)) for s, r in zip(sc, rw, strict=True) if r >= 0]
                    for sc, rw in zip(scores, rows, strict=True)], None
        scores, rows = run_search(queries, spec.pool_size)
        hits, records = [], []
        for i, (sc, rw) in enumerate(zip(scores, rows, strict=True)):
            keep = rw >= 0
            pool_scores, pool_rows = sc[keep], rw[keep]
            picks, logprob = sample_pool(pool_scores, k, spec.alpha,
                                         query_rng(spec.seed, spec.query_offset + i))
            if not math.isfinite(logprob):  # NaN is not JSON; never answer with it
                raise ApiError(400, f"sample.alpha = {spec.alpha:g} gives a log-probability "
                                    f"that is not finite for query {i}; use a larger alpha")
            hits.append([(int(pool_rows[p]), float(pool_scores[p])) for p in picks])
            records.append({"logprob": logprob, "picks": [int(p) for p in picks],
                            "pool_rows": [int(r) for r in pool_rows]})
        return hits, records

    def sample_info(spec: SampleSpec) -> dict[str, Any]:
        return {"pool_size": spec.pool_size, "alpha": spec.alpha, "seed": spec.seed,
                "query_offset": spec.query_offset}

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
        # By the route that matched, not the raw path: no spelling of a protected path may
        # reach its handler without the token.
        rule = request.url_rule.rule if request.url_rule is not None else request.path
        if config.token is None or (rule not in _PROTECTED and request.path not in _PROTECTED):
            return None
        header = request.headers.get("Authorization", "")
        scheme, _, supplied = header.partition(" ")
        if scheme.lower() != "bearer" or not supplied:
            counters.rejected()
            return _error(401, "missing bearer token: send 'Authorization: Bearer <token>'",
                          "unauthorized")
        # The WSGI server decodes header bytes as latin-1: compare the bytes the client sent
        # with the token in UTF-8 (curl in a UTF-8 terminal) and in latin-1 (python-requests).
        # Only spaces and tabs are stripped: str.strip() would also take a trailing \xa0,
        # the last byte of a UTF-8 "\u00e0".
        try:
            sent = supplied.strip(" \t").encode("latin-1")
        except UnicodeEncodeError:
            sent = supplied.strip(" \t").encode("utf-8")
        matches = [hmac.compare_digest(sent, form) for form in token_forms]
        if not any(matches):
            counters.rejected()
            return _error(401, "invalid bearer token", "unauthorized")
        return None

    @app.post("/search")
    def search() -> Response:
        body = read_body()
        queries = parse_queries(body, "questions", limits)
        check_fields(body, SEARCH_FIELDS, "POST /search")
        k = parse_k(body, "N", config.default_n, limits)
        spec = parse_sample(body, k, "N", limits)
        hits, records = ranked(queries, k, spec)
        docs = retriever.corpus.get([r for row in hits for r, _ in row])
        counters.served(len(queries))
        out, start = [], 0
        for i, (question, row) in enumerate(zip(queries, hits, strict=True)):
            item: dict[str, Any] = {"question": question, "top_k_docs": [
                p.contents for p in docs[start:start + len(row)]]}
            start += len(row)
            if records is not None:
                item.update(records[i], scores=[s for _, s in row],
                            sample=sample_info(spec))  # type: ignore[arg-type]
            out.append(item)
        return _json(out)

    @app.post("/retrieve")
    def retrieve() -> Response:
        body = read_body()
        queries = parse_queries(body, "queries", limits)
        check_fields(body, RETRIEVE_FIELDS, "POST /retrieve")
        k = parse_k(body, "topk", config.default_topk, limits)
        with_scores = parse_bool(body, "return_scores", False)
        spec = parse_sample(body, k, "topk", limits)
        hits, records = ranked(queries, k, spec)
        docs = iter(retriever.corpus.get([r for row in hits for r, _ in row]))
        result = []
        for row in hits:
            items: list[dict[str, Any]] = []
            for _, score in row:
                passage = next(docs)
                doc = {"id": passage.id, "contents": passage.contents}
                items.append({"document": doc, "score": score} if with_scores else doc)
            result.append(items)
        counters.served(len(queries))
        if spec is None:
            return _json({"result": result})
        return _json({"result": result, "sampling": records, "sample": sample_info(spec)})

    def bounded_load(path: str | None) -> tuple[Any, dict[str, Any]]:
        """``retriever.load_encoder(path)`` in a thread that may take ``reload_timeout_s``.

        A load that passes it is abandoned: the old encoder keeps serving, the reload lock is
        freed, and whatever the load returns later is dropped. The load copies the folder
        with non-blocking opens under the same deadline (``load_encoder``), so no special file
        can hold it; only a file system that stops answering can, and while two such loads
        still run, new reloads are refused rather than piling up threads."""
        abandoned[:] = [t for t in abandoned if t.is_alive()]
        if len(abandoned) >= 2:
            raise ApiError(503, f"{len(abandoned)} earlier encoder reloads that passed the "
                                f"{limits.reload_timeout_s:g} s bound are still running; "
                                f"restart the server if they never finish", "reload_busy")
        result: dict[str, Any] = {}
        deadline = time.monotonic() + limits.reload_timeout_s

        def work() -> None:
            try:
                result["value"] = retriever.load_encoder(path, deadline=deadline)
            except BaseException as err:  # handed to the request thread below
                result["error"] = err

        thread = threading.Thread(target=work, name="mmoa-encoder-reload", daemon=True)
        thread.start()
        thread.join(limits.reload_timeout_s)
        if thread.is_alive():
            abandoned.append(thread)
            raise ApiError(504, f"loading the query encoder from "
                                f"{path or 'the server start folder'} took longer than "
                                f"{limits.reload_timeout_s:g} s (--reload-timeout); the old "
                                f"encoder keeps serving", "reload_timeout")
        if "error" in result:
            raise result["error"]
        return result["value"]

    def canary_baseline() -> None:
        """Measure, once, how many canaries the serving (start) encoder finds, through the
        micro-batcher: the serving encoder's tokenizer must not be called from a second
        thread (fast tokenizers fail with "Already borrowed")."""
        if getattr(retriever, "canary_baseline", 0) is not None:
            return
        _, texts = retriever.canary_inputs()
        retriever.measure_canary_baseline(run_search(texts, CANARY_K)[1])

    @app.post(RELOAD_PATH)
    def reload_encoder() -> Response:
        """Copy, check, load and prove first, swap last: every failure is a 4xx that names
        what failed, and leaves the old encoder serving."""
        body = read_body()
        check_fields(body, RELOAD_FIELDS, f"POST {RELOAD_PATH}")
        path = parse_reload_path(body)
        if path is not None and config.reload_roots:
            _check_reload_root(path, config.reload_roots)
        if not reload_lock.acquire(blocking=False):
            raise ApiError(409, "another encoder reload is in progress", "conflict")
        where = path or "the folder the server started with"
        try:
            started_at = time.monotonic()
            canary_baseline()
            encoder, identity = bounded_load(path)
            retriever.install_encoder(encoder)
            reloads["count"] += 1
            reloads["path"] = path
        except ApiError:
            raise
        except EncoderChangedError as err:
            raise ApiError(409, f"cannot restore the query encoder: {err}",
                           "encoder_changed") from err
        except EncoderFolderError as err:
            raise ApiError(400, f"cannot load the query encoder from {where!r}: {err.file}: "
                                f"{err.reason}", "bad_encoder") from err
        except EncoderCanaryError as err:
            raise ApiError(400, f"the query encoder from {where!r} loaded but failed the "
                                f"canary (the old encoder keeps serving): {err.reason}",
                           "bad_encoder") from err
        except Exception as err:  # whatever the checkpoint makes transformers raise
            logger.warning("encoder reload from %r failed: %s: %r", where,
                           type(err).__name__, str(err)[:500])
            raise ApiError(400, f"cannot load the query encoder from {where!r}: "
                                f"{type(err).__name__}: {err}", "bad_encoder") from err
        finally:
            reload_lock.release()
        logger.info("query encoder reloaded from %r (fingerprint %s, canary %s)",
                    path or "the index's own encoder", identity.get("fingerprint"),
                    identity.get("canary"))
        return _json({"status": "ok", "encoder": identity,
                      "seconds": round(time.monotonic() - started_at, 3)})

    @app.get("/health")
    def health() -> Response:
        return _json({
            "status": "ok", **retriever.describe(),
            "encoder_reloads": reloads["count"],
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
