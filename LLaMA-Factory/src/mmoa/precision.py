"""Numeric precision: one rule for training, rollouts and evaluation.

bf16 where the hardware computes it natively and faster (a GPU with bf16, or a CPU with AVX-512
BF16 or AMX on which a short probe finds bf16 matrix products faster than fp32), fp32 elsewhere:
on a CPU without those instructions bf16 is emulated and several times slower than fp32, and the
flags alone are not enough: on a 2-core Intel Xeon with AVX-512 BF16 (no AMX) bf16 products ran at
half fp32's rate and a SmolLM2 SFT step took 117-148 s in bf16 against 76-98 s in fp32.
Training uses bf16 *autocast* over fp32 weights (LLaMA-Factory's ``bf16: true``; on a CPU it also
needs ``use_cpu: true``), so the optimiser still updates fp32 master weights; evaluation runs
under the same autocast, so a model is evaluated with the arithmetic it was trained with. A model
loaded only for inference (evaluation, data synthesis, the playground) holds bf16 *weights* on
a GPU at bf16 (half the memory and no per-call casts; :func:`inference_weights_dtype`) and fp32
weights under autocast on a CPU, where the figures of every run so far were measured.

``python -m mmoa.precision [auto|bf16|fp32]`` prints the resolved precision and the training
overrides, for shell scripts (``run_demo.sh``).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mmoa.config_values import reads_as_true

if TYPE_CHECKING:
    import torch

Precision = Literal["fp32", "bf16"]
PRECISION_CHOICES: tuple[str, ...] = ("auto", "bf16", "fp32")


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """True when the CPU has native bf16 arithmetic (AVX-512 BF16 or AMX)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    flags = set(cpuinfo.split())
    return "avx512_bf16" in flags or "amx_bf16" in flags


#: bf16 must beat fp32 by this factor in :func:`bf16_matmul_speedup` for ``auto`` to pick it on a
#: CPU: a margin, so that machines where the two are level (timing noise) resolve to fp32 every
#: time, which keeps the precision in a run's key stable.
BF16_MIN_SPEEDUP = 1.2


def linear_layer_gflops(dtype: torch.dtype, tokens: int = 512, hidden: int = 576,
                        inner: int = 1536, repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of the forward and the two backward products of one linear layer, by default
    SmolLM2-135M's MLP (576 x 1,536) over 512 tokens; the best of ``repeats`` after a warm-up."""
    import torch

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=generator).to(dtype)
    w = torch.randn(inner, hidden, generator=generator).to(dtype)
    g = torch.randn(tokens, inner, generator=generator).to(dtype)
    flops = 2.0 * tokens * hidden * inner
    products = {"forward x@W^T": lambda: x @ w.t(), "grad input g@W": lambda: g @ w,
                "grad weight g^T@x": lambda: g.t() @ x}
    out = {}
    for name, product in products.items():
        product()  # warm-up (oneDNN builds its kernels on the first call)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - start)
        out[name] = round(flops / best / 1e9, 2)
    return out


@functools.lru_cache(maxsize=1)
def bf16_matmul_speedup() -> float:
    """fp32's time over bf16's for :func:`linear_layer_gflops`' three products on this CPU (> 1:
    bf16 is faster). Measured once a process, in well under a second."""
    import torch

    def seconds(dtype: torch.dtype) -> float:
        return sum(1.0 / rate for rate in linear_layer_gflops(dtype, repeats=5).values())

    return seconds(torch.float32) / seconds(torch.bfloat16)


def cpu_bf16_pays(cpuinfo: str | None = None, speedup: float | None = None) -> bool:
    """Whether ``auto`` should compute in bf16 on this CPU: native bf16 instructions, and bf16
    products at least :data:`BF16_MIN_SPEEDUP` times as fast as fp32's (``speedup``, measured
    by :func:`bf16_matmul_speedup` when not given; never measured on a CPU without the flags)."""
    if not cpu_has_bf16(cpuinfo):
        return False
    return (bf16_matmul_speedup() if speedup is None else speedup) >= BF16_MIN_SPEEDUP


def check_precision_name(requested: str) -> None:
    """Raises ``ValueError`` unless ``requested`` is one of :data:`PRECISION_CHOICES`."""
    if requested not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, "
                         f"got {requested!r}")


