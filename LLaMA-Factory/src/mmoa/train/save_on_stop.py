"""LLaMA-Factory's stages (SFT, pre-training, DPO, ...) save their last completed step when
SIGINT or SIGTERM stops them, as our own loops do.

The Hugging Face Trainer under ``llamafactory-cli train`` dies where a signal finds it: every
step since the last ``save_steps`` checkpoint is lost, and a warm start cut by a job's time
limit or a session's end loses up to ``save_steps`` steps (20 steps of 85 s, half an hour, on 2
CPU cores). With :class:`SaveOnStop` the first signal lets the optimiser step under way finish,
saves it as the Trainer's own ``checkpoint-N`` (weights, optimiser, scheduler and random
state: ``resume_from_checkpoint`` continues exactly from it) and ends the process with
128 + signal before LLaMA-Factory writes its final model, so an interrupted run never looks
finished. A second signal ends the process at once, as it would unhandled.

SIGABRT, LlamaBoard's Abort, is left to LLaMA-Factory (its ``LogCallback`` stops the run and
writes the final model, as LlamaBoard's users expect). The callback reaches the Trainer through
``run_exp``'s ``callbacks`` argument, which ``llamafactory-cli``'s launcher leaves empty; runs
under torchrun (several GPUs) go through LLaMA-Factory's own entry point in each rank and
keep its behaviour.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator
from typing import Any

from transformers import TrainerCallback

from mmoa.train.stop import StopRequest, install_stop_handlers, restore_handlers

#: The signals after which the last completed step is saved.
SAVE_ON = (signal.SIGINT, signal.SIGTERM)


class SaveOnStop(TrainerCallback):
    """After the step under way: save it as ``checkpoint-N``, then exit with 128 + signal."""

    def __init__(self, stop: StopRequest) -> None:
        self.stop = stop

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.stop.requested:  # stopped while the data and the model were loading
            raise SystemExit(128 + int(self.stop.signum))
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.stop.requested:
            control.should_save = True  # whatever save_strategy says: this step is kept
            control.should_training_stop = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.stop.requested and control.should_training_stop:
            name = signal.Signals(self.stop.signum).name
            print(f"[train] {name} received: stopped after step {state.global_step} of "
                  f"{state.max_steps}, saved in {args.output_dir}/checkpoint-{state.global_step};"
                  f" the same command with resume_from_checkpoint= that folder continues from "
                  f"it", file=sys.stderr, flush=True)
            raise SystemExit(128 + int(self.stop.signum))
        return control


@contextlib.contextmanager
def llamafactory_saves_on_stop() -> Iterator[None]:
    """While inside: SIGINT / SIGTERM go to a :class:`SaveOnStop` that every in-process
    ``run_exp`` gets among its callbacks."""
    import llamafactory.train.tuner as tuner

    stop = StopRequest()
    run_exp = tuner.run_exp

    def run_exp_saving_on_stop(args: dict[str, Any] | None = None,
                               callbacks: list[Any] | None = None) -> None:
        run_exp(args, [*(callbacks or []), SaveOnStop(stop)])

    previous = install_stop_handlers(stop, SAVE_ON)
    tuner.run_exp = run_exp_saving_on_stop
    try:
        yield
    finally:
        tuner.run_exp = run_exp
        restore_handlers(previous)
