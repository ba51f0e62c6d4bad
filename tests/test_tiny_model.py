"""The tiny demo model: tokenizer round-trip, Llama-3 special tokens and chat template parity with
llamafactory's ``llama3`` template, offline loading (transformers and llamafactory, LoRA and full),
determinism and atomic output."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmoa.agents.prompts import format_answer, generator_prompt, qr_prompt, selector_prompt
from mmoa.fileio import DataFormatError
from mmoa_demo.tiny_model import (
    BOS_TOKEN,
    END_OF_TEXT_TOKEN,
    EOM_TOKEN,
    EOT_TOKEN,
    INFO_FILE,
    SPECIAL_TOKENS,
    TEMPLATE_NAME,
    TinyModelConfig,
    default_extra_texts,
    default_text_files,
    demo_world_texts,
    directory_digest,
    iter_strings,
    load_info,
    make_tiny_model,
    texts_from_jsonl,
    train_tokenizer,
)
from mmoa_demo.world import write_demo_world

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "models" / "make_tiny_model.py"

# Fixed texts for the small, fast builds of the determinism, atomicity and script tests.
FEW_TEXTS = [
    "Wufand Kleispri is a novelist who was born in Brafield in 1923.",
    "Where was Wufand Kleispri born?",
    "The Silent River (1985) is a comedy film by Brindnoul Trica.",
] * 20
SMALL = TinyModelConfig(
    vocab_size=400, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
)


def _tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def _state_dict_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _llamafactory(path: Path, finetuning_type: str = "lora"):
    """Tokenizer, llama3 template and model exactly as llamafactory's inference path loads them."""
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.hparams import get_infer_args
    from llamafactory.model import load_model, load_tokenizer

    model_args, data_args, finetuning_args, _ = get_infer_args(
        {
            "model_name_or_path": str(path),
            "template": TEMPLATE_NAME,
            "finetuning_type": finetuning_type,
            "infer_backend": "huggingface",
        }
    )
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    size_before = len(tokenizer)
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    assert len(tokenizer) == size_before, "the llama3 template must not add tokens"
    assert not model_args.resize_vocab
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=False)
    return tokenizer, template, model


