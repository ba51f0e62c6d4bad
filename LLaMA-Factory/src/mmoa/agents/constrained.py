"""Constrained decoding for the Selector: only well-formed ``Document3,Document7`` outputs.

The original system masked every token except ``0``-``9``, ``,`` and ``Document``; that still let
the model write ``Document,,3`` or ``Document42`` among ten candidates, and it assumed a tokenizer
where those strings are single tokens. Here the constraint is the grammar itself: a token is
allowed when the text generated so far plus that token is still a prefix of

    ""  |  Document<id>(,Document<id>)*      with 0 <= id < K, no leading zeros

where no id appears twice, and end-of-sequence is allowed only after a complete id (or at the
very start: selecting nothing is a legitimate answer). This works with any tokenizer, whatever the
merges of its vocabulary, and with K > 10. Repeating an id is excluded too: a duplicate carries no
information, and a small warm-started model otherwise loops on ``Document0,Document0,...`` until
its token budget runs out. The Selector penalty still scores malformed, out-of-range and duplicate
ids, for outputs decoded without this processor.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import torch
from transformers import LogitsProcessor

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

PREFIX = "Document"
SEPARATOR = ","
_ALPHABET = frozenset(PREFIX + SEPARATOR + "0123456789")


def is_valid_prefix(text: str, k: int) -> bool:
    """Whether ``text`` can still be completed into a well-formed selection over ``k`` ids."""
    if text == "":
        return True
    *done, last = text.split(SEPARATOR)
    if not _distinct_complete_items(done, k):
        return False
    used = {int(item[len(PREFIX):]) for item in done}
    return _is_item_prefix(last, k, used)


def is_complete(text: str, k: int) -> bool:
    """Whether ``text`` is a finished selection (end-of-sequence may follow)."""
    return text == "" or _distinct_complete_items(text.split(SEPARATOR), k)


def _distinct_complete_items(items: list[str], k: int) -> bool:
    """Every item a complete in-range id, none twice (no leading zeros: equal text, equal id)."""
    return all(_is_complete_item(item, k) for item in items) and len(set(items)) == len(items)


def _is_complete_item(item: str, k: int) -> bool:
    digits = item[len(PREFIX):]
    return (
        item.startswith(PREFIX) and digits.isdigit() and _no_leading_zero(digits)
        and int(digits) < k
    )


def _is_item_prefix(item: str, k: int, used: set[int]) -> bool:
    if len(used) >= k:  # every id is taken: no further item can be completed
        return False
    if len(item) <= len(PREFIX):
        return PREFIX.startswith(item)
    if not item.startswith(PREFIX):
        return False
    digits = item[len(PREFIX):]
    if not digits.isdigit() or not _no_leading_zero(digits):
        return False
    # Some id below k, not selected yet, must start with these digits.
    return any(str(i).startswith(digits) for i in range(k) if i not in used)


def _no_leading_zero(digits: str) -> bool:
    return digits == "0" or not digits.startswith("0")


@lru_cache(maxsize=8)
def _candidate_tokens(tokenizer: PreTrainedTokenizerBase) -> tuple[tuple[int, str], ...]:
    """Every token whose text uses only characters of the grammar (computed once per tokenizer)."""
    out = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if text and set(text) <= _ALPHABET:
            out.append((token_id, text))
    return tuple(out)


class SelectorLogitsProcessor(LogitsProcessor):
    """Masks every token that would break the selection grammar for ``k`` candidates.

    ``prompt_length`` is the (left-padded) prompt width of the batch: everything after it was
    generated. ``stop_token_ids`` are the end-of-turn ids of the chat template.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        k: int,
        prompt_length: int,
        stop_token_ids: Sequence[int],
    ) -> None:
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        self.tokenizer = tokenizer
        self.k = k
        self.prompt_length = prompt_length
        self.stop_token_ids = list(stop_token_ids)
        self._stop_set = set(self.stop_token_ids)
        self.candidates = _candidate_tokens(tokenizer)
        #: the logits' width the allowed sets were cut to (:meth:`_fit_width`)
        self._width: int | None = None
        self._all_stop_ids, self._all_candidates = list(self.stop_token_ids), self.candidates
        # Rows of a batch, and the same row at later steps of other batches, keep reaching the
        # same few texts ("", "Document", "Document0,", ...): each is checked against the
        # candidate tokens once per processor, not once per row and step.
        self._allowed_by_text: dict[str, list[int]] = {}
        #: Per row of the batch, from the first generated position: the probability, over the
        #: ids the grammar allows, that the response ends at once (an empty selection), and
        #: whether that is the greedy choice. Recorded from the logits as this processor gets
        #: them (transformers applies temperature and top-p after it), so it is the model's
        #: own preference, whatever the sampling temperature; empty before the first call.
        self.opening_stop_probability: list[float] = []
        self.opening_greedy_stop: list[bool] = []

    def allowed_tokens(self, generated_text: str) -> list[int]:
        """Token ids that keep ``generated_text`` a valid selection prefix (+ stop ids if done)."""
        cached = self._allowed_by_text.get(generated_text)
        if cached is None:
            cached = self._allowed_by_text[generated_text] = self._check_candidates(generated_text)
        return cached

    def _check_candidates(self, generated_text: str) -> list[int]:
        allowed = [
            token_id for token_id, piece in self.candidates
            if is_valid_prefix(generated_text + piece, self.k)
        ]
        if is_complete(generated_text, self.k):
            allowed.extend(self.stop_token_ids)
        return allowed

    def support(self, response_ids: Sequence[int]) -> list[list[int]]:
        """The token ids the mask allowed at each position of a generated ``response_ids`` (the
        sampler's support there), as :meth:`__call__` computed them while generating: the
        grammar's tokens for the text before that position, plus the stop ids once it is a
        complete selection. A trainer scores the sampled tokens over these sets so that the
        policy it optimises is the distribution they were drawn from."""
        out: list[list[int]] = []
        for t in range(len(response_ids)):
            allowed = self._allowed_after(list(response_ids[:t]))
            if allowed is None:
                raise ValueError("the response continues after a stop token")
            out.append(allowed)
        return out

    def _allowed_after(self, generated: list[int]) -> list[int] | None:
        """The ids allowed after the ``generated`` tokens; ``None`` once a stop id is among
        them (a finished row is only padded from there on: it is left unconstrained)."""
        if self._stop_set.intersection(generated):
            return None
        text = self.tokenizer.decode(generated, skip_special_tokens=False)
        # cannot be empty for a valid prefix; never leave a row without a choice
        return self.allowed_tokens(text) or list(self.stop_token_ids)

    def _fit_width(self, width: int) -> None:
        """Leave out of every allowed set the ids the model cannot emit: its logits are
        ``width`` wide, and a tokenizer can hold more ids (LLaMA-Factory's ``llama3`` template
        adds ``<|eom_id|>`` as a stop word, id 128256, to Llama-3-8B-Instruct's tokenizer, whose
        embedding has 128,256 rows). The stop set that ends a response keeps every id."""
        if self._width == width:
            return
        self._width = width
        self.stop_token_ids = [i for i in self._all_stop_ids if i < width]
        self.candidates = tuple(c for c in self._all_candidates if c[0] < width)
        self._allowed_by_text.clear()

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self._fit_width(scores.shape[-1])
        mask = torch.full_like(scores, float("-inf"))
        for row in range(input_ids.shape[0]):
            allowed = self._allowed_after(input_ids[row, self.prompt_length:].tolist())
            if allowed is None:
                mask[row] = 0.0
            else:
                mask[row, allowed] = 0.0
        masked = scores + mask
        if input_ids.shape[1] == self.prompt_length:  # every row at its first response token
            self._record_opening(masked)
        return masked

    def _record_opening(self, masked: torch.Tensor) -> None:
        """How much the first position's masked distribution puts on stopping (selecting
        nothing). A Selector sampled at a low temperature can keep writing documents while
        this mass grows, until the greedy Selector of evaluation selects nothing at all."""
        stops = torch.tensor(sorted(set(self.stop_token_ids)), device=masked.device)
        probabilities = torch.softmax(masked.float(), dim=-1)
        self.opening_stop_probability = probabilities[:, stops].sum(dim=-1).tolist()
        self.opening_greedy_stop = torch.isin(masked.argmax(dim=-1), stops).tolist()
