"""One PPO update over pooled agent samples: the part of MAPPO that does the learning.

Given samples (prompt ids, response ids, score) from any agents, :class:`PPOLearner`

1. runs batched no-grad forward passes for the old log-probs, the reference log-probs (the same
   weights with the LoRA adapter disabled, or a frozen copy for full fine-tuning) and the values;
2. builds per-token rewards (score on the last response token, ``-kl_coef * (logp - logp_ref)``
   on every response token), GAE advantages per agent episode, and whitens the advantages over
   the pooled batch;
3. runs ``ppo_epochs`` epochs of shuffled mini-batches with the clipped policy loss plus
   ``vf_coef`` times the clipped value loss, gradient accumulation and gradient clipping,
   skipping any update whose loss is not finite or whose mean probability ratio is above
   ``ratio_threshold`` (the policy is already far from the one that sampled: trl's rule);
4. updates the KL controller.

``PPOConfig.algorithm`` names a registered algorithm (:mod:`mmoa.train.mappo.algorithms`):
steps 2 and 3 call its advantage estimator and its policy loss, and the learner asks it for
its properties, never its name. Under a critic-free one (``grpo`` and the others without
``value_head``) there is no value head; under a grouped one each sample arrives with its
group-relative advantage (``Sample.advantage``, set by the rollout), spread over its response
tokens; where its ``kl`` is ``"loss"`` the k3 KL to the reference is a loss term weighted by
``kl_loss_coef`` (the reference log-probs are only computed when that is > 0).

It knows nothing about retrieval, prompts or HF's Trainer, so the learning test drives exactly
this code on a toy task with a known best answer.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from mmoa import defaults
from mmoa.agent_adapters import (
    adapter_parameters,
    adapters_disabled,
    rows_by_agent,
    use_agent,
    zero_touch,
)
from mmoa.train.mappo.algorithms import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    Algorithm,
    LossSettings,
    get_algorithm,
)
from mmoa.train.mappo.ppo_math import (
    FLAT_GROUP_TOL,
    AdaptiveKLController,
    FixedKLController,
    entropy_from_logits,
    kl_loss,
    logprobs_from_logits,
    loss_count,
    masked_mean,
    per_token_kl,
    restrict_to_support,
    tis_weights,
    value_loss,
)
from mmoa.train.mappo.samples import (
    Sample,
    SampleBatch,
    collate,
    gather_positions,
    length_groups,
    minibatches,
)
from mmoa.train.mappo.value_head import ValueHead
from mmoa.train.stop import StepAbandoned

#: Why the learner left a mini-batch update out (see ``PPOLearner._agreed_skip``).
NONFINITE = "nonfinite"
RATIO = "ratio"


class PolicyWithValue(nn.Module):
    """The shared policy (a causal LM, possibly a PEFT model) and its value head (``None``
    under GRPO: no critic is created, trained or saved).

    ``forward`` returns response-aligned log-probs, values (``None`` without a value head) and
    entropies for a :class:`SampleBatch`; the reference log-probs come from the same weights
    with the adapter disabled (LoRA) or from ``ref_model`` (full fine-tuning).

    ``temperature`` is the rollouts' sampling temperature: every log-prob (new, old, reference)
    and the entropy are those of ``softmax(logits / temperature)``, the distribution the tokens
    were drawn from, as in current TRL; ``agent_temperatures`` overrides it for the rows of the
    agents it names (``mappo_agent_temperature``), each row scored at the temperature its agent
    sampled at. Top-p truncation is not applied when scoring; the Selector's grammar mask is
    applied only to the rows whose batch carries its support (``mappo_masked_scoring``):
    otherwise the policy that is optimised and kept near the reference is the model's own
    distribution at that temperature (see :mod:`mmoa.train.mappo.trainer`, "behaviour policy").
    """

    def __init__(self, policy: nn.Module, value_head: ValueHead | None,
                 ref_model: nn.Module | None = None, temperature: float = 1.0,
                 agent_temperatures: dict[str, float] | None = None) -> None:
        super().__init__()
        agent_temperatures = dict(agent_temperatures or {})
        for value in (temperature, *agent_temperatures.values()):
            if not value > 0:
                raise ValueError(f"temperature must be > 0, got {value}")
        self.policy = policy
        self.v_head = value_head
        self.temperature = float(temperature)
        self.agent_temperatures = {a: float(t) for a, t in agent_temperatures.items()}
        #: Rows of very different lengths run in separate passes (see
        #: :func:`response_hidden_and_logits`). Off under DeepSpeed ZeRO-3, where every pass
        #: all-gathers the weights: all processes must then make the same number of passes.
        self.group_by_length = True
        # A separate reference is kept out of the module tree: not trained, not saved.
        self._ref = [ref_model] if ref_model is not None else []
        #: The per-agent adapters' parameters, listed on the first forward (after the
        #: adapters are added) instead of walking every parameter name on each one.
        self._adapter_params: list[nn.Parameter] | None = None

    @property
    def config(self) -> Any:
        return self.policy.config

    @property
    def is_gradient_checkpointing(self) -> bool:
        """Asked by trl's ``unwrap_model_for_generation``, which would switch checkpointing off
        around generation and back on with default settings. The rollout generates in eval
        mode, where checkpointing does nothing, so the policy keeps LLaMA-Factory's settings."""
        return False

    def set_reference(self, ref_model: nn.Module) -> None:
        """Replace the separate reference (DeepSpeed ZeRO-3 wraps it in an inference engine)."""
        if not self._ref:
            raise RuntimeError("this policy uses its disabled adapter as the reference")
        self._ref[0] = ref_model

    @property
    def reference_model(self) -> nn.Module | None:
        return self._ref[0] if self._ref else None

    def forward(self, batch: SampleBatch, with_entropy: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        hidden, logits = self._hidden_and_logits(batch)
        logits = restrict_to_support(self.scale_logits(logits, batch), batch.support_ids)
        logprobs = logprobs_from_logits(logits, batch.response_ids)
        values = self.v_head(hidden).float() if self.v_head is not None else None
        entropy = None
        if with_entropy:  # logged only: no graph over a [B, T, vocab] softmax
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach())
        return logprobs, values, entropy

    def _hidden_and_logits(self, batch: SampleBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`response_hidden_and_logits` of the policy; with one adapter per agent
        (:mod:`mmoa.agent_adapters`) one pass per agent present, with its adapter active, put
        back in row order. Every adapter is touched with a zero weight so that each gets a
        gradient (DDP needs one for every trainable parameter)."""
        parts = rows_by_agent(self.policy, batch.agents)
        if len(parts) == 1 and parts[0][0] is None:
            return response_hidden_and_logits(self.policy, batch, self.group_by_length)
        hidden_parts, logit_parts = [], []
        for agent, rows in parts:
            with use_agent(self.policy, agent):
                hidden, logits = response_hidden_and_logits(self.policy, batch.select(rows),
                                                            self.group_by_length)
            hidden_parts.append(hidden)
            logit_parts.append(logits)
        order = torch.tensor([row for _, rows in parts for row in rows],
                             device=batch.input_ids.device)
        hidden = torch.cat(hidden_parts)
        logits = torch.cat(logit_parts)
        hidden = torch.empty_like(hidden).index_copy(0, order, hidden)
        logits = torch.empty_like(logits).index_copy(0, order, logits)
        if self._adapter_params is None:
            self._adapter_params = adapter_parameters(self.policy)
        touch = zero_touch(self._adapter_params)
        if touch is not None:
            logits = logits + touch
        return hidden, logits

    @torch.no_grad()
    def reference_logprobs(self, batch: SampleBatch) -> torch.Tensor:
        if self._ref:
            model = self._ref[0]
            context: Any = contextlib.nullcontext()
        elif hasattr(self.policy, "disable_adapter"):
            # every adapter disabled, with the trainable flags kept (PEFT turns them off)
            model = self.policy
            context = adapters_disabled(self.policy)
        else:
            raise RuntimeError(
                "no reference policy: full fine-tuning needs a frozen reference model"
            )
        with context:
            _, logits = response_hidden_and_logits(model, batch, self.group_by_length)
        return logprobs_from_logits(
            restrict_to_support(self.scale_logits(logits, batch), batch.support_ids),
            batch.response_ids)

    def row_temperatures(self, agents: Sequence[str], rows: int) -> list[float]:
        """The temperature each of ``rows`` rows was sampled at, by its agent (``agents`` is
        empty for a batch without agent names: every row at ``temperature``)."""
        if not agents:
            return [self.temperature] * rows
        return [self.agent_temperatures.get(agent, self.temperature) for agent in agents]

    def scale_logits(self, logits: torch.Tensor, batch: SampleBatch) -> torch.Tensor:
        """``logits / T`` with each row's sampling temperature ``T``."""
        temperatures = self.row_temperatures(batch.agents, logits.shape[0])
        if all(t == self.temperature for t in temperatures):
            return logits if self.temperature == 1.0 else logits / self.temperature
        scale = torch.tensor(temperatures, dtype=logits.dtype, device=logits.device)
        return logits / scale.view(-1, *([1] * (logits.dim() - 1)))


def _backbone_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """The decoder stack and the LM head of a causal LM (through a PEFT wrapper), or ``None``
    where the model's own forward does more than ``lm_head(decoder(x))`` to its logits (final
    soft-capping, logit scaling) and must be called whole."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if any(getattr(config, name, None) for name in ("final_logit_softcapping", "logit_scale",
                                                        "logits_scaling")):
        return None
    get_decoder = getattr(base, "get_decoder", None)
    get_head = getattr(base, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    decoder, head = get_decoder(), get_head()
    if decoder is None or decoder is base or head is None:
        return None
    return decoder, head


def response_hidden_and_logits(model: nn.Module, batch: SampleBatch,
                               group_by_length: bool = True
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Last hidden states ``[B, T, H]`` and fp32 logits ``[B, T, V]`` at the positions that
    predict the response tokens only.

    The LM head is applied after gathering those positions: a 49k-token vocabulary projected over
    every prompt position (as ``model(...).logits`` does) cost more than the rest of the scoring
    and update on a CPU, and its gradient is zero there anyway. Same numbers as slicing the full
    logits (a test compares them).
    """
    parts = _backbone_and_head(model)
    if parts is None:
        out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                    output_hidden_states=True, use_cache=False)
        return (gather_positions(out.hidden_states[-1], batch.positions),
                gather_positions(out.logits, batch.positions).float())
    decoder, head = parts
    groups = length_groups(batch.attention_mask.sum(dim=1).tolist()) if group_by_length else []
    if len(groups) <= 1:
        out = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      use_cache=False)
        hidden = gather_positions(out.last_hidden_state, batch.positions)
    else:
        # Rows of very different lengths (a Query Rewriter prompt beside a Selector prompt with
        # K documents) run in separate passes, each cut to its own longest row, instead of
        # padding every row to the longest of the batch.
        parts_out = []
        for rows, width in groups:
            index = torch.tensor(rows, device=batch.input_ids.device)
            out = decoder(input_ids=batch.input_ids[index, :width],
                          attention_mask=batch.attention_mask[index, :width], use_cache=False)
            parts_out.append(gather_positions(out.last_hidden_state, batch.positions[index]))
        order = torch.tensor([row for rows, _ in groups for row in rows],
                             device=batch.input_ids.device)
        grouped = torch.cat(parts_out)
        hidden = torch.empty_like(grouped).index_copy(0, order, grouped)
    return hidden, head(hidden).float()


