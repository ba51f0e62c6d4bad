"""The MAPPO fields of the Train tab and the YAML keys they become.

One table (:data:`MAPPO_FIELDS`) says, for every widget, its element name (registered by
LlamaBoard as ``train.<name>``), the config key it writes and how a widget value becomes a config
value. Defaults are read from :class:`~mmoa.train.mappo.args.MappoArguments` (and LLaMA-Factory's
``FinetuningArguments`` for ``ppo_epochs`` / ``ppo_target``), so the UI can never drift from what
``mmoa-cli train`` does when a key is left out of a YAML file.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

from mmoa.agents.prompts import AGENTS
from mmoa.metrics import SCORING_PROFILES
from mmoa.train.mappo.algorithms import Algorithm, algorithm_names, get_algorithm
from mmoa.train.mappo.args import GRPO_FILTERS, MappoArguments
from mmoa.train.mappo.ppo_math import (
    GROUP_NORMALISATIONS,
    KL_KINDS,
    KL_SHAPES,
    LOSS_AVERAGING,
)

if TYPE_CHECKING:
    from gradio.components import Component

Kind = Literal["text", "int", "float", "bool", "choice", "agents"]

#: Label of the stage in the Train tab's dropdown (LLaMA-Factory's TRAINING_STAGES key); short,
#: because that dropdown is narrow ("MAPPO (multi-agent RAG)" showed as "MAPPO (multi-ag").
MAPPO_STAGE_LABEL = "MAPPO (RAG)"

#: Standard LLaMA-Factory keys that the MAPPO accordion shows (they keep LLaMA-Factory's meaning).
LLAMAFACTORY_KEYS = ("ppo_epochs", "ppo_target")
#: Hugging Face ``TrainingArguments`` keys that the MAPPO accordion shows.
HF_KEYS = ("max_steps",)

#: ``MappoField.only_for``: which registered algorithms a field applies to, asked of the
#: algorithm's properties (the registry says which are grouped), never of its name.
ALGORITHM_CONDITIONS: dict[str, Any] = {
    "grouped": lambda a: a.grouped,  # group size, normalisation, zero-variance filter
    "kl_loss": lambda a: a.kl == "loss",  # the k3 KL loss term
    "kl_reward": lambda a: a.kl == "reward",  # the (adaptive) KL penalty in the reward
    "value_head": lambda a: a.value_head,  # GAE, per-agent whitening, the QR's retrieval reward
}


def _default(key: str, name: str = "") -> Any:
    """The stage's own default of ``key``; ``name`` (the element) tells the retriever_rl
    accordion's ``max_steps`` from MAPPO's."""
    if name.startswith("retriever_"):  # the retriever_rl stage's accordion
        from mmoa.train.retriever_rl.args import RetrieverRLArguments

        owner: type = RetrieverRLArguments
    elif key in LLAMAFACTORY_KEYS:
        from llamafactory.hparams import FinetuningArguments

        owner = FinetuningArguments
    elif key in HF_KEYS:
        from transformers import Seq2SeqTrainingArguments

        owner = Seq2SeqTrainingArguments
    else:
        owner = MappoArguments
    for f in fields(owner):
        if f.name == key:
            if f.default is MISSING:
                raise KeyError(f"{owner.__name__}.{key} has no default")
            return f.default
    raise KeyError(f"{key} is not a field of {owner.__name__}")


@dataclass(frozen=True)
class MappoField:
    """One widget of a stage's accordion (MAPPO's, or retriever_rl's) and the config key it
    fills; its default is the stage's own."""

    name: str  #: element name; LlamaBoard registers it as ``train.<name>``
    key: str  #: the YAML key (a ``MappoArguments`` or ``RetrieverRLArguments`` field, or
    #: ``ppo_epochs`` / ``ppo_target``)
    label: str
    info: str
    kind: Kind
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    #: An :data:`ALGORITHM_CONDITIONS` key: the field is shown, and written to the config, only
    #: under the algorithms it applies to (``None``: always).
    only_for: str | None = None
    #: 0 means "leave the key out" (the stage's automatic value), e.g. ``max_steps``.
    zero_unset: bool = False

    @property
    def default(self) -> Any:
        value = _default(self.key, self.name)
        if self.kind == "agents":
            return [a.strip() for a in str(value).split(",") if a.strip()]
        if self.kind == "int" and (value is None or (self.zero_unset and value < 0)):
            return 0  # "0 = automatic" for optional counts
        return value

    def applies_to(self, algorithm: str | Algorithm | None) -> bool:
        """Whether the field means anything under ``algorithm`` (a name; ``None``: the
        default algorithm); an unknown name shows every field (its error comes later)."""
        if self.only_for is None:
            return True
        if not isinstance(algorithm, Algorithm):
            try:
                algorithm = get_algorithm(algorithm or _default("mappo_algorithm"))
            except ValueError:
                return True
        return bool(ALGORITHM_CONDITIONS[self.only_for](algorithm))

    def make_component(self) -> Component:
        """An unrendered gradio component (rendered later inside the MAPPO accordion)."""
        import gradio as gr

        common: dict[str, Any] = {"label": self.label, "info": self.info, "render": False,
                                  "elem_id": f"mmoa-train-{self.name}",
                                  "visible": self.applies_to(None)}
        if self.kind == "text":
            return gr.Textbox(value=self.default, **common)
        if self.kind == "int":
            return gr.Number(value=self.default, precision=0, minimum=self.minimum, **common)
        if self.kind == "float":
            return gr.Number(value=self.default, minimum=self.minimum, **common)
        if self.kind == "bool":
            return gr.Checkbox(value=self.default, **common)
        if self.kind == "choice":
            return gr.Dropdown(choices=list(self.choices), value=self.default, **common)
        return gr.CheckboxGroup(choices=list(AGENTS), value=self.default, **common)

    def to_config(self, value: Any) -> Any:
        """The config value of a widget value; raises ``ValueError`` naming the field."""
        if self.kind == "agents":
            agents = [value] if isinstance(value, str) else list(value or [])
            return ",".join(a for a in AGENTS if a in agents)
        if self.kind == "text":
            return str(value or "").strip()
        if self.kind == "bool":
            return bool(value)
        if self.kind == "choice":
            return str(value)
        if value is None or value == "":
            raise ValueError(f"field {self.label!r} ({self.key}) is empty")
        try:
            number = float(value)
        except (TypeError, ValueError) as err:
            raise ValueError(f"field {self.label!r} ({self.key}): expected a number, got "
                             f"{value!r}") from err
        if self.kind == "int":
            if number != int(number):
                raise ValueError(f"field {self.label!r} ({self.key}): expected a whole "
                                 f"number, got {value!r}")
            if self.zero_unset and int(number) == 0:
                return None  # automatic (e.g. per-device batch size x gradient accumulation)
            return int(number)
        return number


