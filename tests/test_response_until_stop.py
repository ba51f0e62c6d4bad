"""The cut of a generated row at its first stop token and the row's text, shared by the
three-agent pipeline and the Selector benches: hand-written rows with and without a stop token."""

from __future__ import annotations

from pathlib import Path

from mmoa.agents.pipeline import response_until_stop


def test_a_row_ends_at_its_first_stop_token_which_it_keeps() -> None:
    # 9 and 2 are stops; padding (0) after the first stop is dropped, later stops too
    assert response_until_stop([5, 7, 9, 0, 0], [2, 9]) == [5, 7, 9]
    assert response_until_stop([2, 9, 4], {9, 2}) == [2]


def test_a_row_without_a_stop_token_is_kept_whole() -> None:
    assert response_until_stop([5, 7, 8], [2, 9]) == [5, 7, 8]
    assert response_until_stop([], [2]) == []
    assert response_until_stop([3, 4], []) == [3, 4]


def test_the_response_text_drops_its_stop_tokens(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from mmoa.agents.pipeline import response_text

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    words = tokenizer.encode(" Document2, Document4", add_special_tokens=False)
    stop = tokenizer.eos_token_id
    assert response_text(tokenizer, [*words, stop], [stop]) == "Document2, Document4"
    # a stop id the tokenizer does not mark special is dropped all the same
    plain = next(i for i in range(100, 1000) if i not in words)
    assert response_text(tokenizer, [*words, plain], [plain]) == "Document2, Document4"
