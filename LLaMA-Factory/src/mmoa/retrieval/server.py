"""Production launcher: one gunicorn worker process holding one index, many threads.

The original system started eight Flask development servers, each with its own 65 GB copy of
the index. Here there is exactly one worker process (so exactly one index in memory) with a
pool of gthread request threads that all feed the same micro-batcher.

Start-up order matters for big indexes:

1. the master validates the index folder (metadata, corpus manifest, Faiss header, encoder
   identity) in milliseconds, then re-hashes every file against the sha256 recorded at build
   time (a full read of the index; ``--skip-checksums`` skips it), and exits with a clear
   message and code if anything is wrong;
2. gunicorn forks the worker, which loads the encoder and the index *after* the fork (no
   torch/OpenMP/CUDA state crosses a fork), with a heartbeat thread so that a load of many
   minutes is not mistaken for a hung worker;
3. the micro-batcher thread starts lazily on the first request, inside the worker.

The worker is gunicorn's gthread with a deadline on reading each request and JSON answers to
malformed HTTP (``mmoa.retrieval.worker``), so that slow or stalled clients cannot hold every
request thread.

Every option can also be given as an environment variable ``MMOA_RETRIEVER_<OPTION>``
(upper case, dashes as underscores, e.g. ``MMOA_RETRIEVER_PORT=8001``); arguments win.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmoa.retrieval.app import AppConfig, ServerLimits, create_app
from mmoa.retrieval.batcher import BatcherConfig, make_scheduler
from mmoa.retrieval.encoder import default_cpu_threads
from mmoa.retrieval.index import (
    FaissOptions,
    IndexLoadError,
    IndexMismatchError,
    IndexMissingError,
    Retriever,
    unverified_warning,
    validate_index_dir,
)

logger = logging.getLogger("mmoa.retrieval.server")

ENV_PREFIX = "MMOA_RETRIEVER_"
EXIT_USAGE = 2
EXIT_INDEX_MISSING = 3
EXIT_INDEX_MISMATCH = 4
ACCESS_LOG_FORMAT = '%(h)s "%(r)s" %(s)s %(b)sB %(M)sms "%(a)s"'


@dataclass
class ServerConfig:
    """Everything the launcher and the worker need; built from arguments and environment."""

    index: str
    host: str = "127.0.0.1"
    port: int = 8000
    threads: int = 32
    token: str | None = None
    access_log: str | None = "-"
    error_log: str = "-"
    log_level: str = "info"
    worker_timeout: int = 120
    #: Seconds a request may take to arrive in full (mmoa.retrieval.worker); slow clients
    #: past it get a 408 and lose the connection instead of holding a request thread.
    read_timeout: float = 10.0
    batcher: BatcherConfig = field(default_factory=BatcherConfig)
    app: AppConfig = field(default_factory=AppConfig)
    faiss: FaissOptions = field(default_factory=FaissOptions)
    encoder_model: str | None = None
    encoder_runtime: dict[str, Any] = field(default_factory=dict)
    torch_threads: int | None = None
    verify_corpus: bool = False
    skip_checksums: bool = False


# ---------------------------------------------------------------------------- arguments


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flask_server.py",
        description="Dense retrieval server: one process, one index, many clients "
                    "(gunicorn, one worker, gthread threads, dynamic micro-batching).",
        epilog=f"Every option can be set as {ENV_PREFIX}<OPTION> in the environment, e.g. "
               f"{ENV_PREFIX}PORT=8001 or {ENV_PREFIX}TOKEN=secret; arguments win. Exit codes: "
               f"{EXIT_USAGE} bad arguments, {EXIT_INDEX_MISSING} index missing or unreadable, "
               f"{EXIT_INDEX_MISMATCH} index/corpus/encoder mismatch or a damaged index file.",
    )
    net = parser.add_argument_group("server")
    net.add_argument("--index", help="index folder from data_builders/build_index.py (required)")
    net.add_argument("--host", default="127.0.0.1",
                     help="bind address (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
    net.add_argument("--port", type=int, default=8000)
    net.add_argument("--threads", type=int, default=32,
                     help="request threads; at least the number of concurrent clients")
    net.add_argument("--token", default=None,
                     help="require 'Authorization: Bearer <token>' on /search and /retrieve "
                          f"(prefer {ENV_PREFIX}TOKEN or --token-file: arguments show in ps)")
    net.add_argument("--token-file", default=None, help="file whose first line is the token")
    net.add_argument("--access-log", default="-",
                     help="access log file, '-' for stdout (default), 'off' to disable")
    net.add_argument("--error-log", default="-", help="server log file, '-' for stderr")
    net.add_argument("--log-level", default="info",
                     choices=("debug", "info", "warning", "error", "critical"))
    net.add_argument("--worker-timeout", type=int, default=120,
                     help="seconds before gunicorn restarts a hung worker (0 = never)")
    net.add_argument("--read-timeout", type=float, default=10.0,
                     help="seconds a request (line, headers, body) may take to arrive in full "
                          "after its first byte; a slower client gets a 408 and is "
                          "disconnected, so stalled clients cannot hold every thread "
                          "(default 10)")

    batch = parser.add_argument_group("micro-batching")
    batch.add_argument("--micro-batching", action=argparse.BooleanOptionalAction, default=True,
                       help="merge concurrent requests into shared batches (default on)")
    batch.add_argument("--batch-max-queries", type=int, default=128,
                       help="most queries encoded together")
    batch.add_argument("--batch-wait-ms", type=float, default=2.0,
                       help="longest a request waits for others to join its batch")

    lim = parser.add_argument_group("limits")
    lim.add_argument("--max-queries", type=int, default=64, help="queries per request")
    lim.add_argument("--max-k", type=int, default=100, help="largest N / topk")
    lim.add_argument("--max-body-bytes", type=int, default=1 << 20)
    lim.add_argument("--max-query-chars", type=int, default=2048)
    lim.add_argument("--request-timeout", type=float, default=60.0,
                     help="seconds a request may wait for its search before a 503")
    lim.add_argument("--reload-timeout", type=float, default=300.0,
                     help="seconds an encoder reload may take; past it the old encoder keeps "
                          "serving and the reload lock is freed (default 300)")
    lim.add_argument("--reload-root", action="append", default=None, metavar="DIR",
                     help="only load reloaded encoders from under DIR (repeatable; "
                          f"{ENV_PREFIX}RELOAD_ROOT takes a {os.pathsep!r}-separated list). "
                          "Without it and without a token, any local user can make the server "
                          "load any folder it can read")
    lim.add_argument("--default-n", type=int, default=10, help="/search N when omitted")
    lim.add_argument("--default-topk", type=int, default=3, help="/retrieve topk when omitted")

    enc = parser.add_argument_group("encoder (pooling, prefixes etc. come from meta.json)")
    enc.add_argument("--encoder", dest="encoder_model", default=None,
                     help="local folder of the index's encoder, if it moved since the build")
    enc.add_argument("--encoder-batch-size", type=int, default=None)
    enc.add_argument("--device", default=None, help="auto (GPU when present), cpu, cuda:0")
    enc.add_argument("--fp16", action="store_true", help="half-precision encoder on GPU")
    enc.add_argument("--torch-threads", type=int, default=None,
                     help="CPU threads of the encoder (default: half the cores)")

    fa = parser.add_argument_group("faiss")
    fa.add_argument("--faiss-gpu", choices=("auto", "on", "off"), default="auto",
                    help="put the index on GPU(s) when faiss-gpu is installed and a GPU visible")
    fa.add_argument("--faiss-fp16", action="store_true", help="GPU index in float16")
    fa.add_argument("--faiss-shard", action="store_true",
                    help="several GPUs: split the index across them instead of copying it")
    fa.add_argument("--nprobe", type=int, default=None, help="IVF lists visited per query")
    fa.add_argument("--ef-search", type=int, default=None, help="HNSW search breadth")
    fa.add_argument("--omp-threads", type=int, default=None, help="Faiss CPU threads")
    fa.add_argument("--verify-corpus", action="store_true",
                    help="re-hash every corpus row against meta.json at start (slow)")
    fa.add_argument("--skip-checksums", action="store_true",
                    help="do not re-hash the index files against the sha256 recorded at build "
                         "time; saves reading the whole index at every start (sha256 runs at "
                         "about 1.3 GB/s: 50 s for 65 GB, more on slow disks), but a damaged "
                         "file then serves wrong passages unnoticed")
    _apply_environment(parser)
    return parser


def _env_name(dest: str) -> str:
    return ENV_PREFIX + dest.upper()


def _apply_environment(parser: argparse.ArgumentParser) -> None:
    """Use ``MMOA_RETRIEVER_<DEST>`` as the default of every option that it names."""
    for action in parser._actions:  # argparse offers no public iterator over actions
        if action.dest in {"help"} or not action.option_strings:
            continue
        raw = os.environ.get(_env_name(action.dest))
        if raw is None and action.dest == "encoder_model":
            raw = os.environ.get(ENV_PREFIX + "ENCODER")
        if raw is None:
            continue
        if action.nargs == 0 or isinstance(action, argparse.BooleanOptionalAction):
            value: Any = raw.strip().lower() in {"1", "true", "yes", "on"}
        elif isinstance(action, argparse._AppendAction):  # a list: os.pathsep-separated
            value = [part for part in raw.split(os.pathsep) if part]
        else:
            try:
                value = action.type(raw) if callable(action.type) else raw
            except ValueError:
                parser.error(f"{_env_name(action.dest)}={raw!r} is not valid for "
                             f"{action.option_strings[0]}")
            if action.choices is not None and value not in action.choices:
                parser.error(f"{_env_name(action.dest)}={raw!r}: choose from "
                             f"{', '.join(map(str, action.choices))}")
        action.default = value


def config_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> ServerConfig:
    if not args.index:
        parser.error(f"--index (or {ENV_PREFIX}INDEX) is required")
    positive = ("port", "threads", "batch_max_queries", "max_queries", "max_k",
                "max_body_bytes", "max_query_chars", "default_n", "default_topk")
    for name in positive:
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if not args.read_timeout > 0:  # also refuses nan
        parser.error(f"--read-timeout {args.read_timeout} must be a positive number of seconds")
    if not 0 < args.reload_timeout < float("inf"):
        parser.error(f"--reload-timeout {args.reload_timeout} must be a positive number of "
                     f"seconds")
    for root in args.reload_root or ():
        if not Path(root).expanduser().is_dir():
            parser.error(f"--reload-root {root}: not a directory")
    if args.port > 65535:
        parser.error(f"--port {args.port} is not a TCP port (1..65535)")
    if not 1 <= args.default_n <= args.max_k or not 1 <= args.default_topk <= args.max_k:
        parser.error("--default-n and --default-topk must lie in 1..--max-k")
    token = args.token
    if args.token_file:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, IndexError) as err:
            parser.error(f"--token-file {args.token_file}: cannot read a token ({err})")
    if token is not None and not token:
        parser.error("the bearer token is empty")
    runtime = {k: v for k, v in (("batch_size", args.encoder_batch_size),
                                 ("device", args.device), ("fp16", args.fp16 or None))
               if v is not None}
    limits = ServerLimits(args.max_queries, args.max_k, args.max_body_bytes,
                          args.max_query_chars, args.request_timeout, args.reload_timeout)
    return ServerConfig(
        index=args.index, host=args.host, port=args.port, threads=args.threads, token=token,
        access_log=None if args.access_log.lower() in {"off", "none", ""} else args.access_log,
        error_log=args.error_log, log_level=args.log_level, worker_timeout=args.worker_timeout,
        read_timeout=args.read_timeout,
        batcher=BatcherConfig(args.micro_batching, args.batch_max_queries, args.batch_wait_ms),
        app=AppConfig(limits, token, args.default_n, args.default_topk,
                      tuple(args.reload_root or ())),
        faiss=FaissOptions(args.faiss_gpu, args.faiss_fp16, args.faiss_shard, args.nprobe,
                           args.ef_search, args.omp_threads),
        encoder_model=args.encoder_model, encoder_runtime=runtime,
        torch_threads=args.torch_threads, verify_corpus=args.verify_corpus,
        skip_checksums=args.skip_checksums,
    )


# ------------------------------------------------------------------------------- worker


def build_wsgi_app(config: ServerConfig) -> Any:
    """Load the index and return the Flask app; runs inside the gunicorn worker."""
    from mmoa.console import quiet_faiss_loader

    logging.basicConfig(level=config.log_level.upper(),
                        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: "
                               "%(message)s")
    quiet_faiss_loader()
    import torch

    torch.set_num_threads(config.torch_threads or default_cpu_threads())
    # The master has just verified the files (main); reading them twice would double the
    # start-up time of a big index.
    retriever = Retriever.load(config.index, faiss_options=config.faiss,
                               verify_corpus=False, model=config.encoder_model,
                               verify_checksums=False, **config.encoder_runtime)
    retriever.search(["warm-up query"], 1)  # first-call allocations happen before serving
    scheduler = make_scheduler(retriever.search_many, config.batcher)
    logger.info("serving %s: %d passages, %s (%s), encoder %s on %s, micro-batching %s",
                config.index, len(retriever.corpus), retriever.meta.factory,
                retriever.placement, retriever.encoder.name, retriever.encoder.device,
                "on" if config.batcher.enabled else "off")
    return create_app(retriever, scheduler, config.app)


def _gunicorn_application(config: ServerConfig) -> Any:
    from gunicorn.app.base import BaseApplication
    from gunicorn.errors import AppImportError

    from mmoa.retrieval.worker import make_worker_class

    def post_fork(server: Any, worker: Any) -> None:
        # Beat for the worker while it loads (possibly for minutes); stops once it serves.
        loaded = threading.Event()
        worker.mmoa_loaded = loaded

        def beat() -> None:
            while not loaded.wait(1.0):
                worker.notify()

        threading.Thread(target=beat, name="mmoa-load-heartbeat", daemon=True).start()

    def post_worker_init(worker: Any) -> None:
        worker.mmoa_loaded.set()

    class RetrievalServer(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            settings = {
                "bind": f"{_bind_host(config.host)}:{config.port}",
                "workers": 1, "threads": config.threads,
                "worker_class": make_worker_class(config.read_timeout),
                "timeout": config.worker_timeout, "graceful_timeout": 30, "keepalive": 5,
                "accesslog": config.access_log, "access_log_format": ACCESS_LOG_FORMAT,
                "errorlog": config.error_log, "loglevel": config.log_level,
                "proc_name": "mmoa-retriever", "control_socket_disable": True,
                "post_fork": post_fork, "post_worker_init": post_worker_init,
                "preload_app": False,
            }
            for key, value in settings.items():
                self.cfg.set(key, value)

        def load(self) -> Any:
            try:
                return build_wsgi_app(config)
            except IndexLoadError as err:
                raise AppImportError(f"retrieval server: {err}") from err

    return RetrievalServer()


def _bind_host(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    # OpenMP threads that sleep instead of spinning when idle: the encoder's and Faiss's
    # thread pools take turns in one process and share the CPU with request threads. Set
    # before the worker (forked later) first loads an OpenMP runtime.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_arg_parser()
    config = config_from_args(parser.parse_args(argv), parser)
    try:
        meta, _ = validate_index_dir(Path(config.index), None, config.verify_corpus,
                                     config.encoder_model,
                                     verify_checksums=not config.skip_checksums, progress=True)
    except IndexMissingError as err:
        print(f"retrieval server: error: {err}", file=sys.stderr)
        return EXIT_INDEX_MISSING
    except IndexMismatchError as err:
        print(f"retrieval server: error: {err}", file=sys.stderr)
        return EXIT_INDEX_MISMATCH
    if config.skip_checksums:
        print("retrieval server: warning: --skip-checksums: the index files are not checked "
              "against the sha256 recorded at build time", file=sys.stderr)
    elif not meta.files:
        print(f"retrieval server: warning: {unverified_warning(Path(config.index))}",
              file=sys.stderr)
    if config.faiss.gpu == "on":
        from mmoa.retrieval.index import faiss_gpu_count

        if faiss_gpu_count() == 0:
            print("retrieval server: error: --faiss-gpu on, but this faiss build has no GPU "
                  "support or no GPU is visible", file=sys.stderr)
            return EXIT_USAGE
    if not _is_loopback(config.host) and config.token is None:
        print(f"retrieval server: warning: listening on {config.host} without a token; anyone "
              f"who can reach the port can query it", file=sys.stderr)
    print(f"retrieval server: index {config.index} ({meta.factory}, {meta.corpus_size} passages,"
          f" encoder {meta.encoder.get('name')}) on http://{_bind_host(config.host)}:"
          f"{config.port}", file=sys.stderr, flush=True)
    _gunicorn_application(config).run()
    return 0