MAPPO_FIELDS: tuple[MappoField, ...] = (
    # retrieval
    MappoField("mappo_retriever_url", "mappo_retriever_url", "Retriever URL",
               "the retrieval server (bash run_server.sh --index DIR); Check server shows "
               "what it serves", "text"),
    MappoField("mappo_top_k", "mappo_top_k", "Top-K candidates",
               "documents the Selector chooses from", "int", minimum=1),
    MappoField("mappo_agents", "mappo_agents", "Agents to optimise",
               "the others still act, with frozen behaviour", "agents"),
    MappoField("mappo_reward_metric", "mappo_reward_metric", "Shared reward",
               "score of the final answer", "choice", choices=("f1", "em", "acc")),
    MappoField("mappo_scoring", "mappo_scoring", "Scoring profile",
               "normaliser and rules of the reward (as the evaluation's --scoring)", "choice",
               choices=tuple(SCORING_PROFILES)),
    # penalties
    MappoField("mappo_qr_penalty", "mappo_qr_penalty", "QR penalty",
               "too many or too long sub-questions", "float"),
    MappoField("mappo_selector_penalty", "mappo_selector_penalty", "Selector penalty",
               "malformed or repeated document ids", "float"),
    MappoField("mappo_generator_penalty", "mappo_generator_penalty", "Generator penalty",
               "answers that are too long", "float"),
    # KL
    MappoField("mappo_adaptive_kl", "mappo_adaptive_kl", "Adaptive KL",
               "adapt the KL coefficient towards the KL target", "bool",
               only_for="kl_reward"),
    MappoField("mappo_init_kl_coef", "mappo_init_kl_coef", "Initial KL coefficient",
               "beta at the start: weight of the per-token KL to the warm start in each "
               "agent's reward (higher: stay closer to the SFT model)", "float", minimum=0,
               only_for="kl_reward"),
    MappoField("mappo_min_kl_coef", "mappo_min_kl_coef", "Minimum KL coefficient",
               "floor of the adaptive coefficient", "float", minimum=0, only_for="kl_reward"),
    MappoField("mappo_kl_target", "ppo_target", "KL target",
               "KL per step the adaptive controller steers towards (LLaMA-Factory's "
               "ppo_target)", "float", minimum=0, only_for="kl_reward"),
    MappoField("mappo_kl_horizon", "mappo_kl_horizon", "KL horizon",
               "adaptation speed of the controller (larger: slower)", "float", minimum=1,
               only_for="kl_reward"),
    MappoField("mappo_kl_reward", "mappo_kl_reward", "KL reward shape",
               "token: -beta x KL at every token (PPO's); mean: the response's mean KL, once "
               "on its last token (a response is not charged for its length)", "choice",
               choices=KL_SHAPES, only_for="kl_reward"),
    MappoField("mappo_kl_estimator", "mappo_kl_estimator", "KL estimator",
               "the per-token KL estimate paid: kl (k1, logp - logp_ref, PPO's) or "
               "low_var_kl (k3: never negative, lower variance), abs, mse", "choice",
               choices=KL_KINDS, only_for="kl_reward"),
    MappoField("mappo_agent_kl_scale", "mappo_agent_kl_scale", "Per-agent KL scale",
               "multipliers of beta by agent, e.g. selector=4 (empty: one beta for all)",
               "text", only_for="kl_reward"),
    # algorithm: every registered one (mmoa.train.mappo.algorithms); ppo is the paper's
    MappoField("mappo_algorithm", "mappo_algorithm", "Algorithm",
               "ppo: value head and GAE (the paper); grpo and the other grouped ones: "
               "group-relative, no critic (docs/mappo.md, Algorithms)", "choice",
               choices=algorithm_names()),
    MappoField("mappo_group_size", "mappo_group_size", "Group size (grouped)",
               "whole pipelines sampled per question; their rewards form one group",
               "int", minimum=1, only_for="grouped"),
    MappoField("mappo_grpo_normalise", "mappo_grpo_normalise", "Group normalisation (grouped)",
               "mean_std: (r - mean) / std; mean: r - mean (Dr. GRPO)", "choice",
               choices=GROUP_NORMALISATIONS, only_for="grouped"),
    MappoField("mappo_grpo_filter", "mappo_grpo_filter", "Zero-variance groups (grouped)",
               "skip: leave out the samples of groups whose rewards are all equal", "choice",
               choices=GRPO_FILTERS, only_for="grouped"),
    MappoField("mappo_loss_averaging", "mappo_loss_averaging", "Loss averaging",
               "token: over all tokens; sequence: per sample first; constant: Dr. GRPO's",
               "choice", choices=LOSS_AVERAGING),
    MappoField("mappo_kl_loss_coef", "mappo_kl_loss_coef", "KL loss coefficient",
               "weight of the k3 KL to the warm start as a loss term; 0 = off", "float",
               minimum=0, only_for="kl_loss"),
    # the joint recipe (docs/joint_mappo.md) and one LoRA adapter per agent
    MappoField("mappo_lam", "mappo_lam", "GAE lambda",
               "1.0 in the demo: with the paper's 0.95 the Selector collapsed to one document",
               "float", minimum=0, only_for="value_head"),
    MappoField("mappo_whiten_per_agent", "mappo_whiten_per_agent", "Whiten per agent",
               "centre and scale each agent's advantages over its own tokens", "bool",
               only_for="value_head"),
    MappoField("mappo_qr_retrieval_reward", "mappo_qr_retrieval_reward",
               "QR retrieval reward",
               "weight x share of the gold passages among the QR's candidates, added to its "
               "score (0.5 in the demo; 0 = the shared reward alone)", "float", minimum=0,
               only_for="value_head"),
    MappoField("mappo_selector_selection_reward", "mappo_selector_selection_reward",
               "Selector selection reward",
               "weight x F1 of the Selector's choice against the gold passages among its "
               "candidates, added to its score (0 = the shared reward alone)", "float",
               minimum=0, only_for="value_head"),
    MappoField("mappo_adapter_per_agent", "mappo_adapter_per_agent", "Adapter per agent",
               "LoRA only: one adapter per agent over one frozen base "
               "(docs/adapter_per_agent.md)", "bool"),
    # PPO and rollouts
    MappoField("mappo_max_steps", "max_steps", "Max steps",
               "MAPPO steps (rollout + update) to run; 0 = as many as the Epochs field gives",
               "int", minimum=0, zero_unset=True),
    MappoField("mappo_ppo_epochs", "ppo_epochs", "PPO epochs",
               "passes of the update over each step's rollouts", "int", minimum=1),
    MappoField("mappo_questions_per_rollout", "mappo_questions_per_rollout",
               "Questions per step", "0 = batch size x gradient accumulation", "int",
               minimum=0, zero_unset=True),
    MappoField("mappo_rollout_batch_size", "mappo_rollout_batch_size", "Rollout batch size",
               "pipelines per batched generate call", "int", minimum=1),
    MappoField("mappo_temperature", "mappo_temperature", "Temperature", "rollout sampling",
               "float", minimum=0),
    MappoField("mappo_top_p", "mappo_top_p", "Top-p", "rollout sampling", "float", minimum=0),
    MappoField("mappo_agent_temperature", "mappo_agent_temperature", "Per-agent temperature",
               "rollout temperatures by agent, e.g. selector=0.5 (empty: Temperature for all)",
               "text"),
    MappoField("mappo_masked_scoring", "mappo_masked_scoring", "Masked Selector scoring",
               "score the Selector's tokens under the grammar mask it sampled with", "bool"),
    MappoField("mappo_max_new_tokens_qr", "mappo_max_new_tokens_qr", "Max new tokens: QR",
               "longest sub-question list the Query Rewriter may write in a rollout "
               "(tokens; fewer: faster steps)", "int", minimum=1),
    MappoField("mappo_max_new_tokens_selector", "mappo_max_new_tokens_selector",
               "Max new tokens: Selector",
               "longest document-id list the Selector may write (e.g. Document0,Document3)",
               "int", minimum=1),
    MappoField("mappo_max_new_tokens_generator", "mappo_max_new_tokens_generator",
               "Max new tokens: Generator",
               "longest answer the Generator may write (answers are short: a few words)",
               "int", minimum=1),
)

