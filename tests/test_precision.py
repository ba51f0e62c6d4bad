"""The one precision rule: bf16 only where the hardware computes it natively and faster."""

from __future__ import annotations

import pytest
import torch

import mmoa.precision as precision_module
from mmoa.precision import (
    BF16_MIN_SPEEDUP,
    EMULATED_BF16,
    autocast,
    bf16_matmul_speedup,
    cpu_bf16_pays,
    cpu_has_bf16,
    device_type_of,
    emulated_bf16_warning,
    inference_weights_dtype,
    linear_layer_gflops,
    resolve_precision,
    slow_bf16_message,
    train_config_warning,
    train_overrides,
    training_on_gpu,
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


def test_inference_weights_are_bf16_only_on_a_gpu_at_bf16() -> None:
    assert inference_weights_dtype("bf16", on_gpu=True) == "bfloat16"
    assert inference_weights_dtype("bf16", on_gpu=False) == "float32"
    assert inference_weights_dtype("fp32", on_gpu=True) == "float32"
    assert inference_weights_dtype("fp32", on_gpu=False) == "float32"


def test_inference_args_carry_the_rules_dtype(tmp_path) -> None:
    from mmoa.modeling import inference_args

    assert inference_args(tmp_path, "smollm2", "bf16", on_gpu=True)["infer_dtype"] == "bfloat16"
    assert inference_args(tmp_path, "smollm2", "bf16", on_gpu=False)["infer_dtype"] == "float32"
    assert inference_args(tmp_path, "smollm2", "fp32", on_gpu=True)["infer_dtype"] == "float32"
    with pytest.raises(ValueError, match="precision must be one of"):
        inference_args(tmp_path, "smollm2", "fp16", on_gpu=True)


def test_the_loaded_weights_have_the_dtype_the_rule_names(tiny_model_dir, monkeypatch) -> None:
    """On this CPU the rule names fp32; forced to bf16 (what it names on a GPU), the loaded
    weights are bf16 although llamafactory loads a checkpoint's own dtype (fp32 here)."""
    import mmoa.modeling as modeling

    model, _ = modeling.load_for_inference(tiny_model_dir, "llama3", precision="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    monkeypatch.setattr(modeling, "inference_weights_dtype", lambda precision, on_gpu: "bfloat16")
    model, _ = modeling.load_for_inference(tiny_model_dir, "llama3", precision="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


AVX2_ONLY = "flags : fpu sse sse2 avx avx2 fma"
WITH_BF16 = "flags : fpu sse sse2 avx avx2 avx512f avx512_bf16"


def test_native_bf16_pays_only_where_the_probe_finds_it_faster(monkeypatch) -> None:
    assert cpu_bf16_pays(WITH_BF16, speedup=2.0)
    assert cpu_bf16_pays(WITH_BF16, speedup=BF16_MIN_SPEEDUP)
    # level with fp32, within the margin: fp32, so that the key of a run stays the same
    assert not cpu_bf16_pays(WITH_BF16, speedup=1.1)
    # the 2-core Intel Xeon with AVX-512 BF16 (no AMX): bf16 products at about half fp32's rate
    assert not cpu_bf16_pays(WITH_BF16, speedup=0.5)

    def no_probe() -> float:
        raise AssertionError("a CPU without bf16 instructions is never probed")

    monkeypatch.setattr(precision_module, "bf16_matmul_speedup", no_probe)
    assert not cpu_bf16_pays(AVX2_ONLY)
    assert emulated_bf16_warning(True, on_gpu=False, cpuinfo=AVX2_ONLY) == EMULATED_BF16


def test_the_probe_measures_the_three_products_of_a_linear_layer() -> None:
    rates = linear_layer_gflops(torch.float32, tokens=8, hidden=16, inner=32, repeats=2)
    assert set(rates) == {"forward x@W^T", "grad input g@W", "grad weight g^T@x"}
    assert all(rate > 0 for rate in rates.values())
    speedup = bf16_matmul_speedup()
    assert speedup > 0 and speedup == bf16_matmul_speedup()  # measured once a process


def test_bf16_asked_of_a_cpu_where_it_costs_time_is_warned_about() -> None:
    assert emulated_bf16_warning(True, on_gpu=False, cpuinfo=AVX2_ONLY) == EMULATED_BF16
    assert emulated_bf16_warning(True, on_gpu=False, cpuinfo=WITH_BF16, speedup=1.6) is None
    assert emulated_bf16_warning(True, on_gpu=False, cpuinfo="flags : amx_bf16",
                                 speedup=3.0) is None
    slow = emulated_bf16_warning(True, on_gpu=False, cpuinfo=WITH_BF16, speedup=0.5)
    assert slow == slow_bf16_message(0.5) and "0.50 times fp32's rate" in slow
    assert emulated_bf16_warning(True, on_gpu=True, cpuinfo=AVX2_ONLY) is None
    assert emulated_bf16_warning(False, on_gpu=False, cpuinfo=AVX2_ONLY) is None


def test_a_training_configs_bf16_key_is_read_as_llamafactory_reads_it() -> None:
    for value in (True, "true", "True", 1, "1"):
        assert train_config_warning({"bf16": value, "use_cpu": True}, False,
                                    AVX2_ONLY) == EMULATED_BF16
    for config in ({"bf16": False}, {"bf16": "false"}, {}):
        assert train_config_warning(config, False, AVX2_ONLY) is None
    assert train_config_warning({"bf16": True}, False, WITH_BF16, speedup=1.6) is None
    # use_cpu keeps the run on the CPU even where CUDA is present
    assert not training_on_gpu({"bf16": True, "use_cpu": "true"})
