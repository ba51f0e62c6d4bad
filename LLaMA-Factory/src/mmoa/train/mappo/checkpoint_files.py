"""MAPPO checkpoint integrity: a manifest of every file's sha256, checked before a resume.

A checkpoint that was damaged after it was written (a flipped block on disk, a file cut short
by a full disk or a copy that stopped) used to resume silently with different weights, or to
fail deep inside safetensors/torch with a message that named no file. Each checkpoint now ends
with ``mappo_manifest.json`` (written last, atomically, inside the staging folder that becomes
the checkpoint), and a resume checks every file against it before anything is loaded. With
``mappo_resume_fallback`` a damaged checkpoint gives way to the newest earlier one that
verifies. Checkpoints written before manifests existed resume with a warning.

Saves that were killed leave hidden staging folders beside the checkpoints
(``.checkpoint-N.<random>.tmp`` from :func:`mmoa.fileio.atomic_dir`, ``.checkpoint-N.parts``
from a multi-process save); :func:`clean_orphans` removes them at the next start.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mmoa.fileio import atomic_write_json, sha256_file

MANIFEST_FILE = "mappo_manifest.json"
MANIFEST_FORMAT = 1
CHECKPOINT_PREFIX = "checkpoint"
_CHECKPOINT = re.compile(rf"^{CHECKPOINT_PREFIX}-(\d+)$")
#: Hidden folders of an unfinished save: ``atomic_dir``'s staging folder, a multi-process
#: save's parts, and the previous copy ``atomic_dir`` keeps while it replaces a folder.
_ORPHAN = re.compile(rf"^\.({CHECKPOINT_PREFIX}-\d+)\.(?:.+\.tmp|parts|old)$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed from; the message names the checkpoint and file."""


def checkpoint_step(folder: Path) -> int | None:
    """``N`` of a ``checkpoint-N`` folder, ``None`` for any other name."""
    found = _CHECKPOINT.match(folder.name)
    return int(found.group(1)) if found else None


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)


def write_manifest(folder: Path) -> Path:
    """Record the size and sha256 of every file below ``folder``; call it after the last file
    of the checkpoint is written (the manifest is written atomically)."""
    entries = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size,
                                                  "sha256": sha256_file(p)}
               for p in _files(folder)}
    path = folder / MANIFEST_FILE
    atomic_write_json(path, {"format": MANIFEST_FORMAT, "algorithm": "sha256",
                             "files": entries})
    return path


def verify_checkpoint(folder: Path) -> bool:
    """Check ``folder`` against its manifest: ``True`` when every file matches, ``False``
    when there is no manifest (a checkpoint saved before manifests existed).

    Raises :class:`CheckpointError` naming the checkpoint and the first bad file: missing,
    cut short or grown, different content, or an unreadable manifest.
    """
    manifest = folder / MANIFEST_FILE
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    if not manifest.exists():
        return False
    try:
        saved = json.loads(manifest.read_text(encoding="utf-8"))
        files = saved["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not an object")
        expected = {name: (int(entry["size"]), str(entry["sha256"]))
                    for name, entry in files.items()}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as err:
        raise CheckpointError(f"checkpoint {folder}: {MANIFEST_FILE} is unreadable "
                              f"({type(err).__name__}: {err})") from err
    for name, (size, digest) in sorted(expected.items()):
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"checkpoint {folder}: {name} is missing (listed in "
                                  f"{MANIFEST_FILE})")
        actual = path.stat().st_size
        if actual != size:
            raise CheckpointError(f"checkpoint {folder}: {name} has {actual} bytes, "
                                  f"{size} were saved (cut short or overwritten)")
        try:
            actual_digest = sha256_file(path)
        except OSError as err:
            raise CheckpointError(f"checkpoint {folder}: {name} cannot be read ({err})") from err
        if actual_digest != digest:
            raise CheckpointError(f"checkpoint {folder}: {name} does not match its sha256 in "
                                  f"{MANIFEST_FILE} (the file changed after it was saved)")
    return True


