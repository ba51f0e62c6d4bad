"""The cut of a generated row at its first stop token, shared by the three-agent pipeline and
the Selector benches: hand-written rows with and without a stop token."""

from __future__ import annotations

from mmoa.agents.pipeline import response_until_stop


def test_a_row_ends_at_its_first_stop_token_which_it_keeps() -> None:
    # 9 and 2 are stops; padding (0) after the first stop is dropped, later stops too
    assert response_until_stop([5, 7, 9, 0, 0], [2, 9]) == [5, 7, 9]
    assert response_until_stop([2, 9, 4], {9, 2}) == [2]


def test_a_row_without_a_stop_token_is_kept_whole() -> None:
    assert response_until_stop([5, 7, 8], [2, 9]) == [5, 7, 8]
    assert response_until_stop([], [2]) == []
    assert response_until_stop([3, 4], []) == [3, 4]
