"""The TOA search tree: which model writes or refines the next response, as a sequential decision.

Pure bookkeeping, no model code, so every rule can be checked by hand (``tests/test_toa_tree.py``).
The tree alternates two kinds of node:

* a **response node** holds one response and its reward; the root is a response node without a
  response. Each response node has one **model node** per model;
* a **model node** under the root *generates* a response from scratch when it is expanded; a
  model node under a response *refines* that response. Its children are the responses it made.

One play (:meth:`SearchTree.select`, then :meth:`SearchTree.add_response`):

1. **Selection.** From the root, pick the model node with the highest UCB,
   ``mean + alpha * sqrt(2 ln N / n)`` (``n``: its visits, ``N``: its parent's visits, ``mean``:
   its mean squashed reward); an unvisited model node (``n = 0``) comes first. Ties are broken by
   the tree's seeded random generator. If that model node is *expandable*, the play expands it;
   otherwise the walk continues at its best response (top-1 by reward: the only eligible child)
   and selects again among that response's model nodes.
2. **Expansion rule** (width limit and "a child must beat its parent"). A model node stays
   expandable while its layer (all responses under its parent response, over every model) holds
   fewer than ``width_limit`` responses, **or** while none of its own responses beats its parent
   response's reward. Under the root every response beats the parent (the root has no reward),
   so the root's model nodes stop expanding once the first layer is ``width_limit`` wide.
3. **Scoring.** The caller generates a response with the selected model (refining the parent
   response when there is one) and scores it with a reward ``r``; the tree squashes it as
   ``sigmoid(r / tau)``.
4. **Back-propagation.** The new response node gets one visit and the squashed score; the model
   node that made it and every node above it up to the root get one more visit and add the score.
5. **Inheritance.** The new response's model nodes start with the visit counts and value sums of
   the root's model nodes (after this play's back-propagation), so what the search learnt about
   which model is good carries down the tree instead of starting from zero at every depth.

Why the squashing: rewards of different scales (F1 in [0, 1], a reward model's logits) become
comparable UCB means in (0, 1); with tau = 0.1 an F1 of 0.6 vs 0.5 is a clear difference.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mmoa.defaults import TOA_ALPHA, TOA_TAU, TOA_WIDTH_DIVISOR

__all__ = [
    "ModelNode",
    "ResponseNode",
    "SearchTree",
    "TreeConfig",
    "default_width_limit",
    "squash",
    "ucb_value",
]


def squash(reward: float, tau: float = TOA_TAU) -> float:
    """``sigmoid(reward / tau)``, computed without overflow for large ``|reward / tau|``."""
    if tau <= 0:
        raise ValueError(f"tau must be > 0, got {tau}")
    x = reward / tau
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def ucb_value(mean: float, visits: int, parent_visits: int, alpha: float = TOA_ALPHA) -> float:
    """``mean + alpha * sqrt(2 ln N / n)``; ``inf`` for an unvisited node (``n = 0``).

    ``N`` below 1 counts as 1 (no exploration bonus): a response node created in this play has
    one visit while its model nodes may have inherited many.
    """
    if visits == 0:
        return math.inf
    return mean + alpha * math.sqrt(2.0 * math.log(max(parent_visits, 1)) / visits)


def default_width_limit(samples_per_model: int, num_models: int) -> int:
    """TOA's width limit: ``samples x models / 3`` responses per layer, at least 1."""
    return max(1, samples_per_model * num_models // TOA_WIDTH_DIVISOR)


@dataclass
class TreeConfig:
    """Search constants: TOA's alpha and tau, the width limit, the tie-breaking seed."""

    alpha: float = TOA_ALPHA
    tau: float = TOA_TAU
    #: Responses per layer before a model node may stop expanding (see the module docstring).
    width_limit: int = 1
    seed: int = 0

    def validate(self) -> None:
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if self.tau <= 0:
            raise ValueError(f"tau must be > 0, got {self.tau}")
        if self.width_limit < 1:
            raise ValueError(f"width_limit must be >= 1, got {self.width_limit}")


@dataclass(eq=False)
class _Stats:
    visits: int = 0
    value_sum: float = 0.0

    @property
    def mean(self) -> float:
        return self.value_sum / self.visits if self.visits else 0.0


@dataclass(eq=False)
class ModelNode(_Stats):
    """A model's option to write (under the root) or refine (under a response) a response."""

    model: str = ""
    parent: ResponseNode | None = None
    children: list[ResponseNode] = field(default_factory=list)


@dataclass(eq=False)
class ResponseNode(_Stats):
    """One response with its raw ``reward`` and squashed ``score``; the root has neither."""

    payload: Any = None
    model: str | None = None
    reward: float | None = None
    score: float | None = None
    parent: ModelNode | None = None
    children: list[ModelNode] = field(default_factory=list)
    #: Creation order among the tree's responses (-1 for the root).
    index: int = -1
    depth: int = 0

    @property
    def is_root(self) -> bool:
        return self.parent is None

    @property
    def refines(self) -> ResponseNode | None:
        """The response this one refined (``None``: written from scratch)."""
        if self.parent is None or self.parent.parent is None or self.parent.parent.is_root:
            return None
        return self.parent.parent


class SearchTree:
    """One question's tree over ``models`` (names); see the module docstring for the rules."""

    def __init__(self, models: Sequence[str], config: TreeConfig) -> None:
        if not models:
            raise ValueError("a search tree needs at least one model")
        if len(set(models)) != len(models):
            raise ValueError(f"model names must be distinct, got {list(models)}")
        config.validate()
        self.models = list(models)
        self.config = config
        self.rng = random.Random(config.seed)
        self.root = ResponseNode()
        self.root.children = [ModelNode(model=m, parent=self.root) for m in self.models]
        self.responses: list[ResponseNode] = []

    # -- rules ------------------------------------------------------------------------------------

    def ucb(self, node: ModelNode) -> float:
        assert node.parent is not None
        return ucb_value(node.mean, node.visits, node.parent.visits, self.config.alpha)

    @staticmethod
    def beats_parent(child: ResponseNode, parent: ResponseNode) -> bool:
        """A child beats its parent response when its reward is higher (always, under the root)."""
        assert child.reward is not None
        return parent.reward is None or child.reward > parent.reward

    def layer_width(self, response: ResponseNode) -> int:
        """Responses under ``response`` over all its model nodes."""
        return sum(len(m.children) for m in response.children)

    def expandable(self, node: ModelNode) -> bool:
        """Width not reached yet, or no child of ``node`` beats its parent response."""
        parent = node.parent
        assert parent is not None
        if self.layer_width(parent) < self.config.width_limit:
            return True
        return not any(self.beats_parent(c, parent) for c in node.children)

    @staticmethod
    def best_child(node: ModelNode) -> ResponseNode:
        """Top-1 response of a model node by reward (the earliest on ties)."""
        return max(node.children, key=lambda c: (c.reward, -c.index))

    # -- one play ---------------------------------------------------------------------------------

    def _argmax_ucb(self, response: ResponseNode) -> ModelNode:
        values = [self.ucb(m) for m in response.children]
        top = max(values)
        tied = [m for m, v in zip(response.children, values, strict=True) if v == top]
        return tied[0] if len(tied) == 1 else self.rng.choice(tied)

    def select(self) -> ModelNode:
        """The model node this play expands (see the module docstring)."""
        response = self.root
        while True:
            node = self._argmax_ucb(response)
            if self.expandable(node):
                return node
            response = self.best_child(node)

    def add_response(self, node: ModelNode, payload: Any, reward: float) -> ResponseNode:
        """Attach ``node``'s new response, back-propagate its squashed reward, then give the
        response its model nodes with the root's statistics."""
        if not math.isfinite(reward):
            raise ValueError(f"reward must be a finite number, got {reward!r} (model "
                             f"{node.model!r})")
        parent = node.parent
        assert parent is not None
        score = squash(reward, self.config.tau)
        child = ResponseNode(payload=payload, model=node.model, reward=float(reward),
                             score=score, parent=node, index=len(self.responses),
                             depth=parent.depth + 1)
        node.children.append(child)
        self.responses.append(child)
        child.visits, child.value_sum = 1, score
        walker: ModelNode | ResponseNode | None = node
        while walker is not None:
            walker.visits += 1
            walker.value_sum += score
            walker = walker.parent
        child.children = [
            ModelNode(visits=m.visits, value_sum=m.value_sum, model=m.model, parent=child)
            for m in self.root.children
        ]
        return child

    # -- results ----------------------------------------------------------------------------------

    def best(self) -> ResponseNode:
        """The response with the highest reward (the earliest on ties)."""
        if not self.responses:
            raise ValueError("the tree has no response yet")
        return max(self.responses, key=lambda r: (r.reward, -r.index))

    def worst(self) -> ResponseNode:
        """The response with the lowest reward (the earliest on ties)."""
        if not self.responses:
            raise ValueError("the tree has no response yet")
        return min(self.responses, key=lambda r: (r.reward, r.index))
