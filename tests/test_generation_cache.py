"""The agents' KV cache option: its rule, its validation, and the same greedy tokens with either
cache on the tiny model (the compiled decoding itself runs only on CUDA)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmoa.agents.generation_cache import (
    GENERATION_CACHES,
    cache_kwargs,
    check_generation_cache,
    resolve_generation_cache,
)
from mmoa.defaults import GENERATION_CACHE, ROLLOUT_GENERATION_CACHE


def test_auto_is_static_on_cuda_and_dynamic_elsewhere() -> None:
    assert resolve_generation_cache("auto", "cuda") == "static"
    assert resolve_generation_cache("auto", "cpu") == "dynamic"
    for device in ("cuda", "cpu"):
        assert resolve_generation_cache("static", device) == "static"
        assert resolve_generation_cache("dynamic", device) == "dynamic"


def test_generate_kwargs_name_the_static_cache_only_when_it_is_used() -> None:
    from tests.mappo_fixtures import tiny_policy

    model = tiny_policy(0)  # on the CPU: auto is the dynamic cache there
    assert cache_kwargs("static", model) == {"cache_implementation": "static"}
    assert cache_kwargs("auto", model) == {}
    assert cache_kwargs("dynamic", model) == {}


def test_rollouts_default_to_static_on_cuda_only_and_evaluation_to_dynamic() -> None:
    """MAPPO's default leaves every CPU run as it was (dynamic) and compiles on CUDA; evaluation
    keeps the dynamic cache everywhere (no per-process compilation for a short evaluation)."""
    from mmoa.evaluation import EvalConfig
    from mmoa.train.mappo.args import MappoArguments

    rollouts = MappoArguments().mappo_generation_cache
    assert rollouts == ROLLOUT_GENERATION_CACHE == "auto"
    assert resolve_generation_cache(rollouts, "cpu") == "dynamic"
    assert resolve_generation_cache(rollouts, "cuda") == "static"
    evaluation = EvalConfig(model_name_or_path="m", template="llama3", output_dir="o",
                            data_file="d.jsonl").generation_cache
    assert resolve_generation_cache(evaluation, "cuda") == "dynamic"


def test_unknown_cache_names_are_refused_everywhere() -> None:
    assert GENERATION_CACHE in GENERATION_CACHES
    with pytest.raises(ValueError, match="generation cache must be one of auto, dynamic, static"):
        check_generation_cache("paged")
    with pytest.raises(ValueError, match="generation cache"):
        resolve_generation_cache("Static", "cuda")

    from mmoa.evaluation import EvalConfig
    config = EvalConfig(model_name_or_path="m", template="llama3", output_dir="o",
                        data_file="d.jsonl", generation_cache="paged")
    with pytest.raises(ValueError, match="generation cache"):
        config.validate()

    from mmoa.train.mappo.args import MappoArguments
    with pytest.raises(ValueError, match="mappo_generation_cache must be one of"):
        MappoArguments(mappo_generation_cache="paged")
    assert MappoArguments(mappo_generation_cache="auto").mappo_generation_cache == "auto"


def test_eval_command_line_takes_the_option() -> None:
    from mmoa.cli.eval import eval_options

    option = eval_options()["generation_cache"]
    assert tuple(option.choices) == GENERATION_CACHES


def test_static_cache_writes_the_dynamic_caches_greedy_tokens(tiny_model_dir: Path,
                                                             tiny_world_dir: Path,
                                                             tiny_server_url: str) -> None:
    """The whole pipeline, greedy, on 6 questions in batches of 4 (left padding, a last
    batch of another size, the Selector's grammar mask): every agent writes the same token ids
    with the static cache as with the dynamic one, and the model keeps the static cache."""
    from mmoa.agents.pipeline import GenerationSettings, RagPipeline
    from mmoa.data.loaders import load_qa
    from mmoa.modeling import load_for_inference
    from mmoa.retrieval.client import RetrievalClient

    model, tokenizer = load_for_inference(tiny_model_dir, "llama3")
    client = RetrievalClient(tiny_server_url)
    questions = [r.question for r in load_qa(tiny_world_dir / "dev.jsonl", "demo")[:6]]
    responses = {}
    for cache in ("dynamic", "static"):
        settings = GenerationSettings(
            max_new_tokens={"qr": 20, "selector": 12, "generator": 10}, cache=cache)
        pipeline = RagPipeline(model, tokenizer, "llama3", client, k=5, settings=settings,
                               batch_size=4)
        traces = pipeline.run(questions)
        responses[cache] = [{agent: call.response_ids for agent, call in t.calls.items()}
                            for t in traces]
    assert responses["static"] == responses["dynamic"]
    assert all(set(r) == {"qr", "selector", "generator"} for r in responses["static"])

    from transformers import StaticCache
    assert isinstance(getattr(model, "_cache", None), StaticCache)
