"""Dynamic micro-batching: concurrent requests share one encoder pass and one Faiss search.

Every MAPPO rollout step sends a few sub-questions from every trainer process at about the same
time. Encoding one query at a time leaves the encoder (and a GPU) mostly idle: a batch of 16
costs little more than a batch of 1. The :class:`MicroBatcher` collects what is waiting - up to
``max_batch_queries`` queries, and for at most ``max_wait_ms`` after the oldest request arrived -
runs it as one :meth:`Retriever.search_many` call, and hands each request its own rows back.

Under load the wait costs nothing: requests that queued while the previous batch ran are
already older than the wait bound, so the next batch starts at once with all of them. Idle,
a lone request pays at most ``max_wait_ms``.

:class:`DirectSearcher` is the switched-off variant (each request alone, under a lock) that the
benchmark uses as the naive baseline.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

SearchResult = tuple[np.ndarray, np.ndarray]
SearchMany = Callable[[Sequence[tuple[Sequence[str], int]]], list[SearchResult]]


@dataclass(frozen=True)
class BatcherConfig:
    enabled: bool = True
    #: Upper bound on the queries encoded together; a larger request still runs, alone.
    max_batch_queries: int = 128
    #: How long the oldest waiting request may be held back to let others join its batch.
    max_wait_ms: float = 2.0


@dataclass
class BatchStats:
    """Counters shown by ``/health``; updated by the single executing thread."""

    batches: int = 0
    requests: int = 0
    queries: int = 0
    largest_batch: int = 0
    busy_seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, n_requests: int, n_queries: int, seconds: float) -> None:
        with self._lock:
            self.batches += 1
            self.requests += n_requests
            self.queries += n_queries
            self.largest_batch = max(self.largest_batch, n_queries)
            self.busy_seconds += seconds

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"batches": self.batches, "requests": self.requests, "queries": self.queries,
                    "mean_batch_queries": round(self.queries / self.batches, 2)
                    if self.batches else 0.0,
                    "largest_batch_queries": self.largest_batch,
                    "busy_seconds": round(self.busy_seconds, 3)}


class Scheduler(Protocol):
    """What the Flask app needs: run one request's search, report counters, shut down."""

    stats: BatchStats

    def search(self, queries: Sequence[str], k: int, timeout: float | None = None
               ) -> SearchResult: ...

    def close(self) -> None: ...


class DirectSearcher:
    """No batching: each request is encoded and searched on its own, one at a time."""

    def __init__(self, search_many: SearchMany) -> None:
        self._search_many = search_many
        self._lock = threading.Lock()
        self.stats = BatchStats()

    def search(self, queries: Sequence[str], k: int, timeout: float | None = None
               ) -> SearchResult:
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise TimeoutError(f"search did not start within {timeout} s")
        try:
            started = time.perf_counter()
            result = self._search_many([(queries, k)])[0]
            self.stats.record(1, len(queries), time.perf_counter() - started)
            return result
        finally:
            self._lock.release()

    def close(self) -> None:
        pass


@dataclass
class _Pending:
    queries: Sequence[str]
    k: int
    enqueued: float
    future: Future = field(default_factory=Future)


_STOP = object()
#: How many past batches set the number of requests a new batch waits for.
RECENT_BATCHES = 16


class MicroBatcher:
    """Merges concurrent requests into shared batches, run by one background thread.

    The thread starts on first use, in the process that uses it: gunicorn forks its worker
    after importing the application, and a thread started before a fork does not exist in the
    child (and an encoder's thread pool must not be touched across a fork either).
    """

    def __init__(self, search_many: SearchMany, config: BatcherConfig | None = None) -> None:
        self.config = config or BatcherConfig()
        self._search_many = search_many
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._owner_pid: int | None = None
        self._start_lock = threading.Lock()
        self._closed = False
        #: Requests per batch of the last batches: the concurrency the batcher expects.
        self._recent: deque[int] = deque(maxlen=RECENT_BATCHES)
        self.stats = BatchStats()

    def _ensure_running(self) -> None:
        if self._thread is not None and self._owner_pid == os.getpid():
            return
        with self._start_lock:
            if self._thread is None or self._owner_pid != os.getpid():
                self._queue = queue.Queue()
                self._owner_pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name="mmoa-microbatcher",
                                                daemon=True)
                self._thread.start()

    def submit(self, queries: Sequence[str], k: int) -> Future:
        if self._closed:
            raise RuntimeError("the micro-batcher is shut down")
        self._ensure_running()
        item = _Pending(queries, k, time.monotonic())
        self._queue.put(item)
        return item.future

    def search(self, queries: Sequence[str], k: int, timeout: float | None = None
               ) -> SearchResult:
        future = self.submit(queries, k)
        try:
            return future.result(timeout=timeout)
        except TimeoutError:
            future.cancel()  # skipped if not started yet; otherwise its result is dropped
            raise TimeoutError(f"search did not finish within {timeout} s") from None

    def close(self, timeout: float = 5.0) -> None:
        self._closed = True
        if self._thread is not None and self._owner_pid == os.getpid():
            self._queue.put(_STOP)
            self._thread.join(timeout)

    # ---------------------------------------------------------------- background thread

    def _collect(self, first: _Pending) -> tuple[list[_Pending], Any]:
        """The batch led by ``first``, and the item that did not fit (or None).

        Everything already queued joins at once. Beyond that the batch is held open - for at
        most ``max_wait_ms`` - only until it has as many requests as the busiest recent batch:
        with N clients in lock-step the N-th request is known to be on its way, with a single
        client nothing is expected and nothing waits.
        """
        batch, n = [first], len(first.queries)
        expected = max(self._recent, default=1)
        deadline = time.monotonic() + self.config.max_wait_ms / 1000.0
        limit = self.config.max_batch_queries
        while n < limit:
            remaining = deadline - time.monotonic()
            try:
                if len(batch) < expected and remaining > 0:
                    item = self._queue.get(timeout=remaining)
                else:
                    item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP or n + len(item.queries) > limit:
                return batch, item
            batch.append(item)
            n += len(item.queries)
        return batch, None

    def _run(self) -> None:
        carry: Any = None
        while True:
            first = carry if carry is not None else self._queue.get()
            carry = None
            if first is _STOP:
                return
            batch, carry = self._collect(first)
            live = [item for item in batch if item.future.set_running_or_notify_cancel()]
            self._recent.append(len(batch))
            if not live:
                continue
            started = time.perf_counter()
            try:
                results = self._search_many([(item.queries, item.k) for item in live])
            except Exception as err:  # every waiting request must hear of it
                for item in live:
                    item.future.set_exception(err)
                continue
            self.stats.record(len(live), sum(len(i.queries) for i in live),
                              time.perf_counter() - started)
            for item, result in zip(live, results, strict=True):
                item.future.set_result(result)


def make_scheduler(search_many: SearchMany, config: BatcherConfig) -> Scheduler:
    return MicroBatcher(search_many, config) if config.enabled else DirectSearcher(search_many)
