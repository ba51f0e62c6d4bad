"""Shared helpers of the retrieval tests: a demo index built once, and a real server process.

Not a conftest (another part of the suite owns that); test modules import these helpers. The
demo index and the in-process retriever are cached per test session, so every retrieval test
module reuses one build (a few seconds on 2 cores).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests

ROOT = Path(__file__).resolve().parents[1]
N_DEMO_PASSAGES = 400

if str(ROOT / "bench") not in sys.path:  # the reload probes' second encoder is defined there
    sys.path.insert(0, str(ROOT / "bench"))
from encoder_variants import perturbed_encoder  # noqa: E402,F401  (re-exported for the tests)

_CACHE: dict[str, Any] = {}


@pytest.fixture(scope="module", autouse=True)
def encoder_threads() -> Iterator[None]:
    """Run the encoder with the server's thread policy (half the cores) during these tests.

    Torch's default (all cores) collapses when other jobs share the CPU (see
    ``mmoa.retrieval.encoder.default_cpu_threads``); restored afterwards for other modules.
    """
    import torch

    from mmoa.retrieval.encoder import default_cpu_threads

    before = torch.get_num_threads()
    torch.set_num_threads(default_cpu_threads())
    yield
    torch.set_num_threads(before)


def demo_corpus(base: Path) -> Path:
    """A small demo world's corpus.jsonl (seeded, identical on every run)."""
    from mmoa_demo.world import DemoWorldConfig, generate_demo_world, write_demo_world

    out = base / "world"
    if not (out / "corpus.jsonl").is_file():
        world = generate_demo_world(DemoWorldConfig(n_passages=N_DEMO_PASSAGES, n_train=60,
                                                    n_dev=20, n_test=20, seed=7))
        write_demo_world(world, out)
    return out / "corpus.jsonl"


def demo_index(tmp_path_factory: Any) -> Path:
    """Flat index over the demo corpus with the bundled MiniLM encoder; built once a session."""
    if "index" not in _CACHE:
        from mmoa.retrieval.builder import BuildConfig, build_index

        base = tmp_path_factory.mktemp("retrieval")
        corpus = demo_corpus(base)
        build_index(BuildConfig(corpus=str(corpus), output=str(base / "index"), progress=False))
        _CACHE["index"] = base / "index"
    return _CACHE["index"]


def demo_retriever(tmp_path_factory: Any) -> Any:
    """The in-process reference: the same index folder opened with :class:`Retriever`."""
    if "retriever" not in _CACHE:
        from mmoa.retrieval.index import Retriever

        _CACHE["retriever"] = Retriever.load(demo_index(tmp_path_factory), device="cpu")
    return _CACHE["retriever"]


def demo_questions() -> list[str]:
    """Questions of the demo world's splits (what the trainer will send)."""
    from mmoa.fileio import read_jsonl

    world = _CACHE["index"].parent / "world"
    questions = [r["question"] for split in ("train", "dev", "test")
                 for r in read_jsonl(world / f"{split}.jsonl")]
    return questions


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: Servers started by this process and not stopped yet.
_LIVE: list[ServerProcess] = []
#: The SIGTERM / SIGHUP handlers found when ours was installed (chained to).
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_PR_SET_PDEATHSIG = 1


def stop_all_servers() -> None:
    """Stop every server this process started and has not stopped (at exit, on SIGTERM)."""
    for server in list(_LIVE):
        with contextlib.suppress(Exception):
            server.stop()


def _on_termination(signum: int, frame: Any) -> None:
    """SIGTERM (or SIGHUP) to the test run: its servers first, then what the signal did
    before (the default: the process ends as killed by that signal)."""
    stop_all_servers()
    previous = _PREVIOUS_HANDLERS.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_cleanup() -> None:
    """Once per process: stop the servers at interpreter exit and on SIGTERM / SIGHUP, which
    otherwise end pytest without running a fixture's teardown or ``atexit`` (the servers run
    in their own session, so the signal does not reach them)."""
    if _PREVIOUS_HANDLERS or threading.current_thread() is not threading.main_thread():
        return
    atexit.register(stop_all_servers)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        _PREVIOUS_HANDLERS[sig] = signal.signal(sig, _on_termination)


