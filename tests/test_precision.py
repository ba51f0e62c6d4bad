"""The one precision rule: bf16 only where the hardware computes it natively."""

from __future__ import annotations

import pytest
import torch

from mmoa.precision import (
    autocast,
    cpu_has_bf16,
    device_type_of,
    resolve_precision,
    train_overrides,
)


def test_cpu_bf16_is_read_from_the_cpu_flags() -> None:
    assert cpu_has_bf16("flags : fpu sse2 avx2 avx512f avx512_bf16 amx_tile")
    assert cpu_has_bf16("flags : fpu avx2 amx_bf16")
    # AVX-512 without its BF16 extension emulates bf16 (measured 6-40x slower than fp32 on an
    # AVX2-only EPYC for SmolLM2's matrix shapes): not native
    assert not cpu_has_bf16("flags : fpu sse2 avx2 avx512f avx512bw")
    assert not cpu_has_bf16("")


def test_explicit_precisions_pass_and_bad_ones_are_refused() -> None:
    assert resolve_precision("fp32") == "fp32"
    assert resolve_precision("bf16") == "bf16"
    assert resolve_precision("auto") in ("fp32", "bf16")
    with pytest.raises(ValueError, match="precision must be one of auto, bf16, fp32"):
        resolve_precision("fp16")


def test_training_overrides() -> None:
    assert train_overrides("fp32", on_gpu=False) == ["bf16=false"]
    assert train_overrides("bf16", on_gpu=False) == ["bf16=true", "use_cpu=true"]
    assert train_overrides("bf16", on_gpu=True) == ["bf16=true"]


def test_autocast_computes_in_bf16_only_when_asked() -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast("bf16", "cpu"):
        assert (a @ b).dtype == torch.bfloat16
    with autocast("fp32", "cpu"):
        assert (a @ b).dtype == torch.float32


def test_device_type_is_where_the_parameters_sit() -> None:
    assert device_type_of(torch.nn.Linear(2, 2)) == "cpu"
