"""HTTP client of the retrieval server, used by MAPPO rollouts and evaluation.

The original trainer called the server with a bare ``requests.post`` and no timeout: one hung
or restarting server stalled all eight training processes forever. This client bounds every
call, retries what can succeed on a second try (connection errors, time-outs, 502/503/504) with
exponential backoff, never retries a 4xx (the request itself is wrong), and when the server
stays unreachable raises :class:`RetrieverUnavailableError` naming the URL.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import requests

RETRIABLE_STATUS = frozenset({502, 503, 504})
DEFAULT_URL = "http://127.0.0.1:8000"


class RetrieverUnavailableError(ConnectionError):
    """The server could not be reached (or kept failing) after all retries.

    ``attempts`` is how many requests were sent (the first try and its retries), so that a
    caller can say exactly what happened; ``None`` where no request count applies."""

    def __init__(self, message: str, attempts: int | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts


class RetrieverRequestError(RuntimeError):
    """The server rejected the request (4xx) or failed on it (500); not retried."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {message}")
        self.url = url
        self.status = status
        self.message = message


class RetrievalClient:
    """Thread-safe client; one keep-alive connection per calling thread.

    ``search``/``retrieve`` accept any number of queries and split them into requests of at
    most ``max_queries_per_request`` (the server's limit), returning results in input order.
    """

    def __init__(self, url: str = DEFAULT_URL, token: str | None = None, timeout: float = 30.0,
                 retries: int = 3, backoff: float = 0.5, max_backoff: float = 8.0,
                 max_queries_per_request: int = 64) -> None:
        base = url.rstrip("/")
        for suffix in ("/search", "/retrieve", "/health"):
            base = base.removesuffix(suffix)
        if not base.startswith(("http://", "https://")):
            raise ValueError(f"retriever URL {url!r} must start with http:// or https://")
        if retries < 0 or timeout <= 0 or max_queries_per_request <= 0:
            raise ValueError("retries must be >= 0, timeout and max_queries_per_request > 0")
        self.url = base
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_queries_per_request = max_queries_per_request
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._local = threading.local()
        # Its own generator: the backoff jitter must not advance the global ``random`` state,
        # which a training run saves and restores with its checkpoints.
        self._jitter = random.Random()

    # ------------------------------------------------------------------------ public API

    def search(self, questions: Sequence[str], n: int = 10) -> list[list[str]]:
        """Original API: the top-``n`` ``"title\\ntext"`` strings per question, in order."""
        out: list[list[str]] = []
        for chunk in self._chunks(questions):
            payload = self._call("POST", "/search", {"questions": chunk, "N": n})
            out.extend(item["top_k_docs"] for item in payload)
        return out

    def retrieve(self, queries: Sequence[str], topk: int = 3, return_scores: bool = False
                 ) -> list[list[dict[str, Any]]]:
        """FlashRAG / Search-R1 API: ``{"id", "contents"}`` per hit, or with scores
        ``{"document": {...}, "score": float}``."""
        out: list[list[dict[str, Any]]] = []
        for chunk in self._chunks(queries):
            payload = self._call("POST", "/retrieve", {"queries": chunk, "topk": topk,
                                                       "return_scores": return_scores})
            out.extend(payload["result"])
        return out

    def retrieve_sampled(self, queries: Sequence[str], topk: int, pool_size: int, alpha: float,
                         seed: int) -> list[dict[str, Any]]:
        """Stochastic retrieval (HARR): per query ``{"documents": [{"id", "contents", "score"}],
        "logprob", "picks", "pool_rows"}``, the documents in sampled order.

        Query ``i`` of ``queries`` draws from the stream ``(seed, i)`` however the batch is
        split into requests (each chunk sends its offset), so the same call returns the same
        answer, and repeated queries in one call are independent samples (a GRPO group).
        """
        out: list[dict[str, Any]] = []
        offset = 0
        for chunk in self._chunks(queries):
            payload = self._call("POST", "/retrieve", {
                "queries": chunk, "topk": topk, "return_scores": True,
                "sample": {"pool_size": pool_size, "alpha": alpha, "seed": seed,
                           "query_offset": offset}})
            for hits, record in zip(payload["result"], payload["sampling"], strict=True):
                documents = [{**hit["document"], "score": hit["score"]} for hit in hits]
                out.append({"documents": documents, **record})
            offset += len(chunk)
        return out

    def reload_encoder(self, path: str | None = None) -> dict[str, Any]:
        """Make the server embed queries with the encoder checkpoint at ``path`` (a folder the
        server can read; ``None``: the index's own encoder). Returns the new encoder's identity.

        Not retried on a time-out (a reload that timed out may still complete): loading a
        large encoder can take a while, so this call waits up to ten times the usual time-out.
        """
        body = {} if path is None else {"path": str(path)}
        try:
            payload = self._once("POST", "/admin/reload_encoder", body, self.timeout * 10)
        except (requests.ConnectionError, requests.Timeout, _Retriable) as err:
            self.close()
            raise RetrieverUnavailableError(
                f"retrieval server at {self.url}: encoder reload failed ({type(err).__name__}: "
                f"{err})", attempts=1) from err
        return dict(payload["encoder"])

    def search_documents(self, queries: Sequence[str], k: int) -> list[list[dict[str, Any]]]:
        """Ranked ``{"id", "contents"}`` documents per query: what the pipeline merges by id."""
        return self.retrieve(queries, topk=k, return_scores=False)

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health", None)

    def wait_until_ready(self, timeout: float = 300.0, interval: float = 0.5) -> dict[str, Any]:
        """Poll ``/health`` until the server answers (a big index takes minutes to load)."""
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                return self._once("GET", "/health", None, min(self.timeout, 5.0))
            except RetrieverRequestError as err:
                if 400 <= err.status < 500:
                    # the retrieval server answers /health without a token, even while its
                    # index loads: a 4xx is another web server at this URL, and waiting for
                    # it (30 s, then the whole page in the error) helps nobody
                    raise RetrieverUnavailableError(
                        f"{self.url} is not a retrieval server: GET /health answered "
                        f"HTTP {err.status} ({err.message}); is the URL right (bash "
                        f"run_server.sh --index DIR prints it)?") from err
                last = err
            except requests.RequestException as err:
                last = err
            time.sleep(interval)
        raise RetrieverUnavailableError(
            f"retrieval server at {self.url} not ready after {timeout:.0f} s ({last}); "
            f"is it running (bash run_server.sh --index DIR) and is the URL right?"
        )

    def close(self) -> None:
        session = getattr(self._local, "session", None)
        if session is not None:
            session.close()
            self._local.session = None

    def __enter__(self) -> RetrievalClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------------------ internals

    def _chunks(self, queries: Sequence[str]) -> list[list[str]]:
        if isinstance(queries, str):
            raise TypeError("pass a list of queries, not a single string")
        items = list(queries)
        step = self.max_queries_per_request
        return [items[i:i + step] for i in range(0, len(items), step)]

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            session.headers.update(self._headers)
            self._local.session = session
        return session

    def _once(self, method: str, path: str, body: Any, timeout: float) -> Any:
        response = self._session().request(method, self.url + path, json=body, timeout=timeout)
        if response.status_code in RETRIABLE_STATUS:
            raise _Retriable(f"HTTP {response.status_code}: {_message(response)}")
        if response.status_code >= 400:
            raise RetrieverRequestError(self.url + path, response.status_code,
                                        _message(response))
        return response.json()

    def _call(self, method: str, path: str, body: Any) -> Any:
        attempts = self.retries + 1
        last = ""
        for attempt in range(attempts):
            try:
                return self._once(method, path, body, self.timeout)
            except (requests.ConnectionError, requests.Timeout, _Retriable) as err:
                last = f"{type(err).__name__}: {err}"
                self.close()  # a broken keep-alive connection must not be reused
            if attempt + 1 < attempts:
                delay = min(self.max_backoff, self.backoff * 2 ** attempt)
                time.sleep(delay * (0.5 + self._jitter.random() / 2))
        raise RetrieverUnavailableError(
            f"retrieval server at {self.url} unavailable after {attempts} attempt(s) "
            f"({last}); is it running (bash run_server.sh --index DIR) and is the URL right?",
            attempts=attempts,
        )


class _Retriable(Exception):
    """A response worth retrying (server overloaded or restarting)."""


def _message(response: requests.Response) -> str:
    """The server's error message; a body that is not JSON (another web server's HTML page)
    in one line, shortened: it ends up in one-line errors of the trainer and of eval."""
    try:
        payload = response.json()
    except ValueError:
        text = " ".join(response.text.split())
        kind = response.headers.get("Content-Type", "no content type").split(";")[0]
        return (f"a {kind} answer, not the retrieval server's JSON: "
                f"{text[:120] + '…' if len(text) > 120 else text}")
    return str(payload.get("message", payload)) if isinstance(payload, dict) else str(payload)