def _die_with_parent(parent: int) -> Any:
    """``preexec_fn``: the server gets SIGTERM when the process that started it dies, even by
    SIGKILL (Linux ``PR_SET_PDEATHSIG``, kept across ``run_server.sh``'s ``exec``); gunicorn
    then stops its worker. Elsewhere nothing."""
    def preexec() -> None:
        if not sys.platform.startswith("linux"):
            return
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before prctl: nobody will stop us
            os._exit(1)
    return preexec


class ServerProcess:
    """``run_server.sh`` (or ``flask_server.py``) as a subprocess on a loopback port.

    It runs in its own session (``stop`` ends the whole group: gunicorn and its worker) and
    never outlives the test run: stopped at exit, on SIGTERM / SIGHUP to this process, and,
    on Linux, when this process dies in any way (``PR_SET_PDEATHSIG``)."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 log_path: Path | None = None, use_script: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        full_env = {**os.environ, "MMOA_PYTHON": sys.executable,
                    "MMOA_RETRIEVER_PORT": str(self.port), **(env or {})}
        command = (["bash", str(ROOT / "run_server.sh")] if use_script
                   else [sys.executable, str(ROOT / "flask_server.py")]) + args
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        _install_cleanup()
        self.proc = subprocess.Popen(command, env=full_env, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent(os.getpid()))
        _LIVE.append(self)

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(requests.RequestException):
                response = requests.get(self.url + "/health", timeout=2)
                if response.status_code == 200:
                    return response.json()
            time.sleep(0.25)
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path else ""

    def stop(self) -> int:
        if self in _LIVE:
            _LIVE.remove(self)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # our own session: gunicorn and its worker
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self._log is not subprocess.DEVNULL:
            self._log.close()
        return self.proc.returncode


@contextlib.contextmanager
def running_server(args: list[str], env: dict[str, str] | None = None,
                   log_path: Path | None = None) -> Iterator[ServerProcess]:
    server = ServerProcess(args, env, log_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def shared_server(key: str, args: list[str], env: dict[str, str] | None = None,
                  log_path: Path | None = None) -> ServerProcess:
    """A server started once per test session under ``key`` and stopped when the session's
    interpreter exits, for modules that need the same server (a start and stop cost about ten
    seconds on 2 cores). A test that changes the server's state (reloads its encoder) must put
    it back."""
    if key not in _CACHE:
        server = ServerProcess(args, env, log_path)
        atexit.register(server.stop)
        server.wait_ready()
        _CACHE[key] = server
    return _CACHE[key]


HARR_TOKEN = "harr-token"


def harr_server(index_dir: Path, tmp_path_factory: Any) -> ServerProcess:
    """The tiny world's server with a token and ``--max-k 40``, shared with the retriever_rl
    integration tests (each test that reloads its encoder restores it)."""
    log = tmp_path_factory.mktemp("harr_server") / "server.log"
    return shared_server("harr", ["--index", str(index_dir), "--device", "cpu", "--max-k", "40"],
                         env={"MMOA_RETRIEVER_TOKEN": HARR_TOKEN}, log_path=log)


def run_launcher(args: list[str], env: dict[str, str] | None = None,
                 timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run ``run_server.sh`` expecting it to exit by itself (start-up failures)."""
    full_env = {**os.environ, "MMOA_PYTHON": sys.executable, **(env or {})}
    return subprocess.run(["bash", str(ROOT / "run_server.sh"), *args], env=full_env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def assert_same_ranking(got_ids: list[str], got_scores: list[float] | None,
                        want_ids: list[str], want_scores: np.ndarray, tol: float = 1e-4) -> None:
    """Ids equal position by position, except inside groups of tied scores (within ``tol``)
    where only the set must agree (and a tied group at the cut-off, which may continue past k
    differently); scores equal within ``tol``.

    Batched and single-query BLAS calls round differently in the last bits, which may swap
    two passages whose scores are equal to 1e-7; anything else is a real difference.
    """
    assert len(got_ids) == len(want_ids), (got_ids, want_ids)
    if got_scores is not None:
        np.testing.assert_allclose(got_scores, want_scores, atol=tol, rtol=0)
    start = 0
    while start < len(want_ids):
        end = start + 1
        while end < len(want_ids) and abs(want_scores[end] - want_scores[end - 1]) <= tol:
            end += 1
        if end - start == 1:
            assert got_ids[start] == want_ids[start], (start, got_ids, want_ids)
        elif end < len(want_ids):  # a tie that runs past k may pick different members
            assert set(got_ids[start:end]) == set(want_ids[start:end]), (got_ids, want_ids)
        start = end
