"""Issue 72, item 5: the web UI as a new user finds it, without a browser.

The probe (a real browser, a newcomer's first clicks): the CPU demo preset set Save steps to 2
under the slider's minimum of 10, so Preview and Start failed with "Value 2 is less than
minimum value 10"; nothing showed in the minute before step 1; the Generator's rollout phase
never showed; the progress bar was an editable slider; the server-down line's command left out
the port; the Playground forgot the Train tab's retriever URL; mode ``g`` said "the question
itself is searched"; Language, Finetuning method, Checkpoint path and Template had no help;
SmolLM2-Instruct was called "a non-instruct model". ``tests/test_webui_browser.py`` presses the
preset, Preview and Start in a real browser.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """The patched UI, built (not served) in a temporary working directory."""
    from mmoa.webui.launch import build_ui
    from mmoa.webui.patches import remove_patches

    workdir = tmp_path_factory.mktemp("webui_newcomer")
    previous = Path.cwd()
    os.chdir(workdir)
    try:
        yield build_ui()
    finally:
        remove_patches()
        os.chdir(previous)


def test_every_preset_value_fits_its_field(ui: tuple[Any, Any]) -> None:
    """gradio refuses a slider or number value outside the field's range at Preview and Start
    (naming no field): every value the preset sets must be inside it."""
    from mmoa.webui.mappo_fields import CPU_DEMO_PRESET

    manager = ui[1].manager
    for elem_id, value in CPU_DEMO_PRESET.items():
        elem = manager.get_elem_by_id(elem_id)
        low, high = getattr(elem, "minimum", None), getattr(elem, "maximum", None)
        assert low is None or value >= low, (elem_id, value, low)
        assert high is None or value <= high, (elem_id, value, high)
    save_steps = manager.get_elem_by_id("train.save_steps")
    assert save_steps.minimum == 1 and save_steps.step == 1


def test_the_preset_passes_gradio_s_own_check(ui: tuple[Any, Any]) -> None:
    """What gradio runs on every input before Preview/Start: the slider's preprocess."""
    from mmoa.webui.mappo_fields import CPU_DEMO_PRESET

    manager = ui[1].manager
    for elem_id, value in CPU_DEMO_PRESET.items():
        elem = manager.get_elem_by_id(elem_id)
        if hasattr(elem, "preprocess") and hasattr(elem, "minimum"):
            elem.preprocess(value)  # raised "Value 2 is less than minimum value 10"
            # the copy gradio keeps in a session after an update (language, resume): built
            # from the constructor's arguments, and the one that checks Preview's inputs
            copy = type(elem)(**{**elem.constructor_args, "render": False})
            copy.preprocess(value)


def test_the_top_row_has_help_and_no_non_instruct_warning(ui: tuple[Any, Any]) -> None:
    from llamafactory.webui.components import top
    from llamafactory.webui.locales import LOCALES

    from mmoa.webui.patches import TOP_HELP, check_template, guess_template, template_for_path

    for key in ("lang", "finetuning_type", "checkpoint_path", "template"):
        assert LOCALES[key]["en"]["info"] == TOP_HELP[key]
    assert top.check_template is check_template
    assert guess_template("models/smollm2-135m-instruct") == "smollm2"
    assert guess_template("/abs/saves/smollm2-135m/full/sft") == "smollm2"
    assert guess_template("models/tiny-llama3") == "llama3"
    assert guess_template("/data/Meta-Llama-3-8B-Instruct") == "llama3"
    assert guess_template("/data/some-model") is None and guess_template("") is None
    assert template_for_path("models/smollm2-135m-instruct", "default")["value"] == "smollm2"
    assert "value" not in template_for_path("models/smollm2-135m-instruct", "llama3")


def test_progress_bar_is_read_only_and_says_loading_before_step_1(ui: tuple[Any, Any],
                                                                  tmp_path: Path) -> None:
    import gradio as gr
    import yaml
    from llamafactory.webui import interface

    from mmoa.webui.patches import PAGE_CSS, _wrap_trainer_info
    from mmoa.webui.run_status import loading_label

    # built non-interactive, drawn as a bar (no number box, no knob, no pointer)
    bar = ui[1].manager.get_elem_by_id("train.progress_bar")
    assert bar.interactive is False and bar.elem_id == "mmoa-train-progress_bar"
    assert PAGE_CSS in interface.CSS and "pointer-events: none" in PAGE_CSS
    (tmp_path / "training_args.yaml").write_text(yaml.safe_dump({"stage": "mappo"}))
    os.utime(tmp_path / "training_args.yaml", (time.time() - 65, time.time() - 65))
    label = loading_label(tmp_path)
    assert label is not None and label.startswith("Loading the model and the data")
    assert "1:05 elapsed" in label or "1:06 elapsed" in label

    def original(lang: str, output_path: Any, do_train: bool) -> Any:
        return "", gr.Slider(visible=False), {}

    _, progress, _ = _wrap_trainer_info(original)("en", str(tmp_path), True)
    assert progress.visible and progress.label.startswith("Loading the model")
    # an update that named ``interactive`` made gradio drop the bar's elem_id
    assert "interactive" not in progress.constructor_args
    (tmp_path / "step_progress.json").write_text(
        '{"state": "running", "step": 1, "percentage": 12.5, "text": "step 1/2 · rollout: '
        'generator, question 0/2 · 0:40 elapsed"}')
    assert loading_label(tmp_path) is None
    _, progress, _ = _wrap_trainer_info(original)("en", str(tmp_path), True)
    assert "generator" in progress.label and progress.value == 12.5


def test_the_server_down_line_names_the_port(ui: tuple[Any, Any]) -> None:
    from mmoa.webui.server_check import START_COMMAND, ServerReport, refusal_line

    line = refusal_line(ServerReport("http://127.0.0.1:8001", False, "connection refused"))
    assert f"Start one with: {START_COMMAND} --port 8001" in line and "\n" not in line


def test_playground_follows_the_train_tab_s_url(ui: tuple[Any, Any]) -> None:
    demo, engine = ui
    train_url = engine.manager.get_elem_by_id("train.mappo_retriever_url")
    followers = [dep for dep in demo.config["dependencies"]
                 if train_url._id in [i for i in dep["inputs"]]
                 and any(demo.blocks[o].elem_id == "mmoa-pg-retriever_url"
                         for o in dep["outputs"])]
    assert followers, "no event copies the Train tab's URL into the Playground"


def test_mode_g_says_closed_book() -> None:
    from mmoa.agents.pipeline import Trace
    from mmoa.webui.playground import PlaygroundAnswer, render_subquestions

    note = render_subquestions(PlaygroundAnswer(Trace("q?"), {}, 0.1, "g"))
    assert "closed book" in note and "searched" not in note.replace("nothing is searched", "")
    rag = render_subquestions(PlaygroundAnswer(Trace("q?"), {}, 0.1, "rag"))
    assert "the question itself is searched" in rag
