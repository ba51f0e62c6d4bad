"""Shared fixtures: a small demo world and the tiny model made from it, each built once a session.

Every test that needs a real causal LM asks for ``tiny_model_dir``: a real ``LlamaForCausalLM``
with its Llama-3-style tokenizer (``template: llama3``), made in a few seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mmoa_demo.tiny_model import default_extra_texts, demo_world_texts, make_tiny_model
from mmoa_demo.world import (
    DemoWorld,
    DemoWorldConfig,
    generate_demo_world,
    write_demo_world,
)

#: The modules whose tests share the session's two-process DDP run (``ddp_run``): one xdist
#: group, so that run is made once. Listed here because the scheduler, in the controller, sees
#: only test ids; the collection checks the list against the tests that use the fixture.
DDP_RUN_MODULES = frozenset({"tests/test_mappo_deepspeed.py", "tests/test_mappo_integration.py"})


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def xdist_group(nodeid: str) -> str:
    """The pytest-xdist group of a test: its module, or ``ddp_run`` for the modules that share
    that run. A group runs whole on one worker, so a module's fixtures are built once."""
    module = _module(nodeid)
    return "ddp_run" if module in DDP_RUN_MODULES else module


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest -p no:xdist must still run
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with :func:`xdist_group` as the grouping, decided here rather than by
    ``xdist_group`` marks: pytest-xdist 3.8 puts a mark's group into the test id through an
    attribute pytest 9 no longer reads, so every test became its own group and module-scoped
    fixtures (the GPU-check dry run, the distractor chain) were built on both workers."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid)

    return ModuleGroupScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order the suite for ``run_tests.sh``'s two pytest-xdist workers (grouped by
    :func:`xdist_group`): modules with a slow test go first, each kept whole, so the workers
    take the long groups early instead of leaving one worker alone at the end. Without xdist
    the order is the only effect."""
    with_ddp_run = {_module(item.nodeid) for item in items
                    if "ddp_run" in getattr(item, "fixturenames", ())}
    if not with_ddp_run <= DDP_RUN_MODULES:
        raise pytest.UsageError(f"tests/conftest.py: add {sorted(with_ddp_run - DDP_RUN_MODULES)} "
                                "to DDP_RUN_MODULES (they use the shared ddp_run)")
    slow_modules = {_module(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: _module(item.nodeid) not in slow_modules)  # stable: whole modules


#: Small enough to build in about a second, big enough to have every kind of question.
TINY_WORLD_CONFIG = DemoWorldConfig(n_passages=300, n_train=100, n_dev=30, n_test=30, seed=11)


@pytest.fixture(scope="session")
def tiny_world() -> DemoWorld:
    return generate_demo_world(TINY_WORLD_CONFIG)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_world: DemoWorld) -> Path:
    """The tiny model (default sizes) with its tokenizer trained on ``tiny_world``."""
    out = tmp_path_factory.mktemp("tiny_model") / "tiny-llama3"
    make_tiny_model(demo_world_texts(tiny_world), out, extra_texts=default_extra_texts())
    return out


@pytest.fixture(scope="session")
def tiny_world_dir(tmp_path_factory: pytest.TempPathFactory, tiny_world: DemoWorld) -> Path:
    """``tiny_world`` written to disk (corpus.jsonl, train/dev/test.jsonl, world.json)."""
    out = tmp_path_factory.mktemp("tiny_world") / "demo"
    write_demo_world(tiny_world, out)
    return out


@pytest.fixture(scope="session")
def tiny_mappo_data_dir(tmp_path_factory: pytest.TempPathFactory, tiny_world_dir: Path) -> Path:
    """``tiny_world``'s train split as the MAPPO prompt set ``tiny_mappo`` (read-only)."""
    from mmoa.data.loaders import load_qa
    from mmoa.data.sft_builder import write_mappo_dataset

    out = tmp_path_factory.mktemp("tiny_mappo_data")
    write_mappo_dataset(load_qa(tiny_world_dir / "train.jsonl", "demo"), out, "tiny_mappo")
    return out


@pytest.fixture(scope="session")
def tiny_index_dir(tmp_path_factory: pytest.TempPathFactory, tiny_world_dir: Path) -> Path:
    """A Flat index over ``tiny_world``'s corpus with the bundled MiniLM encoder."""
    from mmoa.retrieval.builder import BuildConfig, build_index

    out = tmp_path_factory.mktemp("tiny_index") / "index"
    build_index(BuildConfig(corpus=str(tiny_world_dir / "corpus.jsonl"), output=str(out),
                            progress=False))
    return out


@pytest.fixture(scope="session")
def tiny_server_url(tiny_index_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The real retrieval server (gunicorn, subprocess) on a loopback port over ``tiny_world``."""
    from tests.retrieval_fixtures import running_server

    log = tmp_path_factory.mktemp("tiny_server") / "server.log"
    with running_server(["--index", str(tiny_index_dir)], log_path=log) as server:
        yield server.url


@pytest.fixture(scope="session")
def unbatched_server_url(tiny_index_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The retrieval server with micro-batching off: each request is encoded alone.

    With micro-batching, two processes' requests are merged into one encoder batch as they
    happen to arrive, and a query's vector then depends on its batch companions at float-noise
    level (about 1e-7), enough to reorder two nearly tied passages now and then: runs compared
    weight for weight would see different documents for reasons unrelated to what is compared.
    """
    from tests.retrieval_fixtures import running_server

    log = tmp_path_factory.mktemp("unbatched_server") / "server.log"
    with running_server(["--index", str(tiny_index_dir), "--no-micro-batching"],
                        log_path=log) as server:
        yield server.url


@pytest.fixture(scope="session")
def ddp_run(tiny_model_dir: Path, tiny_mappo_data_dir: Path, unbatched_server_url: str,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One two-process DDP MAPPO run (torchrun, gloo), made once: the torchrun test checks it
    and the DeepSpeed tests compare their ZeRO runs with it. ``save_total_limit: 1`` (checked
    by the torchrun test) removes checkpoint-1 when checkpoint-2 is saved."""
    from tests.mappo_fixtures import launch_compared_run

    return launch_compared_run(tmp_path_factory.mktemp("ddp_run"), "ddp", tiny_model_dir,
                               tiny_mappo_data_dir, unbatched_server_url, save_total_limit=1)
