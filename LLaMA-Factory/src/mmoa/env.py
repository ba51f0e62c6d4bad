"""Process environment shared by every entry point.

All models and datasets are local directories, so hub access is never needed; switching it off
up front turns an accidental hub id into an immediate, clear error instead of a network time-out,
and stops the download-count ping of ``datasets`` and gradio's analytics calls.

``OMP_WAIT_POLICY=PASSIVE`` makes idle OpenMP threads sleep instead of spinning. Training,
rollouts and the retrieval server share a few CPU cores; with spinning threads, PyTorch ran the
PPO learning test 30 times slower (129 s instead of 4 s) while another process was busy.
"""

from __future__ import annotations

import os

#: Variables set (unless the user already set them) before any HF library is imported.
OFFLINE_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "GRADIO_ANALYTICS_ENABLED": "False",
    "TOKENIZERS_PARALLELISM": "false",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "OMP_WAIT_POLICY": "PASSIVE",
}


def configure_offline(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Set the offline variables in ``environ`` (default ``os.environ``) where they are unset.

    Returns the variables that were applied, so callers (and tests) can see what changed.
    """
    target = os.environ if environ is None else environ
    applied: dict[str, str] = {}
    for key, value in OFFLINE_ENV.items():
        if key not in target:
            target[key] = value
            applied[key] = value
    return applied
