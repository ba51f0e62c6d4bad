"""Micro-batcher: merging, splitting back, limits, errors, time-outs, lazy start.

The search function here is a small deterministic stand-in for ``Retriever.search_many`` that
records the batches it is called with, so the tests can see exactly how requests were merged;
the batcher on top of the real retriever is exercised by the server tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from mmoa.retrieval.batcher import BatcherConfig, DirectSearcher, MicroBatcher, make_scheduler


class RecordingSearch:
    """``search_many`` whose rows encode (query length, rank) so answers can be checked."""

    def __init__(self, hold_first: bool = False) -> None:
        self.batches: list[list[tuple[list[str], int]]] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.hold_first = hold_first
        self.fail_batches: set[int] = set()  # 1-based numbers of the batches that raise

    def __call__(self, requests: Sequence[tuple[Sequence[str], int]]
                 ) -> list[tuple[np.ndarray, np.ndarray]]:
        self.batches.append([(list(q), k) for q, k in requests])
        self.entered.set()
        if self.hold_first and len(self.batches) == 1:
            assert self.release.wait(10)
        if len(self.batches) in self.fail_batches:
            raise RuntimeError("encoder exploded")
        return [(np.array([[float(len(q))] * k for q in qs], dtype=np.float32),
                 np.array([[len(q) * 100 + r for r in range(k)] for q in qs]))
                for qs, k in requests]


def expected_rows(queries: list[str], k: int) -> np.ndarray:
    return np.array([[len(q) * 100 + r for r in range(k)] for q in queries])


def test_each_request_gets_its_own_rows_back() -> None:
    fn = RecordingSearch()
    batcher = MicroBatcher(fn, BatcherConfig(max_wait_ms=5))
    results: dict[int, np.ndarray] = {}

    def client(i: int) -> None:
        queries = ["q" * (i + 1), "x" * (2 * i + 1)]
        _, rows = batcher.search(queries, k=1 + i % 3, timeout=10)
        results[i] = rows
        np.testing.assert_array_equal(rows, expected_rows(queries, 1 + i % 3))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == 20
    assert batcher.stats.requests == 20 and batcher.stats.queries == 40
    batcher.close()


def test_requests_waiting_during_a_batch_are_merged() -> None:
    fn = RecordingSearch(hold_first=True)
    batcher = MicroBatcher(fn, BatcherConfig(max_wait_ms=0))
    first = batcher.submit(["first"], 2)
    assert fn.entered.wait(5)  # the batcher is now busy with the first request
    waiting = [batcher.submit([f"q{i}", f"r{i}"], 2 + i % 2) for i in range(5)]
    fn.release.set()
    first.result(5)
    for i, future in enumerate(waiting):
        np.testing.assert_array_equal(future.result(5)[1],
                                      expected_rows([f"q{i}", f"r{i}"], 2 + i % 2))
    assert len(fn.batches) == 2
    assert fn.batches[1] == [([f"q{i}", f"r{i}"], 2 + i % 2) for i in range(5)]
    assert batcher.stats.to_json()["largest_batch_queries"] == 10
    batcher.close()


def test_batch_size_limit_carries_the_rest_over() -> None:
    fn = RecordingSearch(hold_first=True)
    batcher = MicroBatcher(fn, BatcherConfig(max_batch_queries=4, max_wait_ms=0))
    head = batcher.submit(["h"], 1)
    assert fn.entered.wait(5)
    futures = [batcher.submit(["a", "b", "c"], 1), batcher.submit(["d"], 1),
               batcher.submit(["e", "f"], 1), batcher.submit(["g" * 9] * 6, 1)]
    fn.release.set()
    head.result(5)
    for f in futures:
        f.result(5)
    sizes = [sum(len(q) for q, _ in batch) for batch in fn.batches]
    assert sizes == [1, 4, 2, 6]  # [abc+d], [ef], and the oversize request alone
    batcher.close()


def test_an_error_reaches_every_request_of_the_batch_and_serving_goes_on() -> None:
    fn = RecordingSearch(hold_first=True)
    fn.fail_batches = {2}
    batcher = MicroBatcher(fn, BatcherConfig(max_wait_ms=0))
    head = batcher.submit(["h"], 1)
    assert fn.entered.wait(5)
    doomed = [batcher.submit(["a"], 1), batcher.submit(["b"], 1)]  # queued: batch 2
    fn.release.set()
    head.result(5)
    for future in doomed:
        with pytest.raises(RuntimeError, match="encoder exploded"):
            future.result(5)
    assert fn.batches[1] == [(["a"], 1), (["b"], 1)]
    np.testing.assert_array_equal(batcher.search(["ok"], 2, timeout=5)[1],
                                  expected_rows(["ok"], 2))
    batcher.close()


def test_timeout_is_reported() -> None:
    fn = RecordingSearch(hold_first=True)
    batcher = MicroBatcher(fn)
    with pytest.raises(TimeoutError, match=r"did not finish within 0\.2 s"):
        batcher.search(["slow"], 1, timeout=0.2)
    fn.release.set()
    batcher.close()


def test_a_lone_request_does_not_wait_for_company() -> None:
    fn = RecordingSearch()
    batcher = MicroBatcher(fn, BatcherConfig(max_wait_ms=60_000))
    # Nothing seen yet, so nothing is expected: the minute-long bound is never used.
    batcher.search(["alone"], 1, timeout=10)
    batcher.close()


def test_a_batch_waits_for_the_concurrency_seen_recently() -> None:
    fn = RecordingSearch(hold_first=True)
    batcher = MicroBatcher(fn, BatcherConfig(max_wait_ms=60_000))
    head = batcher.submit(["h"], 1)
    assert fn.entered.wait(5)
    trio = [batcher.submit([f"t{i}"], 1) for i in range(3)]
    fn.release.set()
    head.result(5)
    for f in trio:
        f.result(5)  # a batch of 3 requests: 3 are now expected
    late = [batcher.submit(["late0"], 1)]
    time.sleep(0.3)  # the batch is held open for the expected company...
    late += [batcher.submit([f"late{i}"], 1) for i in (1, 2)]
    for f in late:
        f.result(10)
    assert fn.batches[-1] == [([f"late{i}"], 1) for i in range(3)]  # ...which joined it
    batcher.close()


def test_thread_starts_lazily_and_again_in_a_new_process() -> None:
    fn = RecordingSearch()
    batcher = MicroBatcher(fn)
    assert batcher._thread is None  # nothing runs before the first request (pre-fork)
    batcher.search(["a"], 1, timeout=5)
    first_thread = batcher._thread
    assert first_thread is not None and first_thread.is_alive()
    batcher._owner_pid = -1  # as seen from a forked child: the thread is not ours
    batcher.search(["b"], 1, timeout=5)
    assert batcher._thread is not first_thread and batcher._thread.is_alive()
    batcher.close()
    with pytest.raises(RuntimeError, match="shut down"):
        batcher.submit(["c"], 1)


def test_direct_searcher_runs_every_request_alone() -> None:
    fn = RecordingSearch()
    scheduler = make_scheduler(fn, BatcherConfig(enabled=False))
    assert isinstance(scheduler, DirectSearcher)
    threads = [threading.Thread(target=scheduler.search, args=([f"q{i}", "x"], 2))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(fn.batches) == 8 and all(len(b) == 1 for b in fn.batches)
    assert scheduler.stats.to_json()["mean_batch_queries"] == 2.0
    assert isinstance(make_scheduler(fn, BatcherConfig()), MicroBatcher)
