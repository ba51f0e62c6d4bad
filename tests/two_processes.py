"""Two spawned CPU processes in one gloo group, for the learner's distributed tests.

The tests of what DDP processes must agree on (a skipped update, the KL controller, the token
mean of ``loss_scope``) each start one pair of workers that runs all their scenarios (spawning
costs more than the scenarios) and save each scenario's result per rank; this module is that
launcher, kept once. A worker that hangs in a collective is caught by the process group's
timeout and by the join's deadline, so a regression fails instead of blocking the suite.
"""

from __future__ import annotations

import datetime
import os
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.retrieval_fixtures import free_port

WORLD = 2
#: Seconds a collective may wait before gloo gives up (a hang becomes an error).
COLLECTIVE_TIMEOUT_S = 60
#: The vocabulary and end token of :func:`ddp_tiny_policy`.
VOCAB, EOS = 16, 1

#: ``scenario(rank) -> result``: what one process computes; saved as ``NAME.rankR.pt``.
Scenario = Callable[[int], Any]


def ddp_tiny_policy() -> torch.nn.Module:
    """A one-layer Llama of 16 tokens, seeded: the same initial weights on every process, as
    DDP requires."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=32, eos_token_id=EOS, pad_token_id=0)
    return LlamaForCausalLM(config)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """The sum over the processes of ``tensor`` (a copy: the learner's ``all_reduce``)."""
    tensor = tensor.clone()
    dist.all_reduce(tensor)
    return tensor


def _worker(rank: int, port: int, out_dir: str, scenarios: dict[str, Scenario]) -> None:
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        dist.init_process_group("gloo", rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        for name, scenario in scenarios.items():
            torch.save(scenario(rank), Path(out_dir) / f"{name}.rank{rank}.pt")
            dist.barrier()
        dist.destroy_process_group()
    except Exception:  # the parent reads the traceback from the file
        (Path(out_dir) / f"rank{rank}.error").write_text(traceback.format_exc())
        raise


def run_on_two_processes(scenarios: dict[str, Scenario],
                         out: Path) -> dict[str, list[Any]]:
    """Every scenario on both processes, in order, a barrier after each: ``{name: [rank 0,
    rank 1]}``. The scenarios must be module-level functions (the spawned workers import them
    by name). A worker's exception fails the caller with the workers' tracebacks. A worker
    killed by a signal (once in CI: gloo's C++ side aborted with "terminate called without an
    active exception", a crash of the launcher, not of the code under test) is retried once on
    a new port; a second death fails."""
    try:
        return _launch(scenarios, out / "try1")
    except mp.ProcessExitedException as err:
        if err.signal_name is None:
            raise
        print(f"[two_processes] {err}: retrying once on a new port")
        return _launch(scenarios, out / "try2")


def _launch(scenarios: dict[str, Scenario], out: Path) -> dict[str, list[Any]]:
    out.mkdir(parents=True)
    context = mp.start_processes(_worker, args=(free_port(), str(out), scenarios),
                                 nprocs=WORLD, join=False, start_method="spawn")
    deadline = COLLECTIVE_TIMEOUT_S * 4
    start = time.monotonic()
    try:
        while not context.join(timeout=5):
            if time.monotonic() - start > deadline:
                raise AssertionError(f"the two processes did not finish in {deadline} s "
                                     "(a collective is waiting)")
    except mp.ProcessRaisedException as err:
        errors = [p.read_text() for p in sorted(out.glob("rank*.error"))]
        raise AssertionError("\n".join(errors) or str(err)) from err
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return _results(out, scenarios)


def _results(out: Path, names: Iterable[str]) -> dict[str, list[Any]]:
    return {name: [torch.load(out / f"{name}.rank{rank}.pt", weights_only=False)
                   for rank in range(WORLD)] for name in names}
