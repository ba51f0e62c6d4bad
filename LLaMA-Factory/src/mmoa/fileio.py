"""Atomic file and folder writing, and JSON Lines reading with line-precise errors.

Every data file, index and checkpoint of the project is written through these helpers: the
content goes to a temporary sibling first and is moved into place with ``os.replace`` only when
complete, so an interrupted run never leaves a half-written file behind and never damages what
was there before.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

PathLike = str | os.PathLike[str]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _apply_default_mode(path: Path, directory: bool) -> None:
    """mkstemp/mkdtemp create private (0600/0700) entries; give them the usual umask mode."""
    os.chmod(path, (0o777 if directory else 0o666) & ~_umask())


def apply_umask_modes(folder: Path) -> None:
    """Give ``folder`` and everything below it the usual (umask) modes.

    Temporary entries are created private (0600/0700) and safetensors writes weights 0600; an
    index or a model folder is usually shared (built by one user, served or trained by another).
    """
    mask = _umask()
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def sha256_file(path: PathLike, chunk_size: int = 1 << 20,
                on_read: Callable[[int], object] | None = None) -> str:
    """Hex sha256 of a file, read in chunks (a multi-GB weights file need not fit in memory).

    ``on_read(n)`` is called after each chunk of ``n`` bytes (e.g. a progress bar's update)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
            if on_read is not None:
                on_read(len(chunk))
    return digest.hexdigest()


@contextlib.contextmanager
def atomic_path(path: PathLike) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; on success move it onto ``path``.

    On an exception the temporary file is removed and ``path`` keeps its previous content.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if tmp.exists():
            _apply_default_mode(tmp, directory=False)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_dir(path: PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` as a whole.

    Used for outputs made of several files (an index with its metadata, a checkpoint) that must
    appear together or not at all.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield tmp
        _apply_default_mode(tmp, directory=True)
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            if old.exists():
                shutil.rmtree(old)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old)
        else:
            os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def atomic_write_text(path: PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_json(path: PathLike, obj: Any, indent: int | None = 2) -> None:
    atomic_write_text(path, json.dumps(obj, ensure_ascii=False, indent=indent) + "\n")


def atomic_write_jsonl(path: PathLike, records: Iterable[dict[str, Any]]) -> int:
    """Write one JSON object per line; returns the number of records written."""
    count = 0
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


class DataFormatError(ValueError):
    """Bad input data; the message names the file, the line or record, and the field."""


def decode_utf8(data: bytes, source: PathLike, first_line: int = 1, offset: int = 0) -> str:
    """``data`` decoded as UTF-8; a byte that is not UTF-8 is a :class:`DataFormatError` naming
    the file, the line and the byte offset in the file (Python's own error gives an offset in
    an internal buffer and names no file). ``data`` starts at line ``first_line``, byte
    ``offset`` of ``source``."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = first_line + data.count(b"\n", 0, err.start)
        raise DataFormatError(
            f"{source}:{line}: byte 0x{data[err.start]:02x} at byte offset {offset + err.start} "
            f"is not UTF-8 ({err.reason}); save the file as UTF-8") from err


def read_utf8_text(path: PathLike) -> str:
    """The whole file as text, with :func:`decode_utf8`'s error for a byte that is not UTF-8."""
    source = Path(path)
    return decode_utf8(source.read_bytes(), source)


def iter_jsonl(path: PathLike) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line, 1-based line numbers.

    Lines are read as bytes and decoded one by one, so that a byte that is not UTF-8 is
    reported with its line and byte offset."""
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such file")
    with source.open("rb") as handle:
        offset = 0
        for line_number, raw in enumerate(handle, start=1):
            line = decode_utf8(raw, source, line_number, offset)
            offset += len(raw)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataFormatError(f"{source}:{line_number}: invalid JSON ({err.msg})") from err
            if not isinstance(obj, dict):
                raise DataFormatError(
                    f"{source}:{line_number}: expected a JSON object, got {type(obj).__name__}"
                )
            yield line_number, obj


def read_jsonl(path: PathLike) -> list[dict[str, Any]]:
    return [obj for _, obj in iter_jsonl(path)]
