"""``mmoa-cli train CONFIG [key=value ...]``: our stages ``mappo`` and ``retriever_rl``,
LLaMA-Factory for the rest.

For every stage other than ``mappo`` and ``retriever_rl`` the command hands its arguments,
unchanged, to ``llamafactory-cli train``'s own entry point in this process, so SFT, DPO,
reward modelling and the rest behave exactly as with ``llamafactory-cli`` (including its
torchrun re-launch on several GPUs and its ``key=value`` overrides), except that SIGINT or
SIGTERM saves the last completed step before the process ends (:mod:`mmoa.train.save_on_stop`).
Only the stage is read here, with the same OmegaConf semantics LLaMA-Factory uses.

Before either runs, :func:`mmoa.preflight.check_train_config` checks that the model folder and
the datasets exist, so a missing one is a two-line message naming the command that makes it,
not a hub-lookup traceback from deep inside transformers. A MAPPO run under DeepSpeed first
clears build locks that an interrupted op build left (:mod:`mmoa.train.extension_locks`). A run
that would start from step 0 beside an earlier run's checkpoints says so and names the override
that continues it (:mod:`mmoa.train.restart_check`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

# read_train_config and TrainConfigError live below the stages (joint MAPPO reads a second
# config); imported here too, where the command line and the web UI have always found them
from mmoa.train.config_file import TrainConfigError, read_train_config

MAPPO_STAGE = "mappo"
#: The query encoder's RL stage (HARR; ``mmoa.train.retriever_rl``): one process, our own loop.
RETRIEVER_RL_STAGE = "retriever_rl"


def run_train(argv: Sequence[str]) -> int:
    """Check what the config needs, then run stage ``mappo`` here or hand over to LLaMA-Factory.

    A missing model, dataset (or, for ``mappo``, server) raises :class:`PreflightError`; for
    ``mappo`` it is reported like the stage's other start-up errors instead (``[mappo] error:``
    on stderr, which the web UI shows, and exit code 1).
    """
    from mmoa.preflight import PreflightError, check_train_config

    config = read_train_config(argv)
    stage = config.get("stage", "sft")
    check_stage(stage)
    if stage == MAPPO_STAGE and config.get("deepspeed") and "LOCAL_RANK" not in os.environ:
        # once, before torchrun starts the ranks: else DeepSpeed may wait forever for its build
        from mmoa.train.extension_locks import clear_stale_extension_locks

        clear_stale_extension_locks()
    try:
        check_train_config(config)
    except PreflightError as err:
        if stage not in (MAPPO_STAGE, RETRIEVER_RL_STAGE):
            raise
        print(err.report(f"[{stage}] error:"), file=sys.stderr, flush=True)
        return 1
    if stage == MAPPO_STAGE and _wants_torchrun():
        return _relaunch_with_torchrun(argv)
    from mmoa.precision import train_config_warning, training_on_gpu
    from mmoa.train.restart_check import restart_warning

    warnings = (train_config_warning(config, training_on_gpu(config)), restart_warning(config))
    for warning in warnings:
        if warning is not None and os.environ.get("LOCAL_RANK", "0") == "0":  # once, not per rank
            print(f"[{stage}] warning: {warning}", file=sys.stderr, flush=True)
    from mmoa.console import routed_library_logs

    with routed_library_logs(config.get("output_dir")):
        if stage == MAPPO_STAGE:
            from mmoa.train.mappo.workflow import run_mappo_from_config

            return run_mappo_from_config(config)
        if stage == RETRIEVER_RL_STAGE:
            from mmoa.train.retriever_rl.workflow import run_retriever_rl_from_config

            return run_retriever_rl_from_config(config)
        from mmoa.train.save_on_stop import llamafactory_saves_on_stop

        with llamafactory_saves_on_stop():  # SIGINT / SIGTERM keep the last completed step
            return run_llamafactory("train", argv)


#: LLaMA-Factory's stages, where its ``FinetuningArguments`` cannot be read.
LLAMAFACTORY_STAGES: tuple[str, ...] = ("pt", "sft", "rm", "ppo", "dpo", "kto")


def llamafactory_stages() -> tuple[str, ...]:
    """The values of LLaMA-Factory's ``stage`` key (its ``FinetuningArguments.stage``)."""
    import typing

    try:
        from llamafactory.hparams import FinetuningArguments

        stages = typing.get_args(typing.get_type_hints(FinetuningArguments)["stage"])
    except Exception:  # another llamafactory layout: the 0.9.5 list
        return LLAMAFACTORY_STAGES
    return tuple(s for s in stages if isinstance(s, str)) or LLAMAFACTORY_STAGES


def check_stage(stage: Any) -> None:
    """An unknown ``stage`` (``retriever-rl``) is a :class:`TrainConfigError` naming the
    closest stage, instead of falling through to LLaMA-Factory's parser and its traceback."""
    import difflib

    if stage in (MAPPO_STAGE, RETRIEVER_RL_STAGE):
        return
    known = (*llamafactory_stages(), MAPPO_STAGE, RETRIEVER_RL_STAGE)
    if stage in known:
        return
    typed = str(stage).strip().lower().replace("-", "_").replace(" ", "_")
    close = [typed] if typed in known else difflib.get_close_matches(typed, known, n=1,
                                                                      cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise TrainConfigError(f"unknown stage {stage!r}{hint} (stages: {', '.join(known)})")


def _wants_torchrun() -> bool:
    """LLaMA-Factory's rule: ``FORCE_TORCHRUN=1`` or more than one GPU, unless already launched."""
    if "LOCAL_RANK" in os.environ:
        return False
    if os.environ.get("FORCE_TORCHRUN", "0").lower() in ("1", "true", "y"):
        return True
    import torch

    return torch.cuda.device_count() > 1


def _relaunch_with_torchrun(argv: Sequence[str]) -> int:
    """One process per GPU (``NPROC_PER_NODE``, default: all visible GPUs), each rolling out its
    own questions against the one retrieval server; gradients are reduced by DDP."""
    import torch

    nproc = os.environ.get("NPROC_PER_NODE") or str(max(torch.cuda.device_count(), 1))
    port = os.environ.get("MASTER_PORT") or str(_free_port())
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", os.environ.get("NNODES", "1"),
        "--node_rank", os.environ.get("NODE_RANK", "0"), "--nproc_per_node", nproc,
        "--master_addr", os.environ.get("MASTER_ADDR", "127.0.0.1"), "--master_port", port,
        "-m", "mmoa.cli", "train", *argv,
    ]
    print(f"[mmoa] launching {nproc} MAPPO processes with torchrun", flush=True)
    return subprocess.run(command, check=False).returncode


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_llamafactory(command: str, argv: Sequence[str]) -> int:
    """``llamafactory-cli COMMAND ARGV`` in this process (it reads ``sys.argv`` itself)."""
    from llamafactory.cli import main as llamafactory_main

    saved = sys.argv
    sys.argv = ["llamafactory-cli", command, *argv]
    try:
        llamafactory_main()
    finally:
        sys.argv = saved
    return 0
