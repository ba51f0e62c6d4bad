"""bench/base_model_probe.py: the copy and reading probes run on a real (tiny) model."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _probe_module():
    spec = importlib.util.spec_from_file_location("base_model_probe",
                                                  ROOT / "bench" / "base_model_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_probe_measures_each_model(tiny_model_dir: Path, tiny_world_dir: Path,
                                   tmp_path: Path, capsys) -> None:
    probe = _probe_module()
    out = tmp_path / "probe.json"
    assert probe.main([str(tiny_model_dir), "--corpus", str(tiny_world_dir / "corpus.jsonl"),
                       "--questions", str(tiny_world_dir / "dev.jsonl"), "--copy-lists", "3",
                       "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    measured = result["models"][str(tiny_model_dir)]
    one_hop = [json.loads(line) for line in (tiny_world_dir / "dev.jsonl").open()]
    one_hop = [q for q in one_hop if q["type"] == "one_hop"]
    assert measured["reading_questions"] == len(one_hop) > 0
    assert all(0.0 <= measured[key] <= 1.0
               for key in ("copy", "reading_em", "generator_reading_em",
                           "generator_text_reading_em"))
    # An untrained model neither copies a list of new names nor reads an answer.
    assert measured["copy"] < 0.2
    assert measured["reading_em"] == 0.0 == measured["generator_reading_em"]
    assert measured["generator_text_reading_em"] == 0.0
    assert [e["gold"] for e in measured["reading_examples"]] == [
        q["answers"][0] for q in one_hop[:len(measured["reading_examples"])]]
    assert "G chat EM %" in capsys.readouterr().out
