"""Our keys of the ``mappo`` stage, parsed before the rest goes to LLaMA-Factory.

LLaMA-Factory's ``get_train_args`` refuses keys it does not know, so every key of ours carries
the ``mappo_`` prefix and is split off here. Standard keys keep their LLaMA-Factory meaning:
``ppo_epochs`` (PPO epochs over each rollout), ``ppo_target`` (KL target of the adaptive
controller), ``ppo_whiten_rewards``, ``per_device_train_batch_size`` (PPO mini-batch),
``gradient_accumulation_steps``, ``learning_rate``, ``max_steps`` / ``num_train_epochs``, ...

Defaults are the paper's (MMOA-RAG, Table 6 and section 3.3): clip 0.2, value clip 0.2,
value-loss weight 0.1, gamma 1, lambda 0.95, adaptive KL from 0.2 with a floor of 0.06,
sampling temperature 0.95 / top-p 0.9, penalties -0.5 (QR), -1 (Selector), -0.5 (Generator).

``mappo_pipeline: search_agent`` trains the multi-turn search agent (RAG-R1 / Search-R1) instead of
the three agents: one policy, one sample per trajectory, the retrieved tokens masked out of the
loss (the ``mappo_search_*`` keys; docs/search_agent.md). ``mappo_pipeline: decision_agent``
(alias ``smart_rag``) trains the retrieve-or-answer decision agent (SmartRAG) on the same loop,
with the reward ``answer reward - retrieval cost x searches - malformed penalty`` (the
``mappo_decision_*`` keys; docs/decision_agent.md). The agent keys (``mappo_agents``,
``mappo_qr_*``, ``mappo_selector_*``, ``mappo_generator_*``, ``mappo_top_k``) are then not used.

``mappo_algorithm`` names a registered algorithm (:mod:`mmoa.train.mappo.algorithms`; docs/
mappo.md, "Algorithms"). ``grpo`` and the other grouped ones replace the critic by
group-relative advantages (``mappo_group_size`` rollouts of the whole pipeline per question);
the keys of the value head, GAE and the adaptive KL reward (``mappo_vf_coef``,
``mappo_cliprange_value``, ``mappo_gamma``, ``mappo_lam``, ``mappo_whiten_advantages``,
``mappo_whiten_per_agent``, ``mappo_*kl_coef``, ``mappo_adaptive_kl``, ``mappo_kl_horizon``) are
then not used, and the ``mappo_grpo_*`` keys and ``mappo_kl_loss_coef`` are.
"""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field, fields
from typing import Any

from mmoa import defaults
from mmoa.agents.generation_cache import GENERATION_CACHES
from mmoa.agents.prompts import AGENTS
from mmoa.config_values import (
    check_at_least,
    check_clip_range,
    check_learning_rate,
    check_max_grad_norm,
    check_positive,
    check_range,
    check_temperature,
    check_top_p,
    typed_fields,
    typed_value,
)
from mmoa.pipelines import Pipeline, get_pipeline, pipeline_names
from mmoa.retrieval.client import DEFAULT_URL
from mmoa.train.mappo.algorithms import LOSS_SCOPES, Algorithm, algorithm_names, get_algorithm
from mmoa.train.mappo.ppo_math import (
    GROUP_NORMALISATIONS,
    KL_KINDS,
    KL_SHAPES,
    LOSS_AVERAGING,
)

PREFIX = "mappo_"
#: Other names of a pipeline, read as the pipeline (SmartRAG's name for the decision agent).
PIPELINE_ALIASES = {"smart_rag": "decision_agent", "smartrag": "decision_agent"}
#: Keys read as another key of ours (the issue that asked for the search agent named it so).
ALIASES = {"mmoa_pipeline": "mappo_pipeline"}
#: ``mappo_grpo_filter``: what happens to the groups whose rollouts all scored the same.
GRPO_FILTERS: tuple[str, ...] = ("none", "skip")
#: Keys of comma-separated names that a config may also give as a YAML list.
LIST_KEYS: tuple[str, ...] = ("mappo_counterfactual_agents",)


def parse_agent_values(text: str, key: str, *, allow_zero: bool = True) -> dict[str, float]:
    """``"qr=2,selector=4"`` -> ``{"qr": 2.0, "selector": 4.0}``: a per-agent key's value (an
    agent not named keeps the shared setting). Each name one of
    :data:`~mmoa.agents.prompts.AGENTS` at most once, each number finite and >= 0 (> 0 without
    ``allow_zero``); errors name ``key``."""
    values: dict[str, float] = {}
    bound = ">= 0" if allow_zero else "> 0"
    for item in (part.strip() for part in str(text or "").split(",")):
        if not item:
            continue
        name, sep, value = (x.strip() for x in item.partition("="))
        if not sep or name not in AGENTS or name in values:
            raise ValueError(f"{key}: expected AGENT=NUMBER, each agent of "
                             f"{', '.join(AGENTS)} at most once, got {item!r}")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and (number >= 0 if allow_zero else number > 0)):
            raise ValueError(f"{key}: {name}'s value must be a finite number {bound}, "
                             f"got {value!r}")
        values[name] = number
    return values


def parse_agent_kl_scale(text: str) -> dict[str, float]:
    """``mappo_agent_kl_scale``: multipliers of the KL reward's coefficient, each >= 0."""
    return parse_agent_values(text, "mappo_agent_kl_scale")


def parse_agent_temperature(text: str) -> dict[str, float]:
    """``mappo_agent_temperature``: rollout temperatures by agent, each in the range of every
    sampling temperature (:func:`~mmoa.config_values.check_temperature`)."""
    values = parse_agent_values(text, "mappo_agent_temperature", allow_zero=False)
    for agent, value in values.items():
        check_temperature(f"mappo_agent_temperature: {agent}'s value", value)
    return values


