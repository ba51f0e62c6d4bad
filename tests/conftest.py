"""Shared fixtures: a small demo world and the tiny model made from it, each built once a session.

Every test that needs a real causal LM asks for ``tiny_model_dir``: a real ``LlamaForCausalLM``
with its Llama-3-style tokenizer (``template: llama3``), made in a few seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mmoa_demo.tiny_model import default_extra_texts, demo_world_texts, make_tiny_model
from mmoa_demo.world import (
    DemoWorld,
    DemoWorldConfig,
    generate_demo_world,
    write_demo_world,
)

#: The xdist group of tests that share the session's two-process DDP run (``ddp_run``).
DDP_RUN_GROUP = "ddp_run"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order and group the suite for ``run_tests.sh``'s two pytest-xdist workers.

    Each module is one xdist group (``--dist loadgroup``), so its module-scoped fixtures (a web
    UI, a browser, a ZeRO run) are built once, on one worker; the modules whose tests use the
    shared DDP run (``ddp_run``) form one group, so that run is made once. Modules with a slow
    test go first, each kept whole: the workers take groups in this order, so the long ones
    start early instead of leaving one worker alone at the end. Without xdist the order is the
    only effect."""
    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    with_ddp_run = {module(item) for item in items
                    if "ddp_run" in getattr(item, "fixturenames", ())}
    for item in items:
        group = DDP_RUN_GROUP if module(item) in with_ddp_run else module(item)
        item.add_marker(pytest.mark.xdist_group(group))
    slow_modules = {module(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: module(item) not in slow_modules)  # stable: modules stay whole


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
