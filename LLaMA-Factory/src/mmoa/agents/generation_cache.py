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
from mmoa.precision import device_type_of

GENERATION_CACHES: tuple[str, ...] = ("auto", "dynamic", "static")

__all__ = ["GENERATION_CACHE", "GENERATION_CACHES", "cache_kwargs", "check_generation_cache",
           "resolve_generation_cache", "weights_in_compute_dtype"]


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


def weights_in_compute_dtype(model: Any) -> bool:
    """Whether ``model`` computes in its weights' dtype: no autocast on its device, or an
    autocast to the dtype of its input embeddings (the dtype of the residual stream).

    A static cache holds one dtype, set by the first keys it receives. Under bf16 autocast over
    fp32 weights the keys come out of the rotary embedding in fp32 (its cos/sin take the fp32
    hidden states' dtype) and the values out of ``v_proj`` in bf16, so the cache refuses the
    values (``index_copy_(): ... Float and BFloat16``, seen on an H200 and on a CPU in the MAPPO
    trainer); the dynamic cache stores each as it comes."""
    import torch

    device_type = device_type_of(model)
    if not torch.is_autocast_enabled(device_type):
        return True
    return model.get_input_embeddings().weight.dtype == torch.get_autocast_dtype(device_type)


def cache_kwargs(cache: str, model: Any) -> dict[str, Any]:
    """The ``generate`` keyword arguments of ``cache`` for ``model`` where it is about to
    generate (its device, the autocast in force): none for the dynamic cache (transformers'
    default), ``cache_implementation="static"`` for the static one (which makes transformers
    compile the decoding step on CUDA). ``auto`` is the static cache only where it works (on
    CUDA, weights in the compute dtype); an explicit ``static`` where it cannot work raises
    ``ValueError``."""
    device_type = device_type_of(model)
    if resolve_generation_cache(cache, device_type) != "static":
        return {}
    if not weights_in_compute_dtype(model):
        if cache == "auto":
            return {}
        raise ValueError(
            "generation cache static needs the weights in the compute dtype, but this model "
            "holds them in another and generates under autocast (bf16 over fp32 weights): "
            "load it in bf16 (evaluation on a GPU does), or use the dynamic cache. MAPPO's "
            "rollouts generate with a bf16 copy of the policy in that case "
            "(mmoa.train.mappo.rollout_weights)")
    return {"cache_implementation": "static"}
