"""Selector grammar, its logits processor on a real model, and prompt rendering."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessorList

from mmoa.agents.constrained import SelectorLogitsProcessor, is_complete, is_valid_prefix
from mmoa.agents.parsers import parse_selection
from mmoa.agents.prompts import generator_prompt, qr_prompt, selector_prompt
from mmoa.agents.render import PromptRenderer


@pytest.mark.parametrize(
    ("text", "k", "valid", "complete"),
    [
        ("", 10, True, True),
        ("Doc", 10, True, False),
        ("Document", 10, True, False),
        ("Document3", 10, True, True),
        ("Document3,", 10, True, False),
        ("Document3,Document9", 10, True, True),
        ("Document1", 13, True, True),  # 1 is complete and also a prefix of 10..12
        ("Document12", 13, True, True),
        ("Document13", 13, False, False),
        ("Document10", 10, False, False),
        ("Document01", 10, False, False),
        ("Document,", 10, False, False),
        ("Document3,,", 10, False, False),
        ("Documents", 10, False, False),
        ("3,4", 10, False, False),
        (",", 10, False, False),
        ("Document3 ", 10, False, False),
        ("Document3,Document3", 10, False, False),  # a repeated id
        ("Document3,Document9,Document3", 10, False, False),
        ("Document1,Document1", 13, True, False),  # may still become Document10..12
        ("Document1,Document10,Document1", 11, False, False),  # no unused id starts with 1
        ("Document0,Document", 1, False, False),  # k=1: nothing left to add after Document0
        ("Document0,", 1, False, False),
    ],
)
def test_selector_grammar(text: str, k: int, valid: bool, complete: bool) -> None:
    assert is_valid_prefix(text, k) is valid
    assert is_complete(text, k) is complete


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    return model.eval(), tokenizer, PromptRenderer(tokenizer, "llama3")


@pytest.mark.parametrize("k", [10, 13])
def test_constrained_sampling_is_always_well_formed(tiny, tiny_world, k: int) -> None:
    """An untrained model sampling at temperature 1.5 still only writes valid selections."""
    model, tokenizer, renderer = tiny
    docs = [f"{p['title']}\n{p['text']}" for p in tiny_world.corpus[:k]]
    prompt_ids = renderer.prompt_ids(selector_prompt("Who directed The Amber Lantern?", docs))
    batch = torch.tensor([prompt_ids] * 24)
    processor = SelectorLogitsProcessor(tokenizer, k, batch.shape[1], renderer.stop_token_ids)
    torch.manual_seed(0)
    out = model.generate(
        batch, attention_mask=torch.ones_like(batch), do_sample=True, temperature=1.5,
        max_new_tokens=24, eos_token_id=renderer.stop_token_ids,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        logits_processor=LogitsProcessorList([processor]),
    )
    stop = set(renderer.stop_token_ids)
    texts = []
    for row in out[:, batch.shape[1]:].tolist():
        ids = row[: next((i for i, t in enumerate(row) if t in stop), len(row))]
        texts.append(tokenizer.decode(ids))
    for text in texts:
        assert is_valid_prefix(text, k), text
        parsed = parse_selection(text, k)
        assert not parsed.malformed and not parsed.out_of_range, text
        assert len(set(parsed.ids)) == len(parsed.ids), text
    assert any(parse_selection(t, k).ids for t in texts), "expected some non-empty selections"


def test_processor_masks_everything_but_the_grammar(tiny) -> None:
    _, tokenizer, renderer = tiny
    processor = SelectorLogitsProcessor(tokenizer, 10, 0, renderer.stop_token_ids)
    start = set(processor.allowed_tokens(""))
    assert set(renderer.stop_token_ids) <= start  # an empty selection may end at once
    after_comma = processor.allowed_tokens("Document3,")
    assert after_comma and not set(renderer.stop_token_ids) & set(after_comma)
    for token_id in after_comma:
        assert is_valid_prefix("Document3," + tokenizer.decode([token_id]), 10)
    vocabulary = set(range(len(tokenizer)))
    assert len(vocabulary - set(after_comma)) > 0.99 * len(vocabulary)


def test_processor_remembers_the_allowed_tokens_per_text_and_per_k(tiny) -> None:
    """The per-text memory must give what a fresh check of the grammar gives, for each K."""
    _, tokenizer, renderer = tiny
    five = SelectorLogitsProcessor(tokenizer, 5, 0, renderer.stop_token_ids)
    twelve = SelectorLogitsProcessor(tokenizer, 12, 0, renderer.stop_token_ids)
    texts = ["", "Doc", "Document", "Document1", "Document1,", "Document1,Document4", "Document1"]
    for text in texts:
        for processor in (five, twelve):
            assert processor.allowed_tokens(text) == processor._check_candidates(text), text
    digits = {tokenizer.decode([t]) for t in five.allowed_tokens("Document1,Document")}
    assert "1" not in digits and "4" in digits  # no repeated id
    assert set(twelve.allowed_tokens("Document1")) != set(five.allowed_tokens("Document1"))


def test_the_recorded_support_is_what_the_mask_allowed_while_sampling(tiny, tiny_world) -> None:
    """``support(response)`` gives, position by position, the tokens the processor left
    finite while the response was generated, and each holds the token that was sampled."""
    model, tokenizer, renderer = tiny
    docs = [f"{p['title']}\n{p['text']}" for p in tiny_world.corpus[:5]]
    prompt_ids = renderer.prompt_ids(selector_prompt("Who directed The Amber Lantern?", docs))
    width = len(prompt_ids)
    batch = torch.tensor([prompt_ids] * 6)
    processor = SelectorLogitsProcessor(tokenizer, 5, width, renderer.stop_token_ids)
    torch.manual_seed(1)
    out = model.generate(
        batch, attention_mask=torch.ones_like(batch), do_sample=True, temperature=1.5,
        max_new_tokens=12, eos_token_id=renderer.stop_token_ids,
        pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
        logits_processor=LogitsProcessorList([processor]))
    stop = set(renderer.stop_token_ids)
    for row in out[:, width:].tolist():
        response = row[: next((i + 1 for i, t in enumerate(row) if t in stop), len(row))]
        support = processor.support(response)
        assert len(support) == len(response)
        for t, token in enumerate(response):
            prefix = torch.tensor([prompt_ids + response[:t]])
            scores = processor(prefix, torch.zeros(1, len(tokenizer)))[0]
            assert set(torch.isfinite(scores).nonzero().squeeze(1).tolist()) == set(support[t])
            assert token in support[t]
    with pytest.raises(ValueError, match="after a stop token"):
        processor.support([renderer.stop_token_ids[0], 5])


def test_rendered_prompts_contain_the_text_and_end_with_the_assistant_header(tiny) -> None:
    _, tokenizer, renderer = tiny
    for prompt in (
        qr_prompt("Who founded Brelton Pictures?"),
        selector_prompt("Who founded Brelton Pictures?", ["Brelton Pictures\nA studio."]),
        generator_prompt("Who founded Brelton Pictures?", []),
    ):
        text = renderer.prompt_text(prompt)
        assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
        assert prompt.system in text and prompt.user in text
        assert text.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
        prompt_ids, response_ids = renderer.sft_ids(prompt, "**Ada**")
        assert prompt_ids == renderer.prompt_ids(prompt)
        assert tokenizer.decode(response_ids) == "**Ada**<|eot_id|>"
    assert tokenizer.convert_tokens_to_ids("<|eot_id|>") in renderer.stop_token_ids


def test_the_processor_records_how_much_the_first_position_puts_on_selecting_nothing(
        tiny) -> None:
    """At the first response position the grammar allows the stop ids and the pieces of
    ``Document`` (n tokens, s of them stop ids). Hand-computed: all at logit 0 but one stop id
    at log 3, the stop mass is (3 + s - 1) / (3 + n - 1); one piece at logit 5 instead, it is
    s / (e^5 + n - 1), and the greedy choice is that piece."""
    _, tokenizer, renderer = tiny
    width = 4
    processor = SelectorLogitsProcessor(tokenizer, 5, width, renderer.stop_token_ids)
    allowed = processor.allowed_tokens("")
    stops = set(renderer.stop_token_ids)
    n, s = len(set(allowed)), len(stops)
    scores = torch.zeros(2, len(tokenizer))
    first_stop = renderer.stop_token_ids[0]
    scores[0, first_stop] = torch.log(torch.tensor(3.0))
    pieces = [t for t in allowed if t not in stops]
    scores[1, pieces[0]] = 5.0
    processor(torch.zeros(2, width, dtype=torch.long), scores)
    assert processor.opening_stop_probability[0] == pytest.approx((3 + s - 1) / (3 + n - 1))
    assert processor.opening_stop_probability[1] == pytest.approx(s / (torch.e ** 5 + n - 1))
    assert processor.opening_greedy_stop == [True, False]
    # later positions leave the record of the first one as it was
    processor(torch.zeros(2, width + 1, dtype=torch.long), torch.zeros(2, len(tokenizer)))
    assert processor.opening_greedy_stop == [True, False]