def scoring_batch_size(requested: int | None, per_device_batch_size: int) -> int:
    """Samples per forward pass when a rollout is scored: ``mappo_forward_batch_size`` when
    set, else the per-device batch size but at least 8 (scoring keeps no activations for a
    backward pass, so it can take more rows than an update micro-batch)."""
    if requested is not None:
        return requested
    return max(per_device_batch_size, 8)


@dataclass
class PPOConfig:
    """The PPO settings the learner needs (mapped from MappoArguments + LLaMA-Factory keys)."""

    ppo_epochs: int = defaults.PPO_EPOCHS
    mini_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    forward_batch_size: int = 8
    #: Lower clip range; ``None``: the algorithm's own (gspo 3e-4), else PPO's 0.2.
    cliprange: float | None = None
    cliprange_value: float = defaults.CLIPRANGE_VALUE
    vf_coef: float = defaults.VF_COEF
    gamma: float = defaults.GAMMA
    lam: float = defaults.LAM
    whiten_advantages: bool = True
    #: Whiten each agent's advantages over its own tokens instead of over the pooled batch.
    whiten_per_agent: bool = False
    whiten_rewards: bool = False
    max_grad_norm: float = 1.0
    adaptive_kl: bool = True
    init_kl_coef: float = defaults.INIT_KL_COEF
    kl_target: float = defaults.KL_TARGET
    kl_horizon: float = defaults.KL_HORIZON
    min_kl_coef: float = defaults.MIN_KL_COEF
    #: Multipliers of the KL reward's coefficient by agent (``mappo_agent_kl_scale``); an
    #: agent not named keeps the controller's value.
    agent_kl_scales: dict[str, float] = field(default_factory=dict)
    #: How the KL reward is spread over a response: "token" or "mean" (``mappo_kl_reward``).
    kl_shape: str = "token"
    #: The per-token KL estimate paid in that reward: "kl" (k1) or "low_var_kl" (k3), ...
    #: (``mappo_kl_estimator``).
    kl_estimator: str = "kl"
    ratio_threshold: float = defaults.RATIO_THRESHOLD
    #: A registered algorithm's name (:mod:`mmoa.train.mappo.algorithms`): "ppo" (value
    #: head, GAE), "grpo" (the samples' group advantages, no critic), ...
    algorithm: str = "ppo"
    #: How the policy (and k3 KL) loss is averaged: "token", "sequence" or "constant"
    #: (ppo_math); an algorithm that prescribes one (dapo, dr_grpo, gspo) uses its own.
    loss_averaging: str = "token"
    #: Weight of the k3 KL-to-reference loss term of the algorithms whose KL is a loss; 0
    #: skips the reference pass.
    kl_loss_coef: float = defaults.KL_LOSS_COEF
    #: Upper clip range (clip-higher): ratios are clipped to [1 - cliprange, 1 +
    #: cliprange_high]; None: the algorithm's default (dapo 0.28, gspo 4e-4), else cliprange.
    cliprange_high: float | None = None
    #: ``micro_batch`` or ``batch`` (``mappo_loss_scope``); ``None``: the algorithm's own
    #: (dapo and dr_grpo: ``batch``, the others ``micro_batch``).
    loss_scope: str | None = None
    #: The constant tokens per row of the ``constant`` averaging (Dr. GRPO's generation
    #: budget, ``mappo_loss_norm_length``); ``None``: the rollout's widest response.
    norm_length: int | None = None
    #: Truncated importance sampling (``mappo_tis_cap``): each token's policy loss is
    #: multiplied by ``min(exp(old - sampled), tis_cap)``; ``None``: off.
    tis_cap: float | None = None

    @property
    def spec(self) -> Algorithm:
        """The registered algorithm."""
        return get_algorithm(self.algorithm)

    @property
    def scope(self) -> str:
        """The loss scope in effect (:attr:`loss_scope`, else the algorithm's)."""
        return self.loss_scope or self.spec.loss_scope

    @property
    def averaging(self) -> str:
        """The loss averaging in effect (the algorithm's, where it prescribes one)."""
        return self.spec.resolve_loss_averaging(self.loss_averaging)

    def loss_settings(self, norm_length: int | None = None,
                      total: float | None = None) -> LossSettings:
        """The policy loss's clip range and averaging under :attr:`spec`; ``norm_length``
        (the rollout's widest response) is used where :attr:`norm_length` is unset."""
        spec = self.spec
        return LossSettings(spec.resolve_cliprange(self.cliprange),
                            spec.resolve_cliprange_high(self.cliprange, self.cliprange_high),
                            self.averaging,
                            self.norm_length if self.norm_length is not None else norm_length,
                            total)


