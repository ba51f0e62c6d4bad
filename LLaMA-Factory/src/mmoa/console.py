"""What the entry points print: our lines, progress bars and results on the console; the
libraries' INFO chatter in a log file beside the run's outputs.

LLaMA-Factory switches transformers to INFO with its explicit format, so loading one model
prints its whole config (twice), every "loading file" and an "Offline mode" line per file: an
8-question evaluation printed 186 lines before its table, the small demo about 2,000. Those
lines help when something goes wrong, so they are kept, in ``<output dir>/library.log``; the
console handlers of ``llamafactory`` and ``transformers`` show warnings and errors only.
The MAPPO stage's own logger (``llamafactory.mmoa``) keeps printing its INFO lines.

LLaMA-Factory's data loader also ``print``s one tokenized example before training: its
``input_ids`` and ``label_ids`` as Python lists (two lines of about 20,000 characters for a
demo SFT sample) and their decoded text. Those go to the same file: while a block is routed,
the loader's and the dataset processors' modules see a ``print`` that writes there.

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
from types import ModuleType
from typing import Any

#: Environment variable that keeps every library line on the console.
VERBOSE_ENV = "MMOA_VERBOSE"
#: The file, in a run's output folder, that receives the libraries' INFO lines.
LIBRARY_LOG = "library.log"
#: Loggers whose console output is cut to warnings.
LIBRARY_LOGGERS = ("llamafactory", "transformers")
#: Our loggers under ``llamafactory`` whose INFO lines stay on the console.
OWN_LOGGERS = ("llamafactory.mmoa",)
_FORMAT = "[%(levelname)s|%(asctime)s] %(name)s:%(lineno)s >> %(message)s"
#: The module that prints a tokenized example, and the package of the processors whose
#: ``print_data_example`` print it.
EXAMPLE_PRINTERS = ("llamafactory.data.loader", "llamafactory.data.processor")
#: The log file of the block being routed (one at a time per process).
_routed: list[Path] = []
_UNSET = object()


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
    printers = _example_printers()
    saved = [(module, module.__dict__.get("print", _UNSET)) for module in printers]
    for module in printers:
        module.print = _print_to(file_handler, module.__name__)  # type: ignore[attr-defined]
    _routed.append(path)
    try:
        yield path
    finally:
        _routed.remove(path)
        for module, before in saved:
            if before is _UNSET:
                del module.print  # type: ignore[attr-defined]
            else:
                module.print = before  # type: ignore[attr-defined]
        for name in OWN_LOGGERS:
            logging.getLogger(name).removeHandler(console)
        for logger in loggers:
            logger.removeHandler(file_handler)
        for handler, level in levels:
            handler.setLevel(level)
        file_handler.close()


def _example_printers() -> list[ModuleType]:
    """LLaMA-Factory's modules that ``print`` a tokenized example (the loader and every dataset
    processor); none when this llamafactory has another layout."""
    import importlib

    try:
        for name in EXAMPLE_PRINTERS:
            importlib.import_module(name)
    except ImportError:
        return []
    loader, package = EXAMPLE_PRINTERS
    return [module for name, module in sorted(sys.modules.items())
            if module is not None and (name == loader or name.startswith(package + "."))]


def _print_to(handler: logging.Handler, name: str) -> Any:
    """A ``print`` for a library module: what it prints to stdout becomes one INFO record of
    ``handler`` (the run's library.log) whatever the library's log level, since a user who
    sets ``LLAMAFACTORY_VERBOSITY=WARN`` still wants the example kept; other files are untouched."""

    def library_print(*values: object, sep: str | None = " ", end: str | None = "\n",
                      file: Any = None, flush: bool = False) -> None:
        if file is not None and file is not sys.stdout:
            print(*values, sep=sep, end=end, file=file, flush=flush)
            return
        text = (" " if sep is None else sep).join(map(str, values))
        handler.handle(logging.LogRecord(name, logging.INFO, name, 0, text, None, None))

    return library_print


def quiet_faiss_loader() -> None:
    """faiss logs, at INFO, the ``ModuleNotFoundError`` of each CPU-specific build it probes
    before the one it loads: noise under any ``basicConfig(level=INFO)``."""
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
