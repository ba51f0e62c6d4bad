"""``bench_runs.report_result``: the one ending of the one-shot benches (the JSON, the table, the
``--json-out`` file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_fixtures import import_bench


def test_report_result_prints_the_json_then_the_table(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    runs = import_bench("bench_runs")
    runs.report_result({"a": 1}, "\nname  value", None, "bench/x.py")
    assert capsys.readouterr().out == '{\n  "a": 1\n}\n\nname  value\n'
    assert not list(tmp_path.iterdir()), "no --json-out: nothing written"


def test_report_result_writes_the_json_out_with_the_code_stamp(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    runs = import_bench("bench_runs")
    out = tmp_path / "result.json"
    runs.report_result({"a": 1}, "table", out, "bench/x.py")
    written = json.loads(out.read_text())
    assert written["a"] == 1 and "code" in written
    assert capsys.readouterr().out.endswith("table\n")