@dataclass
class Rollout:
    """Tensors of one rollout, row-aligned with its samples.

    Without a value head ``values`` and ``returns`` are ``None``; ``rewards`` too where the
    KL is a loss (no per-token rewards), and so are ``ref_logprobs`` and ``kl`` when the KL
    loss is off."""

    samples: list[Sample]
    batch: SampleBatch
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    values: torch.Tensor | None
    rewards: torch.Tensor | None
    kl: torch.Tensor | None
    advantages: torch.Tensor
    returns: torch.Tensor | None
    #: Truncated importance sampling weights (``[B, T]``, ``mappo_tis_cap``), ``None``: off.
    tis_weights: torch.Tensor | None = None


class PPOLearner:
    """Runs PPO updates of a :class:`PolicyWithValue` with a given optimiser.

    ``backward`` and ``clip_grad`` default to plain torch; the Trainer passes accelerate's, so
    DDP reduces gradients exactly as in LLaMA-Factory's own stages.

    With ``engine_steps`` (DeepSpeed) an engine owns clipping, the optimiser step and zeroing:
    ``backward(loss, boundary)`` is told which micro-batch closes a gradient-accumulation group
    and steps the engine there, and ``clip_grad`` only reports the norm the engine computed. The
    engine counts every micro-batch, so a non-finite loss cannot simply be left out: its
    micro-batch back-propagates zero instead (the group's other micro-batches still step) and is
    counted in ``skipped_updates``.

    With several processes, ``all_reduce`` sums a tensor over them (the Trainer passes
    accelerate's). Two decisions must then be the same everywhere, or the processes drift apart
    or wait forever in a gradient all-reduce that one of them skipped: whether a micro-batch's
    loss is finite (a non-finite loss on any process skips that update on every process), and
    the KL fed to the adaptive controller (the mean over every process's samples, so beta is one
    value, saved once and restored everywhere). ``no_sync`` (DDP's, through accelerate) skips the
    gradient all-reduce on the micro-batches before an accumulation boundary.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: PPOConfig,
        pad_id: int,
        *,
        unwrap: Callable[[nn.Module], PolicyWithValue] | None = None,
        backward: Callable[..., None] | None = None,
        clip_grad: Callable[[Any, float], Any] | None = None,
        generator: torch.Generator | None = None,
        engine_steps: bool = False,
        all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
        no_sync: Callable[[nn.Module], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.pad_id = pad_id
        self.unwrap = unwrap or (lambda m: m)  # type: ignore[assignment,return-value]
        self.backward = backward or (lambda loss: loss.backward())
        self.clip_grad = clip_grad or torch.nn.utils.clip_grad_norm_
        self.generator = generator
        self.engine_steps = engine_steps
        self.all_reduce = all_reduce or _identity
        self.no_sync = no_sync
        #: Processes averaging gradients, asked once (:meth:`_processes`).
        self._world: int | None = None
        #: Samples the last ``prepare`` dropped for an empty response.
        self.dropped_empty = 0
        #: Hooks the trainer sets (progress inside a step and the stop request): called with
        #: ``(phase, done, total)`` after each forward batch of :meth:`prepare` (``"score"``)
        #: and each micro-batch of :meth:`update` (``"update"``). Neither draws a random
        #: number, so a run with hooks computes exactly what one without does.
        self.on_progress: Callable[[str, int, int], None] | None = None
        #: Asked before each forward batch and micro-batch; under an engine or with several
        #: processes only before each accumulation group (the engine counts micro-batches, and
        #: the processes must agree: the trainer's answer is the same on every one), and not
        #: during :meth:`prepare` (ZeRO-3 forward passes are collective).
        self.stop_requested: Callable[[], bool] | None = None
        self._stop_anywhere = not engine_steps and all_reduce is None and no_sync is None
        if config.spec.kl == "loss":  # the k3 loss weight: a setting, saved for the record
            self.kl_ctl: AdaptiveKLController | FixedKLController = FixedKLController(
                config.kl_loss_coef)
        elif config.adaptive_kl:
            self.kl_ctl = AdaptiveKLController(
                config.init_kl_coef, config.kl_target, config.kl_horizon, config.min_kl_coef)
        else:
            self.kl_ctl = FixedKLController(config.init_kl_coef)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- rollout tensors -----------------------------------------------------------------------

    def _chunks(self, samples: Sequence[Sample]) -> Iterator[tuple[int, SampleBatch]]:
        size = self.config.forward_batch_size
        for offset in range(0, len(samples), size):
            yield offset, collate(samples[offset: offset + size], self.pad_id).to(self.device)

    @torch.no_grad()
    def prepare(self, samples: Sequence[Sample]) -> Rollout:
        """Old/reference log-probs and values, and the algorithm's advantages (PPO: rewards with
        the KL penalty, GAE).

        Samples with an empty response (a 0-token action has nothing to reinforce) are dropped:
        the rollout's ``samples`` are the others, and ``dropped_empty`` counts them."""
        kept = [s for s in samples if s.response_ids]
        if not kept:
            raise ValueError(f"all {len(samples)} samples have empty responses")
        self.dropped_empty = len(samples) - len(kept)
        samples = kept
        algorithm = self.config.spec
        if algorithm.grouped and any(s.advantage is None for s in samples):
            raise ValueError(f"{algorithm.name}: every sample needs its group advantage "
                             f"(Sample.advantage)")
        with_ref = algorithm.needs_reference(self.config.kl_loss_coef)
        policy = self.unwrap(self.model)
        was_training = policy.training
        policy.eval()
        old, ref, values = [], [], []
        chunks = math.ceil(len(samples) / self.config.forward_batch_size)
        self._report("score", 0, chunks)
        for index, (_, batch) in enumerate(self._chunks(samples)):
            if self._stop_anywhere and self.stop_requested is not None \
                    and self.stop_requested():
                policy.train(was_training)
                raise StepAbandoned("stop requested while scoring the rollout")
            logprobs, value, _ = policy(batch)
            old.append(logprobs)
            if value is not None:
                values.append(value)
            if with_ref:
                ref.append(policy.reference_logprobs(batch))
            self._report("score", index + 1, chunks)
        policy.train(was_training)
        full = collate(samples, self.pad_id).to(self.device)
        width = full.response_mask.shape[1]
        old_logprobs = _pad_cat(old, width)
        tis = None
        if self.config.tis_cap is not None:
            tis = tis_weights(old_logprobs, sampling_logprobs(samples, width, self.device),
                              full.response_mask, self.config.tis_cap)
        ref_logprobs = _pad_cat(ref, width) if with_ref else None
        value_t = _pad_cat(values, width) if algorithm.value_head else None
        cfg = self.config
        out = ADVANTAGE_ESTIMATORS[algorithm.advantage](AdvantageInputs(
            samples, full.response_mask, old_logprobs, ref_logprobs, value_t,
            self.kl_coefficients(samples),
            gamma=cfg.gamma, lam=cfg.lam, kl_shape=cfg.kl_shape,
            kl_estimator=cfg.kl_estimator,
            whiten_advantages=cfg.whiten_advantages, whiten_per_agent=cfg.whiten_per_agent,
            whiten_rewards=cfg.whiten_rewards))
        return Rollout(list(samples), full, old_logprobs, ref_logprobs, value_t, out.rewards,
                       out.kl, out.advantages, out.returns, tis)

    # -- the update ----------------------------------------------------------------------------

    def update(self, rollout: Rollout) -> dict[str, float]:
        """``ppo_epochs`` epochs of mini-batch updates; returns averaged statistics, with
        ``entropy/<agent>`` the mean over each agent's response tokens of every update.

        A stop request (:attr:`stop_requested`) ends the update before the next micro-batch,
        dropping the gradients of an unfinished accumulation group: before any optimiser
        step it raises :class:`~mmoa.train.stop.StepAbandoned` (nothing changed, the step can
        be discarded); after one the statistics of the groups that ran come back with
        ``stopped_early`` = 1 and ``updates`` = those groups.

        Dropout is switched off in the policy first (:func:`disable_dropout`): the old
        log-probs were scored in eval mode, and a ratio between a dropped-out forward pass and
        an intact one would be noise, not the policy's change.

        Under ``loss_scope: batch`` each accumulation group's tokens (or rows) are counted on
        every process first (one all-reduce per epoch) and every micro-batch's loss is its sum
        over that total: the mean over the whole optimiser step, whatever the micro-batches'
        lengths (:meth:`_group_totals`)."""
        cfg = self.config
        self.model.train()
        disable_dropout(self.unwrap(self.model))
        stats: dict[str, list[float]] = defaultdict(list)
        n = len(rollout.samples)
        micro = max(1, cfg.mini_batch_size)
        skipped = ratio_skips = 0
        per_epoch = math.ceil(n / micro)
        total = cfg.ppo_epochs * per_epoch
        done = groups = changed = 0
        stopped = False
        self._report("update", 0, total)
        for _ in range(cfg.ppo_epochs):
            batches = minibatches(n, micro, self.generator)
            starts = range(0, len(batches), cfg.gradient_accumulation_steps)
            totals = self._group_totals(rollout, [
                batches[start: start + cfg.gradient_accumulation_steps] for start in starts])
            for group_index, start in enumerate(starts):
                group = batches[start: start + cfg.gradient_accumulation_steps]
                group_total = None if totals is None else totals[group_index]
                if self._should_stop():
                    stopped = True
                    break
                if self.engine_steps:
                    reasons = self._engine_group(rollout, group, stats, group_total)
                    skipped += NONFINITE in reasons
                    ratio_skips += RATIO in reasons
                    done += len(group)
                    groups += 1
                    changed += 1  # the engine stepped (its counters, at the least)
                    self._report("update", done, total)
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                skip: str | None = None
                for position, indices in enumerate(group):
                    if position and self._stop_anywhere and self._should_stop():
                        stopped = True
                        break
                    loss, step_stats = self._loss(rollout, indices, len(group), group_total)
                    skip = self._agreed_skip(loss, step_stats)
                    if skip is not None:
                        break
                    boundary = position == len(group) - 1
                    with self._sync_context(boundary):
                        self.backward(loss)
                    for key, value in step_stats.items():
                        stats[key].append(value)
                    done += 1
                    self._report("update", done, total)
                if stopped:  # the group's gradients so far are dropped, never applied
                    self.optimizer.zero_grad(set_to_none=True)
                    break
                groups += 1
                if skip is not None:
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped += skip == NONFINITE
                    ratio_skips += skip == RATIO
                    continue
                grad_norm = self.clip_grad(self.model.parameters(), cfg.max_grad_norm)
                if not self._agreed_finite(grad_norm):
                    # a gradient with a NaN or an infinity: no optimiser step (Adam's moments
                    # would hold the NaN for good), counted with the non-finite losses
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                    continue
                stats["grad_norm"].append(float(grad_norm) if grad_norm is not None else 0.0)
                self.optimizer.step()
                changed += 1
            if stopped:
                break
        if stopped and not changed:
            raise StepAbandoned("stop requested before the update's first optimiser step")
        out = fold_agent_token_means(stats)
        out.update({k: sum(v) / len(v) for k, v in stats.items() if v})
        out["skipped_updates"] = float(skipped)
        out["ratio_skips"] = float(ratio_skips)
        out["updates"] = float(cfg.ppo_epochs * math.ceil(len(range(0, n, micro))
                                                          / cfg.gradient_accumulation_steps))
        if stopped:
            out["updates"] = float(groups)
            out["stopped_early"] = 1.0
        return out

    def _should_stop(self) -> bool:
        return self.stop_requested is not None and self.stop_requested()

    def _report(self, phase: str, done: int, total: int) -> None:
        if self.on_progress is not None:
            self.on_progress(phase, done, total)

    def _group_totals(self, rollout: Rollout, groups: Sequence[Sequence[Sequence[int]]]
                      ) -> list[float] | None:
        """Under ``loss_scope: batch``: for each accumulation group (an optimiser step) the
        count :func:`~mmoa.train.mappo.ppo_math.masked_average` divides by, tokens or rows, summed
        over the group's micro-batches and over every process (one all-reduce; every process
        has as many groups, as DDP needs anyway). ``None`` under ``micro_batch``."""
        cfg = self.config
        if cfg.scope != "batch":
            return None
        mask = rollout.batch.response_mask
        counts = [float(sum(loss_count(mask[torch.tensor(indices, device=mask.device)],
                                       cfg.averaging) for indices in group))
                  for group in groups]
        totals = self.all_reduce(torch.tensor(counts, dtype=torch.float64, device=self.device))
        return [max(float(t), 1.0) for t in totals.tolist()]

    def _processes(self) -> int:
        """How many processes average their gradients (1 without ``all_reduce``)."""
        if self._world is None:
            self._world = round(float(self.all_reduce(
                torch.ones(1, dtype=torch.float64, device=self.device))[0]))
        return self._world

    def _engine_group(self, rollout: Rollout, group: list[list[int]],
                      stats: dict[str, list[float]], total: float | None = None) -> set[str]:
        """One accumulation group under an engine that steps itself; returns why micro-batches
        of it were left out (``NONFINITE``, ``RATIO``): each back-propagated zero instead, as
        the engine counts every micro-batch."""
        reasons: set[str] = set()
        for position, indices in enumerate(group):
            loss, step_stats = self._loss(rollout, indices, len(group), total)
            skip = self._agreed_skip(loss, step_stats)
            if skip is None:
                for key, value in step_stats.items():
                    stats[key].append(value)
            else:
                reasons.add(skip)
                loss = torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0) * 0.0
            self.backward(loss, position == len(group) - 1)  # type: ignore[call-arg]
        grad_norm = self.clip_grad(self.model.parameters(), self.config.max_grad_norm)
        if grad_norm is not None and math.isfinite(float(grad_norm)):
            stats["grad_norm"].append(float(grad_norm))
        return reasons

    def _loss(self, rollout: Rollout, indices: list[int], group_size: int,
              total: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's loss for ``backward`` and its statistics.

        ``total`` is ``None`` under ``loss_scope: micro_batch``: the policy (and KL) loss is
        the micro-batch's own mean, and the whole loss is divided by the accumulation count
        ``group_size`` (trl's PPO, the recorded golden values). Otherwise it is the
        accumulation group's count on every process (:meth:`_group_totals`): the policy and
        KL losses are this micro-batch's share of the group's mean, times the number of
        processes (DDP and DeepSpeed average the processes' gradients), so the step's gradient
        is that of the mean over every token (or row) of the step; the value loss stays a
        micro-batch mean over ``group_size``. The logged losses are the micro-batch's own
        means either way."""
        cfg = self.config
        samples = [rollout.samples[i] for i in indices]
        batch = collate(samples, self.pad_id).to(self.device)
        width = batch.response_mask.shape[1]
        index = torch.tensor(indices, device=self.device)
        old = rollout.old_logprobs[index, :width]
        adv = rollout.advantages[index, :width]
        mask = batch.response_mask
        logprobs, values, entropy = self.model(batch, with_entropy=True)
        algorithm = cfg.spec
        # the rollout's widest response: the "constant" averaging's tokens per sequence where
        # no constant is configured, the same for every mini-batch of the update
        settings = cfg.loss_settings(norm_length=rollout.batch.response_mask.shape[1],
                                     total=total)
        weights = None if rollout.tis_weights is None else rollout.tis_weights[index, :width]
        pg_loss, pg_stats = POLICY_LOSSES[algorithm.policy_loss](logprobs, old, adv, mask,
                                                                 settings, weights)
        # a share of the group's mean back to this micro-batch's own mean, for the logs
        own = 1.0 if total is None else total / max(loss_count(mask, settings.averaging), 1)
        step_stats = {
            "policy_loss": float(pg_loss.detach()) * own,
            "entropy": float(masked_mean(entropy, mask).detach()) if entropy is not None else 0.0,
            **{k: float(v) for k, v in pg_stats.items()},
        }
        if entropy is not None:
            step_stats.update(agent_token_sums("entropy", samples, entropy.detach(), mask))
        vf_loss = kl_term = None
        if algorithm.value_head:
            assert rollout.returns is not None and rollout.values is not None \
                and values is not None
            ret = rollout.returns[index, :width]
            old_values = rollout.values[index, :width]
            vf_loss, vf_stats = value_loss(values, old_values, ret, mask, cfg.cliprange_value)
            step_stats["value_loss"] = float(vf_loss.detach())
            step_stats.update({k: float(v) for k, v in vf_stats.items()})
        if algorithm.kl == "loss" and cfg.kl_loss_coef > 0:
            assert rollout.ref_logprobs is not None
            kl_term = kl_loss(logprobs, rollout.ref_logprobs[index, :width], mask,
                              settings.averaging, settings.norm_length, settings.total)
            step_stats["kl_loss"] = float(kl_term.detach()) * own
        if total is None:  # the micro-batch's mean over the accumulation count, as before
            loss = pg_loss
            if vf_loss is not None:
                loss = pg_loss + cfg.vf_coef * vf_loss
            if kl_term is not None:
                loss = loss + cfg.kl_loss_coef * kl_term
            step_stats["loss"] = float(loss.detach())
            return loss / group_size, step_stats
        shares = pg_loss if kl_term is None else pg_loss + cfg.kl_loss_coef * kl_term
        loss = shares * self._processes()
        step_stats["loss"] = step_stats["policy_loss"] + cfg.kl_loss_coef * step_stats.get(
            "kl_loss", 0.0)
        if vf_loss is not None:
            loss = loss + cfg.vf_coef * vf_loss / group_size
            step_stats["loss"] += cfg.vf_coef * step_stats["value_loss"]
        return loss, step_stats

    def kl_coefficients(self, samples: Sequence[Sample]) -> float | torch.Tensor:
        """The KL reward's coefficient: the controller's value, or with per-agent scales a
        ``[B]`` tensor of that value times each sample's agent's multiplier."""
        beta = self.kl_ctl.value
        scales = self.config.agent_kl_scales
        if not scales:
            return beta
        return torch.tensor([beta * scales.get(s.agent, 1.0) for s in samples],
                            dtype=torch.float32, device=self.device)

    def update_kl(self, rollout: Rollout) -> float | None:
        """Feeds the mean per-sample KL over every process's samples, with their total count, to
        the controller (as TRL does); returns that KL, the same on every process. ``None``
        when the rollout has no reference log-probs (a KL loss that is off): every
        process then skips the all-reduce alike, as they share the config."""
        if rollout.ref_logprobs is None:
            return None
        mask = rollout.batch.response_mask
        kl_per_sample = (per_token_kl(rollout.old_logprobs, rollout.ref_logprobs) * mask).sum(1)
        totals = self.all_reduce(torch.stack([kl_per_sample.sum().double(),
                                              torch.tensor(float(len(kl_per_sample)),
                                                           dtype=torch.float64,
                                                           device=kl_per_sample.device)]))
        kl_sum, count = float(totals[0]), round(float(totals[1]))
        mean_kl = kl_sum / count
        self.kl_ctl.update(mean_kl, count)
        return mean_kl

    @staticmethod
    def agent_kl(rollout: Rollout) -> dict[str, float]:
        """``kl/<agent>``: the mean per-token KL to the reference (k1, as :meth:`update_kl`)
        over each agent's response tokens, so that one agent drifting from the warm start is
        not averaged away by the others; empty without reference log-probs. Per token rather
        than per sample (the pooled ``kl``): the agents' responses differ in length by tens
        of tokens, and a per-sample sum would rank them by length."""
        if rollout.ref_logprobs is None:
            return {}
        kl = per_token_kl(rollout.old_logprobs, rollout.ref_logprobs).detach()
        sums = agent_token_sums("kl", rollout.samples, kl, rollout.batch.response_mask)
        return fold_agent_token_means({key: [value] for key, value in sums.items()})

    def _agreed_skip(self, loss: torch.Tensor, step_stats: dict[str, float]) -> str | None:
        """Whether to leave this micro-batch's update out, and why (``NONFINITE``, ``RATIO``),
        decided on every process alike with one all-reduce: a process that left out a backward
        alone would wait forever in the others' gradient all-reduce, and every process must
        count the same skipped updates to stop together."""
        flags = torch.tensor([float(not bool(torch.isfinite(loss))),
                              float(step_stats.get("ratio_mean", 0.0)
                                    > self.config.ratio_threshold)], device=self.device)
        on_any = self.all_reduce(flags) > 0
        if on_any[0]:
            return NONFINITE
        return RATIO if on_any[1] else None

    def _agreed_finite(self, grad_norm: Any) -> bool:
        """Whether the gradient norm ``clip_grad`` computed (and returned: no extra pass) is
        finite on every process. DDP's gradients are averaged before clipping, so the norms are
        equal; the one-scalar all-reduce makes sure of it, since a process that stepped while
        another skipped would leave their weights apart for good."""
        bad = grad_norm is not None and not math.isfinite(float(grad_norm))
        if self.all_reduce is _identity:
            return not bad
        flag = torch.tensor([float(bad)], device=self.device)
        return not bool(self.all_reduce(flag)[0] > 0)

    def _sync_context(self, boundary: bool) -> contextlib.AbstractContextManager[Any]:
        if boundary or self.no_sync is None:
            return contextlib.nullcontext()
        return self.no_sync(self.model)


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    """The all-reduce of a single process."""
    return tensor


def behaviour_ratio_stats(rollout: Rollout) -> dict[str, float]:
    """How far the scored policy is from the one the rollout sampled from.

    For every response token with a recorded sampling log-prob, ``r = exp(old - sampled)``: the
    old log-prob as the learner scores it, over the log-prob under the sampler's distribution.
    Scored at the sampling temperature with no truncation, ``r`` is 1 up to float noise; top-p and
    the Selector's grammar mask make ``r <= 1`` where they cut the support (the sampler
    renormalises over fewer tokens), the mask no longer under ``mappo_masked_scoring``.
    Returns ``behaviour_ratio/mean``, ``/std``, ``/min`` and ``/max`` over all such tokens, and
    the mean per agent; empty when nothing was recorded.
    """
    ratios: list[torch.Tensor] = []
    per_agent: dict[str, list[torch.Tensor]] = defaultdict(list)
    for row, sample in enumerate(rollout.samples):
        if sample.sampling_logprobs is None:
            continue
        n = len(sample.sampling_logprobs)
        sampled = torch.tensor(sample.sampling_logprobs, dtype=torch.float32)
        ratio = torch.exp(rollout.old_logprobs[row, :n].detach().float().cpu() - sampled)
        ratios.append(ratio)
        per_agent[sample.agent].append(ratio)
    if not ratios:
        return {}
    every = torch.cat(ratios)
    out = {"behaviour_ratio/mean": float(every.mean()),
           "behaviour_ratio/std": float(every.std(unbiased=False)),
           "behaviour_ratio/min": float(every.min()),
           "behaviour_ratio/max": float(every.max())}
    for agent, parts in per_agent.items():
        out[f"behaviour_ratio/{agent}"] = float(torch.cat(parts).mean())
    return out


def sampling_logprobs(samples: Sequence[Sample], width: int,
                      device: torch.device | str = "cpu") -> torch.Tensor:
    """``[B, width]``: each sample's recorded sampling log-probs (:attr:`Sample.sampling_logprobs`,
    the rollout's own distribution), ``nan`` where none was recorded and at padding."""
    out = torch.full((len(samples), width), math.nan, dtype=torch.float32)
    for row, sample in enumerate(samples):
        if sample.sampling_logprobs is not None:
            values = sample.sampling_logprobs[:width]
            out[row, : len(values)] = torch.tensor(values, dtype=torch.float32)
    return out.to(device)


def tis_stats(rollout: Rollout) -> dict[str, float]:
    """``tis/weight_mean`` (the mean truncated importance weight over the response tokens with
    a recorded sampling log-prob), ``tis/capped_fraction`` (the share of those whose weight the
    cap cut) and ``tis/weight_min``; empty with TIS off or nothing recorded."""
    if rollout.tis_weights is None:
        return {}
    width = rollout.tis_weights.shape[1]
    sampled = sampling_logprobs(rollout.samples, width, rollout.tis_weights.device)
    known = rollout.batch.response_mask.bool() & torch.isfinite(sampled)
    if not bool(known.any()):
        return {}
    weights = rollout.tis_weights[known].float()
    ratio = torch.exp(rollout.old_logprobs[known].float() - sampled[known])
    return {"tis/weight_mean": float(weights.mean()),
            "tis/weight_min": float(weights.min()),
            "tis/capped_fraction": float((ratio > weights).float().mean())}


#: Dropout modules of torch; their ``p`` is set to 0 by :func:`disable_dropout`.
_DROPOUT_TYPES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                  nn.FeatureAlphaDropout)


def disable_dropout(model: nn.Module) -> int:
    """Switches every dropout of ``model`` off, for good; returns how many were on.

    Why: the old log-probs of a rollout are scored in eval mode and the update's new ones in
    train mode; with dropout active the PPO ratio of an unchanged policy is not 1 but noise,
    which the clip range then cuts at random. TRL's online trainers (``disable_dropout_in_model``
    in PPO and RLOO, ``disable_dropout`` in GRPO) set every ``nn.Dropout``'s ``p`` to 0; the
    update cannot simply run in eval mode instead, because transformers' gradient
    checkpointing only runs in train mode. Beyond TRL, dropout that a model applies
    functionally from a float attribute (Llama's ``attention_dropout``, read per forward) and
    the config's dropout keys are zeroed too. PEFT's ``lora_dropout`` modules are
    ``nn.Dropout``. Idempotent: called at the start of every update, it catches adapters added
    after the learner was built."""
    changed = 0
    for module in model.modules():
        if isinstance(module, _DROPOUT_TYPES):
            changed += module.p > 0
            module.p = 0.0
            continue
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float) and value > 0:
                setattr(module, name, 0.0)
                changed += 1
    configs = {id(c): c for c in (getattr(m, "config", None) for m in model.modules())
               if c is not None and hasattr(c, "to_dict")}
    for config in configs.values():
        for key, value in config.to_dict().items():
            if ("dropout" in key or key.endswith("_pdrop")) and isinstance(value, float) \
                    and value > 0 and hasattr(config, key):
                setattr(config, key, 0.0)
    return changed


