"""Which KV cache the agents' ``generate`` calls decode with: one rule for rollouts and evaluation.

The agents' turns are short (32-128 new tokens) and the models small, so on a GPU a decoding step
is bound by the Python and kernel-launch overhead of one forward pass, not by arithmetic (an
H200 sat at 3-9 % utilisation with the dynamic cache). A *static* KV cache has fixed shapes,
which lets transformers compile the decoding forward pass (``torch.compile``, mode
``reduce-overhead``: CUDA graphs, one launch per step) on CUDA; the prefill runs eagerly.
transformers keeps that cache on the model between calls and reuses it while the batch size is
the same and the cache long enough, so a rollout's calls mostly replay graphs already compiled.

- ``dynamic``: transformers' default cache, growing by one position per step (every CPU figure
  of this project was measured with it).
- ``static``: the static cache; compiled decoding on CUDA, no compilation on a CPU (transformers
  compiles only on accelerators), where it gives the same tokens more slowly.
- ``auto``: ``static`` on CUDA, ``dynamic`` elsewhere.

Greedy decoding writes the same tokens with either cache (``tests/test_generation_cache.py``);
sampled tokens differ only through the floating-point order of the attention sums.
"""

from __future__ import annotations

from typing import Any

from mmoa.defaults import GENERATION_CACHE

GENERATION_CACHES: tuple[str, ...] = ("auto", "dynamic", "static")

__all__ = ["GENERATION_CACHE", "GENERATION_CACHES", "cache_kwargs", "check_generation_cache",
           "resolve_generation_cache"]


def check_generation_cache(cache: str) -> None:
    """Raises ``ValueError`` unless ``cache`` is one of :data:`GENERATION_CACHES`."""
    if cache not in GENERATION_CACHES:
        raise ValueError(f"generation cache must be one of {', '.join(GENERATION_CACHES)}, "
                         f"got {cache!r}")


def resolve_generation_cache(cache: str, device_type: str) -> str:
    """``dynamic`` or ``static``: what ``cache`` means on a device of type ``device_type``
    (``cuda``, ``cpu``, ...)."""
    check_generation_cache(cache)
    if cache == "auto":
        return "static" if device_type == "cuda" else "dynamic"
    return cache


def cache_kwargs(cache: str, device_type: str) -> dict[str, Any]:
    """The ``generate`` keyword arguments of ``cache`` on ``device_type``: none for the dynamic
    cache (transformers' default), ``cache_implementation="static"`` for the static one (which
    makes transformers compile the decoding step on CUDA)."""
    if resolve_generation_cache(cache, device_type) == "static":
        return {"cache_implementation": "static"}
    return {}
