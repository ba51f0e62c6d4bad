"""Shared fixtures: a small demo world and the tiny model made from it, each built once a session.

Every test that needs a real causal LM asks for ``tiny_model_dir``: a real ``LlamaForCausalLM``
with its Llama-3-style tokenizer (``template: llama3``), made in a few seconds on a CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mmoa.data.demo_world import DemoWorld, DemoWorldConfig, generate_demo_world
from mmoa.tiny_model import default_extra_texts, demo_world_texts, make_tiny_model

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
