"""The samplers of the search: local causal LMs (and prompt variants of them) that write or
refine one agent's response, batched.

A "model" of the search is a :class:`ModelSpec`: a checkpoint with its LLaMA-Factory template,
a prompt variant and sampling settings. Two specs of one checkpoint (say the plain prompt and
the ``careful`` variant, or two temperatures) share one copy of the weights; the search still
counts them as two models, because they behave as two samplers.

Prompts are the agents' own (:mod:`mmoa.agents.prompts`), encoded through
:class:`mmoa.agents.render.PromptRenderer` and generated with the pipeline's batched, left-padded
``generate`` (:meth:`mmoa.agents.pipeline.RagPipeline.generate`), the Selector with its grammar
mask; a refinement uses :func:`mmoa.agents.prompts.refinement_prompt`. Everything that produces
text for training data therefore sees the exact prompt text of SFT, rollouts and evaluation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mmoa.agents.pipeline import GenerationSettings, RagPipeline
from mmoa.agents.prompts import (
    PROMPT_VARIANTS,
    AgentPrompt,
    generator_prompt,
    prompt_variant,
    refinement_prompt,
)
from mmoa.defaults import MAX_NEW_TOKENS, ROLLOUT_TEMPERATURE, ROLLOUT_TOP_P
from mmoa.precision import Precision, autocast, device_type_of, resolve_precision

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "LocalModelPolicy",
    "ModelAnswerer",
    "ModelSpec",
    "PlayRequest",
    "ResponsePolicy",
]

_SPEC_KEYS = {"name", "path", "template", "adapter", "variant", "temperature", "top_p"}


@dataclass(frozen=True)
class ModelSpec:
    """One sampler of the search: a local checkpoint, its template, a prompt variant and the
    sampling temperature / top-p."""

    name: str
    model_name_or_path: str
    template: str
    adapter_name_or_path: str | None = None
    variant: str = "plain"
    temperature: float = ROLLOUT_TEMPERATURE
    top_p: float = ROLLOUT_TOP_P

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a model spec needs a non-empty name")
        if self.variant not in PROMPT_VARIANTS:
            raise ValueError(f"model {self.name!r}: variant must be one of {PROMPT_VARIANTS}, "
                             f"got {self.variant!r}")
        if self.temperature <= 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"model {self.name!r}: temperature must be > 0 and top_p in (0, 1], "
                             f"got {self.temperature} and {self.top_p}")

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """From ``name=NAME,path=DIR,template=T[,adapter=DIR][,variant=V][,temperature=X]
        [,top_p=Y]`` (the ``--model`` flag of ``mmoa-cli data toa``)."""
        fields: dict[str, str] = {}
        for part in text.split(","):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or key not in _SPEC_KEYS:
                raise ValueError(f"--model {text!r}: expected comma-separated key=value pairs "
                                 f"with keys {sorted(_SPEC_KEYS)}, got {part!r}")
            fields[key] = value.strip()
        for key in ("name", "path", "template"):
            if not fields.get(key):
                raise ValueError(f"--model {text!r}: {key}= is required")
        try:
            temperature = float(fields.get("temperature", ROLLOUT_TEMPERATURE))
            top_p = float(fields.get("top_p", ROLLOUT_TOP_P))
        except ValueError:
            raise ValueError(f"--model {text!r}: temperature and top_p must be numbers") from None
        return cls(fields["name"], fields["path"], fields["template"], fields.get("adapter"),
                   fields.get("variant", "plain"), temperature, top_p)

    @property
    def weights_key(self) -> tuple[str, str, str | None]:
        return (self.model_name_or_path, self.template, self.adapter_name_or_path)


@dataclass(frozen=True)
class PlayRequest:
    """Write (``previous is None``) or refine ``previous`` for the agent ``prompt`` with
    ``model``; ``prompt`` is the agent's canonical prompt, variants are the policy's business."""

    model: str
    prompt: AgentPrompt
    previous: str | None = None
    #: Candidates shown by a Selector prompt (its grammar mask's K).
    num_candidates: int = 0


class ResponsePolicy(Protocol):
    """What TOA and best-of-N need of the samplers: model names and batched responses."""

    @property
    def models(self) -> list[str]: ...

    def respond(self, requests: Sequence[PlayRequest]) -> list[str]: ...


class SeedablePolicy(ResponsePolicy, Protocol):
    """A sampler whose stream can be restarted at a seed: what chunked, resumable synthesis
    needs, so a resumed run samples what an uninterrupted one samples."""

    def reseed(self, seed: int) -> None: ...


@dataclass
class _Loaded:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


@dataclass
class LocalModelPolicy:
    """Local HF causal LMs served in-process: each model's requests of one agent go through one
    batched ``generate`` per ``batch_size`` rows. Weights are loaded once per checkpoint.

    ``precision`` is :mod:`mmoa.precision`'s rule (``auto``: bf16 autocast where the hardware
    has native bf16), the same as evaluation's, so the labels are sampled with the arithmetic
    the models are evaluated and trained with; ``fp32`` reproduces results exactly."""

    specs: Sequence[ModelSpec]
    batch_size: int = 16
    max_new_tokens: dict[str, int] = field(default_factory=lambda: dict(MAX_NEW_TOKENS))
    seed: int = 0
    precision: str = "auto"
    _pipelines: dict[str, RagPipeline] = field(default_factory=dict, init=False, repr=False)
    _loaded: dict[tuple[str, str, str | None], _Loaded] = field(default_factory=dict,
                                                                 init=False, repr=False)

    def __post_init__(self) -> None:
        from mmoa.modeling import load_for_inference

        names = [s.name for s in self.specs]
        if not names:
            raise ValueError("the search needs at least one --model")
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be distinct, got {names}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        self._precision: Precision = resolve_precision(self.precision)
        self.reseed(self.seed)
        for spec in self.specs:
            if spec.weights_key not in self._loaded:
                self._loaded[spec.weights_key] = _Loaded(*load_for_inference(
                    spec.model_name_or_path, spec.template, spec.adapter_name_or_path,
                    precision=self._precision))
            loaded = self._loaded[spec.weights_key]
            settings = GenerationSettings(do_sample=True, temperature=spec.temperature,
                                          top_p=spec.top_p, max_new_tokens=self.max_new_tokens)
            self._pipelines[spec.name] = RagPipeline(
                loaded.model, loaded.tokenizer, spec.template, None, mode="g",
                settings=settings, batch_size=self.batch_size)
        self._specs = {s.name: s for s in self.specs}

    @property
    def models(self) -> list[str]:
        return [s.name for s in self.specs]

    @property
    def resolved_precision(self) -> Precision:
        """``precision`` with ``auto`` resolved for this machine."""
        return self._precision

    def reseed(self, seed: int) -> None:
        """Restart the sampling stream, so a dataset does not depend on what ran before it
        (``--baselines`` builds two datasets with one policy)."""
        import torch

        self.seed = seed
        torch.manual_seed(seed)

    def sampling_state(self) -> dict[str, Any]:
        """The sampling stream's position (torch's generators), to continue it later."""
        import torch

        state: dict[str, Any] = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def restore_sampling_state(self, state: dict[str, Any]) -> None:
        """Continue the sampling stream where :meth:`sampling_state` left it."""
        import torch

        torch.set_rng_state(state["cpu"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])

    def prompt_for(self, request: PlayRequest) -> AgentPrompt:
        """The prompt the model sees: its variant of the agent prompt, as a refinement when
        there is an earlier response."""
        spec = self._specs.get(request.model)
        if spec is None:
            raise ValueError(f"unknown model {request.model!r}; the policy has {self.models}")
        prompt = prompt_variant(request.prompt, spec.variant)
        return prompt if request.previous is None else refinement_prompt(prompt, request.previous)

    def respond(self, requests: Sequence[PlayRequest]) -> list[str]:
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            groups[(request.model, request.prompt.agent)].append(i)
        out = [""] * len(requests)
        for (model, agent), rows in groups.items():
            prompts = [self.prompt_for(requests[i]) for i in rows]
            pipeline = self._pipelines[model]
            processor = None
            if agent == "selector":
                processor = pipeline.selector_processor(
                    max(requests[i].num_candidates for i in rows))
            with autocast(self._precision, device_type_of(pipeline.model)):
                calls = pipeline.generate(agent, prompts, processor)
            for i, call in zip(rows, calls, strict=True):
                out[i] = call.response_text
        return out

    def answerer(self, model: str | None = None) -> ModelAnswerer:
        """A greedy Generator on the weights of ``model`` (default: the first), for the
        Selector's reward; it uses the plain prompt, as evaluation does."""
        if model is not None and model not in self._specs:
            raise ValueError(f"unknown answerer model {model!r}; the policy has {self.models}")
        spec = self._specs[model] if model is not None else self.specs[0]
        loaded = self._loaded[spec.weights_key]
        settings = GenerationSettings(do_sample=False, max_new_tokens=self.max_new_tokens)
        return ModelAnswerer(RagPipeline(loaded.model, loaded.tokenizer, spec.template, None,
                                         mode="g", settings=settings,
                                         batch_size=self.batch_size), self._precision)


@dataclass
class ModelAnswerer:
    """The frozen Generator of the Selector's reward: greedy answers from given documents."""

    pipeline: RagPipeline
    precision: Precision = "fp32"

    def answer(self, questions: Sequence[str], documents: Sequence[Sequence[str]]
               ) -> list[str]:
        from mmoa.agents.parsers import parse_answer

        prompts = [generator_prompt(q, list(d)) for q, d in zip(questions, documents,
                                                                 strict=True)]
        with autocast(self.precision, device_type_of(self.pipeline.model)):
            calls = self.pipeline.generate("generator", prompts)
        return [parse_answer(c.response_text).answer for c in calls]