#: How the accordion lays the fields out (one tuple per row).
MAPPO_ROWS: tuple[tuple[str, ...], ...] = (
    ("mappo_retriever_url", "mappo_top_k", "mappo_agents", "mappo_reward_metric",
     "mappo_scoring"),
    ("mappo_qr_penalty", "mappo_selector_penalty", "mappo_generator_penalty"),
    ("mappo_algorithm", "mappo_group_size", "mappo_grpo_normalise", "mappo_grpo_filter",
     "mappo_loss_averaging", "mappo_kl_loss_coef"),
    ("mappo_adaptive_kl", "mappo_init_kl_coef", "mappo_min_kl_coef", "mappo_kl_target",
     "mappo_kl_horizon", "mappo_kl_reward", "mappo_kl_estimator", "mappo_agent_kl_scale"),
    ("mappo_lam", "mappo_whiten_per_agent", "mappo_qr_retrieval_reward",
     "mappo_selector_selection_reward", "mappo_adapter_per_agent"),
    ("mappo_max_steps", "mappo_ppo_epochs", "mappo_questions_per_rollout",
     "mappo_rollout_batch_size", "mappo_temperature", "mappo_agent_temperature",
     "mappo_top_p", "mappo_masked_scoring"),
    ("mappo_max_new_tokens_qr", "mappo_max_new_tokens_selector",
     "mappo_max_new_tokens_generator"),
)

