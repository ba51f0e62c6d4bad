"""The "Check server" button of the Train tab and the Playground, and the same check before Start.

A new user's first run used to start with the retrieval server down, fail after about 20 s and
show the same four-line urllib3 message three times; and nothing told which index a URL served
(a real-world question was answered "yes" from the synthetic demo corpus). So the UI asks the
server's ``GET /health`` (:mod:`mmoa.retrieval.app`) and says in one line either what it serves
(index, passage count, encoder, whether it is the demo world) or that nothing answers there and
the command that starts a server.

``/health`` reports the index folder as the server was started with it (``index_path``), taken
at its word. A server of an older version reports only the checksums: its folder (and so whether
it is the demo world) is then found by matching the served ``corpus_checksum`` /
``index_checksum`` against the ``meta.json`` of the index folders under ``data/`` of the folder
the UI runs in (where ``run_demo.sh`` builds ``data/demo/index``).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmoa.retrieval.app import ServerLimits
from mmoa.retrieval.index import INDEX_FILE

#: The command a refusal names (the README's and run_demo.sh's).
START_COMMAND = "bash run_server.sh --index data/demo/index"
#: Seconds the check waits: /health answers at once, even while the server is busy.
CHECK_TIMEOUT_S = 5.0
#: Where index folders are looked for, relative to the folder the UI runs in.
INDEX_GLOBS = ("data/*/meta.json", "data/*/*/meta.json", "data/*/*/*/meta.json")
#: At most this many ``meta.json`` files are read per check (a data folder may be large).
MAX_METAS = 200
#: The path component that marks the generated demo world (``data/demo/...``).
DEMO_MARK = "demo"
#: The longest query the server accepts by default (``--max-query-chars``); one place:
#: the server's own limits.
DEFAULT_MAX_QUERY_CHARS = ServerLimits.max_query_chars


@dataclass(frozen=True)
class ServerReport:
    """What one check found; ``reason`` (a short phrase) says why ``ok`` is false."""

    url: str
    ok: bool
    reason: str = ""
    health: dict[str, Any] = field(default_factory=dict)
    index_path: str | None = None
    demo: bool | None = None

    @property
    def corpus_size(self) -> int | None:
        value = self.health.get("corpus_size")
        return value if isinstance(value, int) else None

    @property
    def encoder(self) -> str:
        encoder = self.health.get("encoder")
        return str(encoder.get("name", "?")) if isinstance(encoder, dict) else "?"

    @property
    def max_query_chars(self) -> int:
        """The server's own limit (it may run with ``--max-query-chars``), else the default."""
        limits = self.health.get("limits")
        value = limits.get("max_query_chars") if isinstance(limits, dict) else None
        return value if isinstance(value, int) and value > 0 else DEFAULT_MAX_QUERY_CHARS


def _base_url(url: str) -> str:
    """The server's root, as the client reads a URL (``/search`` etc. stripped)."""
    base = url.strip().rstrip("/")
    for suffix in ("/search", "/retrieve", "/health"):
        base = base.removesuffix(suffix)
    return base


def _connection_reason(err: Exception) -> str:
    """A short phrase for a failed connection instead of urllib3's four-line message."""
    import requests

    text = str(err)
    if isinstance(err, requests.Timeout):
        return f"no answer within {CHECK_TIMEOUT_S:.0f} s"
    if "Connection refused" in text or "Errno 111" in text:
        return "connection refused: nothing listens there"
    if "Name or service not known" in text or "nodename nor servname" in text \
            or "Temporary failure in name resolution" in text:
        return "the host name is not known"
    return f"cannot connect ({type(err).__name__})"


def check_server(url: str, *, token: str | None = None, timeout: float = CHECK_TIMEOUT_S,
                 roots: Sequence[Path] = (Path("."),)) -> ServerReport:
    """Ask ``url``'s ``/health``; never raises. ``roots`` are the folders whose ``data/`` holds
    index folders to recognise the served index by."""
    import requests

    url = (url or "").strip()
    if not url.startswith(("http://", "https://")):
        return ServerReport(url, False, "the URL must start with http:// or https://")
    base = _base_url(url)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = requests.get(f"{base}/health", timeout=timeout, headers=headers)
    except requests.RequestException as err:
        return ServerReport(base, False, _connection_reason(err))
    if response.status_code != 200:
        return ServerReport(base, False, f"/health answered HTTP {response.status_code}: "
                                         "is this a retrieval server of this project?")
    try:
        health = response.json()
    except ValueError:
        health = None
    if not isinstance(health, dict) or "corpus_size" not in health:
        return ServerReport(base, False, "the reply of /health is not a retrieval server's "
                                         "(no corpus_size): is the port right?")
    path = health.get("index_path") if isinstance(health.get("index_path"), str) else None
    source = None if path is None else local_index_source(Path(path))
    if path is None:
        path, source = find_local_index(health, roots)
    demo = None if path is None else (
        DEMO_MARK in Path(path).parts or (source is not None and DEMO_MARK in Path(source).parts))
    return ServerReport(base, True, "", health, path, demo)


