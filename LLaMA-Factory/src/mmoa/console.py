"""What the entry points print: our lines, progress bars and results on the console; the
libraries' INFO chatter in a log file beside the run's outputs.

LLaMA-Factory switches transformers to INFO with its explicit format, so loading one model
prints its whole config (twice), every "loading file" and an "Offline mode" line per file: an
8-question evaluation printed 186 lines before its table, the small demo about 2,000. Those
lines help when something goes wrong, so they are kept, in ``<output dir>/library.log``; the
console handlers of ``llamafactory`` and ``transformers`` show warnings and errors only.
The MAPPO stage's own logger (``llamafactory.mmoa``) keeps printing its INFO lines.

``MMOA_VERBOSE=1`` restores the libraries' console output as LLaMA-Factory configures it.
The web UI's runs are left alone (``LLAMABOARD_ENABLED``): LlamaBoard shows its log box from
the same loggers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

#: Environment variable that keeps every library line on the console.
VERBOSE_ENV = "MMOA_VERBOSE"
#: The file, in a run's output folder, that receives the libraries' INFO lines.
LIBRARY_LOG = "library.log"
#: Loggers whose console output is cut to warnings.
LIBRARY_LOGGERS = ("llamafactory", "transformers")
#: Our loggers under ``llamafactory`` whose INFO lines stay on the console.
OWN_LOGGERS = ("llamafactory.mmoa",)
_FORMAT = "[%(levelname)s|%(asctime)s] %(name)s:%(lineno)s >> %(message)s"
#: The log file of the block being routed (one at a time per process).
_routed: list[Path] = []


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "0").lower() in ("1", "true", "yes")


def library_log_path(log_dir: str | Path) -> Path:
    """``library.log`` for the first process, ``library.rank<N>.log`` for the others."""
    rank = int(os.environ.get("RANK", "0") or 0)
    return Path(log_dir) / (LIBRARY_LOG if rank == 0 else f"library.rank{rank}.log")


def _library_loggers() -> list[logging.Logger]:
    """The libraries' root loggers, configured (handlers attached) as they configure them."""
    import transformers.utils.logging as hf_logging
    from llamafactory.extras import logging as lf_logging

    return [lf_logging.get_logger("llamafactory"), hf_logging.get_logger("transformers")]


@contextlib.contextmanager
def routed_library_logs(log_dir: str | Path | None) -> Iterator[Path | None]:
    """While the block runs, send the libraries' INFO lines to ``log_dir/library.log`` and keep
    warnings on the console; yields the log file, or ``None`` when nothing is changed
    (``MMOA_VERBOSE=1``, a web UI run, no folder, or a block already routed in this process).

    On exit every handler it added is removed and closed and the console handlers get their
    levels back: a process that runs several commands (the tests, a notebook) neither keeps
    writing to a folder that may be gone nor prints our lines once per earlier command."""
    if log_dir is None or verbose() or os.environ.get("LLAMABOARD_ENABLED") or _routed:
        yield None
        return
    path = library_log_path(log_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    file_handler = logging.FileHandler(path, encoding="utf-8", delay=True)
    file_handler.setLevel(logging.INFO)
    file_handler.setFormatter(logging.Formatter(_FORMAT))
    loggers = _library_loggers()
    levels: list[tuple[logging.Handler, int]] = []
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(
                    handler, logging.FileHandler):
                levels.append((handler, handler.level))
                handler.setLevel(logging.WARNING)
        logger.addHandler(file_handler)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO)
    console.setFormatter(logging.Formatter(_FORMAT))
    console.addFilter(lambda record: record.levelno < logging.WARNING)  # warnings: parent's
    for name in OWN_LOGGERS:
        logging.getLogger(name).addHandler(console)
    _routed.append(path)
    try:
        yield path
    finally:
        _routed.remove(path)
        for name in OWN_LOGGERS:
            logging.getLogger(name).removeHandler(console)
        for logger in loggers:
            logger.removeHandler(file_handler)
        for handler, level in levels:
            handler.setLevel(level)
        file_handler.close()


def quiet_faiss_loader() -> None:
    """faiss logs, at INFO, the ``ModuleNotFoundError`` of each CPU-specific build it probes
    before the one it loads: noise under any ``basicConfig(level=INFO)``."""
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
