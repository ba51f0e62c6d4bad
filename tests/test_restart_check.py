"""A training run that starts over beside an earlier run's checkpoints warns first and names the
override that continues it (``mmoa.train.restart_check``): the shipped configs set
``overwrite_output_dir: true``, so the same command again after a cut run starts from step 0
and its checkpoint rotation removes what the cut run left."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmoa.train.restart_check import newest_checkpoint, restart_warning


def _checkpoints(folder: Path, *names: str) -> None:
    for name in names:
        (folder / name).mkdir(parents=True)


def test_newest_checkpoint_is_the_largest_step_not_the_last_name(tmp_path: Path) -> None:
    _checkpoints(tmp_path, "checkpoint-20", "checkpoint-120", "checkpoint-9")
    (tmp_path / "checkpoint-300").write_text("a file, not a checkpoint")
    _checkpoints(tmp_path, "checkpoint-final", ".checkpoint-400.parts")
    assert newest_checkpoint(tmp_path) == tmp_path / "checkpoint-120"
    assert newest_checkpoint(tmp_path / "missing") is None
    assert newest_checkpoint(tmp_path / "checkpoint-9") is None  # no checkpoints inside


def test_newest_checkpoint_holding_a_file_skips_incomplete_ones(tmp_path: Path) -> None:
    """The web UI's "complete" MAPPO checkpoint: the newest one holding its manifest."""
    from mmoa.train.mappo.checkpoint_files import MANIFEST_FILE
    from mmoa.webui.run_status import latest_checkpoint

    _checkpoints(tmp_path, "checkpoint-4", "checkpoint-8", "checkpoint-12")
    for name in ("checkpoint-4", "checkpoint-8"):
        (tmp_path / name / MANIFEST_FILE).write_text("{}")
    assert newest_checkpoint(tmp_path) == tmp_path / "checkpoint-12"
    assert newest_checkpoint(tmp_path, holding=MANIFEST_FILE) == tmp_path / "checkpoint-8"
    assert latest_checkpoint(tmp_path) == (tmp_path / "checkpoint-8", 8)
    assert latest_checkpoint(tmp_path / "missing") is None
    assert newest_checkpoint(tmp_path, holding="absent.json") is None


def test_the_warning_names_the_newest_checkpoint_and_the_override(tmp_path: Path) -> None:
    out = tmp_path / "sft"
    _checkpoints(out, "checkpoint-110", "checkpoint-120")
    config = {"output_dir": str(out), "overwrite_output_dir": True}
    warning = restart_warning(config)
    assert warning is not None
    assert warning.startswith(f"{out} holds checkpoint-120 of an earlier run")
    assert warning.endswith(f"add resume_from_checkpoint={out / 'checkpoint-120'}")
    assert restart_warning({**config, "overwrite_output_dir": "true"}) == warning  # override


@pytest.mark.parametrize("change", [
    {"resume_from_checkpoint": "x/checkpoint-120"},  # it continues: what the user meant
    {"overwrite_output_dir": False},  # LLaMA-Factory resumes from the newest one itself
    {"overwrite_output_dir": "false"},
    {"output_dir": None},
])
def test_no_warning_where_the_run_continues_or_cannot_restart(tmp_path: Path,
                                                              change: dict) -> None:
    _checkpoints(tmp_path, "checkpoint-3")
    config = {"output_dir": str(tmp_path), "overwrite_output_dir": True, **change}
    assert restart_warning(config) is None


def test_no_warning_without_checkpoints(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_text("a finished run: replacing it is the point")
    assert restart_warning({"output_dir": str(tmp_path), "overwrite_output_dir": True}) is None
    assert restart_warning({"output_dir": str(tmp_path / "new"),
                            "overwrite_output_dir": True}) is None


def test_mmoa_cli_train_prints_it_before_the_run(tiny_model_dir: Path,
                                                 tiny_mappo_data_dir: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Through ``run_train``: the warning comes before the run starts (here a MAPPO config
    refused at its argument check, so nothing trains) and the old checkpoint is untouched."""
    from mmoa.train.launcher import run_train

    out = tmp_path / "out"
    _checkpoints(out, "checkpoint-7")
    (out / "checkpoint-7" / "model.safetensors").write_text("the earlier run's weights")
    path = tmp_path / "run.yaml"
    path.write_text(f"stage: mappo\nmodel_name_or_path: {tiny_model_dir}\n"
                    f"finetuning_type: full\ntemplate: llama3\ndataset: tiny_mappo\n"
                    f"dataset_dir: {tiny_mappo_data_dir}\noutput_dir: {out}\n"
                    "overwrite_output_dir: true\nmappo_retriever_url: http://127.0.0.1:9\n"
                    "max_grad_norm: .nan\n", encoding="utf-8")
    assert run_train([str(path)]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert lines[0].startswith(f"[mappo] warning: {out} holds checkpoint-7 of an earlier run")
    assert lines[0].endswith(f"resume_from_checkpoint={out / 'checkpoint-7'}")
    assert lines[1].startswith("[mappo] error: max_grad_norm")
    assert (out / "checkpoint-7" / "model.safetensors").read_text() == "the earlier run's weights"
    # with the override the same command is quiet about it
    assert run_train([str(path), f"resume_from_checkpoint={out / 'checkpoint-7'}"]) == 1
    assert "warning" not in capsys.readouterr().err
