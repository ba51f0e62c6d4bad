"""The TOA search tree against hand-computed trees: UCB, squashing, selection, back-propagation,
inheritance, the width limit and the beat-the-parent rule."""

from __future__ import annotations

import math

import pytest

from mmoa.synthesis.tree import (
    SearchTree,
    TreeConfig,
    default_width_limit,
    squash,
    ucb_value,
)

# sigmoid(r / 0.1) of the rewards used below, written out by hand
S05, S02, S07, S04 = 0.9933071490757153, 0.8807970779778823, 0.9990889488055994, \
    0.9820137900379085


def _node(tree: SearchTree, response, model: str):
    return next(m for m in response.children if m.model == model)


def test_squash_and_ucb_values() -> None:
    assert squash(0.5) == pytest.approx(S05, abs=1e-12)
    assert squash(-0.3) == pytest.approx(0.04742587317756678, abs=1e-12)
    assert squash(1000.0) == 1.0 and squash(-1000.0) == 0.0  # no overflow
    # 0.6 + 0.01 * sqrt(2 ln 6 / 2)
    assert ucb_value(0.6, 2, 6) == pytest.approx(0.6133856619904585, abs=1e-9)
    assert ucb_value(0.6, 0, 6) == math.inf
    assert ucb_value(0.3, 4, 1) == 0.3  # ln 1 = 0: no bonus
    assert default_width_limit(32, 5) == 53 and default_width_limit(1, 2) == 1
    with pytest.raises(ValueError, match="tau"):
        squash(1.0, tau=0.0)


def test_unvisited_model_nodes_come_first() -> None:
    tree = SearchTree(["a", "b", "c"], TreeConfig(width_limit=10, seed=5))
    chosen = []
    for reward in (0.9, 0.1, 0.5):
        node = tree.select()
        chosen.append(node.model)
        tree.add_response(node, node.model, reward)
    assert sorted(chosen) == ["a", "b", "c"]


def test_hand_computed_tree() -> None:
    """Two models, width limit 2; every number below is worked out in the comments."""
    tree = SearchTree(["a", "b"], TreeConfig(alpha=0.01, tau=0.1, width_limit=2, seed=0))
    root = tree.root
    A = tree.add_response(_node(tree, root, "a"), "A", 0.5)
    # inheritance happens after back-propagation: A's "a" starts with root.a = (1, S05)
    assert [(m.model, m.visits, m.value_sum) for m in A.children] == [("a", 1, S05),
                                                                      ("b", 0, 0.0)]
    B = tree.add_response(_node(tree, root, "b"), "B", 0.2)
    assert (root.visits, root.value_sum) == (2, pytest.approx(S05 + S02, abs=1e-12))
    assert [(m.visits, m.mean) for m in B.children] == [(1, S05), (1, S02)]

    # play 3: the root layer is full (2) and both children beat the root, so nothing expands
    # there; ucb(a) = S05 + 0.01 sqrt(2 ln 2) > ucb(b) = S02 + same -> descend to A; A's "b" is
    # unvisited -> it refines A.
    bonus = 0.01 * math.sqrt(2 * math.log(2))
    assert tree.ucb(_node(tree, root, "a")) == pytest.approx(S05 + bonus, abs=1e-9)
    assert tree.ucb(_node(tree, root, "b")) == pytest.approx(S02 + bonus, abs=1e-9)
    node = tree.select()
    assert (node.model, node.parent) == ("b", A)
    C = tree.add_response(node, "C", 0.7)
    assert C.refines is A and C.depth == 2 and A.refines is None
    # back-propagation: A.b (1, S07), A (2, S05+S07), root.a (2, S05+S07), root (3, all three)
    assert (node.visits, node.value_sum) == (1, pytest.approx(S07, abs=1e-12))
    assert (A.visits, A.value_sum) == (2, pytest.approx(S05 + S07, abs=1e-12))
    root_a, root_b = root.children
    assert (root_a.visits, root_a.mean) == (2, pytest.approx((S05 + S07) / 2, abs=1e-12))
    assert (root_b.visits, root_b.value_sum) == (1, S02)
    assert (root.visits, root.value_sum) == (3, pytest.approx(S05 + S02 + S07, abs=1e-12))
    assert [(m.visits, m.value_sum) for m in C.children] == [
        (2, pytest.approx(S05 + S07, abs=1e-12)), (1, S02)]

    # play 4: root a: (S05+S07)/2 + 0.01 sqrt(2 ln 3 / 2) = 1.00363 > b: S02 + 0.01 sqrt(2 ln 3)
    # -> A. At A (N=2): a = S05 + 0.01 sqrt(2 ln 2) = 1.00508 < b = S07 + same = 1.01086 -> b;
    # A's layer holds 1 < 2 responses -> b expands again.
    assert tree.ucb(root_a) == pytest.approx((S05 + S07) / 2 + 0.01 * math.sqrt(math.log(3)),
                                             abs=1e-9)
    node = tree.select()
    assert (node.model, node.parent) == ("b", A)
    D = tree.add_response(node, "D", 0.4)
    assert D.depth == 2

    # play 5: root a (3 visits) still wins; at A (N=3): a = S05 + 0.01 sqrt(2 ln 3) = 1.00813 >
    # b = (S07+S04)/2 + 0.01 sqrt(ln 3) = 1.00103 -> a. A's layer is full (2) but a has no child
    # beating A, so it is expandable.
    a_at_A, b_at_A = A.children
    assert tree.ucb(a_at_A) == pytest.approx(S05 + 0.01 * math.sqrt(2 * math.log(3)), abs=1e-9)
    assert tree.ucb(b_at_A) == pytest.approx((S07 + S04) / 2 + 0.01 * math.sqrt(math.log(3)),
                                             abs=1e-9)
    node = tree.select()
    assert (node.model, node.parent) == ("a", A)
    assert tree.best() is C and tree.worst() is B


