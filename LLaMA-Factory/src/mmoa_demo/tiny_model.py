"""The tiny demo model: a few-million-parameter Llama, its tokenizer trained on the demo world.

Tests, CI and the demo must run a real causal LM on a 2-core CPU with nothing downloaded, and the
very same YAML (``template: llama3``) must work for this model and for a real Llama-3. So the model
is a genuine ``LlamaForCausalLM`` (random init, seeded) and its tokenizer copies Llama-3's
conventions exactly:

* byte-level BPE with Llama-3's pre-tokenizer regex and no normaliser, so every text round-trips
  through encode/decode byte for byte, and unseen characters fall back to byte tokens;
* Llama-3's special tokens (``<|begin_of_text|>``, ``<|end_of_text|>``, the header tokens,
  ``<|eot_id|>``, ``<|eom_id|>``) already in the vocabulary, so llamafactory's ``llama3`` template
  adds no token and never needs ``resize_vocab``; no pad token (llamafactory sets pad = eos);
* a Llama-3-style jinja chat template that yields the same token ids as llamafactory's
  ``llama3`` template, so ``tokenizer.apply_chat_template`` and llamafactory agree.

Everything is deterministic (same texts + same seed give byte-identical files) and the output
folder is written atomically.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmoa.fileio import PathLike, atomic_dir, atomic_write_json, iter_jsonl, sha256_file

if TYPE_CHECKING:
    from transformers import (
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

#: Name of llamafactory's built-in template that this tokenizer matches.
TEMPLATE_NAME = "llama3"
#: Default output folder (relative to the repository root).
DEFAULT_OUTPUT_DIR = Path("models/tiny-llama3")
#: Folder whose ``*.jsonl`` files are the default training texts.
DEFAULT_TEXT_DIR = Path("data/demo")
#: Provenance file written beside the model (how it was made; no timestamps, so it is reproducible).
INFO_FILE = "tiny_model_info.json"

BOS_TOKEN = "<|begin_of_text|>"
END_OF_TEXT_TOKEN = "<|end_of_text|>"
START_HEADER_TOKEN = "<|start_header_id|>"
END_HEADER_TOKEN = "<|end_header_id|>"
EOT_TOKEN = "<|eot_id|>"
EOM_TOKEN = "<|eom_id|>"
#: Llama-3's special tokens, in the order they get ids 0..5.
SPECIAL_TOKENS: tuple[str, ...] = (
    BOS_TOKEN,
    END_OF_TEXT_TOKEN,
    START_HEADER_TOKEN,
    END_HEADER_TOKEN,
    EOT_TOKEN,
    EOM_TOKEN,
)

#: Llama-3's pre-tokenisation regex. Unlike GPT-2's it keeps a run of newlines in one piece
#: ("\n\nParis" -> "\n\n", "Paris"), so the "\n\n" that ends every chat header is tokenised the
#: same whether the answer follows in the same string (apply_chat_template) or in a separate
#: one (llamafactory encodes prompt and response separately).
LLAMA3_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: Llama-3-style chat template matching llamafactory 0.9.5's ``llama3`` template token for token:
#: bos first, "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>" per message, no
#: default system prompt (an empty system message is dropped, as llamafactory does), content is not
#: trimmed, and the generation prompt is the assistant header.
LLAMA3_CHAT_TEMPLATE = """
{{- bos_token }}
{%- for message in messages %}
    {%- if loop.first and message['role'] == 'system' and not message['content'] %}
        {#- an empty system prompt is left out, as in llamafactory's llama3 template #}
    {%- else %}
        {%- set role = 'ipython' if message['role'] == 'tool' else message['role'] %}
        {{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}
        {{- message['content'] + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
""".strip()


@dataclass(frozen=True)
class TinyModelConfig:
    """Sizes of the tiny model and its tokenizer.

    The defaults (~4M parameters) are chosen for CPU training speed: SFT and PPO of this model on
    prompts of 400-600 tokens must run in minutes on 2 cores. A 4096-token vocabulary already
    covers the demo world's words (a larger one barely shortens the texts but grows the
    embedding), GQA halves the K/V projections, and tied embeddings keep the output layer free.
    """

    vocab_size: int = 4096
    """Target vocabulary size including the 256 byte tokens and the special tokens. A small
    corpus may yield fewer tokens (no pair reaches ``min_frequency``); the model always gets the
    tokenizer's real size."""
    min_frequency: int = 2
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    rope_theta: float = 500000.0
    rms_norm_eps: float = 1e-5
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True
    seed: int = 42
    extra_text_weight: int = 100
    """How many times each extra text (prompt wording) is counted when training the tokenizer: a
    prompt is seen once per training example, so its words must outweigh one-off corpus words."""

    def __post_init__(self) -> None:
        minimum_vocab = 256 + len(SPECIAL_TOKENS)
        if self.vocab_size < minimum_vocab:
            raise ValueError(
                f"vocab_size={self.vocab_size}: must be at least {minimum_vocab} "
                "(256 byte tokens + the Llama-3 special tokens)"
            )
        for name in (
            "min_frequency",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
            "extra_text_weight",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: must be a positive integer")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads={self.num_attention_heads} must be divisible by "
                f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention)"
            )


@dataclass(frozen=True)
class TinyModelInfo:
    """What :func:`make_tiny_model` made."""

    path: Path
    num_parameters: int
    vocab_size: int
    template: str
    num_texts: int

    def summary(self) -> str:
        return (
            f"tiny model: {self.path}\n"
            f"  parameters: {self.num_parameters:,}\n"
            f"  vocab size: {self.vocab_size}\n"
            f"  template:   {self.template}\n"
            f"  trained tokenizer on {self.num_texts:,} texts"
        )


#: Record fields the tokenizer is not trained on: annotations that only re-phrase the world's own
#: text (a bridge hop naming its entity), left out so that adding one to the world does not
#: change the tiny model, nor any result measured with it.
TOKENIZER_SKIPPED_KEYS = frozenset({"resolved_decomposition"})


def iter_strings(obj: Any) -> Iterator[str]:
    """Yield every non-empty string inside ``obj`` (dict values and list items, recursively),
    except under the keys of :data:`TOKENIZER_SKIPPED_KEYS`."""
    if isinstance(obj, str):
        if obj:
            yield obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            if key not in TOKENIZER_SKIPPED_KEYS:
                yield from iter_strings(value)
    elif isinstance(obj, list | tuple):
        for item in obj:
            yield from iter_strings(item)


def default_text_files(text_dir: PathLike = DEFAULT_TEXT_DIR) -> list[Path]:
    """Every ``*.jsonl`` file in ``text_dir``, sorted so the training order is stable."""
    folder = Path(text_dir)
    files = sorted(folder.glob("*.jsonl"))
    if not files:
        raise FileNotFoundError(
            f"{folder}: no *.jsonl files to train the tokenizer on; create the demo world first "
            "(python data_builders/make_demo_world.py) or pass --text-files"
        )
    return files


def texts_from_jsonl(paths: Iterable[PathLike]) -> list[str]:
    """Collect every string value (and every string inside lists) of every record of the files."""
    texts: list[str] = []
    for path in paths:
        before = len(texts)
        for _, record in iter_jsonl(path):
            texts.extend(iter_strings(record))
        if len(texts) == before:
            raise ValueError(f"{path}: contains no string values to train the tokenizer on")
    return texts


#: The text between the chat template's special tokens (role names, the "\n\n" after each
#: header), trained with the extra weight so each is one token, as in Llama-3. The special tokens
#: themselves must stay out of the training texts: BpeTrainer does not split them off, and would
#: learn merges such as "<|" and "|>".
CHAT_HEADER_TEXTS: tuple[str, ...] = tuple(
    f"{role}\n\n" for role in ("system", "user", "assistant", "ipython")
)


def demo_world_texts(world: Any) -> list[str]:
    """Every string of a demo world (``mmoa_demo.world.DemoWorld``), in file order.

    The order is that of reading the files ``write_demo_world`` writes with
    :func:`default_text_files` (``corpus.jsonl`` then the splits by file name), so a model made
    from the world in memory is byte-identical to one made by the script from ``data/demo``.
    """
    texts = list(iter_strings(world.corpus))
    for split in sorted(world.splits):
        texts.extend(iter_strings(world.splits[split]))
    return texts


def default_extra_texts() -> list[str]:
    """The agents' fixed prompt wording, so instruction words become merged tokens."""
    from mmoa.agents.prompts import vocabulary_texts

    return vocabulary_texts()


def _weighted_texts(
    texts: Iterable[str], extra_texts: Sequence[str], extra_text_weight: int
) -> Iterator[str]:
    yield from texts
    for _ in range(extra_text_weight):
        yield from CHAT_HEADER_TEXTS
        yield from extra_texts


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = TinyModelConfig.vocab_size,
    *,
    extra_texts: Sequence[str] = (),
    extra_text_weight: int = TinyModelConfig.extra_text_weight,
    min_frequency: int = TinyModelConfig.min_frequency,
    model_max_length: int = TinyModelConfig.max_position_embeddings,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a Llama-3-style byte-level BPE tokenizer on ``texts`` (+ weighted ``extra_texts``).

    Returns a ``PreTrainedTokenizerFast`` with bos ``<|begin_of_text|>``, eos ``<|eot_id|>`` (the
    chat end-of-turn, as in Llama-3-Instruct), no pad token and the Llama-3 chat template. The
    result depends only on the texts and their order.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    # No normaliser and no prefix space: encode/decode is the identity on every string.
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 bytes, so characters never seen in training still encode (as byte tokens).
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    backend.train_from_iterator(
        _weighted_texts(texts, extra_texts, extra_text_weight), trainer=trainer
    )
    bos_id = backend.token_to_id(BOS_TOKEN)
    # As Llama-3: encode(text) with special tokens prepends bos (llamafactory encodes without).
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOT_TOKEN,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE
    return tokenizer


def build_llama_config(tokenizer: PreTrainedTokenizerFast, config: TinyModelConfig) -> LlamaConfig:
    """The ``LlamaConfig`` for ``config``, sized to the tokenizer's real vocabulary."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        rms_norm_eps=config.rms_norm_eps,
        initializer_range=config.initializer_range,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids(EOT_TOKEN),
        pad_token_id=None,
        dtype="float32",
    )


def build_generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    """Stop on end-of-turn (and on ``<|eom_id|>`` / ``<|end_of_text|>``), as Llama-3.1 does."""
    from transformers import GenerationConfig

    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[
            tokenizer.convert_tokens_to_ids(token)
            for token in (EOT_TOKEN, EOM_TOKEN, END_OF_TEXT_TOKEN)
        ],
    )


def build_model(tokenizer: PreTrainedTokenizerFast, config: TinyModelConfig) -> LlamaForCausalLM:
    """A randomly initialised ``LlamaForCausalLM``; the same seed gives the same weights.

    The global torch RNG is forked, so making a model does not change the caller's random state.
    """
    import torch
    from transformers import LlamaForCausalLM

    llama_config = build_llama_config(tokenizer, config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(llama_config)
    model.generation_config = build_generation_config(tokenizer)
    model.eval()
    return model


def _texts_digest(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


def make_tiny_model(
    texts: Iterable[str],
    output_dir: PathLike = DEFAULT_OUTPUT_DIR,
    config: TinyModelConfig | None = None,
    *,
    extra_texts: Sequence[str] = (),
    show_progress: bool = False,
) -> TinyModelInfo:
    """Train the tokenizer on ``texts``, build the model and save both to ``output_dir``.

    The folder is replaced as a whole only once every file is written, so an interrupted run
    leaves the previous model (or nothing) in place, never a half-written one.
    """
    config = config or TinyModelConfig()
    texts = list(texts)
    if not texts:
        raise ValueError("no texts to train the tokenizer on")
    tokenizer = train_tokenizer(
        texts,
        config.vocab_size,
        extra_texts=extra_texts,
        extra_text_weight=config.extra_text_weight,
        min_frequency=config.min_frequency,
        model_max_length=config.max_position_embeddings,
        show_progress=show_progress,
    )
    model = build_model(tokenizer, config)
    target = Path(output_dir)
    with atomic_dir(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        atomic_write_json(
            tmp / INFO_FILE,
            {
                "made_by": "mmoa_demo.tiny_model.make_tiny_model",
                "template": TEMPLATE_NAME,
                "config": asdict(config),
                "num_texts": len(texts),
                "texts_sha256": _texts_digest(texts),
                "num_extra_texts": len(extra_texts),
                "extra_texts_sha256": _texts_digest(extra_texts),
            },
        )
    return TinyModelInfo(
        path=target,
        num_parameters=model.num_parameters(),  # tied embeddings counted once
        vocab_size=len(tokenizer),
        template=TEMPLATE_NAME,
        num_texts=len(texts),
    )


def directory_digest(path: PathLike) -> dict[str, str]:
    """sha256 of every file in a folder (relative name -> hex digest); used to check determinism."""
    folder = Path(path)
    return {
        str(file.relative_to(folder)): sha256_file(file)
        for file in sorted(folder.rglob("*"))
        if file.is_file()
    }


def load_info(path: PathLike) -> dict[str, Any]:
    """The provenance record of a tiny model folder."""
    info_path = Path(path) / INFO_FILE
    if not info_path.is_file():
        raise FileNotFoundError(f"{info_path}: not a tiny model folder (no {INFO_FILE})")
    return json.loads(info_path.read_text(encoding="utf-8"))