def rollout_diagnostics(rollout: Rollout) -> dict[str, float]:
    """What the update had to learn from: ``samples/<agent>`` (usable samples per agent) and
    ``score_std`` (the spread of their scores; 0 means every sample scored the same, so only
    the value baseline's errors move the policy)."""
    out: dict[str, float] = defaultdict(float)
    for sample in rollout.samples:
        out[f"samples/{sample.agent}"] += 1.0
    scores = torch.tensor([s.score for s in rollout.samples], dtype=torch.float64)
    out["score_std"] = float(scores.std(unbiased=False)) if len(scores) else 0.0
    return dict(out)


#: Suffixes of the per-agent token sums and counts that :func:`agent_token_sums` hands to
#: :func:`fold_agent_token_means` through the update's statistics.
_TOKEN_SUM, _TOKEN_COUNT = ":token_sum", ":tokens"


def agent_token_sums(name: str, samples: Sequence[Sample], values: torch.Tensor,
                     mask: torch.Tensor) -> dict[str, float]:
    """``<name>/<agent>:token_sum`` and ``<name>/<agent>:tokens``: the sum of ``values``
    (``[B, T]``, row-aligned with ``samples``) over each agent's masked response tokens, and
    their count. Sums, not means: a mini-batch holds any mix of agents, and only the sums over
    all mini-batches give each agent's mean over its own tokens."""
    keep = mask.bool()
    totals = torch.where(keep, values.float(), 0.0).sum(dim=1).tolist()  # padding may be inf
    counts = keep.sum(dim=1).tolist()
    out: dict[str, float] = defaultdict(float)
    for sample, total, count in zip(samples, totals, counts, strict=True):
        out[f"{name}/{sample.agent}{_TOKEN_SUM}"] += total
        out[f"{name}/{sample.agent}{_TOKEN_COUNT}"] += count
    return dict(out)


