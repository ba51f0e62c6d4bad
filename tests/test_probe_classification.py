"""The fault probes' own bookkeeping (issue 47): how ``bench/server_probe.py`` tells an answer
given during encoder reloads as the old encoder's, the new one's or a mixed batch, and when a
reload counts as handled. A probe that miscounts would report a clean server that is not."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.bench_fixtures import load_bench


@pytest.fixture(scope="module")
def probe() -> ModuleType:
    return load_bench("server_probe")


@pytest.mark.parametrize(("per_question", "kind"), [
    ([{"old"}], "old"),
    ([{"old"}, {"old", "new"}], "old"),  # the second question is the same under both
    ([{"new"}, {"new"}], "new"),
    ([{"old", "new"}], "either"),
    ([{"old"}, {"new"}], "mixed"),  # half a batch from each encoder
    ([{"old"}, set()], "neither"),
])
def test_an_answer_is_one_encoders_or_mixed(probe: ModuleType, per_question: list[set[str]],
                                            kind: str) -> None:
    assert probe.classify_answer(per_question) == kind


def test_a_refused_reload_counts_only_if_the_old_encoder_still_serves(probe: ModuleType
                                                                      ) -> None:
    call = probe.ReloadCall("bad folder", "4xx", status=400, json_error=True,
                            served_after="old", should_serve="old")
    assert call.as_expected
    call.served_after = "new"  # refused, yet another encoder serves: not handled
    assert not call.as_expected
    assert not probe.ReloadCall("bad folder", "4xx", status=500, json_error=True,
                                served_after="old", should_serve="old").as_expected
    assert not probe.ReloadCall("new", "200", hang=True).as_expected
    pair = probe.ReloadCall("two at once", "200|409", status=409, json_error=True,
                            served_after="new", should_serve="new")
    assert pair.as_expected