def resolve_precision(requested: str = "auto") -> Precision:
    """``auto`` -> ``bf16`` on a GPU with bf16 or a CPU where it pays (:func:`cpu_bf16_pays`),
    else ``fp32``; the others pass through."""
    check_precision_name(requested)
    if requested != "auto":
        return requested  # type: ignore[return-value]
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_bf16_pays() else "fp32"


#: Why the warnings below matter, as measured: on a 2-core AVX2 CPU a demo MAPPO step of SmolLM2
#: took over 8 minutes in (emulated) bf16 before its update had begun, against about 2.7 minutes
#: for the whole step in fp32.
EMULATED_BF16 = ("bf16 on this CPU is emulated (it has neither AVX-512 BF16 nor AMX): several "
                 "times slower than fp32 here. Use fp32 (bf16=false, --precision fp32) or "
                 "--precision auto, which picks bf16 only where the hardware computes it.")


def slow_bf16_message(speedup: float) -> str:
    """The warning for bf16 asked of a CPU with native bf16 that computes it slower than fp32."""
    return (f"bf16 on this CPU is slower than fp32 although it has native bf16 instructions: "
            f"bf16 matrix products measured at {speedup:.2f} times fp32's rate. Use fp32 "
            f"(bf16=false, --precision fp32) or --precision auto, which measures this.")


def emulated_bf16_warning(bf16: bool, on_gpu: bool, cpuinfo: str | None = None,
                          speedup: float | None = None) -> str | None:
    """A warning when bf16 is asked of a CPU where it costs time, else ``None``:
    :data:`EMULATED_BF16` without native bf16, :func:`slow_bf16_message` where native bf16 still
    measures slower than fp32 (``speedup`` < 1, :func:`bf16_matmul_speedup` when not given).

    ``auto`` never picks bf16 there (:func:`resolve_precision`); an explicit ``bf16`` (a config's
    ``bf16: true``, a shared override such as ``bf16=true use_cpu=true`` carried from a machine
    that had it) is obeyed, with this warning, because it still computes correctly."""
    if not bf16 or on_gpu:
        return None
    if not cpu_has_bf16(cpuinfo):
        return EMULATED_BF16
    speedup = bf16_matmul_speedup() if speedup is None else speedup
    return slow_bf16_message(speedup) if speedup < 1.0 else None


def training_on_gpu(config: Mapping[str, Any]) -> bool:
    """Whether a LLaMA-Factory training config runs on a GPU: CUDA present and no ``use_cpu``."""
    import torch

    return torch.cuda.is_available() and not reads_as_true(config.get("use_cpu", False))


def train_config_warning(config: Mapping[str, Any], on_gpu: bool, cpuinfo: str | None = None,
                         speedup: float | None = None) -> str | None:
    """:func:`emulated_bf16_warning` for a training config (``bf16: true`` on a CPU)."""
    return emulated_bf16_warning(reads_as_true(config.get("bf16", False)), on_gpu, cpuinfo,
                                 speedup)


def train_overrides(precision: Precision, on_gpu: bool) -> list[str]:
    """LLaMA-Factory keys for a training run at ``precision`` (``key=value`` strings)."""
    if precision == "fp32":
        return ["bf16=false"]
    return ["bf16=true"] if on_gpu else ["bf16=true", "use_cpu=true"]


def inference_weights_dtype(precision: Precision, on_gpu: bool) -> str:
    """The dtype (a torch name) of a model loaded for inference: ``bfloat16`` on a GPU at bf16,
    else ``float32`` (bf16 on a CPU comes from :func:`autocast` over fp32 weights, as in training;
    a GPU without bf16 resolves to fp32, never to LLaMA-Factory's fp16 fallback)."""
    return "bfloat16" if precision == "bf16" and on_gpu else "float32"


@contextlib.contextmanager
def autocast(precision: Precision, device_type: str) -> Iterator[None]:
    """bf16 autocast on ``device_type`` (``cpu`` or ``cuda``), or nothing for fp32."""
    if precision == "fp32":
        yield
        return
    import torch

    with torch.autocast(device_type, dtype=torch.bfloat16):
        yield


def device_type_of(model: torch.nn.Module) -> str:
    """``cpu`` or ``cuda``: where a torch module's parameters sit (what :func:`autocast` needs)."""
    return next(model.parameters()).device.type


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    requested = args[0] if args else "auto"
    try:
        precision = resolve_precision(requested)
    except ValueError as err:
        print(f"mmoa.precision: {err}", file=sys.stderr)
        return 2
    import torch

    print(precision, *train_overrides(precision, torch.cuda.is_available()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