# ------------------------------------------------------------------------------------------------
# Configuration and text collection
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vocab_size": 100}, "vocab_size=100"),
        ({"hidden_size": 250}, "hidden_size=250"),
        ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
        ({"num_hidden_layers": 0}, "num_hidden_layers=0"),
    ],
)
def test_bad_config_is_rejected_with_the_field_name(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TinyModelConfig(**overrides)


def test_iter_strings_collects_values_and_list_items() -> None:
    record = {"id": "q1", "n": 3, "answers": ["a", "", "b"], "nested": {"x": ["c", 4]}, "e": ""}
    assert list(iter_strings(record)) == ["q1", "a", "b", "c"]
    # an annotation that re-phrases the world's text leaves the tokenizer's texts as they were
    annotated = {**record, "resolved_decomposition": ["Where was Ada Brel born?"]}
    assert list(iter_strings(annotated)) == ["q1", "a", "b", "c"]


def test_texts_from_jsonl_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text('{"title": "T", "text": "x y"}\n\n{"answers": ["a", "b"]}\n', encoding="utf-8")
    assert texts_from_jsonl([good]) == ["T", "x y", "a", "b"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": \n', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"bad\.jsonl:2"):
        texts_from_jsonl([bad])

    empty = tmp_path / "numbers.jsonl"
    empty.write_text('{"n": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"numbers\.jsonl: contains no string"):
        texts_from_jsonl([empty])

    with pytest.raises(FileNotFoundError, match="make_demo_world"):
        default_text_files(tmp_path / "nothing-here")


def test_demo_world_texts_equal_the_written_files(tmp_path: Path, tiny_world) -> None:
    """The fixture's in-memory texts are exactly what the script reads from data/demo."""
    write_demo_world(tiny_world, tmp_path / "demo")
    files = default_text_files(tmp_path / "demo")
    assert [f.name for f in files] == ["corpus.jsonl", "dev.jsonl", "test.jsonl", "train.jsonl"]
    assert texts_from_jsonl(files) == demo_world_texts(tiny_world)


# ------------------------------------------------------------------------------------------------
# Tokenizer
# ------------------------------------------------------------------------------------------------


def test_tokenizer_round_trips_every_demo_text(tiny_model_dir: Path, tiny_world) -> None:
    tokenizer = _tokenizer(tiny_model_dir)
    texts: list[str] = []
    for passage in tiny_world.corpus:
        texts += [passage["title"], passage["text"]]
    for records in tiny_world.splits.values():
        for record in records:
            texts += [record["question"], *record["answers"], *record["decomposition"]]
    assert len(texts) > 1000
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text


def test_tokenizer_round_trips_unseen_text_through_byte_tokens(tiny_model_dir: Path) -> None:
    tokenizer = _tokenizer(tiny_model_dir)
    assert tokenizer.unk_token is None
    for text in [" leading space", "tabs\tand\r\nCRLF  ", "Ünïcødé — 東京 🙂", "a\n\n\nb", "   "]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text


def test_tokenizer_learned_the_demo_vocabulary(tiny_model_dir: Path, tiny_world) -> None:
    """Trained, not byte-level only: demo words and the prompt wording are whole tokens."""
    tokenizer = _tokenizer(tiny_model_dir)
    vocab = tokenizer.get_vocab()
    assert len(tokenizer) > 1000
    passage = tiny_world.corpus[0]["text"]
    assert len(tokenizer.encode(passage, add_special_tokens=False)) < len(passage) / 3
    for word in ["ĠDocument", "Question", "Ġsub", "user", "assistant", "ĊĊ"]:
        assert word in vocab, word


def test_llama3_special_tokens(tiny_model_dir: Path) -> None:
    tokenizer = _tokenizer(tiny_model_dir)
    ids = [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS]
    assert len(set(ids)) == len(SPECIAL_TOKENS)
    for token, token_id in zip(SPECIAL_TOKENS, ids, strict=True):
        assert tokenizer.encode(token, add_special_tokens=False) == [token_id]
    assert tokenizer.bos_token == BOS_TOKEN
    assert tokenizer.eos_token == EOT_TOKEN
    assert tokenizer.pad_token is None  # as in Llama-3; llamafactory sets pad = eos
    # As Llama-3: plain encode() prepends bos, special tokens are skipped on request.
    assert tokenizer.encode("Paris")[0] == tokenizer.bos_token_id
    text = f"{BOS_TOKEN}<|start_header_id|>user<|end_header_id|>\n\nhi{EOT_TOKEN}"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == "user\n\nhi"


# ------------------------------------------------------------------------------------------------
# Chat template parity with llamafactory's llama3 template
# ------------------------------------------------------------------------------------------------


def _conversations(tiny_world) -> list[tuple[str | None, list[dict[str, str]]]]:
    record = tiny_world.splits["train"][0]
    docs = [f"{p['title']}\n{p['text']}" for p in tiny_world.corpus[:10]]
    question, answer = record["question"], record["answers"][0]
    cases: list[tuple[str | None, list[dict[str, str]]]] = [
        (
            "Answer briefly.",
            [
                {"role": "user", "content": "Where was Foum Prantror born?"},
                {"role": "assistant", "content": "Tronford"},
            ],
        ),
        (
            None,
            [
                {"role": "user", "content": " spaces kept \n"},
                {"role": "assistant", "content": "\nleading newline"},
            ],
        ),
    ]
    for prompt, output in [
        (qr_prompt(question), "\n".join(record["decomposition"])),
        (selector_prompt(question, docs), "Document0,Document3"),
        (generator_prompt(question, docs[:3]), format_answer(answer)),
    ]:
        cases.append((prompt.system, prompt.messages(output)))
    return cases


def test_chat_template_gives_llamafactory_llama3_ids(tiny_model_dir: Path, tiny_world) -> None:
    tokenizer, template, _ = _llamafactory(tiny_model_dir)
    plain = _tokenizer(tiny_model_dir)  # before llamafactory touched it
    eot, eom = (tokenizer.convert_tokens_to_ids(t) for t in (EOT_TOKEN, EOM_TOKEN))
    assert tokenizer.eos_token_id == tokenizer.pad_token_id == eot
    assert sorted(template.get_stop_token_ids(tokenizer)) == sorted([eot, eom])
    for system, messages in _conversations(tiny_world):
        prompt_ids, response_ids = template.encode_oneturn(tokenizer, messages, system)
        chat = ([{"role": "system", "content": system}] if system else []) + messages
        for tok in (tokenizer, plain):
            prompt = tok.apply_chat_template(
                chat[:-1], add_generation_prompt=True, return_dict=False
            )
            assert prompt == prompt_ids
            full = tok.apply_chat_template(chat, return_dict=False)
            assert full == prompt_ids + response_ids
        assert prompt_ids[0] == tokenizer.bos_token_id
        assert response_ids[-1] == eot


def test_chat_template_matches_llamafactory_over_several_turns(tiny_model_dir: Path) -> None:
    tokenizer, template, _ = _llamafactory(tiny_model_dir)
    messages = [
        {"role": "user", "content": "Who directed The Silent River?"},
        {"role": "assistant", "content": "Brindnoul Trica"},
        {"role": "user", "content": "When?"},
        {"role": "assistant", "content": "1985"},
    ]
    pairs = template.encode_multiturn(tokenizer, messages, system="Be brief.")
    expected = [i for prompt, response in pairs for i in prompt + response]
    chat = [{"role": "system", "content": "Be brief."}, *messages]
    assert tokenizer.apply_chat_template(chat, return_dict=False) == expected
    # An empty system prompt is left out, as llamafactory does.
    no_system = [i for p, r in template.encode_multiturn(tokenizer, messages, "") for i in p + r]
    chat[0]["content"] = ""
    assert tokenizer.apply_chat_template(chat, return_dict=False) == no_system


# ------------------------------------------------------------------------------------------------
# Loading and generating
# ------------------------------------------------------------------------------------------------


def test_loads_offline_with_transformers(tiny_model_dir: Path) -> None:
    tokenizer, model = _tokenizer(tiny_model_dir), _model(tiny_model_dir)
    config = model.config
    assert config.model_type == "llama"
    assert type(model).__name__ == "LlamaForCausalLM"
    assert config.vocab_size == len(tokenizer)
    assert config.num_key_value_heads < config.num_attention_heads  # GQA
    assert config.max_position_embeddings >= 2048
    assert config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert 2_000_000 <= model.num_parameters() <= 5_000_000
    assert (tiny_model_dir / "model.safetensors").is_file()
    eos = model.generation_config.eos_token_id
    stops = {tokenizer.convert_tokens_to_ids(t) for t in (EOT_TOKEN, END_OF_TEXT_TOKEN)}
    assert stops <= set(eos)
    assert model.generation_config.bos_token_id == tokenizer.bos_token_id
    info = load_info(tiny_model_dir)
    assert info["template"] == TEMPLATE_NAME
    assert info["config"]["seed"] == TinyModelConfig().seed


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_loads_through_llamafactory_and_generates(
    tiny_model_dir: Path, finetuning_type: str
) -> None:
    tokenizer, template, model = _llamafactory(tiny_model_dir, finetuning_type)
    assert type(model).__name__ == "LlamaForCausalLM"
    messages = qr_prompt("Where was Foum Prantror born?").messages("")
    prompt_ids, _ = template.encode_oneturn(tokenizer, messages, "You answer questions.")
    inputs = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = model.generate(
            inputs, attention_mask=torch.ones_like(inputs), max_new_tokens=5, do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    new = out[0, len(prompt_ids):].tolist()
    assert 1 <= len(new) <= 5
    assert all(0 <= i < len(tokenizer) for i in new)
    assert isinstance(tokenizer.decode(new), str)


def test_lora_training_setup_through_llamafactory(tiny_model_dir: Path, tmp_path: Path) -> None:
    """get_train_args + load_model(is_trainable=True) attach LoRA; a training step runs."""
    from llamafactory.data import get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_model, load_tokenizer

    model_args, data_args, _, finetuning_args, _ = get_train_args(
        {
            "model_name_or_path": str(tiny_model_dir),
            "stage": "sft",
            "do_train": True,
            "finetuning_type": "lora",
            "lora_target": "all",
            "template": TEMPLATE_NAME,
            "dataset": "unused",
            "output_dir": str(tmp_path / "out"),
            "report_to": "none",
        }
    )
    tokenizer = load_tokenizer(model_args)["tokenizer"]
    template = get_template_and_fix_tokenizer(tokenizer, data_args)
    model = load_model(tokenizer, model_args, finetuning_args, is_trainable=True)
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert trainable and sum(p.numel() for p in trainable) < model.num_parameters() / 5
    prompt, response = template.encode_oneturn(
        tokenizer,
        [{"role": "user", "content": "Where was Foum born?"},
         {"role": "assistant", "content": "Tronford"}],
    )
    ids = torch.tensor([prompt + response])
    labels = torch.tensor([[-100] * len(prompt) + response])
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainable)


# ------------------------------------------------------------------------------------------------
# Determinism, atomic output, script
# ------------------------------------------------------------------------------------------------


def test_same_texts_and_seed_give_identical_files(
    tiny_model_dir: Path, tiny_world, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    info = make_tiny_model(demo_world_texts(tiny_world), again, extra_texts=default_extra_texts())
    assert directory_digest(again) == directory_digest(tiny_model_dir)
    assert _state_dict_digest(_model(again)) == _state_dict_digest(_model(tiny_model_dir))
    assert info.vocab_size == len(_tokenizer(again))
    assert info.num_parameters == _model(again).num_parameters()


def test_other_seed_changes_weights_not_tokenizer(tmp_path: Path) -> None:
    make_tiny_model(FEW_TEXTS, tmp_path / "a", SMALL)
    make_tiny_model(FEW_TEXTS, tmp_path / "b", TinyModelConfig(**{**SMALL.__dict__, "seed": 1}))
    a, b = directory_digest(tmp_path / "a"), directory_digest(tmp_path / "b")
    assert a["tokenizer.json"] == b["tokenizer.json"]
    assert a["model.safetensors"] != b["model.safetensors"]


def test_making_a_model_leaves_the_global_rng_alone() -> None:
    tokenizer = train_tokenizer(FEW_TEXTS, SMALL.vocab_size)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    from mmoa_demo.tiny_model import build_model

    build_model(tokenizer, SMALL)
    assert torch.equal(torch.rand(3), expected)


def test_failed_write_keeps_the_previous_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "tiny"
    make_tiny_model(FEW_TEXTS, out, SMALL)
    before = directory_digest(out)

    def fail(*_args, **_kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("mmoa_demo.tiny_model.atomic_write_json", fail)
    with pytest.raises(OSError, match="disk full"):
        make_tiny_model(FEW_TEXTS, out, TinyModelConfig(**{**SMALL.__dict__, "seed": 5}))
    assert directory_digest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]  # no temporary leftovers


def _run_script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "LLaMA-Factory" / "src")])}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
        cwd=REPO, timeout=300, check=False,
    )