def fold_agent_token_means(stats: dict[str, list[float]]) -> dict[str, float]:
    """Removes the :func:`agent_token_sums` entries from ``stats`` (lists of them, one per
    mini-batch) and returns ``<name>/<agent>``: the sums over the count of tokens; an agent
    with no token is left out."""
    out: dict[str, float] = {}
    for key in [k for k in stats if k.endswith(_TOKEN_SUM)]:
        name = key.removesuffix(_TOKEN_SUM)
        total = sum(stats.pop(key))
        count = sum(stats.pop(name + _TOKEN_COUNT, []))
        if count > 0:
            out[name] = total / count
    return out


def nothing_to_learn(rollout: Rollout, stats: dict[str, float]) -> str | None:
    """Why a step could not change the policy, in words, or ``None``."""
    scores = {s.score for s in rollout.samples}
    advantages = {s.advantage for s in rollout.samples}
    if stats.get("ratio_skips", 0.0) + stats.get("skipped_updates", 0.0) >= stats["updates"]:
        return "every mini-batch update was skipped"
    if stats.get("grad_norm") == 0.0:
        return "the gradient is zero"
    if None not in advantages and all(abs(a) <= FLAT_GROUP_TOL for a in advantages):
        return (f"all {len(rollout.samples)} samples have a group advantage of 0 (every group's "
                "rewards were equal and no penalty fired)")
    if None in advantages and len(scores) == 1:
        return (f"all {len(rollout.samples)} samples scored {scores.pop():.3g}, so the answer "
                "reward cannot tell good outputs from bad ones")
    return None


def _pad_cat(chunks: list[torch.Tensor], width: int) -> torch.Tensor:
    padded = [torch.nn.functional.pad(c, (0, width - c.shape[1])) for c in chunks]
    return torch.cat(padded, dim=0)
