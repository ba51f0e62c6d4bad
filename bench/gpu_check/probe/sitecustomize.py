"""Per-process probe of the GPU check, loaded by every Python process it starts.

``run_check.py`` puts this folder first on ``PYTHONPATH`` and sets ``MMOA_GPU_CHECK_PROBE_DIR``;
Python then imports this module at start-up in every process (trainers, the retrieval server's
gunicorn worker, data builders, evaluations). Each process writes
``<probe dir>/<pid>.json``: its stage (``MMOA_GPU_CHECK_STAGE``), command line, whether CUDA was
initialised, the device's name and ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved``
peaks (with the card's total memory and the allocator's retry and out-of-memory counts), and
the top-level modules it imported (the bundle's import closure is checked against them). The
record is rewritten every few seconds by a daemon thread (so a process killed at its stage's
deadline still leaves one) and once more at exit. Without the environment variable this
module does nothing but hand over to any other ``sitecustomize`` further down ``sys.path``.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
import time

PROBE_ENV = "MMOA_GPU_CHECK_PROBE_DIR"
STAGE_ENV = "MMOA_GPU_CHECK_STAGE"
INTERVAL_S = 2.0
_HERE = os.path.dirname(os.path.abspath(__file__))
_STARTED = time.time()
#: One writer at a time: the daemon thread and the exit handler write the same temporary file,
#: and two writers interleaved there leave a record that is not JSON (the stage then shows no
#: process). Once the final record is written, the thread's later ones are dropped.
_LOCK = threading.Lock()
_final_written = False


def _cuda_record() -> dict:
    torch = sys.modules.get("torch")
    record: dict = {"torch_imported": torch is not None, "cuda_initialized": False}
    if torch is None:
        return record
    try:
        cuda = torch.cuda
        if not cuda.is_initialized():
            return record
        record["cuda_initialized"] = True
        device = cuda.current_device()
        record["device_name"] = cuda.get_device_name(device)
        record["max_memory_allocated"] = int(cuda.max_memory_allocated(device))
        record["max_memory_reserved"] = int(cuda.max_memory_reserved(device))
        # how close the process came to the card's limit: its size, and how often the
        # caching allocator had to free its cache and retry, or failed (recipe_shapes.py)
        record["total_memory"] = int(cuda.get_device_properties(device).total_memory)
        stats = cuda.memory_stats(device)
        record["num_alloc_retries"] = int(stats.get("num_alloc_retries", 0))
        record["num_ooms"] = int(stats.get("num_ooms", 0))
    except Exception as err:  # a forked child of a CUDA parent, a driver error: say so
        record["cuda_error"] = f"{type(err).__name__}: {err}"
    return record


def _imported_top_level() -> list[str]:
    stdlib = getattr(sys, "stdlib_module_names", frozenset())
    names = {name.split(".", 1)[0] for name in list(sys.modules)}
    return sorted(n for n in names if n not in stdlib and not n.startswith("_"))


def _write(final: bool) -> None:
    global _final_written
    folder = os.environ.get(PROBE_ENV)
    if not folder:
        return
    with _LOCK:
        if _final_written:
            return
        _final_written = final
        _write_record(folder, final)


def _write_record(folder: str, final: bool) -> None:
    pid = os.getpid()
    record = {"pid": pid, "ppid": os.getppid(), "stage": os.environ.get(STAGE_ENV, ""),
              "argv": list(sys.argv), "cwd": os.getcwd(), "started": _STARTED,
              "updated": time.time(), "final": final, **_cuda_record()}
    if final:
        record["imports"] = _imported_top_level()
    try:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{pid}.json")
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(tmp, path)
    except Exception:  # never break the probed process
        pass


def _loop() -> None:
    while True:
        time.sleep(INTERVAL_S)
        _write(final=False)


def _start_thread() -> None:
    threading.Thread(target=_loop, name="gpu-check-probe", daemon=True).start()


def _after_fork_in_child() -> None:
    """A forked child has its own record: a fresh lock (the parent's thread may have held it
    at the fork) and its own thread."""
    global _LOCK, _final_written
    _LOCK = threading.Lock()
    _final_written = False
    _start_thread()


def _chain() -> None:
    """Run the ``sitecustomize`` this one shadows, if the interpreter has one."""
    import importlib.machinery
    import importlib.util

    for entry in sys.path:
        if os.path.abspath(entry or ".") == _HERE:
            continue
        try:
            spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        except Exception:
            continue
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            try:
                spec.loader.exec_module(module)
            except Exception as err:
                print(f"[gpu_check probe] the chained sitecustomize failed: {err}",
                      file=sys.stderr)
            return


if os.environ.get(PROBE_ENV):
    atexit.register(_write, True)
    _start_thread()
    os.register_at_fork(after_in_child=_after_fork_in_child)
_chain()