@dataclass
class ResumeChoice:
    """The checkpoint a run resumes from, and what the user must be told about it."""

    folder: Path
    verified: bool
    warnings: list[str] = field(default_factory=list)


def choose_resume_checkpoint(requested: str | Path, fallback: bool) -> ResumeChoice:
    """``requested`` if it verifies (or has no manifest, with a warning); a damaged one is a
    :class:`CheckpointError`, or with ``fallback`` the newest earlier ``checkpoint-M`` beside
    it that verifies (checkpoints without a manifest cannot be vouched for and are skipped)."""
    folder = Path(requested)
    try:
        if verify_checkpoint(folder):
            return ResumeChoice(folder, verified=True)
    except CheckpointError as err:
        if not fallback:
            raise CheckpointError(f"{err}; set mappo_resume_fallback: true to resume from the "
                                  "newest earlier checkpoint that verifies") from err
        return _fall_back(folder, str(err))
    return ResumeChoice(folder, verified=False, warnings=[
        f"checkpoint {folder} has no {MANIFEST_FILE} (saved before checkpoints were verified): "
        "resuming without checking its files"])


def _fall_back(damaged: Path, reason: str) -> ResumeChoice:
    step = checkpoint_step(damaged)
    earlier = sorted(
        ((s, p) for p in damaged.parent.glob(f"{CHECKPOINT_PREFIX}-*")
         if p.is_dir() and (s := checkpoint_step(p)) is not None
         and (step is None or s < step)),
        reverse=True)
    skipped: list[str] = []
    for _, candidate in earlier:
        try:
            if verify_checkpoint(candidate):
                return ResumeChoice(candidate, verified=True, warnings=[
                    f"{reason}; mappo_resume_fallback: resuming from {candidate} instead"
                    + (f" (skipped: {'; '.join(skipped)})" if skipped else "")])
            skipped.append(f"{candidate.name} has no {MANIFEST_FILE}")
        except CheckpointError as err:
            skipped.append(str(err))
    detail = f" ({'; '.join(skipped)})" if skipped else ""
    raise CheckpointError(f"{reason}; mappo_resume_fallback: no earlier checkpoint in "
                          f"{damaged.parent} verifies{detail}")


def clean_orphans(output_dir: Path) -> list[str]:
    """Remove what killed saves left in ``output_dir``; returns one line per folder handled.

    A ``.checkpoint-N.old`` whose ``checkpoint-N`` is gone is the only copy of that checkpoint
    (the save was killed between the two renames of ``atomic_dir``): it is put back instead.
    """
    lines: list[str] = []
    if not output_dir.is_dir():
        return lines
    for path in sorted(output_dir.iterdir()):
        found = _ORPHAN.match(path.name)
        if found is None or not path.is_dir():
            continue
        target = output_dir / found.group(1)
        if path.name.endswith(".old") and not target.exists():
            path.rename(target)
            lines.append(f"{path} restored as {target} (a save was killed while replacing it)")
            continue
        shutil.rmtree(path)
        lines.append(f"removed {path} (left by a save that was killed)")
    return lines


def rotate_checkpoints(output_dir: Path, keep: int | None) -> list[Path]:
    """Delete all but the ``keep`` newest ``checkpoint-N`` folders of ``output_dir`` (by N);
    returns the folders removed. ``None`` or ``0`` keeps every checkpoint.

    This is Hugging Face's ``save_total_limit``, which our stages' own save loops must apply
    themselves: a SmolLM2 checkpoint with its optimiser state is 1.6 GB, and a run that saves
    every few steps fills a disk without it.
    """
    if not keep or not output_dir.is_dir():
        return []
    found = sorted(((s, p) for p in output_dir.iterdir()
                    if p.is_dir() and (s := checkpoint_step(p)) is not None), reverse=True)
    removed = [p for _, p in found[keep:]]
    for path in removed:
        shutil.rmtree(path)
    return removed
