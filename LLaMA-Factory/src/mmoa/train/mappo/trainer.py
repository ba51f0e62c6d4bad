"""``MappoTrainer``: the MAPPO loop inside a ``transformers.Trainer`` subclass.

Subclassing ``Trainer`` gives us its accelerator (DDP), optimiser and LR scheduler, its
``TrainerState`` and its callback handler, so LLaMA-Factory's ``LogCallback`` writes
``trainer_log.jsonl`` (the web UI's progress bar), its SIGABRT stop button works and
``plot_loss`` draws our curves. The loop itself is ours (LLaMA-Factory's PPO stage cannot run
with the trl it installs):

    questions -> sampled QR -> retrieval -> Selector -> Generator  (one batched pipeline)
              -> rewards (shared answer F1 + per-agent penalties)
              -> PPO update of the shared policy and value head on the pooled agent samples

``mappo_pipeline`` names a registered pipeline (:mod:`mmoa.pipelines`) that does the first two
lines: its rollout and how its traces become samples. The paper's three agents are
:mod:`mmoa.pipelines.qr_s_g`; with ``search_agent`` (:mod:`mmoa.pipelines.search_agent`) or
``decision_agent`` (SmartRAG, :mod:`mmoa.pipelines.decision_agent`) each multi-turn trajectory
is one sample whose retrieved tokens are masked out of the update; everything else below holds
for every pipeline.

``mappo_algorithm`` names a registered algorithm (:mod:`mmoa.train.mappo.algorithms`), whose
properties decide what happens here, never its name: under a grouped one (``grpo``, ...) each
question is rolled out ``mappo_group_size`` times in the same batched pipeline and every agent
sample gets its advantage relative to its question's group (:mod:`mmoa.train.mappo.grpo`);
without ``value_head`` the update has no value head (none is created or saved).

Checkpoints hold everything needed to continue bit-for-bit: weights (adapter or full), value
head, optimiser, scheduler, KL controller, RNG states and the data position, and last a
manifest of every file's sha256 (``checkpoint_files``), checked before a resume.

Behaviour policy. Rollouts sample at ``mappo_temperature`` with ``mappo_top_p`` and, for the
Selector, a grammar mask. Old, new and reference log-probs are all taken from
``softmax(logits / mappo_temperature)`` over the whole vocabulary (as current TRL does): the
temperature is part of the optimised policy, so the first epoch's ratio is that of the sampler.
``mappo_agent_temperature`` gives some agents their own temperature, for their sampling and
their rows' scoring alike.
By default top-p and the grammar mask only narrow the sampler's support: the policy that is
optimised, and kept near the reference by the KL term, is the model's own tempered
distribution, and the gradient on a sampled Selector token also lowers the probability of
tokens the grammar forbids (which greedy evaluation, also masked, never emits). The k1 KL
estimate on masked tokens is then biased: a policy that moves mass onto forbidden tokens gets
a negative "KL" on the tokens it may write, which the KL reward pays as a bonus.
``mappo_masked_scoring`` scores the Selector's tokens over the ids the grammar allowed at
each position (recorded at rollout): its log-probs, KL and entropy are then the masked
distribution's, the one it sampled from and is evaluated with. ``mappo_log_behaviour_ratio``
logs the scored over the sampled probability of every token (1 where nothing was cut).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from transformers import Trainer

from mmoa.agent_adapters import (
    MARKER_FILE,
    ZERO3_REFUSAL,
    agent_adapters,
    load_agent_weights,
    write_marker,
)
from mmoa.agents.render import PromptRenderer
from mmoa.data.records import QARecord
from mmoa.fileio import atomic_dir, atomic_write_json
from mmoa.pipelines import Timings
from mmoa.precision import device_type_of
from mmoa.train.finite import describe, nonfinite_parameters
from mmoa.train.mappo.agent_stats import DRIFT_FLAGS_KEY, DriftMonitor
from mmoa.train.mappo.args import MappoArguments
from mmoa.train.mappo.checkpoint_files import (
    CHECKPOINT_PREFIX,
    CheckpointError,
    rotate_checkpoints,
    write_manifest,
)
from mmoa.train.mappo.learner import (
    PolicyWithValue,
    PPOConfig,
    PPOLearner,
    behaviour_ratio_stats,
    nothing_to_learn,
    rollout_diagnostics,
    scoring_batch_size,
    tis_stats,
)
from mmoa.train.mappo.log import in_web_ui, mappo_logger, step_summary
from mmoa.train.mappo.rollout_weights import RolloutWeights, rollout_weights_dtype
from mmoa.train.mappo.samples import Sample
from mmoa.train.progress import (
    FAILED,
    FINISHED,
    PROGRESS_FILE,
    STOPPED,
    ConsoleLine,
    RolloutCounter,
    StepProgress,
    WatchedPolicy,
)
from mmoa.train.stop import StepAbandoned, StopRequest, install_stop_handlers, restore_handlers

if TYPE_CHECKING:
    from mmoa.agents.pipeline import DocumentRetriever

STATE_FILE = "mappo_state.json"
RNG_FILE = "rng_state.pth"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
#: Under DeepSpeed: the engine's checkpoint (weights and partitioned optimiser state).
DEEPSPEED_DIR = "deepspeed"
DEEPSPEED_TAG = "mappo"


class TrainingStopped(RuntimeError):
    """The run stopped early for a reason the user must see (retriever down, NaN losses)."""


class TrainingInterrupted(TrainingStopped):
    """SIGINT, SIGTERM or SIGABRT (the web UI's Abort): the run stopped within one micro-step
    and the last completed step ``step`` is saved in ``checkpoint`` (``None``: no step had
    completed, nothing was saved). ``note`` says what became of the step under way. The run is
    not complete, so no final model is written and the process exits with 128 + the signal's
    number."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None, note: str = "") -> None:
        name = signal.Signals(signum).name
        if checkpoint is None:
            text = (f"{name} received during step {step + 1}: stopped before any step "
                    "completed, so nothing was saved")
        else:
            text = (f"{name} received: stopped after step {step}, saved in {checkpoint}; "
                    f"resume with resume_from_checkpoint={checkpoint}")
        super().__init__(f"{text} ({note})" if note else text)
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint
        self.note = note
        self.exit_code = 128 + signum


class MappoTrainer(Trainer):
    """Jointly optimises the agents named in ``mappo_args.mappo_agents``."""

    def __init__(
        self,
        model: PolicyWithValue,
        tokenizer: Any,
        template: str,
        records: Sequence[QARecord],
        retriever: DocumentRetriever,
        args: Any,
        mappo_args: MappoArguments,
        ppo_epochs: int,
        kl_target: float,
        whiten_rewards: bool = False,
        callbacks: list[Any] | None = None,
    ) -> None:
        super().__init__(model=model, args=args, processing_class=tokenizer, callbacks=callbacks)
        if not records:
            raise ValueError("the MAPPO dataset is empty")
        self.records = list(records)
        self.retriever = retriever
        self.mappo_args = mappo_args
        self.renderer = PromptRenderer(tokenizer, template)
        self.questions_per_step = mappo_args.mappo_questions_per_rollout or max(
            1, args.per_device_train_batch_size * args.gradient_accumulation_steps
            // mappo_args.rollouts_per_question)
        if mappo_args.algorithm.grouped and mappo_args.group_filter == "skip" \
                and args.world_size > 1:
            raise ValueError(
                "mappo_grpo_filter: skip leaves a different number of samples on each process, "
                "and DDP/DeepSpeed need the same number of updates on every one: use "
                "mappo_grpo_filter: none with several processes"
                + (f" (mappo_algorithm: {mappo_args.mappo_algorithm} always skips: its dynamic "
                   "sampling; train it on one process)"
                   if mappo_args.algorithm.dynamic_sampling else ""))
        global_batch = self.questions_per_step * args.world_size
        if args.max_steps and args.max_steps > 0:
            self.total_steps = int(args.max_steps)
        else:
            self.total_steps = max(1, math.ceil(args.num_train_epochs * len(self.records)
                                                / global_batch))
        self.steps_per_epoch = max(1, math.ceil(len(self.records) / global_batch))
        self.create_optimizer_and_scheduler(num_training_steps=self.total_steps)
        self.ppo_config = PPOConfig(
            ppo_epochs=ppo_epochs,
            mini_batch_size=args.per_device_train_batch_size,
            gradient_accumulation_steps=args.gradient_accumulation_steps,
            forward_batch_size=scoring_batch_size(mappo_args.mappo_forward_batch_size,
                                                  args.per_device_train_batch_size),
            cliprange=mappo_args.mappo_cliprange,
            cliprange_value=mappo_args.mappo_cliprange_value,
            vf_coef=mappo_args.mappo_vf_coef,
            gamma=mappo_args.mappo_gamma,
            lam=mappo_args.mappo_lam,
            whiten_advantages=mappo_args.mappo_whiten_advantages,
            whiten_per_agent=mappo_args.mappo_whiten_per_agent,
            whiten_rewards=whiten_rewards,
            max_grad_norm=args.max_grad_norm,
            adaptive_kl=mappo_args.mappo_adaptive_kl,
            init_kl_coef=mappo_args.mappo_init_kl_coef,
            kl_target=kl_target,
            kl_horizon=mappo_args.mappo_kl_horizon,
            min_kl_coef=mappo_args.mappo_min_kl_coef,
            agent_kl_scales=mappo_args.agent_kl_scales,
            kl_shape=mappo_args.mappo_kl_reward,
            kl_estimator=mappo_args.mappo_kl_estimator,
            ratio_threshold=mappo_args.mappo_ratio_threshold,
            algorithm=mappo_args.mappo_algorithm,
            loss_averaging=mappo_args.mappo_loss_averaging,
            kl_loss_coef=mappo_args.mappo_kl_loss_coef,
            cliprange_high=mappo_args.mappo_cliprange_high,
            loss_scope=mappo_args.mappo_loss_scope,
            norm_length=mappo_args.loss_norm_length,
            tis_cap=mappo_args.mappo_tis_cap,
        )
        if self.is_world_process_zero():  # which clip ranges are the paper's, which the config's
            for note in mappo_args.algorithm.clip_notes(mappo_args.mappo_cliprange,
                                                        mappo_args.mappo_cliprange_high):
                mappo_logger().info(f"[mappo] {note}")
            for warning in mappo_args.startup_warnings():
                mappo_logger().warning(f"[mappo] {warning}")
        #: Objects whose state travels in every checkpoint (``save(folder)`` into the one
        #: being written, ``load(folder)`` when resuming; their ``name`` is their folder),
        #: e.g. the joint option's query encoder (:mod:`.joint_retriever`).
        self.checkpoint_companions: list[Any] = []
        self._stop = StopRequest()
        #: Progress inside the step under way (:mod:`mmoa.train.progress`); set by
        #: :meth:`mappo_train`, ``None`` outside it (nothing is watched then).
        self._progress: StepProgress | None = None
        self._stop_noticed = False
        self._nonfinite_in_a_row = 0
        #: Warns when an agent's statistic drifts from its first step's (a Selector collapse).
        self.drift = DriftMonitor()
        #: The step the last checkpoint of this run holds: the last step can ask for one
        #: several times (save_steps, the end of training, a stop signal).
        self._saved_step: int | None = None
        #: The model the rollouts generate with (:mod:`.rollout_weights`): made at the first
        #: rollout, refreshed from the policy before each one.
        self._rollout_weights: RolloutWeights | None = None

    # -- data order ----------------------------------------------------------------------------

    def step_records(self, step: int) -> list[QARecord]:
        """This process's questions of global step ``step`` (a pure function of the seed)."""
        per_step = self.questions_per_step * self.args.world_size
        start = step * per_step
        out = []
        for position in range(start, start + per_step):
            epoch, offset = divmod(position, len(self.records))
            order = self._epoch_order(epoch)
            out.append(self.records[order[offset]])
        rank = self.args.process_index
        return out[rank * self.questions_per_step: (rank + 1) * self.questions_per_step]

    def _epoch_order(self, epoch: int) -> list[int]:
        cache = getattr(self, "_order_cache", None)
        if cache is None or cache[0] != epoch:
            generator = torch.Generator().manual_seed(self.args.seed * 1000 + epoch)
            cache = (epoch, torch.randperm(len(self.records), generator=generator).tolist())
            self._order_cache = cache
        return cache[1]

    # -- rollout and rewards -------------------------------------------------------------------

    def rollout(self, records: Sequence[QARecord]) -> tuple[list[Any], Timings]:
        """The step's traces (:class:`~mmoa.agents.pipeline.Trace`, or ``SearchTrajectory``
        under the multi-turn pipelines), ``rollouts_per_question`` per record (a record's next
        to each other), and the seconds spent per stage."""
        # Under ZeRO-3 every process holds a slice of the weights: generation runs on the
        # gathered full weights (trl's helper), as in trl's own online trainers.
        from trl.models.utils import unwrap_model_for_generation

        with unwrap_model_for_generation(self.model_wrapped, self.accelerator) as unwrapped:
            return self._rollout(unwrapped.policy, records)

    def rollout_policy(self, policy: Any) -> Any:
        """The model a rollout generates with: ``policy`` itself, or its copy in the compute
        dtype, up to date with its weights (:mod:`.rollout_weights`: on a GPU under bf16
        autocast, or for the static KV cache)."""
        autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(
            str(self.accelerator.mixed_precision))
        dtype = None if self.zero_stage() == 3 else rollout_weights_dtype(
            policy.get_input_embeddings().weight.dtype, autocast,
            device_type_of(policy), self.mappo_args.mappo_generation_cache)
        if self._rollout_weights is None or self._rollout_weights.dtype != dtype:
            self._rollout_weights = RolloutWeights(dtype)
        return self._rollout_weights.policy_for_rollout(policy)

    def _rollout(self, policy: Any, records: Sequence[QARecord]) -> tuple[list[Any], Timings]:
        policy.eval()
        policy = self.rollout_policy(policy)
        pipeline = self.mappo_args.pipeline
        if self._progress is not None:
            # progress and the stop request between generate calls, for every pipeline alike
            counter = RolloutCounter(self._progress,
                                     pipeline.rollout_stages(self.mappo_args, len(records)))
            policy = WatchedPolicy(policy, self._before_generate, counter.add)
        batch = pipeline.rollout(
            policy, self.processing_class, self.renderer, self.retriever, self.mappo_args,
            [r.question for r in records])
        return batch.traces, batch.timings

    def _before_generate(self) -> None:
        """Ahead of each generate call of a rollout: abandon the step when a stop was asked
        for. One process only: the processes of a distributed run decide together after the
        rollout (a ZeRO-3 generate call is collective, one process cannot leave alone)."""
        if self.args.world_size <= 1 and self._stop_requested():
            raise StepAbandoned("stop requested during the rollout")

    def make_samples(self, records: Sequence[QARecord], traces: Sequence[Any]
                     ) -> tuple[list[Sample], dict[str, float]]:
        """Scores every trace and makes the step's samples, as the pipeline says
        (:meth:`mmoa.pipelines.base.Pipeline.samples`): under ppo with their scores (GAE turns
        them into advantages), under a grouped algorithm (grpo, ...) with group advantages."""
        return self.mappo_args.pipeline.samples(records, traces, self.mappo_args)

    # -- the loop ------------------------------------------------------------------------------

    def zero_stage(self) -> int | None:
        """The DeepSpeed ZeRO stage of this run, ``None`` without DeepSpeed."""
        if not self.is_deepspeed_enabled:
            return None
        return int(self.accelerator.state.deepspeed_plugin.zero_stage)

    def _prepare_deepspeed(self) -> tuple[Any, dict[str, Any]]:
        """The DeepSpeed engine and how the learner drives it.

        Our optimiser and LR schedule come from the llamafactory keys, as in DDP runs; the
        engine wraps that optimiser (ZeRO partitions its state), clips with ``max_grad_norm``
        (``gradient_clipping: auto``) and steps at each accumulation boundary.
        """
        plugin = self.accelerator.state.deepspeed_plugin
        for section in ("optimizer", "scheduler"):
            if section in plugin.deepspeed_config:
                raise ValueError(
                    f"the mappo stage builds its optimiser and LR schedule from the llamafactory "
                    f"keys: remove the `{section}` section from the DeepSpeed config "
                    f"{self.args.deepspeed}")
        plugin.hf_ds_config.trainer_config_finalize(self.args, self.model, self.total_steps)
        if self.zero_stage() == 3 and self.mappo_args.mappo_adapter_per_agent:
            raise ValueError(ZERO3_REFUSAL)  # checked before the model loads, too
        engine, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)
        unwrapped: PolicyWithValue = self.accelerator.unwrap_model(engine)
        if self.zero_stage() == 3:
            # every forward pass all-gathers the partitioned weights: the processes must make
            # the same passes, whatever the lengths of their own samples
            unwrapped.group_by_length = False
        if self.zero_stage() == 3 and unwrapped.reference_model is not None:
            # A frozen full copy was loaded partitioned (zero.Init): it needs an engine too.
            from trl.models.utils import prepare_deepspeed

            unwrapped.set_reference(prepare_deepspeed(unwrapped.reference_model,
                                                      self.accelerator))

        def backward(loss: torch.Tensor, boundary: bool = True) -> None:
            engine.set_gradient_accumulation_boundary(boundary)
            engine.backward(loss, scale_wrt_gas=False)  # the learner already averages a group
            if boundary:
                # no_grad: with the gloo backend (CPU) ZeRO's all-gather writes into views of
                # a flat buffer, which autograd refuses while grad mode is on.
                with torch.no_grad():
                    engine.step()

        def grad_norm(_parameters: Any, _max_norm: float) -> float | None:
            norm = engine.get_global_grad_norm()
            return None if norm is None else float(norm)

        return engine, {"backward": backward, "clip_grad": grad_norm, "engine_steps": True}

    def mappo_train(self, resume_from_checkpoint: str | None = None) -> None:
        if self.is_deepspeed_enabled:
            model, drive = self._prepare_deepspeed()
        else:
            model = self.accelerator.prepare_model(self.model)
            drive = {"backward": self.accelerator.backward}
            if self.args.world_size > 1:
                drive["no_sync"] = self.accelerator.no_sync
        if self.args.world_size > 1:
            drive["all_reduce"] = self._all_reduce_sum
        self.model_wrapped = model
        learner = PPOLearner(
            model, self.optimizer, self.ppo_config, self._pad_id(),
            unwrap=self.accelerator.unwrap_model,
            generator=torch.Generator().manual_seed(self.args.seed),
            **drive,
        )
        learner.on_progress = self._on_learner_progress
        learner.stop_requested = self._stop_requested
        start_step = 0
        if resume_from_checkpoint:
            start_step = self.load_mappo_checkpoint(resume_from_checkpoint, learner)
            if Path(resume_from_checkpoint).resolve().parent == \
                    Path(self.args.output_dir).resolve():
                # a stop before the next step completes need not write it again
                self._saved_step = start_step
            # baselines of the run's first step; what was warned about stays warned
            self.drift.replay(self.state.log_history)
        self.state.max_steps = self.total_steps
        self.state.num_train_epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        self.state.logging_steps = self.args.logging_steps
        self.state.save_steps = self.args.save_steps
        self.state.is_local_process_zero = self.is_local_process_zero()
        self.state.is_world_process_zero = self.is_world_process_zero()
        self.control = self.callback_handler.on_train_begin(self.args, self.state, self.control)
        self._progress = self._make_progress()
        # SIGABRT is LlamaBoard's Abort (LogCallback's own handler would stop only after the
        # whole step, and then write a final model as if the run had ended)
        previous = install_stop_handlers(self._stop)
        interrupted: TrainingInterrupted | None = None
        # Progress: Trainer's ProgressCallback draws the bar from on_step_end / on_log; inside
        # a step, self._progress (step_progress.json and the bar's postfix).
        try:
            for step in range(start_step, self.total_steps):
                self._progress.begin_step(step + 1)
                try:
                    logs = self._train_step(step, learner)
                except StepAbandoned:
                    # Nothing of the step changed a weight: it is discarded (RNG put back by
                    # _train_step) and the last completed step is saved.
                    interrupted = self._interrupted(learner, f"step {step + 1} was under way "
                                                    "and is discarded: a resume runs it again")
                    break
                self.state.global_step = step + 1
                self.state.epoch = (step + 1) / self.steps_per_epoch
                self._progress.end_step()
                self.control = self.callback_handler.on_step_end(self.args, self.state,
                                                                 self.control)
                if (step + 1) % self.args.logging_steps == 0 or step == 0 \
                        or step + 1 == self.total_steps:
                    self.log(logs)
                    if in_web_ui() and self.is_world_process_zero():
                        mappo_logger().info(step_summary(step + 1, self.total_steps, logs))
                should_save = self.args.save_steps and (step + 1) % self.args.save_steps == 0
                if should_save:
                    self.save_mappo_checkpoint(learner)
                if self._stop_requested():
                    note = ("its update stopped early: only the optimiser steps made before the "
                            "stop request were applied") if logs.get("stopped_early") else ""
                    interrupted = self._interrupted(learner, note)
                    break
                if self.control.should_training_stop:  # max_steps
                    checkpoint = self.save_mappo_checkpoint(learner)
                    self._progress.finish(FINISHED, f"finished at step {step + 1}/"
                                          f"{self.total_steps}; checkpoint {checkpoint}",
                                          checkpoint)
                    break
            else:  # nothing left to run (resumed from the last step's checkpoint)
                self._progress.finish(FINISHED, f"finished at step {self.state.global_step}/"
                                      f"{self.total_steps}")
        except TrainingStopped as err:
            self._progress.finish(FAILED, str(err))
            raise
        except Exception as err:
            self._progress.finish(FAILED, f"{type(err).__name__}: {err}")
            raise
        finally:
            restore_handlers(previous)
        if interrupted is not None:
            self._progress.finish(STOPPED, str(interrupted), interrupted.checkpoint,
                                  interrupted.note)
        self.control = self.callback_handler.on_train_end(self.args, self.state, self.control)
        if interrupted is not None:
            raise interrupted

    def _interrupted(self, learner: PPOLearner, note: str) -> TrainingInterrupted:
        """Saves the last completed step (none when no step completed) and says so."""
        assert self._stop.signum is not None or self.args.world_size > 1
        checkpoint = self.save_mappo_checkpoint(learner) if self.state.global_step > 0 \
            else None
        # another process's signal stopped this one: name the signal as SIGTERM
        signum = self._stop.signum if self._stop.signum is not None else int(signal.SIGTERM)
        return TrainingInterrupted(signum, self.state.global_step, checkpoint, note)

    # -- progress and the stop request ---------------------------------------------------------

    def _make_progress(self) -> StepProgress:
        """``step_progress.json`` in the output folder (main process only) and the postfix of
        the step bar (or, under the web UI and without a bar, a log line every 30 s)."""
        main = self.is_world_process_zero()
        path = Path(self.args.output_dir) / PROGRESS_FILE if main else None
        console = None
        if main:
            def bar() -> Any:
                if in_web_ui():  # LlamaBoard's bar reads step_progress.json instead
                    return None
                from transformers.trainer_callback import ProgressCallback

                for callback in self.callback_handler.callbacks:
                    if isinstance(callback, ProgressCallback):
                        return callback.training_bar
                return None

            console = ConsoleLine(bar, mappo_logger().info)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        return StepProgress(path, self.total_steps, console=console)

    def _on_learner_progress(self, phase: str, done: int, total: int) -> None:
        if self._progress is None:
            return
        if self._progress.phase != phase:
            self._progress.begin_phase(phase, total)
        self._progress.advance(done)

    def _stop_requested(self) -> bool:
        """Whether a stop was asked for: on this process, or with several processes on any
        (an agreed answer: every process must call it at the same points)."""
        requested = self._any_process(self._stop.requested)
        if requested and not self._stop_noticed:
            self._stop_noticed = True
            if self._progress is not None:
                self._progress.stopping("stop requested: stopping after the current micro-step "
                                        "with a checkpoint of the last completed step")
        return requested

    def _train_step(self, step: int, learner: PPOLearner) -> dict[str, float]:
        records = self.step_records(step)
        # The rollout draws random numbers before retrieval can fail or a stop is noticed; a
        # failure or a discarded step saves the last completed step as it was when this step
        # began, so that a resume is exact.
        rng_at_start = self._rng_state(learner)
        try:
            return self._run_step(step, learner, records, rng_at_start)
        except StepAbandoned:
            self._set_rng_state(rng_at_start, learner)
            self.optimizer.zero_grad(set_to_none=True)
            raise

    def _run_step(self, step: int, learner: PPOLearner, records: list[QARecord],
                  rng_at_start: dict[str, Any]) -> dict[str, float]:
        t0 = time.perf_counter()
        traces, timings = self._checked_rollout(step, learner, records, rng_at_start)
        t1 = time.perf_counter()
        samples, logs = self.make_samples(records, traces)
        if self.mappo_args.algorithm.dynamic_sampling:
            # the refill's rounds are part of the rollout
            samples, logs, timings = self._dynamic_sampling(step, learner, records, samples,
                                                            logs, timings, rng_at_start)
            t1 = time.perf_counter()
        if logs.get("grpo/skipped_samples") and not any(s.response_ids for s in samples):
            # mappo_grpo_filter: skip left nothing (one process only: refused with several)
            mappo_logger().warning(f"[mappo] step {step + 1}: every group's rewards were equal "
                                   "and no penalty fired: no update (mappo_grpo_filter: skip)")
            self._advance_lr_schedule()
            logs.update({"updates": 0.0, "kl_coef": float(learner.kl_ctl.value),
                         "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
                         **self._time_logs(timings, t0, t1, t1, time.perf_counter())})
            self._watch_drift(step, logs)
            return {k: round(v, 6) if isinstance(v, float) else v for k, v in logs.items()}
        if self._stop_requested():  # the rollout is complete, nothing is updated yet
            raise StepAbandoned("stop requested after the rollout")
        if self._any_process(not any(s.response_ids for s in samples)):
            # decided together: one process updating alone would wait in the all-reduce
            raise TrainingStopped(
                f"step {step + 1}: no agent wrote a single token on some process (every "
                "response is empty), so there is nothing to train on; check the chat template "
                "and the mappo_max_new_tokens_* keys")
        with self.accelerator.autocast():
            rollout = learner.prepare(samples)
        t2 = time.perf_counter()
        logs.update(behaviour_ratio_stats(rollout))
        logs.update(tis_stats(rollout))
        logs.update(rollout_diagnostics(rollout))
        stats = learner.update(rollout)
        self._check_weights_after_update(step)
        kl = learner.update_kl(rollout)
        reason = nothing_to_learn(rollout, stats)
        if reason is not None:
            mappo_logger().warning(f"[mappo] step {step + 1}: nothing to learn from ({reason})")
        self._advance_lr_schedule()
        t3 = time.perf_counter()
        if stats["skipped_updates"] >= stats["updates"]:
            self._nonfinite_in_a_row += 1
            mappo_logger().warning(f"[mappo] step {step + 1}: non-finite loss or gradient norm, "
                                   f"update skipped ({self._nonfinite_in_a_row} in a row, "
                                   f"mappo_max_nonfinite_steps "
                                   f"{self.mappo_args.mappo_max_nonfinite_steps})")
            if self._nonfinite_in_a_row >= self.mappo_args.mappo_max_nonfinite_steps:
                # This step ran (its rollout, scheduler and KL controller moved on; only the
                # update was skipped): saved as completed, so that the checkpoint's state is
                # the state of the step it is named after and a resume continues with the next.
                self.state.global_step = step + 1
                checkpoint = self.save_mappo_checkpoint(learner)
                raise TrainingStopped(
                    f"{self._nonfinite_in_a_row} steps in a row had non-finite losses or "
                    f"gradient norms; "
                    f"stopping after step {step + 1}, saved in {checkpoint} (lower the learning "
                    f"rate or check the data, then resume with "
                    f"resume_from_checkpoint={checkpoint})")
        else:
            if stats["skipped_updates"]:
                mappo_logger().warning(
                    f"[mappo] step {step + 1}: {stats['skipped_updates']:g} of "
                    f"{stats['updates']:g} updates skipped (non-finite loss or gradient norm)")
            self._nonfinite_in_a_row = 0
        losses = ("loss", "policy_loss", "entropy", "clipfrac", "approx_kl", "grad_norm")
        algorithm = self.mappo_args.algorithm
        if algorithm.value_head:
            losses += ("value_loss",)
        if algorithm.kl == "loss" and self.mappo_args.mappo_kl_loss_coef > 0:
            losses += ("kl_loss",)
        logs.update({key: stats.get(key, float("nan")) for key in losses})
        if kl is not None:  # a KL loss that is off: no reference log-probs are computed
            logs["kl"] = kl
        # per optimised agent: KL to the warm start and entropy, each over its own tokens
        logs.update(learner.agent_kl(rollout))
        logs.update({k: v for k, v in stats.items() if k.startswith("entropy/")})
        if stats.get("stopped_early"):  # a stop request cut the update short
            logs["stopped_early"] = 1.0
        logs.update({
            # updates left out for a non-finite loss or gradient norm (trainer_log.jsonl)
            "nonfinite_skips": stats["skipped_updates"],
            "nonfinite_in_a_row": float(self._nonfinite_in_a_row),
            "ratio_skips": stats.get("ratio_skips", 0.0),
            "dropped_empty": float(learner.dropped_empty),
            "kl_coef": float(learner.kl_ctl.value),
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),
            **self._time_logs(timings, t0, t1, t2, t3),
        })
        logs = self._mean_over_processes(logs)
        self._watch_drift(step, logs)
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in logs.items()}

    def _checked_rollout(self, step: int, learner: PPOLearner, records: Sequence[QARecord],
                         rng_at_start: dict[str, Any]) -> tuple[list[Any], Timings]:
        """:meth:`rollout`, with a retrieval failure on any process turned into a
        :class:`TrainingStopped` that names the checkpoint of the last completed step."""
        from mmoa.retrieval.client import RetrieverRequestError, RetrieverUnavailableError

        failure: Exception | None = None
        traces: list[Any] = []
        timings = Timings()
        try:
            # Mixed precision (bf16: true) covers the rollout too; accelerate only wraps the
            # prepared model's forward, while generation runs on the unwrapped policy.
            with self.accelerator.autocast():
                traces, timings = self.rollout(records)
        except (RetrieverUnavailableError, RetrieverRequestError) as err:
            failure = err
        # Decided together: a process that stopped alone would leave the others waiting in
        # the next collective (the update's gradient reduction, the checkpoint's barriers).
        if self._any_process(failure is not None):
            self._set_rng_state(rng_at_start, learner)
            checkpoint = None
            if self.state.global_step > 0:
                checkpoint = self.save_mappo_checkpoint(learner)
            raise TrainingStopped(retrieval_failure_message(
                step + 1, failure, self.mappo_args.mappo_retriever_retries, checkpoint,
                self.state.global_step)) from failure
        return traces, timings

    def refill_records(self, step: int, round_: int, count: int,
                       taken: Sequence[QARecord]) -> list[QARecord]:
        """``count`` questions for DAPO's refill round ``round_`` of step ``step``: a
        permutation of the dataset seeded by ``(seed, step, round)``, questions already rolled
        out this step (``taken``) left out while others remain. A pure function of the seed,
        the step and the round, like :meth:`step_records`, so a resumed run refills alike."""
        generator = torch.Generator().manual_seed(
            (self.args.seed * 1_000_003 + step * 1_009 + round_) % (2 ** 63))
        order = torch.randperm(len(self.records), generator=generator).tolist()
        used = {id(record) for record in taken}
        fresh = [self.records[i] for i in order if id(self.records[i]) not in used]
        picks = fresh[:count]
        while len(picks) < count:  # a dataset smaller than the step's demand: repeats
            picks.append(self.records[order[len(picks) % len(order)]])
        return picks

    def _dynamic_sampling(self, step: int, learner: PPOLearner, records: list[QARecord],
                          samples: list[Sample], logs: dict[str, float], timings: Timings,
                          rng_at_start: dict[str, Any]
                          ) -> tuple[list[Sample], dict[str, float], Timings]:
        """DAPO's dynamic sampling (Yu et al. 2025, section 3.2): the flat groups (every
        rollout rewarded alike) are already left out (``mappo_grpo_filter: skip``); while the
        step holds fewer groups with a signal than it has questions, and at most
        ``mappo_dapo_max_rounds`` times, roll out more questions (:meth:`refill_records`), as
        many as the groups still missing over the share of groups kept so far (at most one
        step's worth a round). Groups with a signal beyond the step's number are dropped whole
        (as verl trims to its batch); the penalised samples of flat groups stay (the skip
        filter's rule). Logs ``dapo/rounds``, ``dapo/groups_sampled``, ``dapo/groups_kept``
        and ``dapo/groups_dropped``; the other logs are the means over every round's
        rollouts. One process only (refused with several, as ``skip`` is)."""
        target = len(records)
        rounds = [(samples, logs, len(records))]
        taken = list(records)
        max_rounds = self.mappo_args.mappo_dapo_max_rounds
        extra = 0
        while (found := len(_all_signal_groups(rounds))) < target and extra < max_rounds:
            extra += 1
            rate = found / len(taken)
            count = self.questions_per_step if rate == 0 else min(
                self.questions_per_step, math.ceil((target - found) / rate))
            more = self.refill_records(step, extra, count, taken)
            taken += more
            traces, round_timings = self._checked_rollout(step, learner, more, rng_at_start)
            timings = _add_timings(timings, round_timings)
            round_samples, round_logs = self.make_samples(more, traces)
            rounds.append((round_samples, round_logs, len(more)))
        samples, used, dropped = _trim_to_groups(rounds, target)
        logs = _merge_round_logs(rounds)
        logs.update({"dapo/rounds": float(extra), "dapo/groups_sampled": float(len(taken)),
                     "dapo/groups_kept": float(used), "dapo/groups_dropped": float(dropped)})
        if used < target and self.is_world_process_zero():
            mappo_logger().warning(
                f"[mappo] step {step + 1}: dynamic sampling found {used} of {target} groups "
                f"with differing rewards in {len(taken)} questions ({extra} extra rounds, "
                f"mappo_dapo_max_rounds: {max_rounds}); updating on those")
        return samples, logs, timings

    def _watch_drift(self, step: int, logs: dict[str, float]) -> None:
        """Adds the step's drift flag count to ``logs`` (the mean over processes: the same on
        every one) and warns, from the main process only, about each statistic that crossed its
        threshold for the first time."""
        report = self.drift.observe(step + 1, logs)
        if report is None:
            return
        logs[DRIFT_FLAGS_KEY] = float(report.flags)
        if self.is_world_process_zero():
            for line in report.warnings:
                mappo_logger().warning(line)

    def _advance_lr_schedule(self) -> None:
        """One step of the learning-rate schedule per rollout step, updated or not (a step
        without an update: every group skipped, or a non-finite loss). The schedule counts
        steps, as ``max_steps`` does; torch's warning that the scheduler stepped before the
        optimizer, which it prints when the first step had no update, says nothing here."""
        if self.lr_scheduler is None:
            return
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.lr_scheduler.step()

    @staticmethod
    def _time_logs(timings: Timings, t0: float, t1: float, t2: float, t3: float
                   ) -> dict[str, float]:
        """Seconds of the step: rollout ``t0..t1`` (generate and retrieve within it), scoring
        ``t1..t2``, update ``t2..t3``."""
        return {
            "time/generate": timings.generate,
            "time/retrieve": timings.retrieve,
            "time/score": t2 - t1,
            "time/update": t3 - t2,
            "time/rollout": t1 - t0,
            "time/step": t3 - t0,
        }

    def _all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of ``tensor`` over every process (the learner's agreed decisions use it too)."""
        return self.accelerator.reduce(tensor.to(self.accelerator.device), reduction="sum")

    def _any_process(self, flag: bool) -> bool:
        """True on every process when ``flag`` is true on at least one."""
        if self.args.world_size <= 1:
            return flag
        return bool(self._all_reduce_sum(torch.tensor([float(flag)])).item() > 0)

    def _mean_over_processes(self, logs: dict[str, float]) -> dict[str, float]:
        """Every process rolled out its own questions: log the mean over all of them.

        A key that only some processes log (an agent whose samples were all dropped on one,
        a step whose questions have gold passages on one only) is the mean over those that
        have it; the reduction runs over the union of the keys, so every process reduces the
        same vector."""
        if self.args.world_size <= 1:
            return logs
        from accelerate.utils import gather_object

        keys = sorted(set(gather_object(sorted(logs))))
        values = torch.tensor([[float(logs.get(k, 0.0)), float(k in logs)] for k in keys],
                              dtype=torch.float64, device=self.accelerator.device)
        totals = self.accelerator.reduce(values, reduction="sum")
        return {key: total / count for key, (total, count) in zip(keys, totals.tolist(),
                                                                  strict=True) if count > 0}

    def _pad_id(self) -> int:
        tokenizer = self.processing_class
        return tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
            else tokenizer.eos_token_id

    # -- finite weights ------------------------------------------------------------------------

    def _policy_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The weights a checkpoint or the final model holds: the policy's and the value
        head's (not a frozen reference copy)."""
        unwrapped: PolicyWithValue = self.accelerator.unwrap_model(self.model)
        yield from unwrapped.policy.named_parameters(prefix="policy")
        if unwrapped.v_head is not None:
            yield from unwrapped.v_head.named_parameters(prefix="v_head")

    def _nonfinite_weights(self, trainable_only: bool) -> list[str]:
        """The policy and value-head tensors holding a NaN or an infinity, agreed over the
        processes (ZeRO-3 partitions them: each checks its own); empty when all are finite.
        Every process must call it at the same point."""
        names = nonfinite_parameters(self._policy_parameters(), trainable_only=trainable_only)
        if self._any_process(bool(names)) and not names:
            names = ["on another process"]
        return names

    def _last_good(self) -> str:
        """What the user has left after weights went non-finite: this run's last checkpoint."""
        if self._saved_step is None:
            return "no checkpoint of this run was written"
        folder = Path(self.args.output_dir) / f"{CHECKPOINT_PREFIX}-{self._saved_step}"
        return f"the last checkpoint, {folder}, stays as it was"

    def _check_weights_after_update(self, step: int) -> None:
        """Stop the run when the update left a NaN or an infinity in a trained weight: the
        next rollout would sample from NaN logits (a traceback), and no later save may write
        them. Checked on the trainable tensors only (what an optimiser step changes)."""
        bad = self._nonfinite_weights(trainable_only=True)
        if bad:
            raise TrainingStopped(
                f"step {step + 1}: the update left NaN or infinite values in {describe(bad)} "
                f"(its loss and gradient norm were finite); nothing of it is saved and "
                f"{self._last_good()}; lower learning_rate or max_grad_norm")

    def _refuse_nonfinite_save(self, what: str) -> None:
        """Raise before anything is written when a weight to be saved is not finite."""
        bad = self._nonfinite_weights(trainable_only=False)
        if bad:
            raise TrainingStopped(f"refusing to write {what}: {describe(bad)} hold NaN or "
                                  f"infinite values; {self._last_good()}")

    # -- checkpoints ---------------------------------------------------------------------------

    def save_policy(self, folder: Path) -> None:
        """Adapter (LoRA) or full weights, the value head (ppo only) and the tokenizer.

        Every process must call it: under ZeRO-3 the weights are gathered from all of them;
        the main process writes. Weights with a NaN or an infinity are never written (a
        :class:`TrainingStopped` instead)."""
        self._refuse_nonfinite_save(f"the model to {folder}")
        state = self._gathered_state()
        if self.is_world_process_zero():
            self._write_policy(Path(folder), state)

    def _gathered_state(self) -> dict[str, Any] | None:
        if self.zero_stage() != 3:
            return None  # every process holds the full weights
        return self.accelerator.get_state_dict(self.model_wrapped)

    def _write_policy(self, folder: Path, state: dict[str, Any] | None) -> None:
        unwrapped: PolicyWithValue = self.accelerator.unwrap_model(self.model)
        if state is None:
            unwrapped.policy.save_pretrained(folder, safe_serialization=True)
            if unwrapped.v_head is not None:
                unwrapped.v_head.save(folder)
        else:
            def part(prefix: str) -> dict[str, Any]:
                return {k.removeprefix(prefix): v for k, v in state.items()
                        if k.startswith(prefix)}

            unwrapped.policy.save_pretrained(folder, state_dict=part("policy."),
                                             safe_serialization=True)
            if unwrapped.v_head is not None:
                unwrapped.v_head.save(folder, state_dict=part("v_head."))
        write_marker(folder, unwrapped.policy)  # one adapter per agent: which ones
        self.processing_class.save_pretrained(folder)

    def save_mappo_checkpoint(self, learner: PPOLearner) -> Path:
        """Every process calls it; the checkpoint folder appears whole or not at all.

        With several processes each one writes its own RNG state (its sampling draws differ)
        and, under DeepSpeed, its optimiser partition (the engine's ``save_checkpoint``) into a
        staging folder that the main process moves into the checkpoint."""
        folder = Path(self.args.output_dir) / f"{CHECKPOINT_PREFIX}-{self.state.global_step}"
        if self._saved_step == self.state.global_step:  # the same on every process
            return folder
        self._refuse_nonfinite_save(str(folder))
        distributed = self.args.world_size > 1
        staging = folder.with_name(f".{folder.name}.parts")
        if distributed:
            if self.is_world_process_zero() and staging.exists():
                shutil.rmtree(staging)
            self.accelerator.wait_for_everyone()
            staging.mkdir(parents=True, exist_ok=True)
            torch.save(self._rng_state(learner), staging / self._rng_file())
            if self.is_deepspeed_enabled:
                self.model_wrapped.save_checkpoint(str(staging / DEEPSPEED_DIR),
                                                   tag=DEEPSPEED_TAG)
            self.accelerator.wait_for_everyone()
        state = self._gathered_state()
        if self.is_world_process_zero():
            with atomic_dir(folder) as tmp:
                self._write_policy(tmp, state)
                if not self.is_deepspeed_enabled:
                    torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
                if self.lr_scheduler is not None:
                    torch.save(self.lr_scheduler.state_dict(), tmp / SCHEDULER_FILE)
                atomic_write_json(tmp / STATE_FILE, {
                    "global_step": self.state.global_step,
                    "kl_controller": learner.kl_ctl.state_dict(),
                    "nonfinite_in_a_row": self._nonfinite_in_a_row,
                    "questions_per_step": self.questions_per_step,
                    "world_size": self.args.world_size,
                    "algorithm": self.mappo_args.mappo_algorithm,
                    "group_size": self.mappo_args.rollouts_per_question,
                    "pipeline": self.mappo_args.mappo_pipeline,
                })
                if distributed:
                    for part in staging.iterdir():
                        os.replace(part, tmp / part.name)
                    staging.rmdir()
                else:
                    torch.save(self._rng_state(learner), tmp / RNG_FILE)
                self.state.save_to_json(str(tmp / "trainer_state.json"))
                for companion in self.checkpoint_companions:
                    companion.save(tmp)
                write_manifest(tmp)  # last: it vouches for every file above
            for old in rotate_checkpoints(folder.parent, self.args.save_total_limit):
                mappo_logger().info(f"[mappo] save_total_limit {self.args.save_total_limit}: "
                                    f"removed {old}")
            self.callback_handler.on_save(self.args, self.state, self.control)
        if distributed:
            self.accelerator.wait_for_everyone()
        self._saved_step = self.state.global_step
        return folder

    def _rng_file(self) -> str:
        """``rng_state.pth``, or ``rng_state_<rank>.pth`` with several processes."""
        if self.args.world_size > 1:
            return f"{Path(RNG_FILE).stem}_{self.args.process_index}.pth"
        return RNG_FILE

    @staticmethod
    def _rng_state(learner: PPOLearner) -> dict[str, Any]:
        return {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "learner_generator": learner.generator.get_state() if learner.generator else None,
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        }

    def load_mappo_checkpoint(self, folder: str | os.PathLike[str], learner: PPOLearner) -> int:
        """Restores everything :meth:`save_mappo_checkpoint` wrote; returns the step.

        The workflow has checked the files against the checkpoint's manifest already; a file
        that still cannot be read (a checkpoint saved before manifests existed) is a
        :class:`CheckpointError` naming it and the checkpoint, not a library traceback."""
        path = Path(folder)
        state_file = path / STATE_FILE
        if not state_file.is_file():
            raise FileNotFoundError(f"{path}: not a MAPPO checkpoint (no {STATE_FILE})")
        with _reading(path, STATE_FILE):
            saved = json.loads(state_file.read_text(encoding="utf-8"))
            questions, world = saved["questions_per_step"], saved["world_size"]
            algorithm = saved.get("algorithm", "ppo")  # checkpoints from before grpo: ppo
        if algorithm != self.mappo_args.mappo_algorithm:
            raise ValueError(
                f"{path}: saved by mappo_algorithm: {algorithm} but this run uses "
                f"{self.mappo_args.mappo_algorithm} (only ppo has a value head); resume with "
                f"mappo_algorithm: {algorithm}")
        pipeline = saved.get("pipeline", "qr_s_g")  # checkpoints from before search_agent
        if pipeline != self.mappo_args.mappo_pipeline:
            raise ValueError(
                f"{path}: saved by mappo_pipeline: {pipeline} but this run uses "
                f"{self.mappo_args.mappo_pipeline}; resume with mappo_pipeline: {pipeline}")
        if questions != self.questions_per_step or world != self.args.world_size:
            raise ValueError(
                f"{path}: saved with {questions} questions per step on {world} processes; this "
                f"run uses {self.questions_per_step} on {self.args.world_size}, so the data "
                "order would not continue")
        if self.is_deepspeed_enabled:
            if not (path / DEEPSPEED_DIR).is_dir():
                raise FileNotFoundError(f"{path}: saved without DeepSpeed (no {DEEPSPEED_DIR}/); "
                                        "resume it without `deepspeed`")
            # weights (policy, and the value head under ppo) and this process's
            # optimiser partition
            with _reading(path, f"{DEEPSPEED_DIR}/"):
                self.model_wrapped.load_checkpoint(str(path / DEEPSPEED_DIR), tag=DEEPSPEED_TAG,
                                                   load_optimizer_states=True,
                                                   load_lr_scheduler_states=False)
        else:
            if not (path / OPTIMIZER_FILE).is_file():
                raise FileNotFoundError(f"{path}: no {OPTIMIZER_FILE} (a DeepSpeed checkpoint "
                                        "resumes only under `deepspeed`)")
            unwrapped: PolicyWithValue = self.accelerator.unwrap_model(self.model)
            weights = "adapter_model.safetensors" \
                if (path / "adapter_model.safetensors").is_file() else "model.safetensors"
            if (path / MARKER_FILE).is_file():
                weights = MARKER_FILE  # one adapter per agent, each in its own folder
            with _reading(path, weights):
                load_policy_weights(unwrapped.policy, path)
            if unwrapped.v_head is not None:  # grpo: none was created or saved
                with _reading(path, "value_head.safetensors"):
                    unwrapped.v_head.load(path)
            with _reading(path, OPTIMIZER_FILE):
                self.optimizer.load_state_dict(torch.load(path / OPTIMIZER_FILE,
                                                          weights_only=False))
        if self.lr_scheduler is not None and (path / SCHEDULER_FILE).is_file():
            with _reading(path, SCHEDULER_FILE):
                self.lr_scheduler.load_state_dict(torch.load(path / SCHEDULER_FILE,
                                                             weights_only=False))
        with _reading(path, STATE_FILE):
            learner.kl_ctl.load_state_dict(saved["kl_controller"])
            self._nonfinite_in_a_row = saved["nonfinite_in_a_row"]
        rng_file = path / self._rng_file()
        if not rng_file.is_file():
            raise FileNotFoundError(f"{path}: no {rng_file.name} for process "
                                    f"{self.args.process_index}")
        with _reading(path, rng_file.name):
            self._set_rng_state(torch.load(rng_file, weights_only=False), learner)
        state_json = path / "trainer_state.json"
        if state_json.is_file():
            from transformers import TrainerState

            with _reading(path, state_json.name):
                loaded = TrainerState.load_from_json(str(state_json))
            self.state.log_history = loaded.log_history
        self.state.global_step = saved["global_step"]
        self._load_companions(path)
        return int(saved["global_step"])

    def _load_companions(self, path: Path) -> None:
        """Each companion's state from the checkpoint; a checkpoint holding the state of a
        companion this run lacks is refused (resuming would drop it silently)."""
        from mmoa.train.mappo.joint_retriever import CHECKPOINT_DIR

        names = {companion.name for companion in self.checkpoint_companions}
        if CHECKPOINT_DIR not in names and (path / CHECKPOINT_DIR).is_dir():
            raise ValueError(f"{path}: saved with mappo_joint_retriever (it holds the query "
                             f"encoder's state in {CHECKPOINT_DIR}/); resume it with that key")
        for companion in self.checkpoint_companions:
            companion.load(path)

    @staticmethod
    def _set_rng_state(rng: dict[str, Any], learner: PPOLearner) -> None:
        """Puts back what :meth:`_rng_state` captured."""
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng.get("learner_generator") is not None and learner.generator is not None:
            learner.generator.set_state(rng["learner_generator"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])


def _signal_groups(samples: Sequence[Sample]) -> list[int]:
    """The groups (:attr:`Sample.group`) of one round's samples that carry a group signal for
    at least one agent, in order."""
    return list(dict.fromkeys(s.group for s in samples
                              if s.group is not None and not s.group_flat))


def _all_signal_groups(rounds: Sequence[tuple[list[Sample], dict[str, float], int]]
                       ) -> list[tuple[int, int]]:
    """``(round, group)`` of every round's groups with a signal, in order."""
    return [(r, g) for r, (samples, _, _) in enumerate(rounds) for g in _signal_groups(samples)]


def _trim_to_groups(rounds: Sequence[tuple[list[Sample], dict[str, float], int]], target: int
                    ) -> tuple[list[Sample], int, int]:
    """Every round's samples, with the groups with a signal beyond the first ``target`` left
    out whole; returns ``(samples, groups with a signal kept, groups with a signal dropped)``.
    Samples of flat groups (kept only where a penalty fired) stay."""
    signal = _all_signal_groups(rounds)
    keep, with_signal = set(signal[:target]), set(signal)
    out = [s for r, (samples, _, _) in enumerate(rounds) for s in samples
           if (r, s.group) not in with_signal or (r, s.group) in keep]
    return out, len(keep), len(signal) - len(keep)


#: Logs of a round that are counts, summed over DAPO's rounds (the rest are means).
_COUNT_KEYS = ("grpo/groups", "grpo/zero_variance_groups", "grpo/skipped_samples",
               "overlong/filtered")


def _merge_round_logs(rounds: Sequence[tuple[list[Sample], dict[str, float], int]]
                      ) -> dict[str, float]:
    """One step's logs from its rounds: counts summed, every other value the mean over the
    rounds that logged it, weighted by their questions; the zero-variance fraction is
    recomputed from the summed counts."""
    totals: dict[str, float] = {}
    weights: dict[str, float] = {}
    for _, logs, questions in rounds:
        for key, value in logs.items():
            weight = 1.0 if key in _COUNT_KEYS else float(questions)
            totals[key] = totals.get(key, 0.0) + weight * value
            weights[key] = weights.get(key, 0.0) + weight
    merged = {key: total if key in _COUNT_KEYS else total / weights[key]
              for key, total in totals.items()}
    if merged.get("grpo/groups"):
        merged["grpo/zero_variance_fraction"] = \
            merged["grpo/zero_variance_groups"] / merged["grpo/groups"]
    return merged


def _add_timings(first: Timings, second: Timings) -> Timings:
    """The seconds of two rollouts, stage by stage."""
    stages = first.as_dict()
    for stage, seconds in second.as_dict().items():
        stages[stage] = stages.get(stage, 0.0) + seconds
    return Timings(stages)


@contextlib.contextmanager
def _reading(checkpoint: Path, name: str) -> Iterator[None]:
    """Turns a failure to read or apply ``name`` (SafetensorError, EOFError, an unpickling
    error, ...) into a one-line :class:`CheckpointError` naming the file and the checkpoint."""
    try:
        yield
    except (CheckpointError, FileNotFoundError):
        raise
    except Exception as err:  # whatever the library raises on a damaged file
        lines = str(err).strip().splitlines()
        detail = f"{type(err).__name__}: {lines[0]}" if lines else type(err).__name__
        raise CheckpointError(f"checkpoint {checkpoint}: cannot read {name} ({detail})") from err


def load_policy_weights(policy: torch.nn.Module, folder: Path) -> None:
    """Loads what :meth:`MappoTrainer.save_policy` wrote: a LoRA adapter, one adapter per agent
    (:mod:`mmoa.agent_adapters`) or full weights."""
    from safetensors.torch import load_file

    if agent_adapters(policy) or (folder / MARKER_FILE).is_file():
        load_agent_weights(policy, folder)  # refuses a checkpoint of the other kind
        return
    adapter = folder / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(policy, load_file(str(adapter)))
        if getattr(result, "unexpected_keys", None):
            raise ValueError(f"{adapter}: unexpected keys {result.unexpected_keys[:5]}")
        return
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{folder}: neither adapter_model.safetensors nor "
                                "model.safetensors")
    missing, unexpected = policy.load_state_dict(load_file(str(weights)), strict=False)
    tied = {"lm_head.weight"} if getattr(policy.config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise ValueError(f"{weights}: missing {sorted(set(missing) - tied)[:5]}, unexpected "
                         f"{unexpected[:5]}")


def retrieval_failure_message(step: int, failure: Exception | None, retries: int,
                              checkpoint: Path | None, completed: int) -> str:
    """What happened when retrieval failed at ``step``, exactly: the retries really made (none
    for a request the server refused, which is never retried) and the checkpoint written, or
    that none was (no step had completed)."""
    from mmoa.retrieval.client import RetrieverUnavailableError

    if failure is None:
        what = "on another process (its own error says why)"
    elif isinstance(failure, RetrieverUnavailableError):
        attempts = failure.attempts if failure.attempts is not None else retries + 1
        made = attempts - 1
        tries = ("no retry (mappo_retriever_retries: 0)" if made == 0
                 else f"{made} {'retry' if made == 1 else 'retries'}")
        what = f"after {tries}: {failure}"
    else:  # a 4xx/500 answer: retrying the same request cannot help
        what = f"the server refused the request (not retried): {failure}"
    if checkpoint is None:
        saved = ("no step had completed, so no checkpoint was written; restart the server and "
                 "start the run again")
    else:
        saved = (f"the last completed step ({completed}) is saved in {checkpoint}; restart the "
                 f"server and resume with resume_from_checkpoint={checkpoint}")
    return f"retrieval failed at step {step} {what}; {saved}"
