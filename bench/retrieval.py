"""Retrieval benchmark: in-process limit, the real server, the naive baseline, index scaling.

    python bench/retrieval.py                       # everything, the issue's sizes
    python bench/retrieval.py --n-vectors 200000    # smaller scaling part
    python bench/retrieval.py --skip-scaling --json-out bench_retrieval.json

(a) in-process encode+search throughput at batch 1, 16 and 64 (the per-request limit);
(b) the server (gunicorn, micro-batching on): 1 client sending 64-question requests, 1 client
    and 16 concurrent clients sending single questions - throughput and p50/p99 latency;
(c) the naive baseline: the same 16 single-question clients against the same server with
    micro-batching switched off (each request encoded and searched alone, under a lock);
(d) index scaling on random unit vectors (default 1M x 384): Flat vs HNSW32 vs IVF-PQ -
    build time, queries/s, memory, recall@10 against Flat.

Prints one JSON object (also written with --json-out) and a table. Measures only: no
assertion on time. Clients use ``http.client`` with keep-alive connections, one thread each.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "LLaMA-Factory" / "src"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the server sets it (run_server.sh)

from bench_runs import report_result  # noqa: E402

import mmoa  # noqa: E402,F401  (offline environment)

# ------------------------------------------------------------------------------ helpers


def percentile_ms(samples: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(samples) * 1000.0, q)), 2) if samples else 0.0


def demo_index(work: Path, n_passages: int) -> tuple[Path, list[str]]:
    """A demo world of ``n_passages`` and its Flat index; returns (index dir, questions)."""
    from mmoa_demo.world import DemoWorldConfig, build_demo_index

    return build_demo_index(work, DemoWorldConfig(n_passages=n_passages, n_train=400,
                                                  n_dev=100, n_test=100, seed=42), progress=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def server(index: Path, extra: list[str], log: Path) -> Iterator[str]:
    """The real launcher (run_server.sh -> gunicorn) on a free loopback port."""
    port = free_port()
    env = {**os.environ, "MMOA_PYTHON": sys.executable}
    cmd = ["bash", str(ROOT / "run_server.sh"), "--index", str(index), "--port", str(port),
           "--access-log", "off", "--threads", "64", *extra]
    with log.open("wb") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"server exited: {log.read_text()[-3000:]}")
                with contextlib.suppress(OSError):
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    conn.request("GET", "/health")
                    if conn.getresponse().status == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("server did not start")
                time.sleep(0.25)
            yield f"127.0.0.1:{port}"
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


def health(address: str) -> dict[str, Any]:
    conn = http.client.HTTPConnection(*address.split(":"), timeout=10)
    conn.request("GET", "/health")
    return json.loads(conn.getresponse().read())


def load(address: str, clients: int, batch: int, questions: list[str], seconds: float,
         k: int = 10) -> dict[str, Any]:
    """``clients`` threads, each sending ``batch``-question /search requests back to back."""
    host, port = address.split(":")
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    start_gate = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(i: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        position = i * 97
        start_gate.wait()
        while time.perf_counter() < stop_at[0]:
            chunk = [questions[(position + j) % len(questions)] for j in range(batch)]
            position += batch
            body = json.dumps({"questions": chunk, "N": k})
            t0 = time.perf_counter()
            conn.request("POST", "/search", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            payload = response.read()
            if response.status != 200:
                errors.append(payload.decode()[:200])
                return
            latencies[i].append(time.perf_counter() - t0)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    t_start = time.perf_counter()
    stop_at[0] = t_start + seconds
    start_gate.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t_start
    flat = [x for per in latencies for x in per]
    if errors:
        raise RuntimeError(f"server errors: {errors[:2]}")
    return {"clients": clients, "questions_per_request": batch, "requests": len(flat),
            "queries_per_s": round(len(flat) * batch / elapsed, 1),
            "requests_per_s": round(len(flat) / elapsed, 1),
            "p50_ms": percentile_ms(flat, 50), "p99_ms": percentile_ms(flat, 99)}


# -------------------------------------------------------------------------------- parts


def part_in_process(index: Path, questions: list[str], seconds: float, batches: list[int]
                    ) -> dict[str, Any]:
    from mmoa.retrieval.index import Retriever

    retriever = Retriever.load(index)
    retriever.search(questions[:8], 10)
    out = {}
    for batch in batches:
        done, latencies, position = 0, [], 0
        t_start = time.perf_counter()
        while time.perf_counter() - t_start < seconds:
            chunk = [questions[(position + j) % len(questions)] for j in range(batch)]
            position += batch
            t0 = time.perf_counter()
            retriever.search_many([(chunk, 10)])
            latencies.append(time.perf_counter() - t0)
            done += batch
        elapsed = time.perf_counter() - t_start
        out[f"batch_{batch}"] = {"queries_per_s": round(done / elapsed, 1),
                                 "p50_ms": percentile_ms(latencies, 50),
                                 "p99_ms": percentile_ms(latencies, 99)}
    return out


def part_server(index: Path, questions: list[str], seconds: float, work: Path,
                micro_batching: bool, max_batch: int, threads: int) -> dict[str, Any]:
    flag = "--micro-batching" if micro_batching else "--no-micro-batching"
    name = "batched" if micro_batching else "naive"
    out: dict[str, Any] = {}
    extra = [flag, "--torch-threads", str(threads)]
    with server(index, extra, work / f"server_{name}.log") as address:
        load(address, 2, 1, questions, 1.0)  # warm-up
        runs = [("1_client_batch_64", 1, max_batch), ("1_client_single", 1, 1)] \
            if micro_batching else []
        for key, clients, batch in [*runs, ("16_clients_single", 16, 1)]:
            before = health(address)["batching"]
            out[key] = load(address, clients, batch, questions, seconds)
            after = health(address)["batching"]
            batches = after["batches"] - before["batches"]
            out[key]["server_mean_batch_queries"] = round(
                (after["queries"] - before["queries"]) / max(batches, 1), 2)
    return out


def part_scaling(n_vectors: int, n_queries: int, dim: int, ivf: str, seed: int = 0
                 ) -> dict[str, Any]:
    """Flat vs HNSW32 vs IVF-PQ on random unit vectors.

    Random high-dimensional vectors have no cluster structure, so every neighbour is almost
    as far as any other point: the worst case for approximate indexes. Recall on real
    embeddings is much higher; the point here is the cost side (memory, speed) at scale.
    """
    import faiss

    rng = np.random.default_rng(seed)
    base = rng.standard_normal((n_vectors, dim), dtype=np.float32)
    base /= np.linalg.norm(base, axis=1, keepdims=True)
    queries = rng.standard_normal((n_queries, dim), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    configs = [("Flat", "", [None]), ("HNSW32", "efSearch", [64, 256]),
               (ivf, "nprobe", [16, 64])]
    rows: list[dict[str, Any]] = []
    truth = None
    score_at_rank: dict[str, float] = {}
    n_single = 50
    for factory, param, values in configs:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
        t0 = time.perf_counter()
        if not index.is_trained:
            n_train = min(n_vectors, 100_000)
            index.train(base[rng.choice(n_vectors, size=n_train, replace=False)])
        for start in range(0, n_vectors, 100_000):
            index.add(base[start:start + 100_000])
        build_s = time.perf_counter() - t0
        memory_mb = faiss.serialize_index(index).nbytes / 2**20
        for value in values:
            if value is not None:
                faiss.ParameterSpace().set_index_parameter(index, param, value)
            index.search(queries[:10], 10)
            t0 = time.perf_counter()
            _, ids = index.search(queries, 10)
            batch_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            for q in queries[:n_single]:
                index.search(q[None, :], 10)
            single_s = (time.perf_counter() - t0) / n_single
            if truth is None:
                truth = ids
                top, _ = index.search(queries, 100)
                score_at_rank = {str(r): round(float(top[:, r - 1].mean()), 4)
                                 for r in (1, 10, 100)}
            recall = float(np.mean([len(set(a) & set(b)) / 10
                                    for a, b in zip(ids, truth, strict=True)]))
            row = {"index": factory, "search_param": f"{param}={value}" if param else "-",
                   "build_s": round(build_s, 1),
                   "queries_per_s_batch": round(n_queries / batch_s, 1),
                   "latency_ms_single": round(single_s * 1000, 3),
                   "memory_mb": round(memory_mb, 1), "recall_at_10": round(recall, 4)}
            rows.append(row)
            print(f"  scaling: {row}", file=sys.stderr, flush=True)
        del index
    return {"n_vectors": n_vectors, "dim": dim, "n_queries": n_queries, "k": 10,
            "data": "random unit vectors (Gaussian, normalised)",
            "flat_mean_score_at_rank": score_at_rank,
            "faiss_threads": faiss.omp_get_max_threads(), "rows": rows}


# -------------------------------------------------------------------------------- report


def table(results: dict[str, Any]) -> str:
    lines = []
    a = results.get("in_process", {})
    if a:
        lines.append("(a) in-process encode+search      queries/s   p50 ms   p99 ms")
        for key, row in a.items():
            lines.append(f"    {key:<30}{row['queries_per_s']:>10}{row['p50_ms']:>9}"
                         f"{row['p99_ms']:>9}")
    for part, title in (("server", "(b) server, micro-batching on"),
                        ("naive", "(c) server, micro-batching off")):
        rows = results.get(part, {})
        if rows:
            lines.append(f"{title:<34}  queries/s   p50 ms   p99 ms  mean batch")
            for key, row in rows.items():
                lines.append(f"    {key:<30}{row['queries_per_s']:>10}{row['p50_ms']:>9}"
                             f"{row['p99_ms']:>9}{row['server_mean_batch_queries']:>12}")
    ratios = results.get("ratios", {})
    for key, value in ratios.items():
        lines.append(f"    {key}: {value}")
    d = results.get("scaling", {})
    if d:
        lines.append(f"(d) {d['n_vectors']} x {d['dim']} random vectors, {d['n_queries']} "
                     f"queries, k=10, recall@10 against Flat; mean Flat score at rank "
                     f"1/10/100: {'/'.join(map(str, d['flat_mean_score_at_rank'].values()))}")
        lines.append("    index            search      build s  batch q/s  1-query ms  "
                     "memory MB  recall@10")
        for row in d["rows"]:
            lines.append(f"    {row['index']:<17}{row['search_param']:<12}{row['build_s']:>8}"
                         f"{row['queries_per_s_batch']:>11}{row['latency_ms_single']:>12}"
                         f"{row['memory_mb']:>11}{row['recall_at_10']:>11}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", default=None, help="existing index folder (default: build "
                        "a demo-world index)")
    parser.add_argument("--n-passages", type=int, default=2000, help="demo corpus size")
    parser.add_argument("--seconds", type=float, default=8.0, help="duration of each run")
    parser.add_argument("--max-batch", type=int, default=64, help="per-request query limit")
    parser.add_argument("--n-vectors", type=int, default=1_000_000, help="scaling part size")
    parser.add_argument("--n-queries", type=int, default=1000, help="scaling part queries")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--ivf", default="IVF1024,PQ64", help="IVF-PQ factory string")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="encoder CPU threads, in-process and server alike "
                             "(default: the server's default, half the cores)")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--skip-server", action="store_true")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args(argv)

    import torch

    from mmoa.retrieval.encoder import default_cpu_threads

    threads = args.torch_threads or default_cpu_threads()
    torch.set_num_threads(threads)
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch_threads": torch.get_num_threads(),
                    "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                    "load_avg_start": os.getloadavg()},
    }
    with tempfile.TemporaryDirectory(prefix="bench_retrieval_") as tmp:
        work = Path(tmp)
        if args.index:
            index = Path(args.index)
            questions = [f"question number {i} about the history of place {i % 50}"
                         for i in range(1000)]
        else:
            index, questions = demo_index(work, args.n_passages)
        results["corpus"] = {"index": str(args.index or f"demo world, {args.n_passages} "
                                                         f"passages, Flat"),
                             "encoder": "all-MiniLM-L6-v2 (384-d)", "k": 10}
        print("(a) in-process ...", file=sys.stderr, flush=True)
        results["in_process"] = part_in_process(index, questions, args.seconds,
                                                [1, 16, args.max_batch])
        if not args.skip_server:
            print("(b) server ...", file=sys.stderr, flush=True)
            results["server"] = part_server(index, questions, args.seconds, work, True,
                                            args.max_batch, threads)
            print("(c) naive server ...", file=sys.stderr, flush=True)
            results["naive"] = part_server(index, questions, args.seconds, work, False,
                                           args.max_batch, threads)
            ip = results["in_process"][f"batch_{args.max_batch}"]["queries_per_s"]
            sv = results["server"]["1_client_batch_64"]["queries_per_s"]
            mb = results["server"]["16_clients_single"]["queries_per_s"]
            nv = results["naive"]["16_clients_single"]["queries_per_s"]
            results["ratios"] = {
                "server_batch64_over_in_process_batch64 (target >= 0.8)": round(sv / ip, 2),
                "micro_batched_over_naive_16_clients (target >= 3)": round(mb / nv, 2),
            }
    if not args.skip_scaling:
        print(f"(d) scaling on {args.n_vectors} random vectors ...", file=sys.stderr, flush=True)
        results["scaling"] = part_scaling(args.n_vectors, args.n_queries, args.dim,
                                         args.ivf)
    results["machine"]["load_avg_end"] = os.getloadavg()
    report_result(results, table(results), args.json_out, "bench/retrieval.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
