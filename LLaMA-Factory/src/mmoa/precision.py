"""Numeric precision: one rule for training, rollouts and evaluation.

bf16 where the hardware computes it natively (a GPU with bf16, or a CPU with AVX-512 BF16 or AMX),
fp32 elsewhere: on a CPU without those instructions bf16 is emulated and slower than fp32.
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
import sys
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


def check_precision_name(requested: str) -> None:
    """Raises ``ValueError`` unless ``requested`` is one of :data:`PRECISION_CHOICES`."""
    if requested not in PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, "
                         f"got {requested!r}")


def resolve_precision(requested: str = "auto") -> Precision:
    """``auto`` -> ``bf16`` on hardware with native bf16, else ``fp32``; others pass through."""
    check_precision_name(requested)
    if requested != "auto":
        return requested  # type: ignore[return-value]
    import torch

    if torch.cuda.is_available():
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if cpu_has_bf16() else "fp32"


#: Why the warnings below matter, as measured: on a 2-core AVX2 CPU a demo MAPPO step of SmolLM2
#: took over 8 minutes in (emulated) bf16 before its update had begun, against about 2.7 minutes
#: for the whole step in fp32.
EMULATED_BF16 = ("bf16 on this CPU is emulated (it has neither AVX-512 BF16 nor AMX): several "
                 "times slower than fp32 here. Use fp32 (bf16=false, --precision fp32) or "
                 "--precision auto, which picks bf16 only where the hardware computes it.")


def emulated_bf16_warning(bf16: bool, on_gpu: bool, cpuinfo: str | None = None) -> str | None:
    """:data:`EMULATED_BF16` when bf16 is asked of a CPU without native bf16, else ``None``.

    ``auto`` never picks it (:func:`resolve_precision`); an explicit ``bf16`` (a config's
    ``bf16: true``, a shared override such as ``bf16=true use_cpu=true`` carried from a machine
    that had it) is obeyed, with this warning, because it still computes correctly."""
    if not bf16 or on_gpu or cpu_has_bf16(cpuinfo):
        return None
    return EMULATED_BF16


def training_on_gpu(config: Mapping[str, Any]) -> bool:
    """Whether a LLaMA-Factory training config runs on a GPU: CUDA present and no ``use_cpu``."""
    import torch

    return torch.cuda.is_available() and not reads_as_true(config.get("use_cpu", False))


def train_config_warning(config: Mapping[str, Any], on_gpu: bool,
                         cpuinfo: str | None = None) -> str | None:
    """:func:`emulated_bf16_warning` for a training config (``bf16: true`` on a CPU)."""
    return emulated_bf16_warning(reads_as_true(config.get("bf16", False)), on_gpu, cpuinfo)


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
