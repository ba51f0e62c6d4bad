"""Fixes from the eval, Playground and retriever_rl input probes (issue 47; bench/trainer_probe.py
groups ``retriever_rl``, ``eval``, ``playground``): another web server at the retriever URL is
named at once in one line, an ``output_dir`` under a file and a model folder transformers cannot
open are one-line errors, and questions over the server's query limit are refused before the
model loads, in every retrieving mode."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mmoa.data.records import QARecord
from mmoa.evaluation import EvalConfig, check_question_lengths, evaluate
from mmoa.retrieval.client import RetrievalClient, RetrieverUnavailableError


@pytest.fixture
def html_server() -> Iterator[str]:
    """A web server that is not the retrieval server: every path an HTML 404 page."""

    class Html404(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Html404)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_another_web_server_is_named_at_once_in_one_line(html_server: str) -> None:
    # retriever_rl waited 30 s for it, then printed its whole HTML page (10 lines)
    started = time.monotonic()
    with pytest.raises(RetrieverUnavailableError) as info:
        RetrievalClient(html_server, timeout=2).wait_until_ready(timeout=30)
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert "\n" not in message and "not a retrieval server" in message
    assert html_server in message and "404" in message and len(message) < 400


def _config(tmp_path: Path, **changes: Any) -> EvalConfig:
    return EvalConfig(**{"model_name_or_path": str(tmp_path), "template": "llama3",
                         "output_dir": str(tmp_path / "out"), "data_file": "x.jsonl",
                         "mode": "rag", **changes})


def test_output_dir_under_a_file_is_refused_by_validate(tmp_path: Path) -> None:
    (tmp_path / "metrics.json").write_text("{}")
    config = _config(tmp_path, output_dir=str(tmp_path / "metrics.json" / "run"))
    with pytest.raises(ValueError, match="is a file, not a folder"):
        config.validate()


def _record(rid: str, question: str) -> QARecord:
    return QARecord(id=rid, question=question, answers=["a"])


@pytest.mark.parametrize("mode", ["rag", "qr_s_g"])
def test_a_question_over_the_servers_limit_is_refused_before_the_model(
        tmp_path: Path, mode: str) -> None:
    health = {"limits": {"max_query_chars": 2048, "max_k": 100}}
    records = [_record("short", "who?"), _record("huge", "who " * 1500)]
    with pytest.raises(ValueError, match=r"'huge' \(6,000 characters\)") as info:
        check_question_lengths(_config(tmp_path, mode=mode), records, health)
    assert "max_query_chars (2,048)" in str(info.value) and "\n" not in str(info.value)
    check_question_lengths(_config(tmp_path, mode=mode), records[:1], health)
    check_question_lengths(_config(tmp_path, mode="g"), records, health)  # no retrieval
    check_question_lengths(_config(tmp_path, mode=mode), records, {})  # limit not reported


def test_a_model_folder_transformers_cannot_open_is_a_value_error(
        tmp_path: Path, tiny_world_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mmoa.modeling

    def broken(*_: Any, **__: Any) -> None:
        raise OSError("Failed to load tokenizer.")

    monkeypatch.setattr(mmoa.modeling, "load_for_inference", broken)
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.json").write_text('{"f1": 0.5}')
    config = _config(tmp_path, mode="g", data_file=str(tiny_world_dir / "test.jsonl"),
                     output_dir=str(out))
    with pytest.raises(ValueError, match=r"cannot be loaded .*Failed to load tokenizer"):
        evaluate(config, progress=False)
    assert (out / "metrics.json").read_text() == '{"f1": 0.5}'  # the earlier run is kept
