"""The ``mmoa`` package's import graph: no import cycles, and no module imports a higher layer.

The graph is read statically: every ``.py`` file under ``LLaMA-Factory/src/mmoa`` is parsed with
``ast`` (nothing is imported), and each ``import`` / ``from ... import`` of an ``mmoa`` module is
an edge from the importing module to the module it names (``from mmoa.x import y`` names
``mmoa.x.y`` when that is a module, else ``mmoa.x``; a package is its ``__init__``).

What counts, decided here because DESIGN.md does not say:

* imports at any depth count: module level, inside functions and methods (the lazy imports that
  keep torch out of the command line's start-up) and inside ``try`` blocks. A lazy import still
  runs whenever its function does, so an upward or circular one is as real as any other;
* imports under ``if TYPE_CHECKING:`` do not count. They never run, so they can neither form an
  import cycle nor make a lower layer load a higher one; they let a Protocol name the types of
  the layers that call it (``mmoa.pipelines`` names ``MappoArguments`` and ``EvalConfig`` in its
  signatures). Their ``else:`` branch runs, and counts.

The layers, lowest first, follow DESIGN.md's layout and its waves (docs/architecture.md draws
them). A module belongs to the layer of the longest prefix listed for it; the root package
``mmoa`` is listed on its own and is not a prefix. A module may import its own layer and the
layers below; a new module that no prefix covers fails :func:`test_every_module_has_a_layer`
until it is placed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "LLaMA-Factory" / "src"
ROOT = "mmoa"

#: (layer, module prefixes), lowest first.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the standard library and the model libraries only: used by every layer above
    ("foundation", ("mmoa", "mmoa.env", "mmoa.defaults", "mmoa.fileio", "mmoa.metrics",
                    "mmoa.precision", "mmoa.console", "mmoa.modeling", "mmoa.model_fetch",
                    "mmoa.config_values", "mmoa.agent_adapters")),
    # the RAG parts: prompts, parsers and the agents' pipelines; the retrieval server and its
    # client; the dataset loaders and the SFT data builders
    ("components", ("mmoa.agents", "mmoa.retrieval", "mmoa.data")),
    # what runs the parts without training them: pre-flight checks, warm-start data synthesis
    ("services", ("mmoa.preflight", "mmoa.synthesis")),
    # the training stages' parts: PPO maths, algorithms, rewards, samples, learner, value head,
    # checkpoint files, plots, the query encoder's RL parts
    ("training", ("mmoa.train",)),
    # the registered pipelines: rollout, samples and evaluation rows of each
    ("pipelines", ("mmoa.pipelines",)),
    # the mappo keys (they check mappo_pipeline against the registry)
    ("training config", ("mmoa.train.mappo.args",)),
    # what runs a pipeline end to end: the training loops, their launcher, the evaluation
    ("runners", ("mmoa.train.mappo.trainer", "mmoa.train.mappo.workflow",
                 "mmoa.train.mappo.joint_retriever", "mmoa.train.retriever_rl.workflow",
                 "mmoa.train.retriever_rl.evaluate", "mmoa.train.launcher", "mmoa.evaluation")),
    # the user's entry points
    ("interfaces", ("mmoa.cli", "mmoa.webui")),
)


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    modules = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node`` that can run (not under ``if TYPE_CHECKING:``)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for branch in child.orelse:
                yield from _imports_of(branch)
            continue
        yield from _imports_of(child)


def _imports_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def _target(name: str, modules: dict[str, Path]) -> str | None:
    """The module ``name`` loads: itself, or the nearest package above it that exists."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, dict[str, int]]:
    """``{module: {imported module: line of the first such import}}`` within the package."""
    modules = module_files()
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                          for alias in node.names]
            for target in wanted:
                if target != ROOT and not target.startswith(ROOT + "."):
                    continue
                resolved = _target(target, modules)
                if resolved is not None and resolved != name:
                    graph[name].setdefault(resolved, node.lineno)
    return graph


def layer_of(module: str) -> int | None:
    """The index in :data:`LAYERS` of ``module``'s layer (longest prefix), ``None``: none."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            covers = module == prefix or (prefix != ROOT and module.startswith(prefix + "."))
            if covers and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, int]]:
    return import_graph()


def test_the_graph_is_read(graph: dict[str, dict[str, int]]) -> None:
    """The parser sees the imports it must see (else every check below passes vacuously): a
    module-level one, a lazy one inside a function, a relative-free ``from package import
    module`` and none of the ``TYPE_CHECKING`` ones."""
    assert "mmoa.train.mappo.learner" in graph["mmoa.train.mappo.trainer"]  # module level
    assert "mmoa.train.mappo.joint_retriever" in graph["mmoa.train.mappo.workflow"]  # lazy
    assert "mmoa.pipelines.qr_s_g" in graph["mmoa.pipelines"]  # from package import module
    assert "mmoa.train.mappo.args" not in graph["mmoa.pipelines.qr_s_g"]  # TYPE_CHECKING only
    assert len(graph) > 100


def test_every_module_has_a_layer(graph: dict[str, dict[str, int]]) -> None:
    unplaced = sorted(module for module in graph if layer_of(module) is None)
    assert not unplaced, f"place these modules in a layer of LAYERS: {unplaced}"


def test_no_import_cycles(graph: dict[str, dict[str, int]]) -> None:
    cycles = import_cycles(graph)
    details = [
        "; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in cycle for b in graph[a]
                  if b in cycle)
        for cycle in cycles]
    assert not cycles, "import cycles:\n" + "\n".join(details)


def test_no_upward_imports(graph: dict[str, dict[str, int]]) -> None:
    upward = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module)
        for target, line in sorted(targets.items()):
            there = layer_of(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{module} ({LAYERS[here][0]}) -> {target} ({LAYERS[there][0]}) "
                              f"at line {line}")
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def test_a_cycle_and_an_upward_import_are_found() -> None:
    """The checks themselves, on a made-up graph."""
    made_up = {"mmoa.agents.a": {"mmoa.train.b": 1}, "mmoa.train.b": {"mmoa.agents.a": 2},
               "mmoa.evaluation": {}}
    assert import_cycles(made_up) == [["mmoa.agents.a", "mmoa.train.b"]]
    assert layer_of("mmoa.agents.a") < layer_of("mmoa.train.b")  # a -> b is upward
    assert layer_of("mmoa.train.mappo.trainer") > layer_of("mmoa.train.mappo.learner")
    assert layer_of("mmoa.unplaced_module") is None  # the root package is not a prefix
