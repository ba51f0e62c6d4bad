"""TOA and its best-of-N baseline over a batch of agent tasks, at the same budget.

Both spend exactly ``samples_per_model x models`` generations per task, through the same policy
(:class:`mmoa.synthesis.policies.ResponsePolicy`) and the same reward, so their data differ only
in how the budget is spent: best-of-N writes every response from scratch, each model the same
number of times; TOA lets the tree (:mod:`mmoa.synthesis.tree`) decide which model writes or
refines next.

Batching: the trees of all tasks advance in lockstep, one play per task per round, so a round is
one batched ``generate`` per model (and one reward call); best-of-N uses the same rounds.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from mmoa.defaults import TOA_ALPHA, TOA_SAMPLES_PER_MODEL, TOA_TAU
from mmoa.synthesis.policies import PlayRequest, ResponsePolicy
from mmoa.synthesis.rewards import AgentTask, Reward
from mmoa.synthesis.tree import SearchTree, TreeConfig, default_width_limit

__all__ = ["Method", "Play", "SearchConfig", "SearchResult", "best_of_n", "run_search",
           "toa_search", "win_summary"]

Method = Literal["toa", "best_of_n"]
METHODS: tuple[Method, ...] = ("toa", "best_of_n")


@dataclass
class SearchConfig:
    """The budget (``samples_per_model`` x number of models per task) and TOA's constants."""

    samples_per_model: int = TOA_SAMPLES_PER_MODEL
    alpha: float = TOA_ALPHA
    tau: float = TOA_TAU
    #: Responses per layer before a model node may stop expanding; ``None``: budget / 3.
    width_limit: int | None = None
    seed: int = 0
    progress: bool = True

    def budget(self, num_models: int) -> int:
        if self.samples_per_model < 1:
            raise ValueError(f"samples_per_model must be >= 1, got {self.samples_per_model}")
        return self.samples_per_model * num_models

    def tree_config(self, num_models: int, task_index: int) -> TreeConfig:
        width = self.width_limit if self.width_limit is not None \
            else default_width_limit(self.samples_per_model, num_models)
        return TreeConfig(alpha=self.alpha, tau=self.tau, width_limit=width,
                          seed=self.seed + task_index)

    def validate(self, num_models: int) -> None:
        """Every field checked before any model is loaded (errors name the field)."""
        self.budget(num_models)
        self.tree_config(num_models, 0).validate()


@dataclass(frozen=True)
class Play:
    """One generated response: who wrote it, its reward, and which play it refined."""

    model: str
    text: str
    reward: float
    refines: int | None = None


@dataclass
class SearchResult:
    """Every play of one task, in order; best and worst by reward (the earliest on ties)."""

    task: AgentTask
    plays: list[Play] = field(default_factory=list)

    @property
    def best(self) -> Play:
        return max(self.plays, key=lambda p: p.reward)

    @property
    def worst(self) -> Play:
        return min(self.plays, key=lambda p: p.reward)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="play", disable=not enabled)


def _request(task: AgentTask, model: str, previous: str | None) -> PlayRequest:
    return PlayRequest(model, task.prompt, previous, num_candidates=len(task.candidates))


def toa_search(tasks: Sequence[AgentTask], policy: ResponsePolicy, reward: Reward,
               config: SearchConfig, desc: str = "toa") -> list[SearchResult]:
    """One TOA tree per task, ``budget`` plays each, advanced in lockstep."""
    models = policy.models
    budget = config.budget(len(models))
    trees = [SearchTree(models, config.tree_config(len(models), i)) for i in range(len(tasks))]
    with _progress(budget * len(tasks), desc, config.progress) as bar:
        for _ in range(budget):
            nodes = [tree.select() for tree in trees]
            requests = [_request(task, node.model, None if node.parent.is_root
                                 else node.parent.payload)
                        for task, node in zip(tasks, nodes, strict=True)]
            texts = policy.respond(requests)
            rewards = reward(tasks, texts)
            for tree, node, text, value in zip(trees, nodes, texts, rewards, strict=True):
                tree.add_response(node, text, value)
            bar.update(len(tasks))
    results = []
    for task, tree in zip(tasks, trees, strict=True):
        plays = [Play(r.model or "", r.payload, float(r.reward or 0.0),
                      None if r.refines is None else r.refines.index) for r in tree.responses]
        results.append(SearchResult(task, plays))
    return results


def best_of_n(tasks: Sequence[AgentTask], policy: ResponsePolicy, reward: Reward,
              config: SearchConfig, desc: str = "best-of-n") -> list[SearchResult]:
    """``budget`` responses written from scratch per task, ``samples_per_model`` by each
    model (round-robin), the same rounds and batches as :func:`toa_search`."""
    models = policy.models
    budget = config.budget(len(models))
    results = [SearchResult(task) for task in tasks]
    with _progress(budget * len(tasks), desc, config.progress) as bar:
        for round_index in range(budget):
            model = models[round_index % len(models)]
            texts = policy.respond([_request(task, model, None) for task in tasks])
            rewards = reward(tasks, texts)
            for result, text, value in zip(results, texts, rewards, strict=True):
                result.plays.append(Play(model, text, float(value)))
            bar.update(len(tasks))
    return results


def run_search(method: Method, tasks: Sequence[AgentTask], policy: ResponsePolicy,
               reward: Reward, config: SearchConfig, desc: str | None = None
               ) -> list[SearchResult]:
    if method == "toa":
        return toa_search(tasks, policy, reward, config, desc or "toa")
    if method == "best_of_n":
        return best_of_n(tasks, policy, reward, config, desc or "best-of-n")
    raise ValueError(f"unknown search method {method!r}; expected one of {METHODS}")


def win_summary(results: Sequence[SearchResult]) -> dict[str, object]:
    """Which model wrote the best response how often, and how often it was a refinement."""
    searched = [r for r in results if r.plays]
    wins = Counter(r.best.model for r in searched)
    refined = sum(r.best.refines is not None for r in searched)
    # every response scored the same: the "winner" is only the first to play
    tied = sum(r.best.reward == r.worst.reward for r in searched)
    return {"wins": dict(sorted(wins.items())), "best_is_refinement": refined,
            "all_tied": tied, "tasks": len(results)}
