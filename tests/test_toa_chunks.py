"""Resumable TOA synthesis: a run stopped after a chunk resumes from disk and gives the labels an
uninterrupted run gives; chunks made with other settings or questions are searched again."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from mmoa.cli import main as cli_main
from mmoa.data.loaders import load_qa
from mmoa.synthesis.chunks import ChunkCache, model_fingerprint

TOKENS = {"qr": 12, "selector": 10, "generator": 6}


def _cli_args(model_dir: Path, world_dir: Path, server_url: str, out: Path) -> list[str]:
    return ["data", "toa", "--data_file", str(world_dir / "train.jsonl"), "--max_samples", "3",
            "--dataset_dir", str(out), "--name", "chunked", "--retriever_url", server_url,
            "--samples_per_model", "2", "--k", "5", "--no_progress", "--precision", "fp32",
            "--chunk_size", "2",
            "--model", f"name=tiny,path={model_dir},template=llama3",
            "--model", f"name=careful,path={model_dir},template=llama3,variant=careful",
            *[a for agent, n in TOKENS.items() for a in (f"--max_new_tokens_{agent}", str(n))]]


def test_a_stopped_run_resumes_from_its_chunks_with_the_same_labels(
        tiny_model_dir: Path, tiny_world_dir: Path, tiny_server_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    args = _cli_args(tiny_model_dir, tiny_world_dir, tiny_server_url, tmp_path)
    assert cli_main(args) == 0
    chunks = tmp_path / "chunked_toa_chunks" / "toa"
    first, second = chunks / "chunk-0000.pkl", chunks / "chunk-0001.pkl"
    assert first.is_file() and second.is_file(), "3 questions in chunks of 2"
    uninterrupted = {name: (tmp_path / f"{name}.json").read_text()
                     for name in ("chunked", "chunked_dpo")}
    first_written = first.stat().st_mtime_ns
    second.unlink()  # the run "stopped" after its first chunk
    capsys.readouterr()

    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    assert f"chunk 1/2 (2 questions) loaded from {first}" in printed
    assert "chunk 2/2 done (3 of 3 questions)" in printed
    assert first.stat().st_mtime_ns == first_written, "a loaded chunk is not searched again"
    assert second.is_file()
    for name, text in uninterrupted.items():
        assert (tmp_path / f"{name}.json").read_text() == text, name
    summary = json.loads((tmp_path / "chunked_label_quality.json").read_text())
    assert summary["chunk_size"] == 2, "the samples depend on it: the summary records it"
    assert sum(summary["label_quality"][0]["wins"]["qr"]["wins"].values()) == 3


def test_no_cache_keeps_no_chunks(tiny_model_dir: Path, tiny_world_dir: Path,
                                  tiny_server_url: str, tmp_path: Path) -> None:
    args = _cli_args(tiny_model_dir, tiny_world_dir, tiny_server_url, tmp_path)
    assert cli_main([*args, "--no_cache", "--max_samples", "1"]) == 0
    assert not (tmp_path / "chunked_toa_chunks").exists()
    assert json.loads((tmp_path / "chunked.json").read_text())


def test_a_bad_chunk_size_is_refused_before_any_model_loads(
        tiny_world_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = _cli_args(tmp_path / "no-model", tiny_world_dir, "http://127.0.0.1:9", tmp_path)
    assert cli_main([*args, "--chunk_size", "0"]) == 2
    assert "--chunk_size must be >= 1, got 0" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def _cache(folder: Path, **settings: object) -> ChunkCache:
    return ChunkCache(folder, {"alpha": 0.01, **settings})


def test_a_chunk_is_reused_only_under_the_same_settings_and_questions(
        tiny_world_dir: Path, tmp_path: Path) -> None:
    records = load_qa(tiny_world_dir / "train.jsonl", "demo")[:2]
    cache = _cache(tmp_path)
    state = {"shuffle": (3, (1, 2), None), "sampling": {}}
    cache.save("toa", 0, records, [], state)
    assert cache.load("toa", 0, records) == ([], state)
    assert _cache(tmp_path, alpha=0.5).load("toa", 0, records) is None, "other settings"
    assert cache.load("toa", 0, records[:1]) is None, "other questions"
    changed = replace(records[0], answers=["something else"])
    assert cache.load("toa", 0, [changed, records[1]]) is None, "other gold answers"
    assert cache.load("best_of_n", 0, records) is None, "each method has its own chunks"
    assert cache.load("toa", 1, records) is None, "missing chunk"
    cache.path("toa", 0).write_bytes(b"not a pickle")
    assert cache.load("toa", 0, records) is None, "unreadable chunk: searched again"


def test_model_fingerprint_changes_when_a_checkpoint_is_rewritten(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"1234")
    (tmp_path / "sub").mkdir()
    before = model_fingerprint(tmp_path)
    assert [name for name, _, _ in before] == ["model.safetensors"]
    (tmp_path / "model.safetensors").write_bytes(b"123456")
    assert model_fingerprint(tmp_path) != before
    assert model_fingerprint(tmp_path / "missing") == []
