"""The ``retriever_rl`` stage's fields of the Train tab (HARR: RL of the query encoder) and the
config the stage gets from LlamaBoard's form.

The stage has its own strict parser (:func:`mmoa.train.retriever_rl.args.parse_retriever_rl_args`
refuses every key it would ignore), while LlamaBoard's form always produces the keys of a causal-LM
run (``finetuning_type``, ``per_device_train_batch_size``, ``num_train_epochs``, a cosine
schedule...). :func:`stage_config` keeps what the stage reads from the form (model path =
the frozen generator, template, dataset, output folder, learning rate, logging/save steps,
max samples, seed) and drops the rest, which the accordion says in words; the accordion's
fields and the extra-arguments box give the ``retriever_*`` keys and ``max_steps``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from mmoa.train.retriever_rl.args import (
    FINETUNING_TYPES,
    IGNORED_KEYS,
    REWARDS,
    RetrieverRLArguments,
    parse_retriever_rl_args,
)
from mmoa.train.retriever_rl.state import QUERY_MODES
from mmoa.webui.mappo_fields import MappoField

#: Label of the stage in the Train tab's dropdown (short: the dropdown is narrow).
RETRIEVER_STAGE_LABEL = "Retriever RL (HARR)"

#: The form's keys the stage reads; every other LlamaBoard key is left out of its config.
FORM_KEYS = ("model_name_or_path", "template", "dataset", "dataset_dir", "output_dir",
             "learning_rate", "logging_steps", "save_steps", "max_samples", "max_grad_norm",
             "seed", "plot_loss")

RETRIEVER_FIELDS: tuple[MappoField, ...] = (
    MappoField("retriever_url", "retriever_url", "Retriever URL",
               "the retrieval server (mmoa-cli serve); it reloads the trained encoder",
               "text"),
    MappoField("retriever_index", "retriever_index", "Index folder",
               "the index the server serves (its passage vectors stay frozen)", "text"),
    MappoField("retriever_max_steps", "max_steps", "Steps", "GRPO updates of the encoder",
               "int", minimum=1),
    MappoField("retriever_reward", "retriever_reward", "Reward",
               "f1: the frozen generator's answer F1 (HARR); recall: gold passages found",
               "choice", choices=REWARDS),
    MappoField("retriever_queries", "retriever_queries", "Retrievals",
               "question: one per question; decomposition: one per reference sub-question",
               "choice", choices=QUERY_MODES),
    MappoField("retriever_history", "retriever_history", "History-aware state",
               "earlier sub-queries and observations join the state (decomposition)", "bool"),
    MappoField("retriever_log_answer_f1", "retriever_log_answer_f1", "Log answer F1",
               "with the recall reward: run the generator to log F1 (slower)", "bool"),
    MappoField("retriever_pool_size", "retriever_pool_size", "Pool size",
               "candidates sampled from", "int", minimum=1),
    MappoField("retriever_top_k", "retriever_top_k", "Top-k", "passages drawn in order",
               "int", minimum=1),
    MappoField("retriever_alpha", "retriever_alpha", "Alpha",
               "temperature of softmax(score / alpha)", "float", minimum=0),
    MappoField("retriever_group_size", "retriever_group_size", "Group size",
               "samples per question (GRPO)", "int", minimum=1),
    MappoField("retriever_questions_per_step", "retriever_questions_per_step",
               "Questions per step", "questions sampled for each update of the encoder", "int",
               minimum=1),
    MappoField("retriever_cliprange", "retriever_cliprange", "Clip range",
               "PPO clip of the ratio of new to old retrieval probabilities", "float",
               minimum=0),
    MappoField("retriever_finetuning", "retriever_finetuning", "Encoder fine-tuning",
               "LoRA on the encoder or all its weights", "choice", choices=FINETUNING_TYPES),
    MappoField("retriever_lora_rank", "retriever_lora_rank", "LoRA rank",
               "rank of the LoRA adapter on the encoder (LoRA fine-tuning only)", "int",
               minimum=1),
    MappoField("retriever_reload_every", "retriever_reload_every", "Reload every",
               "updates between two reloads of the server's encoder", "int", minimum=1),
)

RETRIEVER_ROWS: tuple[tuple[str, ...], ...] = (
    ("retriever_url", "retriever_index", "retriever_max_steps"),
    ("retriever_reward", "retriever_queries", "retriever_history", "retriever_log_answer_f1"),
    ("retriever_pool_size", "retriever_top_k", "retriever_alpha", "retriever_group_size",
     "retriever_questions_per_step", "retriever_cliprange"),
    ("retriever_finetuning", "retriever_lora_rank", "retriever_reload_every"),
)

_BY_NAME = {f.name: f for f in RETRIEVER_FIELDS}
_STAGE_KEYS = {f.name for f in fields(RetrieverRLArguments)}


def stage_config(form: dict[str, Any], values: dict[str, Any],
                 extra: dict[str, Any]) -> dict[str, Any]:
    """The ``stage: retriever_rl`` config of a form: LlamaBoard's ``form`` args (only
    :data:`FORM_KEYS`), the accordion's ``values`` ({element name: widget value}), then the
    extra-arguments box's keys that the stage knows (it wins, as everywhere in LlamaBoard)."""
    config: dict[str, Any] = {"stage": "retriever_rl", "do_train": True}
    config.update({k: form[k] for k in FORM_KEYS if form.get(k) is not None})
    for name, value in values.items():
        config[_BY_NAME[name].key] = _BY_NAME[name].to_config(value)
    config.update({k: v for k, v in extra.items() if k in _STAGE_KEYS or k in IGNORED_KEYS})
    return config


def validate(config: dict[str, Any]) -> None:
    """The stage's own checks (its parser), so the form fails before a run starts."""
    parse_retriever_rl_args(config)
