"""Issue 72, item 3: a question longer than the model's context is refused, in every mode,
by ``mmoa-cli eval`` and the Playground, in one line naming the question and both sizes.

The probe: ``mmoa-cli eval --mode g`` with a 100,000-character question (100,028 tokens against
2,048 positions) was not refused and still generating after 300 s; the Playground's mode ``g``
accepted a question that left the Generator no room to answer. Refused, not truncated (a cut
question is another question; docs/reliability.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from mmoa.agents.context_limit import (
    ModelContext,
    check_questions_fit,
    find_overflows,
    model_context,
    question_prompts,
)
from mmoa.agents.modes import MODES
from mmoa.defaults import MAX_NEW_TOKENS
from mmoa.evaluation import EVAL_MODES

BUDGETS = {**MAX_NEW_TOKENS, "search": 128, "decision": 64}


@pytest.fixture(scope="module")
def renderer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    from mmoa.agents.render import PromptRenderer

    return PromptRenderer(AutoTokenizer.from_pretrained(str(tiny_model_dir)), "llama3")


def _fake_model(positions: int) -> Any:
    return SimpleNamespace(config=SimpleNamespace(max_position_embeddings=positions))


def _question_of(renderer: Any, tokens: int) -> str:
    """A question of about ``tokens`` tokens of this tokenizer."""
    words = "where was the author of the novel born "
    per = len(renderer.tokenizer(words * 100, add_special_tokens=False)["input_ids"]) / 100
    return (words * round(tokens / per)).strip()


def test_model_context_is_the_smaller_of_config_and_tokenizer() -> None:
    tokenizer = SimpleNamespace(model_max_length=1024)
    assert model_context(_fake_model(2048), tokenizer) == ModelContext(
        1024, "tokenizer.model_max_length")
    unknown = SimpleNamespace(model_max_length=int(1e30))  # transformers' "no limit"
    assert model_context(_fake_model(2048), unknown) == ModelContext(
        2048, "max_position_embeddings")
    assert model_context(SimpleNamespace(config=None), unknown) is None


def test_every_eval_mode_has_its_question_prompts() -> None:
    for mode in EVAL_MODES:
        prompts = question_prompts(mode, BUDGETS)
        assert prompts, mode
        for p in prompts:
            assert "Q?" in json.dumps(p.build("Q?").messages(""), ensure_ascii=False), mode
    assert [p.agent for p in question_prompts("qr_s_g", BUDGETS)] == [
        "qr", "selector", "generator"]
    assert [p.budget for p in question_prompts("g", {**BUDGETS, "generator": 7})] == [7]


def test_a_question_is_refused_once_prompt_and_budget_pass_the_context(renderer: Any) -> None:
    """The old Playground check let through a question of fewer tokens than the positions,
    leaving the Generator no room: prompt + budget is what must fit."""
    context = ModelContext(2048, "max_position_embeddings")
    prompts = question_prompts("g", BUDGETS)
    question = _question_of(renderer, 2048 - 60)  # fewer tokens than the positions
    assert len(renderer.tokenizer(question)["input_ids"]) < 2048
    [overflow] = find_overflows(renderer, [question], prompts, context)
    assert overflow.agent == "generator" and overflow.prompt_tokens + 100 > 2048
    # the exact boundary: the longest question that fits is accepted, one more word is not
    fits = _question_of(renderer, 1700)
    assert find_overflows(renderer, [fits], prompts, context) == []
    exact = len(renderer.prompt_ids(prompts[0].build(fits)))
    tight = ModelContext(exact + 100, "test")
    assert find_overflows(renderer, [fits], prompts, tight) == []
    assert len(find_overflows(renderer, [fits + " born"], prompts, tight)) == 1


def test_the_refusal_is_one_line_naming_the_id_and_both_sizes(renderer: Any) -> None:
    context = ModelContext(2048, "max_position_embeddings")
    long = "x " * 100_000
    with pytest.raises(ValueError) as info:
        check_questions_fit(renderer, context, ["short?", long, long],
                            question_prompts("qr_s_g", BUDGETS), ["q0", "q-long", "q2"])
    message = str(info.value)
    assert "\n" not in message
    assert "question 'q-long' (200,000 characters)" in message
    assert "Query Rewriter's prompt" in message
    assert "context of 2,048 (max_position_embeddings)" in message
    assert "1 more question(s)" in message and "not truncated" in message
    check_questions_fit(renderer, None, [long], question_prompts("g", BUDGETS))  # no limit known


@pytest.mark.slow
def test_eval_mode_g_refuses_a_100000_character_question_before_generating(
        tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mmoa.agents import pipeline
    from mmoa.cli import main as cli_main

    data = tmp_path / "qa.jsonl"
    rows = [{"id": "ok-1", "question": "Where was Ann born?", "answers": ["Brafield"]},
            {"id": "huge-7", "question": "Where was Ann born? " * 5000, "answers": ["x"]}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text('{"earlier": true}')

    def never(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("generated")

    monkeypatch.setattr(pipeline.RagPipeline, "generate", never)
    code = cli_main(["eval", "--model_name_or_path", str(tiny_model_dir), "--template",
                     "llama3", "--data_file", str(data), "--mode", "g", "--output_dir",
                     str(out)])
    err = [line for line in capsys.readouterr().err.splitlines()
           if line.strip() and not line.startswith("Loading weights")]  # the load bar
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("mmoa-cli eval: error: question 'huge-7' (100,000 characters)")
    assert "context of 2,048" in err[0]
    assert json.loads((out / "metrics.json").read_text()) == {"earlier": True}  # untouched
    assert not (out / "predictions.jsonl").exists()


@pytest.mark.slow
def test_playground_refuses_in_every_mode(tiny_model_dir: Path) -> None:
    """Every mode, the server's character limit out of the way: the model's context decides,
    before the pipeline (or the server) is reached."""
    from mmoa.webui.playground import PlaygroundSession, ask_for_page

    session = PlaygroundSession()
    session.load(str(tiny_model_dir), "", "llama3")
    question = _question_of(_SessionRenderer(session), 2048 - 60)
    for mode in MODES:
        with pytest.raises(ValueError, match="more than the model's context of 2,048"):
            session.ask(question, "http://127.0.0.1:9", 5, mode, max_query_chars=10**9)
    out = ask_for_page(session, str(tiny_model_dir), "", "llama3", "", 5, "g", question)
    assert out[0].startswith("error: ") and "shorten or drop" in out[0] and "\n" not in out[0]


class _SessionRenderer:
    """The tokenizer of a Playground session, as :func:`_question_of` uses it."""

    def __init__(self, session: Any) -> None:
        self.tokenizer = session.tokenizer
