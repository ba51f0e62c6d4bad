"""The joint option of the ``mappo`` stage: query-encoder updates (HARR) alternate with the
agents' MAPPO updates in one run.

``mappo_joint_retriever: <a retriever_rl config>`` turns it on. Every
``mappo_joint_retriever_every`` MAPPO steps the query encoder takes
``mappo_joint_retriever_steps`` GRPO steps of the ``retriever_rl`` stage's own trainer
(:class:`~mmoa.train.retriever_rl.workflow.RetrieverRLTrainer`: the same rollouts, update,
log and server reloads), and the server is left serving the updated encoder, so the next MAPPO
rollouts retrieve with it. Each side thus trains against the other's current version:

* the encoder's answer-F1 reward (``retriever_reward: f1``) is computed with the live policy as
  the RAG Generator (greedy), not with a frozen copy of the warm start;
* the agents' rollouts use the encoder as trained so far.

The encoder's settings (index, pool, alpha, group size, LoRA, reward, history, learning rate)
come from the named ``retriever_rl`` config; the keys that the MAPPO run decides are refused
there (:data:`SET_BY_MAPPO`), and ``dataset`` / ``dataset_dir`` / ``seed`` default to the MAPPO
run's. The encoder's log, plots and final servable ``encoder/`` go to
``<output_dir>/retriever/``; every MAPPO checkpoint holds the encoder's state in
``retriever/`` (covered by the checkpoint's manifest), and a resumed run restores it.

One process only (the encoder trains in the main process against the one server; DDP and
DeepSpeed are refused).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from mmoa.train.mappo.log import mappo_logger

#: The folder of the encoder's state inside a MAPPO checkpoint and of its run in output_dir.
CHECKPOINT_DIR = "retriever"
#: ``retriever_rl`` keys the MAPPO run sets (giving them in the joint config is an error).
SET_BY_MAPPO = ("output_dir", "model_name_or_path", "template", "max_steps", "save_steps",
                "resume_from_checkpoint", "retriever_url", "retriever_token")


def joint_phases(total_steps: int, every: int) -> int:
    """Retriever phases in a run of ``total_steps`` MAPPO steps: after steps ``every``,
    ``2 every``, ... before the last one (after the last step nothing would use them)."""
    return (total_steps - 1) // every


def retriever_arguments(config_path: str, *, output_dir: str, model_name_or_path: str,
                        template: str, dataset: str, dataset_dir: str, seed: int,
                        retriever_url: str, retriever_token: str | None,
                        max_steps: int) -> Any:
    """The ``retriever_rl`` arguments of the joint run: the named config, with the keys the
    MAPPO run decides filled in from it."""
    from mmoa.train.config_file import read_train_config
    from mmoa.train.retriever_rl.args import parse_retriever_rl_args

    config = read_train_config([config_path])
    given = sorted(k for k in SET_BY_MAPPO if k in config)
    if given:
        raise ValueError(f"mappo_joint_retriever: {config_path} sets {given}, which the MAPPO "
                         f"run decides (the live policy answers, the MAPPO server and output "
                         f"folder are used, its checkpoints hold the encoder): remove them")
    config.update(output_dir=str(Path(output_dir) / CHECKPOINT_DIR),
                  model_name_or_path=model_name_or_path, template=template,
                  max_steps=max_steps, save_steps=max_steps, retriever_url=retriever_url,
                  retriever_token=retriever_token)
    config.setdefault("dataset", dataset)
    config.setdefault("dataset_dir", dataset_dir)
    config.setdefault("seed", seed)
    config["stage"] = "retriever_rl"
    return parse_retriever_rl_args(config)


class JointRetriever(TrainerCallback):
    """Runs the retriever phases from MAPPO's step callbacks and keeps the encoder's state in
    MAPPO's checkpoints (a checkpoint companion of :class:`~mmoa.train.mappo.trainer.
    MappoTrainer`)."""

    name = CHECKPOINT_DIR

    def __init__(self, trainer: Any, every: int, steps: int) -> None:
        self.trainer = trainer
        self.every = every
        self.steps = steps
        self._resume: Path | None = None
        self.phases_run = 0

    # -- checkpoint companion --------------------------------------------------------------

    def save(self, checkpoint: Path) -> None:
        """The encoder's state into a MAPPO checkpoint being written."""
        self.trainer.write_checkpoint(checkpoint / CHECKPOINT_DIR)

    def load(self, checkpoint: Path) -> None:
        """Remember the state to restore from a MAPPO checkpoint (restored when training
        begins, after the policy's own state)."""
        folder = checkpoint / CHECKPOINT_DIR
        if not (folder / "trainer_state.json").is_file():
            raise ValueError(f"{checkpoint}: saved without mappo_joint_retriever (no "
                             f"{CHECKPOINT_DIR}/); resume it without that key")
        self._resume = folder

    # -- callbacks -------------------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.begin(self._resume)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step % self.every == 0 and state.global_step < state.max_steps:
            self.phase(state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.finish()
        if self.trainer.args.retriever_restore_server_encoder:
            self.trainer.restore_server()

    def phase(self, mappo_step: int) -> dict[str, float]:
        """``steps`` encoder updates, then the server serves the result."""
        policy = getattr(self.trainer.generator, "model", None)
        was_training = bool(policy is not None and policy.training)
        stats: dict[str, float] = {}
        try:
            for _ in range(self.steps):
                stats = self.trainer.train_step()
            if "time/reload" not in stats:  # the last update of the run reloads nothing
                self.trainer.sync_server()
        finally:
            if was_training:
                policy.train()
        self.phases_run += 1
        mappo_logger().info(
            f"[mappo] retriever phase after step {mappo_step}: {self.steps} encoder update(s), "
            f"reward {stats.get('reward', float('nan')):.3f} (encoder step "
            f"{self.trainer.step}/{self.trainer.args.max_steps})")
        return stats


def build_joint_retriever(mappo_args: Any, training_args: Any, model_args: Any,
                          data_args: Any, trainer: Any) -> JointRetriever | None:
    """The companion of ``trainer`` when ``mappo_joint_retriever`` is set, else ``None``."""
    if not mappo_args.mappo_joint_retriever:
        return None
    if training_args.world_size > 1 or trainer.is_deepspeed_enabled:
        raise ValueError("mappo_joint_retriever trains the query encoder in one process "
                         "against one server: run it without DDP/DeepSpeed")
    if mappo_args.mappo_pipeline != "qr_s_g":
        raise ValueError("mappo_joint_retriever alternates with the three-agent pipeline "
                         f"(mappo_pipeline: qr_s_g), not {mappo_args.mappo_pipeline}")
    every, steps = mappo_args.mappo_joint_retriever_every, mappo_args.mappo_joint_retriever_steps
    phases = joint_phases(trainer.total_steps, every)
    if phases < 1:
        raise ValueError(f"mappo_joint_retriever_every: {every} with {trainer.total_steps} MAPPO "
                         f"steps runs no retriever phase (phases come after every {every} "
                         f"steps, before the last)")
    from mmoa.train.retriever_rl.evaluate import rag_generator
    from mmoa.train.retriever_rl.workflow import RetrieverRLTrainer

    args = retriever_arguments(
        mappo_args.mappo_joint_retriever, output_dir=training_args.output_dir,
        model_name_or_path=model_args.model_name_or_path, template=data_args.template,
        dataset=",".join(data_args.dataset), dataset_dir=data_args.dataset_dir,
        seed=training_args.seed, retriever_url=mappo_args.mappo_retriever_url,
        retriever_token=mappo_args.mappo_retriever_token, max_steps=phases * steps)
    generator = None
    if args.retriever_reward == "f1" or args.retriever_log_answer_f1:
        policy = trainer.accelerator.unwrap_model(trainer.model).policy
        generator = rag_generator(policy, trainer.processing_class, trainer.renderer,
                                  args.retriever_max_new_tokens,
                                  args.retriever_generator_batch_size)
    joint = JointRetriever(RetrieverRLTrainer(args, generator=generator), every, steps)
    trainer.add_callback(joint)
    trainer.checkpoint_companions.append(joint)
    return joint