FIELDS_BY_NAME: dict[str, MappoField] = {f.name: f for f in MAPPO_FIELDS}


def config_from_values(values: dict[str, Any], algorithm: str | None = None) -> dict[str, Any]:
    """Config keys from ``{element name: widget value}``; ``None`` values mean "leave out".

    Fields that do not apply to the algorithm (``algorithm``, else the Algorithm widget's) are
    left out, so a ppo run's YAML holds no GRPO key the trainer would ignore."""
    algorithm = algorithm or values.get("mappo_algorithm")
    config: dict[str, Any] = {}
    for name, value in values.items():
        field = FIELDS_BY_NAME[name]
        if not field.applies_to(algorithm):
            continue
        converted = field.to_config(value)
        if converted is not None:
            config[field.key] = converted
    return config


def validate_config(config: dict[str, Any]) -> None:
    """Run the stage's own checks (``MappoArguments.__post_init__``) on the ``mappo_*`` keys."""
    ours = {k: v for k, v in config.items() if k.startswith("mappo_")}
    MappoArguments(**ours)


# ------------------------------------------------------------------------------- presets

#: "CPU demo": a run that shows its first logged step within about a minute on a 2-core CPU
#: with the demo model (SmolLM2-135M): the form's defaults (16 questions a step, 4 PPO epochs,
#: logging every 5 steps) gave no feedback for over five minutes. Keys are element ids
#: (``train.<name>``): LlamaBoard's fields and ours.
CPU_DEMO_PRESET: dict[str, Any] = {
    "train.mappo_max_steps": 2,
    "train.logging_steps": 1,
    "train.save_steps": 2,
    "train.batch_size": 2,
    "train.gradient_accumulation_steps": 1,
    "train.mappo_questions_per_rollout": 2,
    "train.mappo_rollout_batch_size": 2,
    "train.mappo_ppo_epochs": 1,
    "train.mappo_max_new_tokens_qr": 48,
    "train.mappo_max_new_tokens_selector": 16,
    "train.mappo_max_new_tokens_generator": 24,
}
PRESETS: dict[str, dict[str, Any]] = {"CPU demo": CPU_DEMO_PRESET}


def describe_preset(preset: dict[str, Any]) -> str:
    """One line that says what a preset sets (shown beside its button)."""
    return ", ".join(f"{elem_id.split('.', 1)[1].removeprefix('mappo_')} {value}"
                     for elem_id, value in preset.items())


def logging_warning(config: dict[str, Any]) -> str | None:
    """A warning when no step would be logged before the run ends (``logging_steps`` >
    ``max_steps``): the progress bar, the log and the plots then stay empty until the end,
    which on a CPU looks like a hung run. ``None`` when the settings are fine."""
    try:
        logging_steps = int(config.get("logging_steps") or 0)
        max_steps = int(config.get("max_steps") or 0)
    except (TypeError, ValueError):
        return None
    if max_steps <= 0 or logging_steps <= max_steps:
        return None
    return (f"Logging steps ({logging_steps}) is more than Max steps ({max_steps}): no step is "
            "logged, so the progress bar, the log and the plots stay empty until the run "
            "ends. Set Logging steps to 1 (the CPU demo preset does).")