def _meta_source(meta: Any) -> str | None:
    """The corpus file an index was built from, as its ``meta.json`` records it."""
    build = meta.get("build") if isinstance(meta, dict) else None
    source = build.get("source") if isinstance(build, dict) else None
    return source if isinstance(source, str) else None


def local_index_source(folder: Path) -> str | None:
    """The corpus source of the index folder a server reports, when the UI runs on the same
    machine and can read its ``meta.json``; None otherwise (another machine, no access)."""
    try:
        return _meta_source(json.loads((folder / "meta.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def find_local_index(health: dict[str, Any], roots: Sequence[Path]
                     ) -> tuple[str | None, str | None]:
    """``(folder, corpus source)`` of the index under ``roots``' ``data/`` whose checksums are
    the ones the server reports, else ``(None, None)``. The folder is given relative to its
    root when the root is the working directory (as a user types it)."""
    corpus = health.get("corpus_checksum")
    index = health.get("index_checksum")
    if not isinstance(corpus, str) or not corpus:
        return None, None
    read = 0
    for root in roots:
        for pattern in INDEX_GLOBS:
            for meta_path in sorted(Path(root).glob(pattern)):
                read += 1
                if read > MAX_METAS:
                    return None, None
                try:
                    meta = json.loads(meta_path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    continue
                if not isinstance(meta, dict) or meta.get("corpus_checksum") != corpus:
                    continue
                files = meta.get("files") if isinstance(meta.get("files"), dict) else {}
                if index and files.get(INDEX_FILE) not in (None, index):
                    continue  # the same corpus, another index over it
                folder = meta_path.parent
                shown = (folder.relative_to(root) if Path(root) == Path(".") else folder)
                return str(shown), _meta_source(meta)
    return None, None


_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def start_command(url: str | None) -> str:
    """The command that starts a demo server where ``url`` points: :data:`START_COMMAND` with
    the URL's port (and host, when it is not this machine). The line used to leave the port
    out, so a user who asked about port 8001 was told to start a server on 8000."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit((url or "").strip())
        port = parts.port
    except ValueError:  # a port that is not a number
        return START_COMMAND
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return START_COMMAND
    port = port or (443 if parts.scheme == "https" else 80)
    command = f"{START_COMMAND} --port {port}"
    if parts.hostname not in _LOCAL_HOSTS:
        command = f"{command} --host 0.0.0.0 --token-file FILE (on {parts.hostname})"
    return command


def refusal_line(report: ServerReport) -> str:
    """The one line that says why a run or a question cannot start and what to do."""
    return (f"No retrieval server answers at {report.url or '(no URL)'} ({report.reason}). "
            f"Start one with: {start_command(report.url)}")


def describe(report: ServerReport) -> str:
    """One line (plain text) of what the server serves."""
    size = report.corpus_size
    passages = f"{size:,} passages" if size is not None else "? passages"
    kind = report.health.get("index_type", "?")
    where = (f"index {report.index_path}" if report.index_path
             else "index folder not known (no index under data/ has the served checksums)")
    if report.demo:
        world = ("the DEMO WORLD: a synthetic corpus of invented people, places and films; "
                 "real-world questions will not find their answers there")
    elif report.demo is None:
        world = "not known whether this is the demo world"
    else:
        world = "not the demo world"
    return (f"{report.url} answers: {where} ({kind}, {passages}), encoder {report.encoder}; "
            f"{world}")


def render_report(report: ServerReport) -> str:
    """The check's result as HTML for the page (a class says ok / down, for styles and tests;
    words, not emoji, which headless browsers without an emoji font draw as boxes)."""
    if not report.ok:
        return (f'<div class="mmoa-server-check mmoa-server-down"><b>Not reachable:</b> '
                f"{html.escape(refusal_line(report))}</div>")
    demo = " mmoa-server-demo" if report.demo else ""
    return (f'<div class="mmoa-server-check mmoa-server-ok{demo}"><b>Server OK:</b> '
            f"{html.escape(describe(report))}</div>")
