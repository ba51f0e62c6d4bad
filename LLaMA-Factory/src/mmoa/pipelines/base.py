"""The one Protocol every pipeline implements, its timings type and the registry by name.

Why: the trainer and the evaluation used to choose between the three pipelines with if/elif on
their names in three places, and each pipeline reported its timings in its own shape. Now a
pipeline is one module that implements :class:`Pipeline` and registers it with
:func:`register_pipeline`; ``mappo_pipeline`` (training) and ``mode`` (evaluation) are looked up
here, and nothing else in the trainer or the evaluation knows a pipeline's name.

This module imports nothing of the package at run time: the registry is read by the MAPPO
arguments (which check ``mappo_pipeline``), by the trainer and by the evaluation alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from mmoa.agents.pipeline import DocumentRetriever, GenerationSettings
    from mmoa.agents.render import PromptRenderer
    from mmoa.data.records import QARecord
    from mmoa.evaluation import EvalConfig
    from mmoa.train.mappo.args import MappoArguments
    from mmoa.train.mappo.samples import Sample
    from mmoa.train.progress import RolloutStage

#: The stage of :class:`Timings` that is retrieval; every other stage is generation.
RETRIEVE = "retrieve"


@dataclass(frozen=True)
class Timings:
    """Seconds one batch spent per stage, in the order the stages ran.

    The three-agent pipeline times each agent (``qr``, ``retrieve``, ``selector``,
    ``generator``); the multi-turn agents time ``generate`` and ``retrieve``. The trainer logs
    :attr:`generate` and :attr:`retrieve`; the evaluation sums every stage over its batches."""

    stages: Mapping[str, float] = field(default_factory=dict)

    @property
    def generate(self) -> float:
        """Seconds of model generation: every stage but retrieval."""
        return sum(seconds for stage, seconds in self.stages.items() if stage != RETRIEVE)

    @property
    def retrieve(self) -> float:
        return self.stages.get(RETRIEVE, 0.0)

    def as_dict(self) -> dict[str, float]:
        return dict(self.stages)


@dataclass(frozen=True)
class Batch:
    """What one run of a pipeline over a batch of questions returns."""

    #: One trace per pipeline run (the three-agent ``Trace`` or a ``SearchTrajectory``), a
    #: question's ``group_size`` runs next to each other.
    traces: list[Any]
    timings: Timings


#: Runs an evaluation's pipeline, greedily or sampled as configured, over a batch of questions.
Evaluator = Callable[[Sequence[str]], Batch]


class Pipeline(Protocol):
    """A pipeline the trainer can roll out and optimise and the evaluation can score.

    ``name`` is its ``mappo_pipeline`` value; ``eval_modes`` the evaluation modes it runs (the
    three-agent pipeline also runs its ablations ``g``, ``rag``, ...)."""

    name: str
    eval_modes: tuple[str, ...]
    #: The ``mappo_*`` key of the documents each retrieval asks for (checked against the
    #: server's ``max_k`` before the model loads).
    retrieval_k_key: str
    #: Whether training draws ``training_agents.png`` (per-agent statistics of the three agents).
    agent_plot: bool
    #: The agents whose output the pipeline can replace by a default in its rollout, for the
    #: counterfactual credit (``mappo_counterfactual_agents``' choices); ``()``: none.
    counterfactual_agents: tuple[str, ...]

    # -- training --------------------------------------------------------------------------------

    def rollout(self, policy: Any, tokenizer: Any, renderer: PromptRenderer,
                retriever: DocumentRetriever, args: MappoArguments,
                questions: Sequence[str]) -> Batch:
        """One MAPPO step's sampled runs, ``args.rollouts_per_question`` per question."""
        ...

    def rollout_stages(self, args: MappoArguments, questions: int) -> tuple[RolloutStage, ...]:
        """The rows each stage of a rollout of ``questions`` questions generates, in order:
        the trainer counts the policy's generate calls against them (progress inside a step,
        :mod:`mmoa.train.progress`); the pipeline itself reports nothing."""
        ...

    def samples(self, records: Sequence[QARecord], traces: Sequence[Any], args: MappoArguments
                ) -> tuple[list[Sample], dict[str, float]]:
        """The step's PPO samples (scores, or group advantages under a grouped algorithm) and
        the values it logs."""
        ...

    # -- evaluation ------------------------------------------------------------------------------

    def evaluator(self, model: Any, tokenizer: Any, retriever: DocumentRetriever | None,
                  settings: GenerationSettings, config: EvalConfig) -> Evaluator:
        """The pipeline of an evaluation run of ``config.mode``."""
        ...

    def eval_row(self, record: QARecord, trace: Any, config: EvalConfig) -> dict[str, Any]:
        """One line of ``predictions.jsonl``: the trace, the gold answers, the scores and the
        pipeline's own columns (``agent_stats``)."""
        ...

    def eval_retrieval_k(self, config: EvalConfig) -> tuple[str, int] | None:
        """``(option, documents per query)`` of the run's retrievals; ``None``: none."""
        ...

    def eval_label(self, config: EvalConfig) -> str:
        """The run's name in the progress bar."""
        ...

    def eval_metrics(self, config: EvalConfig) -> dict[str, Any]:
        """What ``metrics.json`` records about the run beyond the shared figures."""
        ...


_PIPELINES: dict[str, Pipeline] = {}
P = TypeVar("P")


def register_pipeline(name: str) -> Callable[[type[P]], type[P]]:
    """Class decorator: registers an instance of the class as the pipeline ``name``.

    Registration order is the order :func:`eval_modes` lists the modes in (the command line's
    ``--mode`` choices), so the built-ins are imported in a fixed order by the package."""
    def register(cls: type[P]) -> type[P]:
        if name in _PIPELINES:
            raise ValueError(f"pipeline {name!r} is registered twice")
        pipeline: Any = cls()
        pipeline.name = name
        taken = set(eval_modes()) & set(pipeline.eval_modes)
        if taken:
            raise ValueError(f"pipeline {name!r}: evaluation mode(s) {sorted(taken)} belong to "
                             "another pipeline")
        _PIPELINES[name] = pipeline
        return cls

    return register


def pipeline_names() -> tuple[str, ...]:
    """Every registered pipeline (``mappo_pipeline``'s choices)."""
    return tuple(_PIPELINES)


def get_pipeline(name: str) -> Pipeline:
    """The pipeline registered as ``name`` (``mappo_pipeline``)."""
    try:
        return _PIPELINES[name]
    except KeyError:
        raise ValueError(f"mappo_pipeline must be one of {', '.join(_PIPELINES)}, got "
                         f"{name!r}") from None


def eval_modes() -> tuple[str, ...]:
    """Every evaluation mode of every registered pipeline (``mode``'s choices)."""
    return tuple(mode for pipeline in _PIPELINES.values() for mode in pipeline.eval_modes)


def pipeline_for_mode(mode: str) -> Pipeline:
    """The pipeline that runs evaluation mode ``mode``."""
    for pipeline in _PIPELINES.values():
        if mode in pipeline.eval_modes:
            return pipeline
    raise ValueError(f"mode must be one of {', '.join(eval_modes())}, got {mode!r}")
