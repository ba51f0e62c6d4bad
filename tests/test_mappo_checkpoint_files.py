"""MAPPO checkpoint integrity without a model: the manifest written with each checkpoint, its
check before a resume, the fallback to an earlier checkpoint, the clean-up of folders left by
killed saves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmoa.train.mappo.checkpoint_files import (
    MANIFEST_FILE,
    CheckpointError,
    choose_resume_checkpoint,
    clean_orphans,
    rotate_checkpoints,
    verify_checkpoint,
    write_manifest,
)


def _checkpoint(parent: Path, step: int, manifest: bool = True) -> Path:
    folder = parent / f"checkpoint-{step}"
    (folder / "deepspeed").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (folder / "mappo_state.json").write_text(json.dumps({"global_step": step}))
    (folder / "deepspeed" / "part.pt").write_bytes(b"partition")
    if manifest:
        write_manifest(folder)
    return folder


def _flip(path: Path, offset: int = 4096, size: int = 4096) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + size, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_manifest_lists_every_file_with_its_sha256(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 1)
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert sorted(manifest["files"]) == ["deepspeed/part.pt", "mappo_state.json",
                                         "model.safetensors"]
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())
    assert verify_checkpoint(folder) is True


@pytest.mark.parametrize("damage, expected", [
    (lambda f: _flip(f / "model.safetensors"), r"model\.safetensors does not match its sha256"),
    (lambda f: (f / "model.safetensors").write_bytes(b"cut"), r"model\.safetensors has 3 bytes"),
    (lambda f: (f / "deepspeed" / "part.pt").unlink(), r"deepspeed/part\.pt is missing"),
    (lambda f: (f / MANIFEST_FILE).write_text("{not json"), rf"{MANIFEST_FILE} is unreadable"),
])
def test_a_damaged_checkpoint_names_the_file_and_the_checkpoint(tmp_path: Path, damage,
                                                                expected: str) -> None:
    folder = _checkpoint(tmp_path, 2)
    damage(folder)
    with pytest.raises(CheckpointError, match=expected) as info:
        choose_resume_checkpoint(folder, fallback=False)
    message = str(info.value)
    assert str(folder) in message and "mappo_resume_fallback" in message
    assert "\n" not in message


def test_fallback_picks_the_newest_earlier_checkpoint_that_verifies(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 1)
    _checkpoint(tmp_path, 2, manifest=False)  # cannot be vouched for: skipped
    third = _checkpoint(tmp_path, 3)
    _flip(third / "model.safetensors")
    _flip(_checkpoint(tmp_path, 4) / "model.safetensors")  # later than the one asked for
    choice = choose_resume_checkpoint(third, fallback=True)
    assert choice.folder == tmp_path / "checkpoint-1" and choice.verified
    [warning] = choice.warnings
    assert "checkpoint-3" in warning and "model.safetensors" in warning
    assert "resuming from" in warning and "checkpoint-2 has no" in warning


def test_fallback_with_nothing_that_verifies_is_an_error(tmp_path: Path) -> None:
    first = _checkpoint(tmp_path, 1)
    _flip(first / "model.safetensors")
    second = _checkpoint(tmp_path, 2)
    (second / "mappo_state.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"no earlier checkpoint in .* verifies"):
        choose_resume_checkpoint(second, fallback=True)


def test_a_checkpoint_without_manifest_resumes_with_a_warning(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path, 5, manifest=False)
    choice = choose_resume_checkpoint(folder, fallback=False)
    assert choice.folder == folder and not choice.verified
    assert len(choice.warnings) == 1 and f"has no {MANIFEST_FILE}" in choice.warnings[0]


def test_orphans_of_killed_saves_are_removed(tmp_path: Path) -> None:
    kept = _checkpoint(tmp_path, 1)
    for name in (".checkpoint-2.k3j_x9.tmp", ".checkpoint-2.parts", ".checkpoint-1.old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".checkpoint-3.old").mkdir()  # its checkpoint-3 is gone: the only copy
    (tmp_path / ".hidden.tmp").mkdir()  # not ours
    lines = clean_orphans(tmp_path)
    assert len(lines) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".hidden.tmp", "checkpoint-1", "checkpoint-3"]
    assert verify_checkpoint(kept)
    assert any("restored" in line and "checkpoint-3" in line for line in lines)
    assert clean_orphans(tmp_path / "missing") == []


def test_rotation_keeps_the_newest_checkpoints_by_step(tmp_path: Path) -> None:
    for step in (2, 10, 4, 1):  # 10 after 4 by number, not by name
        _checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-final").mkdir()  # not a checkpoint-N folder: never touched
    (tmp_path / "model.safetensors").write_bytes(b"final weights")
    removed = rotate_checkpoints(tmp_path, 2)
    assert sorted(p.name for p in removed) == ["checkpoint-1", "checkpoint-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-10", "checkpoint-4", "checkpoint-final", "model.safetensors"]
    assert rotate_checkpoints(tmp_path, 2) == []
    assert rotate_checkpoints(tmp_path, None) == rotate_checkpoints(tmp_path, 0) == []
    assert (tmp_path / "checkpoint-4").is_dir()
    assert [p.name for p in rotate_checkpoints(tmp_path, 1)] == ["checkpoint-4"]
