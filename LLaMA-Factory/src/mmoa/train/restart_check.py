"""A training run that would start over beside the checkpoints of an earlier one says so first.

Every shipped config sets ``overwrite_output_dir: true`` (a rerun of a finished recipe replaces
it), so running the same command again after a run was cut short starts again from step 0,
whatever ``checkpoint-N`` the cut run left: only ``resume_from_checkpoint`` continues it. The new
run's checkpoint rotation (``save_total_limit``) then removes the old checkpoints, or writes its
own over them when it reaches their step: hours of training on a CPU go without a word. The
warning names the newest checkpoint and the override that continues from it, before anything
loads, so a user who meant to resume can stop the run while nothing is lost yet.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mmoa.config_values import reads_as_true
from mmoa.train.mappo.checkpoint_files import checkpoint_step


def newest_checkpoint(output_dir: str | Path, holding: str | None = None) -> Path | None:
    """The ``checkpoint-N`` folder of ``output_dir`` with the largest N, or None; with
    ``holding``, the largest N among those holding that file (a MAPPO checkpoint is complete
    once its manifest, written last, is there)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    steps = [(step, child) for child in folder.iterdir()
             if child.is_dir() and (step := checkpoint_step(child)) is not None
             and (holding is None or (child / holding).is_file())]
    return max(steps)[1] if steps else None


def restart_warning(config: Mapping[str, Any]) -> str | None:
    """The warning for a run that starts from step 0 although ``output_dir`` holds
    checkpoints (``overwrite_output_dir`` true, no ``resume_from_checkpoint``), else None.

    With ``overwrite_output_dir`` false LLaMA-Factory's argument parser (ours for MAPPO too)
    resumes from the newest checkpoint itself, so that needs no warning."""
    output_dir = config.get("output_dir")
    if not output_dir or config.get("resume_from_checkpoint") \
            or not reads_as_true(config.get("overwrite_output_dir", False)):
        return None
    checkpoint = newest_checkpoint(output_dir)
    if checkpoint is None:
        return None
    return (f"{output_dir} holds {checkpoint.name} of an earlier run, and this run starts "
            f"from step 0 (overwrite_output_dir: true, no resume_from_checkpoint); its "
            f"checkpoints will remove or replace the earlier ones. To continue that run "
            f"instead, stop this one and add resume_from_checkpoint={checkpoint}")
