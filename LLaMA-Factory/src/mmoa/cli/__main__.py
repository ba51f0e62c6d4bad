"""``python -m mmoa.cli``: what the launcher, torchrun and the web UI run (``mmoa-cli`` itself
may not be on their PATH)."""

from __future__ import annotations

import os
import sys

from mmoa.cli import main


def _exit_torchrun_rank(code: int) -> None:
    """End a torchrun rank (``python -m mmoa.cli train`` under torchrun) without interpreter
    teardown: its work is written and its process group left, yet the destructors of the
    communication threads (DeepSpeed's and gloo's on CPU) now and then abort a finished rank
    (``terminate called without an active exception``), which fails the whole run."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_code = main()
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # set by torchrun in every rank it starts
        _exit_torchrun_rank(exit_code)
    sys.exit(exit_code)
