"""The MAPPO stage's logger."""

from __future__ import annotations

import logging


def mappo_logger() -> logging.Logger:
    """A child of LLaMA-Factory's "llamafactory" logger: its lines reach stderr and, under the web
    UI, the LlamaBoard log box (LogCallback attaches its file handler to that logger only)."""
    from llamafactory.extras import logging as lf_logging

    return lf_logging.get_logger("llamafactory.mmoa.mappo")
