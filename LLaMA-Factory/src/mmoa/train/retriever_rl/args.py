"""Configuration of the ``retriever_rl`` stage: ``retriever_*`` keys plus the LLaMA-Factory keys
it honours, parsed strictly.

The stage trains a query encoder, not a causal LM, so its loop is its own and
``llamafactory.hparams.get_train_args`` (which knows nothing of this stage) is not called. The
LLaMA-Factory keys keep their meaning (``model_name_or_path`` is the frozen generator,
``learning_rate`` the encoder's), and every other key is refused by name: a key that would
be silently ignored (``finetuning_type``, ``per_device_train_batch_size``) is how a measured
run ends up being a different run than the one configured.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from mmoa import defaults
from mmoa.config_values import (
    as_number,
    check_clip_range,
    check_learning_rate,
    check_max_grad_norm,
    check_positive,
    check_range,
)
from mmoa.retrieval.client import DEFAULT_URL
from mmoa.retrieval.sampling import MAX_ALPHA, MIN_ALPHA
from mmoa.train.retriever_rl.state import QUERY_MODES

STAGE = "retriever_rl"
FINETUNING_TYPES = ("lora", "full")
GENERATOR_MODES = ("rag",)
#: ``f1``: token F1 of the frozen generator's answer (HARR); ``recall``: the fraction of the
#: question's gold passages among the sampled documents (needs them: ``supporting_ids``, or
#: the ``supporting_titles`` of HotpotQA / 2Wiki, matched by title), a
#: retrieval-only reward for data with passage labels and for checking the loop without an LLM
#: that can answer.
REWARDS = ("f1", "recall")
#: LLaMA-Factory keys that may appear in a config (shared files, the web UI) and mean nothing
#: to this stage; everything else that is not a field below is an error.
IGNORED_KEYS = frozenset({"stage", "do_train", "report_to", "overwrite_output_dir",
                          "trust_remote_code", "cutoff_len", "disable_gradient_checkpointing",
                          "preprocessing_num_workers", "overwrite_cache", "bf16", "fp16",
                          "pure_bf16"})


@dataclass
class RetrieverRLArguments:
    """Every setting of a ``retriever_rl`` run (see docs/retriever_rl.md for each key)."""

    # --- LLaMA-Factory keys (same meaning) ---
    #: The frozen generator (a local model folder; SmolLM2 in the demo).
    model_name_or_path: str
    template: str
    dataset: str
    output_dir: str
    dataset_dir: str = "data"
    max_samples: int | None = None
    learning_rate: float = 1e-5
    max_steps: int = 100
    save_steps: int = 50
    #: Keep only the newest N ``checkpoint-M`` folders (Hugging Face's key; 0 or None: all).
    save_total_limit: int | None = None
    logging_steps: int = 1
    seed: int = 42
    max_grad_norm: float = 1.0
    resume_from_checkpoint: str | None = None
    plot_loss: bool = True
    lr_scheduler_type: str = "constant"
    #: Run the query encoder and the frozen generator on the CPU even where CUDA is present
    #: (LLaMA-Factory's key; a config shared with the LLM stages may set it).
    use_cpu: bool = False

    # --- the retrieval server and the index whose passage vectors stay frozen ---
    retriever_url: str = DEFAULT_URL
    retriever_token: str | None = None
    retriever_timeout: float = 60.0
    #: The index folder the server serves: the trainer reads its passage vectors and meta.json.
    retriever_index: str = ""
    #: Initial query encoder folder (default: the encoder the index was built with).
    retriever_encoder: str | None = None

    # --- the stochastic retrieval policy (HARR's defaults) ---
    retriever_pool_size: int = defaults.RETRIEVER_POOL_SIZE
    retriever_top_k: int = defaults.RETRIEVER_TOP_K
    retriever_alpha: float = defaults.RETRIEVER_ALPHA

    # --- GRPO ---
    retriever_group_size: int = defaults.RETRIEVER_GROUP_SIZE
    retriever_questions_per_step: int = 4
    retriever_update_epochs: int = 1
    retriever_cliprange: float = defaults.RETRIEVER_CLIPRANGE
    retriever_grpo_normalise: str = "mean_std"

    # --- what is trained ---
    retriever_finetuning: str = "lora"
    retriever_lora_rank: int = 32
    retriever_lora_alpha: int = 64
    retriever_lora_dropout: float = 0.0
    retriever_lora_target: str = "query,key,value"

    # --- the frozen generator side ---
    retriever_generator: str = "rag"
    retriever_reward: str = "f1"
    #: With ``retriever_reward: recall`` the generator is not needed for the reward; ``false``
    #: skips it (no ``answer_f1`` in the log, ~4x faster steps on a CPU with SmolLM2).
    retriever_log_answer_f1: bool = True
    #: ``question``: one retrieval per question; ``decomposition``: one per reference
    #: sub-question, in order (see :mod:`.state`).
    retriever_queries: str = "question"
    #: HARR's history-aware state: earlier sub-queries and what they retrieved join the
    #: current sub-query (needs ``retriever_queries: decomposition``).
    retriever_history: bool = False
    retriever_generator_batch_size: int = 16
    retriever_max_new_tokens: int = defaults.MAX_NEW_TOKENS["generator"]

    # --- keeping the server's encoder current ---
    #: Reload the server's query encoder every this many updates (1: rollouts always use the
    #: current encoder; larger: cheaper, and the rollout log-probs of the stale encoder are
    #: the behaviour policy of the clipped ratio).
    retriever_reload_every: int = 1
    #: Steps in a row whose update was skipped for a non-finite loss or gradient norm before
    #: the run stops (a lone one is skipped, logged as ``nonfinite_skips``).
    retriever_max_nonfinite_steps: int = defaults.MAX_NONFINITE_STEPS
    #: Give the server back the index's own encoder when the run ends.
    retriever_restore_server_encoder: bool = True

    def __post_init__(self) -> None:
        def positive(name: str) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

        for name in ("max_steps", "save_steps", "logging_steps", "retriever_pool_size",
                     "retriever_top_k", "retriever_group_size", "retriever_questions_per_step",
                     "retriever_update_epochs", "retriever_lora_rank", "retriever_lora_alpha",
                     "retriever_generator_batch_size", "retriever_max_new_tokens",
                     "retriever_reload_every", "retriever_max_nonfinite_steps"):
            positive(name)
        limit = self.save_total_limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 0):
            raise ValueError(f"save_total_limit must be a non-negative integer (0 or null keeps "
                             f"every checkpoint), got {limit!r}")
        if self.retriever_top_k > self.retriever_pool_size:
            raise ValueError(f"retriever_top_k ({self.retriever_top_k}) must not exceed "
                             f"retriever_pool_size ({self.retriever_pool_size})")
        if self.retriever_group_size < 2:
            raise ValueError(f"retriever_group_size must be at least 2, got "
                             f"{self.retriever_group_size} (a group of one retrieval is its own "
                             f"baseline: every advantage is 0 and nothing is learned)")
        # the ranges every stage shares (mmoa.config_values): one line naming the key for
        # NaN, 1e-320, 1e+400 or a 400-digit integer
        self.learning_rate = check_learning_rate("learning_rate", self.learning_rate)
        self.max_grad_norm = check_max_grad_norm("max_grad_norm", self.max_grad_norm)
        self.retriever_cliprange = check_clip_range("retriever_cliprange",
                                                    self.retriever_cliprange, lower=True)
        self.retriever_timeout = check_positive("retriever_timeout", self.retriever_timeout)
        if not as_number("retriever_alpha", self.retriever_alpha) > 0:
            check_positive("retriever_alpha", self.retriever_alpha)
        self.retriever_alpha = check_range(
            "retriever_alpha", self.retriever_alpha, MIN_ALPHA, MAX_ALPHA,
            why=" (the server's range: beyond it score / alpha overflows and the loss is NaN)")
        self.retriever_lora_dropout = check_range("retriever_lora_dropout",
                                                  self.retriever_lora_dropout, 0.0, 1.0,
                                                  high_open=True)
        if self.retriever_finetuning not in FINETUNING_TYPES:
            raise ValueError(f"retriever_finetuning must be one of {list(FINETUNING_TYPES)}, "
                             f"got {self.retriever_finetuning!r}")
        if self.retriever_generator not in GENERATOR_MODES:
            raise ValueError(f"retriever_generator must be one of {list(GENERATOR_MODES)} (the "
                             f"plain RAG generator; the QR/S/G pipeline is not built yet), got "
                             f"{self.retriever_generator!r}")
        if self.retriever_reward not in REWARDS:
            raise ValueError(f"retriever_reward must be one of {list(REWARDS)}, got "
                             f"{self.retriever_reward!r}")
        if self.retriever_queries not in QUERY_MODES:
            raise ValueError(f"retriever_queries must be one of {list(QUERY_MODES)}, got "
                             f"{self.retriever_queries!r}")
        if not isinstance(self.retriever_history, bool):
            raise ValueError(f"retriever_history must be true or false, got "
                             f"{self.retriever_history!r}")
        if self.retriever_history and self.retriever_queries != "decomposition":
            raise ValueError("retriever_history: true needs retriever_queries: decomposition "
                             "(with one retrieval per question there is no history)")
        if self.retriever_grpo_normalise not in ("mean", "mean_std"):
            raise ValueError(f"retriever_grpo_normalise must be 'mean' or 'mean_std', got "
                             f"{self.retriever_grpo_normalise!r}")
        if self.lr_scheduler_type != "constant":
            raise ValueError(f"lr_scheduler_type must be 'constant' for stage {STAGE} (no "
                             f"schedule is implemented), got {self.lr_scheduler_type!r}")
        if not self.retriever_index:
            raise ValueError("retriever_index is required: the index folder the server serves "
                             "(the trainer reads its frozen passage vectors)")

    @property
    def lora_targets(self) -> list[str]:
        return [t.strip() for t in self.retriever_lora_target.split(",") if t.strip()]


def parse_retriever_rl_args(config: dict[str, Any]) -> RetrieverRLArguments:
    """The arguments of a merged config; unknown keys and missing required ones are errors."""
    if config.get("stage", STAGE) != STAGE:
        raise ValueError(f"stage is {config.get('stage')!r}, expected {STAGE!r}")
    known = {f.name for f in fields(RetrieverRLArguments)}
    unknown = sorted(set(config) - known - IGNORED_KEYS)
    if unknown:
        raise ValueError(f"stage {STAGE}: unknown key(s) {unknown}; the keys of this stage are "
                         f"listed in docs/retriever_rl.md")
    required = ("model_name_or_path", "template", "dataset", "output_dir")
    missing = [k for k in required if config.get(k) in (None, "")]
    if missing:
        raise ValueError(f"stage {STAGE}: required key(s) {missing} missing")
    # the types of every key, read by MAPPO's one check, with strings refused for booleans:
    # `plot_loss: "false"` was a non-empty string, so true
    from mmoa.config_values import typed_fields

    typed = typed_fields(RetrieverRLArguments, {k: v for k, v in config.items() if k in known},
                         bool_strings=False)
    return RetrieverRLArguments(**typed)
