"""The MAPPO run configuration the integration tests share: the tiny model, a few questions
per step, short generations, checkpoints every step."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def tiny_mappo_config(model: Path, data: Path, url: str, output: Path,
                      **extra: Any) -> dict[str, Any]:
    """A ``stage: mappo`` config over the ``tiny_mappo`` prompt set; ``extra`` overrides."""
    config: dict[str, Any] = {
        "stage": "mappo", "do_train": True, "model_name_or_path": str(model),
        "finetuning_type": "full", "template": "llama3", "dataset": "tiny_mappo",
        "dataset_dir": str(data), "output_dir": str(output), "overwrite_output_dir": True,
        "disable_gradient_checkpointing": True, "report_to": "none", "plot_loss": True,
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1,
        "learning_rate": 1e-4, "max_steps": 3, "logging_steps": 1, "save_steps": 1,
        "ppo_epochs": 1, "seed": 7, "lr_scheduler_type": "constant", "bf16": False,
        "mappo_retriever_url": url, "mappo_questions_per_rollout": 4,
        "mappo_rollout_batch_size": 4, "mappo_max_new_tokens_qr": 16,
        "mappo_max_new_tokens_selector": 12, "mappo_max_new_tokens_generator": 8,
    }
    config.update(extra)
    return config
