"""Turns agent prompts into token ids through the model's LLaMA-Factory chat template.

LLaMA-Factory's SFT stage encodes an Alpaca record with ``Template.encode_oneturn``; the
pipeline encodes its prompts with the very same call, so the ids the model is trained on and the
ids it is prompted with at rollout and evaluation time cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from mmoa.agents.prompts import AgentPrompt
from mmoa.agents.search_tags import SearchPrompt

if TYPE_CHECKING:
    from llamafactory.data.template import Template
    from transformers import PreTrainedTokenizerBase


class PromptRenderer:
    """Encodes :class:`AgentPrompt` objects with one tokenizer and one template name."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, template: str) -> None:
        from llamafactory.data import get_template_and_fix_tokenizer
        from llamafactory.hparams import DataArguments

        self.tokenizer = tokenizer
        self.template_name = template
        self.template: Template = get_template_and_fix_tokenizer(
            tokenizer, DataArguments(template=template)
        )

    def prompt_ids(self, prompt: AgentPrompt | SearchPrompt) -> list[int]:
        """The ids the model sees before it writes its response."""
        ids, _ = self.template.encode_oneturn(self.tokenizer, prompt.messages(""), prompt.system)
        return ids

    def batch_prompt_ids(self, prompts: Sequence[AgentPrompt | SearchPrompt]
                         ) -> list[list[int]]:
        return [self.prompt_ids(p) for p in prompts]

    def sft_ids(self, prompt: AgentPrompt, output: str) -> tuple[list[int], list[int]]:
        """``(prompt_ids, response_ids)`` exactly as LLaMA-Factory's SFT stage encodes them."""
        return self.template.encode_oneturn(
            self.tokenizer, prompt.messages(output), prompt.system
        )

    def prompt_text(self, prompt: AgentPrompt) -> str:
        """The rendered prompt as text (for traces and the playground)."""
        return self.tokenizer.decode(self.prompt_ids(prompt), skip_special_tokens=False)

    def assistant_suffix_ids(self) -> list[int]:
        """The ids the template puts after an assistant message's content (its end of turn)."""
        pairs = self.template.encode_multiturn(self.tokenizer, [
            {"role": "user", "content": "q"}, {"role": "assistant", "content": ""}])
        return list(pairs[0][1])

    def observation_ids(self, content: str) -> list[int]:
        """An observation (tool result) turn with ``content``, ready for the next assistant
        turn: exactly what LLaMA-Factory's SFT stage encodes for a ShareGPT ``observation``
        message after an assistant turn (the search agent's ``<information>`` blocks)."""
        pairs = self.template.encode_multiturn(self.tokenizer, [
            {"role": "user", "content": "q"}, {"role": "assistant", "content": ""},
            {"role": "observation", "content": content}, {"role": "assistant", "content": ""},
        ])
        return list(pairs[1][0])

    @property
    def stop_token_ids(self) -> list[int]:
        """End-of-turn ids: the tokenizer's eos plus the template's stop words."""
        ids = [self.tokenizer.eos_token_id]
        for word in getattr(self.template, "stop_words", []) or []:
            token_id = self.tokenizer.convert_tokens_to_ids(word)
            if isinstance(token_id, int) and token_id != self.tokenizer.unk_token_id:
                ids.append(token_id)
        return list(dict.fromkeys(i for i in ids if i is not None))
