"""The ``mappo`` stage end to end: arguments, checks, models, trainer, saving and plots.

The order matters for the user: the retrieval server and the dataset are checked first, so a
wrong URL or a dataset without gold answers fails in seconds, before a large model is loaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mmoa.config_values import check_at_least
from mmoa.fileio import atomic_write_text
from mmoa.train.mappo.args import MappoArguments, split_mappo_args, typed_llamafactory_keys
from mmoa.train.mappo.log import in_web_ui, mappo_logger
from mmoa.train.prompt_set import load_mappo_records

PLOT_KEYS = ["loss", "reward", "answer_f1", "kl", "kl_coef", "value_loss"]
#: GRPO has no value head and no adaptive KL coefficient; it logs its groups instead.
GRPO_PLOT_KEYS = ["loss", "reward", "answer_f1", "kl", "kl_loss", "grpo/zero_variance_fraction"]


def plot_keys(algorithm: Any) -> list[str]:
    """The curves plotted for a registered algorithm, from its properties: ``PLOT_KEYS`` under
    ppo, ``GRPO_PLOT_KEYS`` under grpo."""
    keys = ["loss", "reward", "answer_f1", "kl",
            "kl_coef" if algorithm.kl == "reward" else "kl_loss"]
    keys += ["value_loss"] if algorithm.value_head else []
    keys += ["grpo/zero_variance_fraction"] if algorithm.grouped else []
    return keys

#: LLaMA-Factory's per-step log (``extras.constants.TRAINER_LOG``), which the web UI reads.
TRAINER_LOG_FILE = "trainer_log.jsonl"


def check_adapter_per_agent(mappo_args: MappoArguments | None, model_args: Any,
                            training_args: Any, finetuning_args: Any) -> None:
    """``mappo_adapter_per_agent`` only where it computes what it says.

    * LoRA only: under full fine-tuning there is no adapter to give each agent, and the agents'
      copies of the whole model would not fit where one barely does.
    * No gradient checkpointing: a micro-batch's agents are scored one after the other, each
      with its adapter active, and checkpointing recomputes every layer during the backward
      pass, when only the last agent's adapter is active: the other agents' gradients would
      be those of the wrong adapter.
    * Not under DeepSpeed ZeRO-3: each process makes one forward pass
      per agent present in its micro-batch, and ZeRO-3's passes all-gather the weights, so all
      processes must make the same passes.
    """
    if mappo_args is None or not mappo_args.mappo_adapter_per_agent:
        return
    if finetuning_args.finetuning_type != "lora":
        raise ValueError(f"mappo_adapter_per_agent gives each agent a LoRA adapter over one "
                         f"frozen base: it needs finetuning_type: lora, got "
                         f"{finetuning_args.finetuning_type}")
    if not getattr(model_args, "disable_gradient_checkpointing", True):
        raise ValueError("mappo_adapter_per_agent needs disable_gradient_checkpointing: true: "
                         "the agents of a micro-batch are scored one after the other with their "
                         "own adapters, and gradient checkpointing would recompute them during "
                         "the backward pass with the last agent's adapter active")
    deepspeed = getattr(training_args, "hf_deepspeed_config", None)
    if deepspeed is not None and deepspeed.is_zero3():
        from mmoa.agent_adapters import ZERO3_REFUSAL

        raise ValueError(ZERO3_REFUSAL)


def check_training_setup(model_args: Any, training_args: Any, finetuning_args: Any,
                         mappo_args: MappoArguments | None = None) -> None:
    """Refuse set-ups that would train something other than what the user asked for.

    * ``per_device_train_batch_size`` (the PPO mini-batch), ``gradient_accumulation_steps`` or
      ``ppo_epochs`` below 1: LLaMA-Factory accepts them, and the run "trained" without an
      update (ppo_epochs 0) or with a mini-batch of no question.
    * ``fp16``: the loss would be scaled and the gradients clipped unscaled (no GradScaler in
      this loop); bf16 or fp32 train correctly.
    * LoRA with ``adapter_name_or_path`` (an SFT adapter) and ``create_new_adapter: false``:
      LLaMA-Factory would resume training that adapter, and the KL reference (the model with the
      adapter disabled) would be the base model before SFT, not the warm start.
      ``create_new_adapter: true`` merges the SFT adapter into the base and trains a new one on
      top, so the reference is the warm start.
    """
    for name, value in (("per_device_train_batch_size", training_args.per_device_train_batch_size),
                        ("gradient_accumulation_steps", training_args.gradient_accumulation_steps),
                        ("ppo_epochs", finetuning_args.ppo_epochs)):
        # 0 trained nothing (ppo_epochs) or split the rollout oddly, silently
        check_at_least(name, value)
    if getattr(training_args, "fp16", False):
        raise ValueError("the mappo stage does not support fp16 (its loss scaling would leave "
                         "the gradients unscaled at clipping): use bf16: true or fp32")
    check_adapter_per_agent(mappo_args, model_args, training_args, finetuning_args)
    if finetuning_args.finetuning_type == "lora" and model_args.adapter_name_or_path \
            and not finetuning_args.create_new_adapter:
        raise ValueError(
            f"adapter_name_or_path={','.join(model_args.adapter_name_or_path)} with LoRA would "
            "resume that adapter, and the KL reference (adapter disabled) would be the base "
            "model, not the warm start: set create_new_adapter: true (merges the SFT adapter "
            "and trains a new one), or merge it first (mmoa-cli export) and pass the merged "
            "model as model_name_or_path")


#: How to start the server, for the start-up errors.
START_SERVER = "bash run_server.sh --index <index folder>"


def check_retriever(mappo_args: MappoArguments) -> Any:
    """The client of a live retrieval server of this project that accepts our token, checked
    before the model loads: ``/health`` needs no token, so one query is sent too. Anything
    else is a ``ValueError`` (``RetrieverUnavailableError`` when nothing answers) that names
    the URL and what to do."""
    from mmoa.retrieval.client import RetrievalClient, RetrieverRequestError

    client = RetrievalClient(
        mappo_args.mappo_retriever_url, token=mappo_args.mappo_retriever_token,
        timeout=mappo_args.mappo_retriever_timeout, retries=mappo_args.mappo_retriever_retries,
    )
    try:
        health = client.health()  # raises RetrieverUnavailableError naming the URL
    except (RetrieverRequestError, ValueError) as err:  # an HTTP error, or not JSON
        raise ValueError(f"{client.url} answers, but not as a retrieval server of this project "
                         f"({err}); start one with: {START_SERVER}") from err
    if not isinstance(health, dict) or "corpus_size" not in health:
        raise ValueError(f"{client.url}/health answers without a corpus size: not a retrieval "
                         f"server of this project; start one with: {START_SERVER}")
    check_server_k(mappo_args, health, client.url)
    try:
        client.retrieve(["retriever check"], topk=1)
    except RetrieverRequestError as err:
        if err.status == 401:
            raise ValueError(f"{client.url} refused the bearer token ({err.message}); set "
                             "mappo_retriever_token to the server's token") from err
        raise ValueError(f"{client.url} answers /health but not a query ({err})") from err
    mappo_logger().info(f"[mappo] retriever {client.url}: {health.get('corpus_size', '?')} "
                        f"passages, {health.get('index_type', '?')} index")
    return client


def check_server_k(mappo_args: MappoArguments, health: dict[str, Any], url: str) -> None:
    """The documents per query the pipeline asks for against the server's ``max_k`` (from
    ``/health``; a server that does not report it is not checked): a key above it failed at
    the first rollout, after the model had loaded."""
    limits = health.get("limits")
    max_k = limits.get("max_k") if isinstance(limits, dict) else None
    if not isinstance(max_k, int) or isinstance(max_k, bool):
        return
    name = mappo_args.pipeline.retrieval_k_key
    value = getattr(mappo_args, name)
    if value > max_k:
        raise ValueError(f"{name} = {value} exceeds the retrieval server's max_k ({max_k}) at "
                         f"{url}: lower {name}, or restart the server with --max-k {value}")


def run_mappo_from_config(config: dict[str, Any]) -> int:
    from mmoa.retrieval.client import RetrieverUnavailableError
    from mmoa.train.mappo.trainer import TrainingInterrupted, TrainingStopped

    try:
        run_mappo(config)
    except TrainingInterrupted as err:
        print(f"[mappo] interrupted: {err}", file=sys.stderr, flush=True)
        return err.exit_code
    except (RetrieverUnavailableError, TrainingStopped, ValueError, KeyError,
            FileNotFoundError) as err:
        # stderr, not the logger: the web UI shows a failed run's stderr.
        print(f"[mappo] error: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        _leave_process_group()
    return 0


def _leave_process_group() -> None:
    """Tears down the torchrun process group, if any, before the interpreter exits: left to
    interpreter shutdown, its communication threads (and DeepSpeed's on CPU) are destroyed in
    no set order, which now and then aborts a rank that has already finished
    (``terminate called without an active exception``) and fails a finished run."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def run_mappo(config: dict[str, Any], callbacks: list[Any] | None = None) -> None:
    import torch

    from mmoa.train.plots import save_agent_plot, save_training_plots

    trainer, training_args, finetuning_args = build_mappo_trainer(config, callbacks)
    torch.manual_seed(training_args.seed)
    trainer.mappo_train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    output = Path(training_args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    trainer.save_policy(output)  # every process: ZeRO-3 gathers the weights from all of them
    if trainer.is_world_process_zero():
        trainer.state.save_to_json(str(output / "trainer_state.json"))
        if finetuning_args.plot_loss:
            save_training_plots(output, plot_keys(trainer.mappo_args.algorithm))
            if trainer.mappo_args.pipeline.agent_plot:
                save_agent_plot(output)  # training_agents.png: one panel per agent statistic


def logged_steps_until(output_dir: str | None, checkpoint: str | None) -> str | None:
    """The lines of ``output_dir``'s trainer log up to the step of ``checkpoint`` (a
    ``checkpoint-N`` folder), or ``None`` when not resuming or there is no log."""
    if not output_dir or not checkpoint:
        return None
    log = Path(output_dir) / TRAINER_LOG_FILE
    step = Path(checkpoint).name.rpartition("-")[2]
    if not log.is_file() or not step.isdigit():
        return None
    kept = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a killed run
        if isinstance(entry, dict) and entry.get("current_steps", 0) <= int(step):
            kept.append(line + "\n")
    return "".join(kept)


def build_mappo_trainer(config: dict[str, Any], callbacks: list[Any] | None = None
                        ) -> tuple[Any, Any, Any]:
    """``(trainer, training_args, finetuning_args)`` with every check done and models loaded."""
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer
    from llamafactory.train.trainer_utils import create_ref_model

    from mmoa.train.mappo.agent_stats import counterfactual_log_keys
    from mmoa.train.mappo.learner import PolicyWithValue
    from mmoa.train.mappo.log_callback import MappoLogCallback
    from mmoa.train.mappo.trainer import MappoTrainer
    from mmoa.train.mappo.value_head import ValueHead

    mappo_args, rest = split_mappo_args(config)
    rest = typed_llamafactory_keys(rest)  # HfArgumentParser converts no value of a dict
    rest.setdefault("do_train", True)
    model_args, data_args, training_args, finetuning_args, _ = get_train_args(rest)
    if in_web_ui():
        # LLaMA-Factory's parser turned transformers to INFO, whose model-config dumps would
        # fill LlamaBoard's log box (it shows both libraries' INFO lines)
        import transformers

        transformers.utils.logging.set_verbosity_warning()
    check_training_setup(model_args, training_args, finetuning_args, mappo_args)
    if mappo_args.algorithm.kl != "reward" and finetuning_args.ppo_whiten_rewards:
        raise ValueError(f"ppo_whiten_rewards whitens PPO's per-token rewards; "
                         f"mappo_algorithm: {mappo_args.mappo_algorithm} has none (its "
                         f"advantages are group-normalised)")
    if not data_args.dataset:
        raise ValueError("the mappo stage needs `dataset` (a MAPPO prompt set)")
    records = load_mappo_records(",".join(data_args.dataset), data_args.dataset_dir,
                                 data_args.max_samples)
    retriever = check_retriever(mappo_args)
    prepare_resume(training_args, mappo_args)
    history = logged_steps_until(training_args.output_dir, training_args.resume_from_checkpoint)

    tokenizer = load_tokenizer(model_args)["tokenizer"]
    tokenizer.padding_side = "left"
    policy = load_model(tokenizer, model_args, finetuning_args, is_trainable=True)
    if mappo_args.mappo_adapter_per_agent:
        from mmoa.agent_adapters import add_agent_adapters

        policy = add_agent_adapters(policy, mappo_args.optimized_agents)
    value_head = None
    if mappo_args.algorithm.value_head:  # grpo, ...: no critic is created, loaded or saved
        hidden = policy.config.get_text_config().hidden_size
        value_head = ValueHead(hidden).to(device=next(policy.parameters()).device)
    ref_model = None
    needs_reference = mappo_args.algorithm.needs_reference(mappo_args.mappo_kl_loss_coef)
    if finetuning_args.finetuning_type != "lora" and needs_reference:
        ref_model = create_ref_model(model_args, finetuning_args, add_valuehead=False)
        if ref_model is None:  # no `ref_model` given: a frozen copy of the starting weights
            ref_model = load_model(tokenizer, model_args, finetuning_args, is_trainable=False)
        ref_model.requires_grad_(False).eval()
    if value_head is not None and model_args.adapter_name_or_path and (
            Path(model_args.adapter_name_or_path[0]) / "value_head.safetensors").is_file():
        value_head.load(model_args.adapter_name_or_path[0])
    model = PolicyWithValue(policy, value_head, ref_model,
                            temperature=mappo_args.mappo_temperature,
                            agent_temperatures=mappo_args.agent_temperatures)
    # the trainer log (what the web UI reads) also carries the counterfactual credit's stats
    # and the updates skipped for a non-finite loss or gradient norm
    log_keys = [*plot_keys(mappo_args.algorithm),
                *counterfactual_log_keys(mappo_args.counterfactual_agents),
                "nonfinite_skips", "nonfinite_in_a_row"]

    trainer = MappoTrainer(
        model=model, tokenizer=tokenizer, template=data_args.template, records=records,
        retriever=retriever, args=training_args, mappo_args=mappo_args,
        ppo_epochs=finetuning_args.ppo_epochs, kl_target=finetuning_args.ppo_target,
        whiten_rewards=finetuning_args.ppo_whiten_rewards,
        callbacks=[MappoLogCallback(log_keys), *(callbacks or [])],
    )
    from mmoa.train.mappo.joint_retriever import build_joint_retriever

    build_joint_retriever(mappo_args, training_args, model_args, data_args, trainer)
    if history is not None and trainer.is_world_process_zero():
        # LLaMA-Factory's LogCallback deletes the log of a folder it may overwrite; a resumed
        # run keeps the steps up to its checkpoint (later lines were of the abandoned part).
        atomic_write_text(Path(training_args.output_dir) / TRAINER_LOG_FILE, history)
    return trainer, training_args, finetuning_args


def prepare_resume(training_args: Any, mappo_args: MappoArguments) -> None:
    """Before the model loads: remove what killed saves left in ``output_dir``, check the
    checkpoint to resume from against its manifest (or fall back to an earlier one with
    ``mappo_resume_fallback``) and point ``resume_from_checkpoint`` at the one chosen.

    The main process goes first (it cleans up); the others then check the same files, so that
    every process resumes from the same checkpoint or stops with the same error."""
    from mmoa.train.mappo.checkpoint_files import choose_resume_checkpoint, clean_orphans

    main = training_args.process_index == 0
    with training_args.main_process_first(local=False, desc="checking checkpoints"):
        if main:
            for line in clean_orphans(Path(training_args.output_dir)):
                mappo_logger().warning(f"[mappo] {line}")
        if not training_args.resume_from_checkpoint:
            return
        choice = choose_resume_checkpoint(training_args.resume_from_checkpoint,
                                          fallback=mappo_args.mappo_resume_fallback)
    if main:
        for line in choice.warnings:
            mappo_logger().warning(f"[mappo] {line}")
        if choice.verified:
            mappo_logger().info(f"[mappo] checkpoint {choice.folder} verified against its "
                                "manifest")
    training_args.resume_from_checkpoint = str(choice.folder)