def test_beat_the_parent_keeps_a_model_node_expanding() -> None:
    tree = SearchTree(["a", "b"], TreeConfig(width_limit=1))
    root_a, root_b = tree.root.children
    A = tree.add_response(root_a, "A", 0.5)
    assert not tree.expandable(root_a), "layer full and A beats the root"
    assert tree.expandable(root_b), "no child of b beats the root yet"
    under = A.children[0]
    tree.add_response(under, "worse", 0.3)
    assert tree.layer_width(A) == 1
    assert tree.expandable(under), "its only child does not beat A (0.3 < 0.5)"
    tree.add_response(under, "equal", 0.5)
    assert tree.expandable(under), "a tie does not beat the parent"
    better = tree.add_response(under, "better", 0.6)
    assert not tree.expandable(under)
    assert tree.best_child(under) is better


def test_width_limit_bounds_the_first_layer() -> None:
    tree = SearchTree(["a", "b"], TreeConfig(width_limit=3, seed=1))
    depths = []
    for reward in (0.2, 0.4, 0.3, 0.9, 0.1):
        node = tree.select()
        depths.append(tree.add_response(node, node.model, reward).depth)
    assert depths[:3] == [1, 1, 1]
    assert depths[3] == 2, "the fourth play refines a first-layer response"
    assert tree.layer_width(tree.root) == 3


def _simulate(seed: int, plays: int = 12) -> list[tuple[str, int]]:
    tree = SearchTree(["a", "b", "c"], TreeConfig(width_limit=2, seed=seed))
    out = []
    for _ in range(plays):
        node = tree.select()
        depth = node.parent.depth + 1 if node.parent else 1
        reward = {"a": 0.3, "b": 0.5, "c": 0.4}[node.model] + 0.1 * depth
        out.append((node.model, tree.add_response(node, node.model, reward).depth))
    return out


def test_search_is_deterministic_given_the_seed() -> None:
    assert _simulate(7) == _simulate(7)
    seen = {tuple(_simulate(seed)) for seed in range(6)}
    assert len(seen) > 1, "the seed breaks the ties between unvisited models"


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="width_limit"):
        SearchTree(["a"], TreeConfig(width_limit=0))
    with pytest.raises(ValueError, match="distinct"):
        SearchTree(["a", "a"], TreeConfig())
    tree = SearchTree(["a"], TreeConfig())
    with pytest.raises(ValueError, match="finite"):
        tree.add_response(tree.root.children[0], "x", float("nan"))