def test_script_makes_a_model_and_reports_it(tmp_path: Path) -> None:
    texts = tmp_path / "texts.jsonl"
    texts.write_text(
        "".join(json.dumps({"text": t, "answers": [t[:5]]}) + "\n" for t in FEW_TEXTS),
        encoding="utf-8",
    )
    out = tmp_path / "model"
    sizes = ["--vocab-size", "400", "--hidden-size", "32", "--intermediate-size", "64",
             "--num-hidden-layers", "1", "--num-attention-heads", "2",
             "--num-key-value-heads", "1", "--max-position-embeddings", "128"]
    result = _run_script("--text-files", str(texts), "--output-dir", str(out), *sizes)
    assert result.returncode == 0, result.stderr
    model = _model(out)
    assert str(out) in result.stdout
    assert f"parameters: {model.num_parameters():,}" in result.stdout
    assert f"vocab size: {len(_tokenizer(out))}" in result.stdout
    assert f"template:   {TEMPLATE_NAME}" in result.stdout
    assert load_info(out)["num_texts"] == 2 * len(FEW_TEXTS)


def test_script_help_and_clear_errors(tmp_path: Path) -> None:
    help_result = _run_script("--help")
    assert help_result.returncode == 0
    assert "--text-files" in help_result.stdout and "--vocab-size" in help_result.stdout
    missing = _run_script("--text-dir", str(tmp_path / "no-demo"), "--output-dir", str(tmp_path))
    assert missing.returncode == 2
    assert "no *.jsonl files" in missing.stderr
    bad = _run_script("--num-key-value-heads", "3", "--text-dir", str(tmp_path))
    assert bad.returncode == 2 and "num_key_value_heads=3" in bad.stderr
    assert not (tmp_path / INFO_FILE).exists()