@dataclass
class MappoArguments:
    """Everything MAPPO adds to a LLaMA-Factory config (all keys start with ``mappo_``)."""

    # retrieval
    mappo_retriever_url: str = field(
        default=DEFAULT_URL, metadata={"help": "URL of the retrieval server."}
    )
    mappo_retriever_token: str | None = field(default=None, metadata={"help": "Bearer token."})
    mappo_retriever_timeout: float = field(default=60.0, metadata={"help": "Seconds per call."})
    mappo_retriever_retries: int = field(default=5, metadata={"help": "Retries with backoff."})
    mappo_top_k: int = field(default=10, metadata={"help": "Candidate documents K."})

    # algorithm
    mappo_algorithm: str = field(
        default="ppo",
        metadata={"help": "A registered algorithm (docs/mappo.md, Algorithms): ppo (value "
                          "head, GAE; the paper), grpo (critic-free, group-relative advantages "
                          "over mappo_group_size rollouts), dr_grpo, rloo, reinforce_plus_plus, "
                          "reinforce_plus_plus_baseline, dapo or gspo."})
    mappo_group_size: int = field(
        default=defaults.GRPO_GROUP_SIZE,
        metadata={"help": "grouped algorithms (grpo, ...): rollouts of the whole pipeline per "
                          "question (G)."})
    mappo_grpo_normalise: str = field(
        default="mean_std",
        metadata={"help": "grpo: mean_std, (r - mean) / (std + eps), or mean, r - mean "
                          "(Dr. GRPO)."})
    mappo_grpo_filter: str = field(
        default="none",
        metadata={"help": "grpo: none, or skip: leave out the samples of groups whose G "
                          "rewards are equal (max - min <= 1e-9) and that no penalty moved."})
    mappo_loss_averaging: str = field(
        default="token",
        metadata={"help": "token (mean over tokens), sequence (mean of each sample's token "
                          "mean) or constant (sum over tokens / (samples x "
                          "mappo_loss_norm_length); Dr. GRPO). dapo, dr_grpo and gspo use "
                          "their own."})
    mappo_loss_scope: str | None = field(
        default=None,
        metadata={"help": "What a loss mean is over: micro_batch (each micro-batch its own "
                          "mean, divided by the accumulation count; ppo, grpo, ...) or batch "
                          "(every token or sample of an optimiser step, on every process: "
                          "dapo's and dr_grpo's default). Unset: the algorithm's."})
    mappo_loss_norm_length: int | None = field(
        default=None,
        metadata={"help": "The constant tokens per sample of the constant averaging (Dr. "
                          "GRPO's generation budget). Unset: the largest generation budget of "
                          "the optimised agents (qr_s_g: mappo_max_new_tokens_*; search and "
                          "decision agents: tokens per turn x turns)."})
    mappo_dapo_max_rounds: int = field(
        default=defaults.DAPO_MAX_ROUNDS,
        metadata={"help": "dapo's dynamic sampling: extra rollout rounds a step may make to "
                          "fill its batch with groups whose rewards differ (0: none, the "
                          "filter alone)."})
    mappo_overlong_buffer: float = field(
        default=defaults.OVERLONG_BUFFER,
        metadata={"help": "DAPO's soft overlong punishment (grouped algorithms, qr_s_g): the "
                          "buffer L_cache as a share of each agent's mappo_max_new_tokens_* "
                          "(L_max); a response longer than L_max - L_cache loses up to "
                          "mappo_overlong_penalty_factor of reward. 0: off (the paper: 0.2)."})
    mappo_overlong_penalty_factor: float = field(
        default=defaults.OVERLONG_PENALTY_FACTOR,
        metadata={"help": "The soft overlong punishment at L_max (the paper's 1)."})
    mappo_overlong_filter: bool = field(
        default=False,
        metadata={"help": "DAPO's overlong filtering (grouped algorithms, qr_s_g): responses "
                          "that reached their agent's mappo_max_new_tokens_* are left out of "
                          "the loss (their rewards still count in their groups)."})
    mappo_tis_cap: float | None = field(
        default=None,
        metadata={"help": "Truncated importance sampling (verl's TIS; qr_s_g): each token's "
                          "policy loss is multiplied by min(p_scored / p_sampled, cap), the "
                          "correction for sampling with the rollout copy, top-p and the "
                          f"Selector's grammar. Unset: off (verl and TRL use "
                          f"{defaults.TIS_CAP:g})."})
    mappo_kl_loss_coef: float = field(
        default=defaults.KL_LOSS_COEF,
        metadata={"help": "algorithms with a KL loss (grpo, ...): weight of the k3 "
                          "KL-to-reference loss term (0: off)."})

    # which pipeline is rolled out and trained
    mappo_pipeline: str = field(
        default="qr_s_g",
        metadata={"help": "qr_s_g (the three agents: Query Rewriter, Selector, Generator) or "
                          "search_agent (one multi-turn agent that searches with up to "
                          "mappo_search_max_queries parallel queries per turn; docs/"
                          "search_agent.md) or decision_agent (alias smart_rag: answer or "
                          "search with a cost per search; docs/decision_agent.md). "
                          "`mmoa_pipeline` is accepted as its alias."})
    mappo_search_max_turns: int = field(
        default=defaults.SEARCH_MAX_TURNS,
        metadata={"help": "search_agent: search rounds before the answer is forced."})
    mappo_search_max_queries: int = field(
        default=defaults.SEARCH_MAX_QUERIES,
        metadata={"help": "search_agent: queries allowed in one <search> (more ends the "
                          "trajectory as malformed)."})
    mappo_search_top_k: int = field(
        default=defaults.SEARCH_TOP_K,
        metadata={"help": "search_agent: documents per query in each <information> block."})
    mappo_max_new_tokens_search: int = field(
        default=defaults.SEARCH_MAX_NEW_TOKENS,
        metadata={"help": "search_agent: new tokens per model turn."})
    mappo_search_format_penalty: float = field(
        default=defaults.SEARCH_FORMAT_PENALTY,
        metadata={"help": "search_agent: added (<= 0) to the reward of a trajectory that ended "
                          "malformed (0: off)."})
    mappo_search_mask_information: bool = field(
        default=True,
        metadata={"help": "search_agent: keep the retrieved <information> tokens out of the "
                          "loss, KL, values and advantages (false only for the ablation)."})

    mappo_decision_max_searches: int = field(
        default=defaults.DECISION_MAX_SEARCHES,
        metadata={"help": "decision_agent: searches before the answer is forced (the quota; 0: "
                          "always answer at once)."})
    mappo_decision_top_k: int = field(
        default=defaults.DECISION_TOP_K,
        metadata={"help": "decision_agent: documents returned by one search."})
    mappo_max_new_tokens_decision: int = field(
        default=defaults.DECISION_MAX_NEW_TOKENS,
        metadata={"help": "decision_agent: new tokens per model turn."})
    mappo_decision_retrieval_cost: float = field(
        default=defaults.DECISION_RETRIEVAL_COST,
        metadata={"help": "decision_agent: subtracted from the reward per search (>= 0)."})
    mappo_decision_malformed_penalty: float = field(
        default=defaults.DECISION_MALFORMED_PENALTY,
        metadata={"help": "decision_agent: subtracted from the reward of a malformed "
                          "trajectory (>= 0)."})
    mappo_decision_answer_reward: str = field(
        default=defaults.DECISION_ANSWER_REWARD,
        metadata={"help": "decision_agent: the answer part of the reward: em_f1 (SmartRAG's "
                          "EM + F1), em or f1, under mappo_scoring."})

    # which agents learn (the others still act)
    mappo_agents: str = field(
        default="qr,selector,generator",
        metadata={"help": "Comma-separated agents to optimise: any of qr, selector, generator."},
    )

    mappo_adapter_per_agent: bool = field(
        default=False,
        metadata={"help": "With finetuning_type: lora: one LoRA adapter per optimised agent "
                          "(named after it) over one frozen base, instead of one adapter "
                          "shared by all agents; the base is every agent's KL reference "
                          "(docs/adapter_per_agent.md). Needs disable_gradient_checkpointing: "
                          "true and the qr_s_g pipeline."},
    )

    # rollout generation
    mappo_questions_per_rollout: int | None = field(
        default=None,
        metadata={"help": "Questions per step and process (default: per-device batch size x "
                          "gradient accumulation steps)."},
    )
    mappo_rollout_batch_size: int = field(
        default=16, metadata={"help": "Pipelines per batched generate call during rollouts "
                                      "(a question under ppo; under grpo each of a question's "
                                      "G rollouts counts, and a call holds whole groups)."}
    )
    mappo_forward_batch_size: int | None = field(
        default=None,
        metadata={"help": "Samples per forward pass when a rollout is scored (old and "
                          "reference log-probs, values) before the update (default: the "
                          "per-device batch size, at least 8). Larger on a GPU, where a "
                          "small model's forward is bound by kernel launches: fewer, fuller "
                          "passes."})
    mappo_temperature: float = field(default=defaults.ROLLOUT_TEMPERATURE,
                                     metadata={"help": "Sampling temperature."})
    mappo_top_p: float = field(default=defaults.ROLLOUT_TOP_P,
                               metadata={"help": "Nucleus sampling top-p."})
    mappo_agent_temperature: str = field(
        default="",
        metadata={"help": "Per-agent rollout temperatures, e.g. 'selector=0.5' (qr_s_g's "
                          "agents; the others mappo_temperature). An agent's tokens are "
                          "sampled and scored (new, old and reference log-probs, entropy) "
                          "at its own temperature. Empty: mappo_temperature for all."})
    mappo_max_new_tokens_qr: int = defaults.MAX_NEW_TOKENS["qr"]
    mappo_max_new_tokens_selector: int = defaults.MAX_NEW_TOKENS["selector"]
    mappo_max_new_tokens_generator: int = defaults.MAX_NEW_TOKENS["generator"]
    mappo_constrained_selector: bool = field(
        default=True, metadata={"help": "Grammar-constrained Selector decoding."}
    )
    mappo_masked_scoring: bool = field(
        default=False,
        metadata={"help": "Score the Selector's tokens under the grammar mask it sampled with "
                          "(new, old and reference log-probs and the entropy over the tokens "
                          "the grammar allowed), so that the optimised policy and its KL are "
                          "those of the masked sampler. qr_s_g with mappo_constrained_selector."},
    )
    mappo_log_behaviour_ratio: bool = field(
        default=False,
        metadata={"help": "Log behaviour_ratio/*: the scored over the sampled probability of "
                          "each rollout token (costs the scores of every generation step)."},
    )

    mappo_generation_cache: str = field(
        default=defaults.ROLLOUT_GENERATION_CACHE,
        metadata={"help": "KV cache of the rollouts' generate calls: dynamic, static (compiled "
                          "decoding on CUDA) or auto (static on CUDA where the weights are in "
                          "the compute dtype, dynamic elsewhere; the default)."},
    )

    # rewards and penalties
    mappo_reward_metric: str = field(default="f1", metadata={"help": "f1, em or acc."})
    mappo_scoring: str = field(
        default="mmoa",
        metadata={"help": "Scoring profile of the shared reward, as for the evaluation "
                          "(mmoa, squad or hotpotqa; see mmoa.metrics.SCORING_PROFILES)."})
    mappo_qr_penalty: float = defaults.QR_PENALTY
    mappo_qr_max_subquestions: int = field(
        default=defaults.QR_MAX_SUBQUESTIONS,
        metadata={"help": "Sub-questions kept from the Query Rewriter's output; more written "
                          "costs mappo_qr_penalty."})
    mappo_qr_max_chars: int = defaults.QR_MAX_CHARS
    mappo_qr_retrieval_reward: float = field(
        default=0.0,
        metadata={"help": "Weight of the Query Rewriter's retrieval reward, added to its "
                          "score: weight x the share of the question's gold passages among "
                          "the K candidates its sub-questions retrieved (training data with "
                          "gold passages only; qr_s_g, value-head algorithms). 0: off, the "
                          "paper's shared reward alone."})
    mappo_selector_selection_reward: float = field(
        default=0.0,
        metadata={"help": "Weight of the Selector's selection reward, added to its score: "
                          "weight x the F1 of its selection against the gold passages among "
                          "its candidates (training data with gold passages only; qr_s_g, "
                          "value-head algorithms). 0: off, the paper's shared reward alone."})
    mappo_counterfactual_agents: str = field(
        default="",
        metadata={"help": "Counterfactual credit (qr_s_g): comma-separated agents among qr, "
                          "selector (a YAML list also works) whose part of the shared reward is "
                          "their gain R - R_cf over the same pipeline, in the same rollout, with "
                          "their output replaced by a default (qr: the question as the only "
                          "sub-question; selector: mappo_counterfactual_selector_default). Each "
                          "must be optimised (mappo_agents). Empty: off, the shared reward."})
    mappo_counterfactual_selector_default: str = field(
        default="all",
        metadata={"help": "The Selector's default for its counterfactual credit: all (every "
                          "candidate: the gain over the pipeline without a Selector, s3's gain "
                          "beyond RAG) or top1 (the top candidate: the gain over the constant "
                          "a collapsed Selector keeps). The expected gradient is the same."})
    mappo_selector_penalty: float = defaults.SELECTOR_PENALTY
    mappo_generator_penalty: float = defaults.GENERATOR_PENALTY
    mappo_generator_max_words: int = defaults.GENERATOR_MAX_WORDS

    # PPO
    mappo_adaptive_kl: bool = True
    mappo_init_kl_coef: float = defaults.INIT_KL_COEF
    mappo_kl_horizon: float = defaults.KL_HORIZON
    mappo_min_kl_coef: float = defaults.MIN_KL_COEF
    mappo_agent_kl_scale: str = field(
        default="",
        metadata={"help": "Per-agent multipliers of the KL-to-warm-start reward, e.g. "
                          "'selector=4' or 'qr=2,selector=4' (qr_s_g's agents; the others "
                          "1): the KL that keeps an agent near its warm start, strengthened "
                          "for one that drifts (the Selector's collapse to one document). "
                          "Empty: one coefficient for all."})
    mappo_kl_reward: str = field(
        default="token",
        metadata={"help": "How the KL-to-warm-start reward is paid over a response: 'token' "
                          "(-beta x KL at every token, PPO's) or 'mean' (-beta x the mean "
                          "per-token KL, once, on the last token: a response is not charged "
                          "for its length, so a strong KL does not reward short outputs)."})
    mappo_kl_estimator: str = field(
        default="kl",
        metadata={"help": "The per-token estimate of the KL to the warm start paid in the "
                          "reward: 'kl' (k1, logp - logp_ref, PPO's and the original's), "
                          "'low_var_kl' (k3, Schulman's: never negative, lower variance; "
                          "verl's kl_penalty), 'abs' or 'mse'."})
    mappo_cliprange: float | None = field(
        default=None,
        metadata={"help": "Lower clip range: ratios are clipped to [1 - mappo_cliprange, "
                          "1 + mappo_cliprange_high]. Unset: the algorithm's (gspo: 3e-4), "
                          "else 0.2."})
    mappo_cliprange_high: float | None = field(
        default=None,
        metadata={"help": "Upper clip range (clip-higher, DAPO): ratios are clipped to "
                          "[1 - mappo_cliprange, 1 + mappo_cliprange_high]; unset: the "
                          "algorithm's (dapo: 0.28, gspo: 4e-4), else mappo_cliprange."})
    mappo_cliprange_value: float = defaults.CLIPRANGE_VALUE
    mappo_vf_coef: float = defaults.VF_COEF
    mappo_gamma: float = defaults.GAMMA
    mappo_lam: float = defaults.LAM
    mappo_ratio_threshold: float = field(
        default=defaults.RATIO_THRESHOLD,
        metadata={"help": "Skip a PPO mini-batch whose mean probability ratio is above this."})
    mappo_whiten_advantages: bool = True
    mappo_whiten_per_agent: bool = field(
        default=False,
        metadata={"help": "With mappo_whiten_advantages: whiten each agent's advantages over "
                          "its own tokens (per-agent baselines) instead of the pooled batch."})
    mappo_max_nonfinite_steps: int = field(
        default=defaults.MAX_NONFINITE_STEPS,
        metadata={"help": "Steps in a row whose every update was skipped for a non-finite loss "
                          "or gradient norm before the run stops (each such step is logged, "
                          "nonfinite_skips in trainer_log.jsonl)."})

    # the joint option: query-encoder updates (HARR) between MAPPO updates
    mappo_joint_retriever: str | None = field(
        default=None,
        metadata={"help": "A retriever_rl config: its query encoder is trained with GRPO "
                          "between MAPPO steps and served to the rollouts (train/mappo/"
                          "joint_retriever.py, docs/retriever_rl.md)."})
    mappo_joint_retriever_every: int = field(
        default=1, metadata={"help": "MAPPO steps between two retriever phases."})
    mappo_joint_retriever_steps: int = field(
        default=1, metadata={"help": "Query-encoder GRPO steps per retriever phase."})

    # checkpoints
    mappo_resume_fallback: bool = field(
        default=False,
        metadata={"help": "When resume_from_checkpoint fails its manifest check (a damaged "
                          "file), resume from the newest earlier checkpoint that verifies "
                          "instead of stopping."},
    )

    def __post_init__(self) -> None:
        agents = self.optimized_agents
        unknown = [a for a in agents if a not in AGENTS]
        if unknown or not agents:
            raise ValueError(
                f"mappo_agents must name one or more of {', '.join(AGENTS)}; got "
                f"{self.mappo_agents!r}"
            )
        if self.mappo_reward_metric not in ("f1", "em", "acc"):
            raise ValueError(f"mappo_reward_metric must be f1, em or acc, got "
                             f"{self.mappo_reward_metric!r}")
        for name in ("mappo_top_k", "mappo_rollout_batch_size", "mappo_forward_batch_size",
                     "mappo_max_new_tokens_qr", "mappo_max_new_tokens_selector",
                     "mappo_max_new_tokens_generator"):
            # None: the default (mappo_forward_batch_size)
            check_at_least(name, getattr(self, name))
        from mmoa.metrics import get_profile
        from mmoa.train.mappo.rewards import DECISION_ANSWER_REWARDS

        self.mappo_pipeline = PIPELINE_ALIASES.get(self.mappo_pipeline, self.mappo_pipeline)
        get_profile(self.mappo_scoring)  # an unknown name fails here, before any model loads
        for name, choices in (("mappo_pipeline", pipeline_names()),
                              ("mappo_algorithm", algorithm_names()),
                              ("mappo_decision_answer_reward", DECISION_ANSWER_REWARDS),
                              ("mappo_grpo_normalise", GROUP_NORMALISATIONS),
                              ("mappo_grpo_filter", GRPO_FILTERS),
                              ("mappo_loss_averaging", LOSS_AVERAGING),
                              ("mappo_loss_scope", (None, *LOSS_SCOPES)),
                              ("mappo_kl_reward", KL_SHAPES),
                              ("mappo_kl_estimator", KL_KINDS),
                              ("mappo_generation_cache", GENERATION_CACHES)):
            if getattr(self, name) not in choices:
                named = ", ".join(c for c in choices if c is not None)
                raise ValueError(f"{name} must be one of {named}, got "
                                 f"{getattr(self, name)!r}")
        self.mappo_top_p = check_top_p("mappo_top_p", self.mappo_top_p)
        self.mappo_temperature = check_temperature("mappo_temperature", self.mappo_temperature)
        temperatures = self.agent_temperatures  # parsed here: a bad value fails before loading
        if temperatures and self.is_multiturn:
            raise ValueError(f"mappo_agent_temperature names the agents of the qr_s_g pipeline; "
                             f"mappo_pipeline: {self.mappo_pipeline} has one agent, whose "
                             f"temperature is mappo_temperature")
        if self.mappo_masked_scoring and (self.is_multiturn
                                          or not self.mappo_constrained_selector):
            raise ValueError("mappo_masked_scoring scores the qr_s_g Selector under its grammar "
                             "mask: it needs mappo_pipeline: qr_s_g and "
                             "mappo_constrained_selector: true")
        self._check_ranges()
        self._check_algorithm()
        self._check_counterfactual()
        if self.mappo_adapter_per_agent and self.is_multiturn:
            raise ValueError(f"mappo_adapter_per_agent gives each agent of the qr_s_g pipeline "
                             f"its own adapter; mappo_pipeline: {self.mappo_pipeline} has one "
                             f"agent, whose one adapter is finetuning_type: lora without it")

    def _check_ranges(self) -> None:
        """Values the PPO maths accepts without complaint but that train something else than
        asked (a negative clip range clips every ratio, gamma 1.5 grows returns geometrically),
        or that fail later with a message naming no key."""
        for name in ("mappo_qr_max_subquestions", "mappo_qr_max_chars",
                     "mappo_generator_max_words", "mappo_max_nonfinite_steps",
                     "mappo_group_size", "mappo_search_max_turns",
                     "mappo_search_max_queries", "mappo_search_top_k",
                     "mappo_max_new_tokens_search", "mappo_decision_top_k",
                     "mappo_max_new_tokens_decision", "mappo_joint_retriever_every",
                     "mappo_joint_retriever_steps"):
            check_at_least(name, getattr(self, name))
        if self.algorithm.grouped and self.mappo_group_size < 2:
            raise ValueError(f"mappo_group_size must be at least 2 under mappo_algorithm: "
                             f"{self.mappo_algorithm}, "
                             f"got {self.mappo_group_size} (a group of one rollout is its own "
                             f"baseline: every advantage is 0 and nothing is learned)")
        if self.mappo_questions_per_rollout is not None and self.mappo_questions_per_rollout < 0:
            raise ValueError("mappo_questions_per_rollout must be at least 1 (0 or unset: per-"
                             "device batch size x gradient accumulation steps), got "
                             f"{self.mappo_questions_per_rollout}")
        if self.mappo_retriever_retries < 0:
            raise ValueError(f"mappo_retriever_retries must be >= 0, got "
                             f"{self.mappo_retriever_retries}")
        for name in ("mappo_retriever_timeout", "mappo_kl_horizon", "mappo_ratio_threshold",
                     "mappo_tis_cap"):
            value = getattr(self, name)
            if value is not None:  # mappo_tis_cap unset: TIS off
                check_positive(name, value)
        if self.mappo_cliprange is not None:  # unset: the algorithm's clip range
            check_clip_range("mappo_cliprange", self.mappo_cliprange, lower=True)
        check_clip_range("mappo_cliprange_value", self.mappo_cliprange_value)
        for name in ("mappo_vf_coef", "mappo_init_kl_coef", "mappo_min_kl_coef",
                     "mappo_kl_loss_coef"):
            check_range(name, getattr(self, name))
        for name in ("mappo_gamma", "mappo_lam"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        check_at_least("mappo_decision_max_searches", self.mappo_decision_max_searches, 0)
        for name in ("mappo_decision_retrieval_cost", "mappo_decision_malformed_penalty"):
            check_range(name, getattr(self, name), why=" (it is subtracted from the reward)")
        for name, agent in (("mappo_qr_retrieval_reward", "the Query Rewriter"),
                            ("mappo_selector_selection_reward", "the Selector")):
            weight = getattr(self, name)
            check_range(name, weight, why=f" (a reward added to {agent}'s score)")
            if weight > 0 and self.algorithm.grouped:
                raise ValueError(f"{name} is learned against the value head's baseline; "
                                 f"mappo_algorithm: {self.mappo_algorithm} has none (use a "
                                 f"value-head algorithm such as ppo, or set it to 0)")
        penalty = self.mappo_search_format_penalty
        if not (math.isfinite(penalty) and penalty <= 0):
            raise ValueError(f"mappo_search_format_penalty must be a finite number <= 0 (it is "
                             f"added to the reward), got {penalty}")
        default = {f.name: f.default for f in fields(self)}
        for name in ("mappo_kl_reward", "mappo_kl_estimator"):
            if getattr(self, name) != default[name] and self.algorithm.kl != "reward":
                raise ValueError(f"{name} shapes the KL in the reward; mappo_algorithm: "
                                 f"{self.mappo_algorithm} has none")
        scales = self.agent_kl_scales  # parsed here, so a bad value fails before loading
        if scales and self.algorithm.kl != "reward":
            raise ValueError(f"mappo_agent_kl_scale scales the KL in the reward "
                             f"(mappo_init_kl_coef); mappo_algorithm: {self.mappo_algorithm} "
                             f"has none")
        if self.algorithm.kl != "loss" and self.mappo_kl_loss_coef > 0:
            with_loss = [a.name for a in map(get_algorithm, algorithm_names()) if a.kl == "loss"]
            raise ValueError(f"mappo_kl_loss_coef is the KL loss of mappo_algorithm: "
                             f"{', '.join(with_loss)}; {self.mappo_algorithm} puts the KL in the "
                             f"reward (mappo_init_kl_coef)")

    def _check_algorithm(self) -> None:
        """Keys that contradict the algorithm: a group normalisation it does not use, a loss
        averaging other than the one it prescribes, an upper clip range that is not a
        positive number."""
        algorithm = self.algorithm
        if algorithm.grouped:
            algorithm.group_advantage(self.mappo_grpo_normalise)  # raises on a contradiction
        prescribed = algorithm.loss_averaging
        if prescribed and self.mappo_loss_averaging not in ("token", prescribed):
            raise ValueError(f"mappo_algorithm: {algorithm.name} averages its loss by "
                             f"{prescribed}; remove mappo_loss_averaging: "
                             f"{self.mappo_loss_averaging}")
        if self.mappo_cliprange_high is not None:
            check_clip_range("mappo_cliprange_high", self.mappo_cliprange_high)
        if algorithm.batch_whitened and (not self.mappo_whiten_advantages
                                         or self.mappo_whiten_per_agent):
            key = ("mappo_whiten_advantages: false" if not self.mappo_whiten_advantages
                   else "mappo_whiten_per_agent: true")
            raise ValueError(f"{key}: mappo_algorithm: {algorithm.name} normalises its "
                             f"advantages over the whole batch by definition (REINFORCE++'s "
                             f"global batch normalisation); remove the key")
        self._check_loss_keys(algorithm)
        self._check_dapo_keys(algorithm)

    def _check_loss_keys(self, algorithm: Algorithm) -> None:
        """The constant of the ``constant`` averaging only where that averaging is used."""
        length = check_at_least("mappo_loss_norm_length", self.mappo_loss_norm_length)
        averaging = algorithm.resolve_loss_averaging(self.mappo_loss_averaging)
        if length is not None and averaging != "constant":
            raise ValueError(f"mappo_loss_norm_length is the constant of mappo_loss_averaging: "
                             f"constant; mappo_algorithm: {algorithm.name} averages by "
                             f"{averaging}")
        if self.mappo_tis_cap is not None and self.is_multiturn:
            raise ValueError(f"mappo_tis_cap needs each token's sampling log-prob, which only "
                             f"the qr_s_g pipeline records; mappo_pipeline: "
                             f"{self.mappo_pipeline} does not")

    def _check_dapo_keys(self, algorithm: Algorithm) -> None:
        """DAPO's options: the refill rounds under dynamic sampling only; the overlong
        shaping and filter under a grouped algorithm of the qr_s_g pipeline (the reward of an
        agent's response length enters its group, and only the three agents have one
        generation budget per response)."""
        rounds = self.mappo_dapo_max_rounds
        check_at_least("mappo_dapo_max_rounds", rounds, 0)
        if rounds != defaults.DAPO_MAX_ROUNDS and not algorithm.dynamic_sampling:
            sampling = [a.name for a in map(get_algorithm, algorithm_names())
                        if a.dynamic_sampling]
            raise ValueError(f"mappo_dapo_max_rounds refills the batch of the dynamic sampling "
                             f"of mappo_algorithm: {', '.join(sampling)}; "
                             f"{algorithm.name} has none")
        buffer, factor = self.mappo_overlong_buffer, self.mappo_overlong_penalty_factor
        if not (math.isfinite(buffer) and 0 <= buffer <= 1):
            raise ValueError(f"mappo_overlong_buffer must be a share in [0, 1] of each agent's "
                             f"generation budget, got {buffer}")
        check_range("mappo_overlong_penalty_factor", factor)
        for key, on in (("mappo_overlong_buffer", buffer > 0),
                        ("mappo_overlong_filter", self.mappo_overlong_filter)):
            if on and not algorithm.grouped:
                raise ValueError(f"{key} shapes the rewards of a group of rollouts; "
                                 f"mappo_algorithm: {algorithm.name} has no groups")
            if on and self.is_multiturn:
                raise ValueError(f"{key} needs one generation budget per response (the qr_s_g "
                                 f"agents'); mappo_pipeline: {self.mappo_pipeline} has turns")

    def _check_counterfactual(self) -> None:
        """The counterfactual credit's agents: each one the pipeline has a default for, named
        once and optimised (a counterfactual of an agent that does not learn would be generated
        for nothing); the Selector's default one of its choices."""
        from mmoa.pipelines.counterfactual import SELECTOR_DEFAULTS

        key = "mappo_counterfactual_agents"
        if self.mappo_counterfactual_selector_default not in SELECTOR_DEFAULTS:
            raise ValueError(f"mappo_counterfactual_selector_default must be one of "
                             f"{', '.join(SELECTOR_DEFAULTS)}, got "
                             f"{self.mappo_counterfactual_selector_default!r}")
        agents = self.counterfactual_agents
        choices = tuple(self.pipeline.counterfactual_agents)
        if agents and not choices:
            raise ValueError(f"{key}: mappo_pipeline: {self.mappo_pipeline} has no agent whose "
                             f"output has a default; leave it empty")
        if any(a not in choices for a in agents) or len(set(agents)) != len(agents):
            raise ValueError(f"{key} must name agents among {', '.join(choices)}, each at most "
                             f"once, got {self.mappo_counterfactual_agents!r}")
        idle = [a for a in agents if a not in self.optimized_agents]
        if idle:
            raise ValueError(f"{key} names {', '.join(idle)}, which mappo_agents does not "
                             f"optimise: its counterfactual would be generated for nothing")

    @property
    def counterfactual_agents(self) -> tuple[str, ...]:
        """``mappo_counterfactual_agents`` as a tuple (empty: the credit is off)."""
        return tuple(a.strip() for a in self.mappo_counterfactual_agents.split(",")
                     if a.strip())

    @property
    def agent_kl_scales(self) -> dict[str, float]:
        """``mappo_agent_kl_scale`` as ``{agent: multiplier}`` (agents not named: 1)."""
        return parse_agent_kl_scale(self.mappo_agent_kl_scale)

    @property
    def agent_temperatures(self) -> dict[str, float]:
        """``mappo_agent_temperature`` as ``{agent: temperature}`` (agents not named:
        ``mappo_temperature``)."""
        return parse_agent_temperature(self.mappo_agent_temperature)

    def startup_warnings(self) -> list[str]:
        """Valid settings known to mislead a run, each as the line the trainer logs once at its
        start: both concern the grammar-constrained Selector scored over the whole vocabulary
        (``mappo_masked_scoring`` off), whose sampled tokens then carry only the mass its
        grammar allows."""
        unmasked_selector = (not self.is_multiturn and "selector" in self.optimized_agents
                             and self.mappo_constrained_selector
                             and not self.mappo_masked_scoring)
        if not unmasked_selector:
            return []
        warnings = []
        if self.mappo_tis_cap is not None:
            warnings.append(
                "mappo_tis_cap with the grammar-constrained Selector scored over the whole "
                "vocabulary: its tokens' weights are the mass its grammar allows (about 1e-3 on "
                "the tiny model), so its updates nearly vanish; set mappo_masked_scoring: true "
                "to score it as it was sampled")
        scale = self.agent_kl_scales.get("selector", 1.0)
        if self.algorithm.kl == "reward" and self.mappo_kl_estimator == "kl" and scale > 1:
            warnings.append(
                f"mappo_agent_kl_scale: selector={scale:g} with the grammar-constrained Selector "
                f"scored over the whole vocabulary: its k1 KL goes negative once the policy puts "
                f"mass on tokens the grammar forbids, and the scaled KL reward pays that as a "
                f"bonus (x4 on the HotpotQA distractor set: -0.72 nats a token, about 0.56 a "
                f"response, over steps 37-40); set mappo_masked_scoring: true")
        return warnings

    @property
    def algorithm(self) -> Algorithm:
        """The registered algorithm ``mappo_algorithm`` names: what the trainer, workflow and
        rollouts ask (value head? groups? KL as a reward or a loss?)."""
        return get_algorithm(self.mappo_algorithm)

    @property
    def group_advantage(self) -> str:
        """The registered group advantage of a grouped algorithm (``mappo_grpo_normalise``
        under grpo)."""
        return self.algorithm.group_advantage(self.mappo_grpo_normalise)

    @property
    def group_filter(self) -> str:
        """The effective ``mappo_grpo_filter`` (dapo's dynamic sampling: ``skip``)."""
        return self.algorithm.group_filter(self.mappo_grpo_filter)

    @property
    def pipeline(self) -> Pipeline:
        """The registered pipeline ``mappo_pipeline`` names: what the trainer rolls out and how
        its traces become samples."""
        return get_pipeline(self.mappo_pipeline)

    @property
    def is_search_agent(self) -> bool:
        return self.mappo_pipeline == "search_agent"

    @property
    def is_decision_agent(self) -> bool:
        return self.mappo_pipeline == "decision_agent"

    @property
    def is_multiturn(self) -> bool:
        """One policy, one sample per multi-turn trajectory (search or decision agent)."""
        return self.is_search_agent or self.is_decision_agent

    @property
    def rollouts_per_question(self) -> int:
        """Pipelines sampled per question and step: G under a grouped algorithm (grpo, ...),
        1 otherwise (ppo, reinforce_plus_plus)."""
        return self.mappo_group_size if self.algorithm.grouped else 1

    @property
    def optimized_agents(self) -> tuple[str, ...]:
        return tuple(a.strip() for a in self.mappo_agents.split(",") if a.strip())

    def max_new_tokens(self) -> dict[str, int]:
        return {"qr": self.mappo_max_new_tokens_qr,
                "selector": self.mappo_max_new_tokens_selector,
                "generator": self.mappo_max_new_tokens_generator}

    @property
    def record_sampling_logprobs(self) -> bool:
        """Whether rollouts record each token's log-prob under the sampler's distribution:
        for the behaviour-ratio log and for truncated importance sampling."""
        return self.mappo_log_behaviour_ratio or self.mappo_tis_cap is not None

    @property
    def loss_norm_length(self) -> int:
        """The constant tokens per sample of the ``constant`` averaging: the configured one,
        else the most tokens an optimised agent may write in one response (Dr. GRPO divides
        by the generation budget, so the gradient's scale does not move with the step's
        longest response). The multi-turn agents write up to their per-turn budget in every
        turn (retrieved tokens are masked out of the sum, so they are not counted)."""
        if self.mappo_loss_norm_length is not None:
            return self.mappo_loss_norm_length
        if self.is_search_agent:
            return self.mappo_max_new_tokens_search * (self.mappo_search_max_turns + 1)
        if self.is_decision_agent:
            return self.mappo_max_new_tokens_decision * (self.mappo_decision_max_searches + 1)
        budgets = self.max_new_tokens()
        return max(budgets[agent] for agent in self.optimized_agents)

    @property
    def overlong_limits(self) -> dict[str, int]:
        """``agent -> L_max``, each optimised agent's generation budget: what DAPO's overlong
        shaping and filter measure a response against (empty with both off)."""
        if self.mappo_overlong_buffer <= 0 and not self.mappo_overlong_filter:
            return {}
        budgets = self.max_new_tokens()
        return {agent: budgets[agent] for agent in self.optimized_agents}


def split_mappo_args(config: dict[str, Any]) -> tuple[MappoArguments, dict[str, Any]]:
    """``(our arguments, the rest for llamafactory)``; unknown ``mappo_*`` keys are an error."""
    known = {f.name for f in fields(MappoArguments)}
    config = dict(config)
    for alias, key in ALIASES.items():
        if alias in config:
            if key in config and config[key] != config[alias]:
                raise ValueError(f"{alias} is another name of {key}; give one of them, not "
                                 f"both with different values")
            config[key] = config.pop(alias)
    ours = {k: v for k, v in config.items() if k.startswith(PREFIX)}
    unknown = sorted(set(ours) - known)
    if unknown:
        raise ValueError(
            f"unknown MAPPO keys: {', '.join(unknown)} (known: {', '.join(sorted(known))})"
        )
    rest = {k: v for k, v in config.items() if not k.startswith(PREFIX)}
    for key in LIST_KEYS:  # a YAML list of names is the comma string
        if isinstance(ours.get(key), list) \
                and all(isinstance(item, str) for item in ours[key]):
            ours[key] = ",".join(ours[key])
    hints = typing.get_type_hints(MappoArguments)
    return MappoArguments(**{k: typed_value(k, v, hints[k]) for k, v in ours.items()}), rest


def typed_llamafactory_keys(config: dict[str, Any]) -> dict[str, Any]:
    """The LLaMA-Factory keys of a ``mappo`` config read with their dataclass types, as its
    command line reads them: ``get_train_args`` is given a dict, which HfArgumentParser passes
    on unconverted, so ``max_samples: abc`` reached the data loader (a ``TypeError``
    traceback) and ``plot_loss: "false"`` was true. Booleans and numbers only: LLaMA-Factory
    takes lists for some of its string keys (``dataset``, ``lora_target``)."""
    from llamafactory.hparams import (
        DataArguments,
        FinetuningArguments,
        GeneratingArguments,
        ModelArguments,
        TrainingArguments,
    )

    for cls in (ModelArguments, DataArguments, TrainingArguments, FinetuningArguments,
                GeneratingArguments):
        config = typed_fields(cls, config, keep_none=True, kinds=(bool, int, float))
    check_optimiser_keys(config)
    return config


def check_optimiser_keys(config: dict[str, Any]) -> None:
    """``learning_rate`` and ``max_grad_norm`` of a config (where given; Hugging Face's defaults,
    5e-5 and 1.0, are fine) in their ranges, at parse time: LLaMA-Factory passes both on
    unchecked, and ``max_grad_norm: .nan`` trained an all-NaN model that was saved with exit
    code 0 (:func:`~mmoa.config_values.check_max_grad_norm`)."""
    if "learning_rate" in config:
        check_learning_rate("learning_rate", config["learning_rate"])
    if "max_grad_norm" in config:
        check_max_grad_norm("max_grad_norm", config["max_grad_norm"])
