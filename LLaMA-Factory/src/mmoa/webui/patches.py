"""In-memory patches that put our stages (``mappo``, ``retriever_rl``) into LLaMA-Factory's
LlamaBoard.

We never edit the installed ``llamafactory`` package (a reinstall would undo it, and users compare
our UI with theirs). Instead :func:`apply_patches` changes a few module-level names before
``create_ui()`` runs; every patch point is one that LlamaBoard looks up at call time:

1. ``extras.constants.TRAINING_STAGES`` gets ``"MAPPO (RAG)": "mappo"`` and
   ``"Retriever RL (HARR)": "retriever_rl"``, mutated in place because every webui module holds
   a reference to the same dict;
2. ``Runner._parse_train_args`` adds the MAPPO fields (as their YAML keys), drops the evaluation
   keys that do not apply, and ``Runner._initialize`` checks the MAPPO fields before a run;
   for ``retriever_rl`` the form becomes the stage's own strict config
   (:func:`mmoa.webui.retriever_fields.stage_config`), checked by the stage's parser;
3. ``runner.Popen`` sends a ``stage: mappo`` or ``retriever_rl`` YAML to ``python -m mmoa.cli
   train`` (everything
   else still goes to ``llamafactory-cli train``); the inherited ``LLAMABOARD_*`` environment
   makes our trainer's ``LogCallback`` feed the progress bar, log and Stop button unchanged;
4. ``runner.gen_cmd`` previews a MAPPO run as the YAML that Start writes plus the ``mmoa-cli``
   command that runs it (``llamafactory-cli train --stage mappo`` would be refused);
5. ``runner.get_trainer_info`` plots loss and reward for our stages' runs, and below them the
   per-agent panels of a three-agent MAPPO run (:mod:`mmoa.webui.plots`);
6. ``interface.create_train_tab`` adds the MAPPO and Retriever RL accordions: the widgets are
   created with
   ``render=False`` and slipped into the tab's input set (through a temporary
   ``manager.get_base_elems``), so Preview, Start, Save and Load all carry them; the accordion
   is then moved up, under the rows where the stage is chosen;
7. ``interface.create_footer`` (called right after the last tab) first opens the RAG Playground
   tab, which therefore joins LlamaBoard's tab strip;
8. ``save_config`` (bound by name in ``common``, ``components.top`` and ``interface``) becomes
   :func:`save_user_config`: LlamaBoard runs it un-queued on every keystroke in the model path,
   so several threads rewrite ``user_config.yaml`` at once, and one that reads the file while
   another has just truncated it gets ``None`` and fails with an error toast. Ours serialises the
   writers and replaces the file atomically, so readers always see a whole file;
9. ``Runner.monitor`` turns a failed run's "Failed. Exit code: N" and its whole stderr
   (progress-bar redraws included, often one very long line) into the line that says what
   went wrong and the run's last lines, with a warning toast.

It also makes the defaults CPU-friendly when no accelerator is present: fp32 instead of bf16,
and no more preprocessing workers than cores.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mmoa.fileio import atomic_write_text
from mmoa.train.launcher import (
    MAPPO_STAGE,
    RETRIEVER_RL_STAGE,
    TrainConfigError,
    read_train_config,
)
from mmoa.webui.mappo_fields import (
    MAPPO_FIELDS,
    MAPPO_ROWS,
    MAPPO_STAGE_LABEL,
    config_from_values,
    validate_config,
)
from mmoa.webui.retriever_fields import (
    RETRIEVER_FIELDS,
    RETRIEVER_ROWS,
    RETRIEVER_STAGE_LABEL,
    stage_config,
)

if TYPE_CHECKING:
    from gradio.components import Component

#: Keys LlamaBoard adds for a validation split; the MAPPO stage evaluates with ``mmoa-cli eval``.
EVAL_KEYS = ("val_size", "eval_strategy", "eval_steps", "per_device_eval_batch_size")
#: The stages that run through ``mmoa-cli train`` (LlamaBoard's CLI would refuse them).
OUR_STAGES = (MAPPO_STAGE, RETRIEVER_RL_STAGE)
#: Prefix of the ``elem_id`` given to LlamaBoard's components (stable hooks for CSS and tests).
ELEM_ID_PREFIX = "mmoa"

_originals: dict[str, Any] = {}
_last_engine: list[Any] = []
_user_config_lock = threading.Lock()


# -------------------------------------------------------------------- 3. route the subprocess


def read_stage(config_path: str | Path) -> str | None:
    """The ``stage`` of a YAML/JSON config (read as ``mmoa-cli train`` reads it), or ``None``
    when it cannot be read."""
    try:
        return read_train_config([str(config_path)]).get("stage")
    except TrainConfigError:
        return None


def route_command(command: Sequence[str] | str) -> Sequence[str] | str:
    """The command that really runs LlamaBoard's ``["llamafactory-cli", "train", yaml]``.

    ``stage: mappo`` and ``retriever_rl`` go to our CLI with this interpreter. Other stages stay
    with
    ``llamafactory-cli``; when it is not on ``PATH`` (a virtualenv used without activating it)
    the same entry point runs as ``python -m llamafactory.cli``.
    """
    if isinstance(command, str) or len(command) != 3 or list(command[:2]) != [
            "llamafactory-cli", "train"]:
        return command
    config = command[2]
    if read_stage(config) in OUR_STAGES:
        return [sys.executable, "-m", "mmoa.cli", "train", config]
    if shutil.which("llamafactory-cli") is None:
        return [sys.executable, "-m", "llamafactory.cli", "train", config]
    return command


class RoutingPopen(subprocess.Popen):  # type: ignore[type-arg]
    """``subprocess.Popen`` that runs :func:`route_command` of the command it is given."""

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        super().__init__(route_command(args), *rest, **kwargs)


# ------------------------------------------------------------------- 2. arguments and checks


def _mappo_values(runner: Any, data: dict[Component, Any]) -> dict[str, Any]:
    get = runner.manager.get_elem_by_id
    return {f.name: data[get(f"train.{f.name}")] for f in MAPPO_FIELDS}


def _retriever_values(runner: Any, data: dict[Component, Any]) -> dict[str, Any]:
    get = runner.manager.get_elem_by_id
    return {f.name: data[get(f"train.{f.name}")] for f in RETRIEVER_FIELDS}


def _extra_args(runner: Any, data: dict[Component, Any]) -> dict[str, Any]:
    raw = data[runner.manager.get_elem_by_id("train.extra_args")]
    try:
        extra = json.loads(raw or "{}")
    except json.JSONDecodeError:
        return {}
    return extra if isinstance(extra, dict) else {}


def _stage_of(runner: Any, data: dict[Component, Any]) -> str | None:
    from llamafactory.extras.constants import TRAINING_STAGES

    label = data[runner.manager.get_elem_by_id("train.training_stage")]
    return TRAINING_STAGES.get(label)


def _wrap_parse_train_args(original: Callable[..., dict[str, Any]]) -> Callable[..., Any]:
    def _parse_train_args(self: Any, data: dict[Component, Any]) -> dict[str, Any]:
        args = original(self, data)
        extra = _extra_args(self, data)
        if "preprocessing_num_workers" not in extra:  # LlamaBoard always asks for 16
            args["preprocessing_num_workers"] = min(int(args.get("preprocessing_num_workers")
                                                        or 1), os.cpu_count() or 1)
        if args.get("stage") == RETRIEVER_RL_STAGE:
            return stage_config(args, _retriever_values(self, data), extra)
        if args.get("stage") != MAPPO_STAGE:
            return args
        for key in EVAL_KEYS:
            args.pop(key, None)
        args.update(config_from_values(_mappo_values(self, data)))
        # The extra-arguments box wins over the widgets, as it does for every LlamaBoard field.
        args.update({k: v for k, v in extra.items() if k.startswith("mappo_")
                     or k in ("ppo_epochs", "ppo_target")})
        return args

    _parse_train_args.__wrapped__ = original  # type: ignore[attr-defined]
    return _parse_train_args


def _wrap_initialize(original: Callable[..., str]) -> Callable[..., str]:
    def _initialize(self: Any, data: dict[Component, Any], do_train: bool,
                    from_preview: bool) -> str:
        error = original(self, data, do_train, from_preview)
        if error or not do_train or _stage_of(self, data) not in OUR_STAGES:
            return error
        if _stage_of(self, data) == RETRIEVER_RL_STAGE:
            from mmoa.webui.retriever_fields import validate

            try:
                validate(self._parse_train_args(data))
            except (ValueError, TypeError) as err:
                return f"Retriever RL: {err}"
            return ""
        try:
            config = config_from_values(_mappo_values(self, data))
            if not config.get("mappo_retriever_url", "").startswith(("http://", "https://")):
                raise ValueError("the retriever URL must start with http:// or https:// "
                                 "(start one with: mmoa-cli serve --index <index folder>)")
            validate_config(config)
        except (ValueError, TypeError) as err:
            return f"MAPPO: {err}"
        return ""

    _initialize.__wrapped__ = original  # type: ignore[attr-defined]
    return _initialize


# ----------------------------------------------------------------------------- 4. preview


def _wrap_gen_cmd(original: Callable[[dict[str, Any]], str]) -> Callable[[dict[str, Any]], str]:
    def gen_cmd(args: dict[str, Any]) -> str:
        if args.get("stage") not in OUR_STAGES:
            return original(args)
        from llamafactory.extras.constants import TRAINING_ARGS

        # The same cleaning save_cmd applies, so the preview is exactly the file Start writes.
        from llamafactory.webui.common import _clean_cmd

        text = yaml.safe_dump(_clean_cmd(args), allow_unicode=True)
        path = os.path.join(str(args["output_dir"]), TRAINING_ARGS)
        return f"```yaml\n{text}```\n\n```bash\nmmoa-cli train {path}\n```"

    return gen_cmd


# ------------------------------------------------------------------ 9. a readable failure

#: LlamaBoard's failure text: ``"<Failed.> Exit code: N\n\n```\n<stderr>\n```\n"``.
_FAILURE = re.compile(r"^(?P<head>.*?) Exit code: (?P<code>-?\d+)\n\n```\n(?P<stderr>.*)\n```\n?$",
                      re.DOTALL)
#: Lines of the run's stderr shown under the summary.
FAILURE_TAIL_LINES = 25


def failure_report(stderr: str) -> tuple[str, str]:
    """``(summary, tail)`` of a failed run's stderr: the line that says what went wrong (our
    ``error:`` lines, else the last exception line, else the last line) and the last lines
    with progress-bar redraws reduced to their final state."""
    # (split on newlines only: str.splitlines would also split the \r of each bar redraw)
    lines = [line.rstrip("\r").rsplit("\r", 1)[-1].rstrip() for line in stderr.split("\n")]
    lines = [line for line in lines if line.strip()]
    if not lines:
        return "the run ended without a message", ""
    ours = [line for line in lines if "] error:" in line or line.startswith("error:")]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Stopped)\b", line)]
    summary = (ours or raised or lines)[-1].strip()
    return summary, "\n".join(lines[-FAILURE_TAIL_LINES:])


def _readable_failure(text: str) -> tuple[str, str] | None:
    """LlamaBoard's failure text rewritten as ``(markdown, summary)``; ``None`` if it is not one."""
    match = _FAILURE.match(text)
    if match is None:
        return None
    summary, tail = failure_report(match["stderr"])
    markdown = (f"**{match['head']}** (exit code {match['code']}): {summary}\n\n"
                f"Last lines of the run's output:\n\n```\n{tail}\n```\n")
    return markdown, summary


def _wrap_monitor(original: Callable[..., Any]) -> Callable[..., Any]:
    def monitor(self: Any) -> Any:
        output_box = self.manager.get_elem_by_id("train.output_box")
        for update in original(self):
            text = update.get(output_box) if isinstance(update, dict) else None
            failure = _readable_failure(text) if isinstance(text, str) else None
            if failure is not None:
                import gradio as gr

                update = {**update, output_box: failure[0]}
                gr.Warning(f"The run failed: {failure[1]}")
            yield update

    monitor.__wrapped__ = original  # type: ignore[attr-defined]
    return monitor


# ------------------------------------------------------------------------ 5. reward plot


def _wrap_trainer_info(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_trainer_info(lang: str, output_path: Any, do_train: bool) -> Any:
        running_log, progress, info = original(lang, output_path, do_train)
        if do_train and "loss_viewer" in info:
            from llamafactory.extras.constants import TRAINER_LOG, TRAINING_ARGS

            if read_stage(os.path.join(output_path, TRAINING_ARGS)) in OUR_STAGES:
                import gradio as gr

                from mmoa.webui.plots import mappo_plot, read_trainer_log

                log = read_trainer_log(os.path.join(output_path, TRAINER_LOG))
                info["loss_viewer"] = gr.Plot(mappo_plot(log))
        return running_log, progress, info

    return get_trainer_info


# ---------------------------------------------------------------------- 6. the Train tab


def _tag_elements(tab: str, elems: dict[str, Any]) -> None:
    """Give LlamaBoard's components stable DOM ids (``mmoa-<tab>-<name>``) where they have none.

    gradio writes ``elem_id`` into the page config at launch, so setting it after construction
    works; it only adds an ``id`` attribute.
    """
    for name, elem in elems.items():
        if getattr(elem, "elem_id", "unset") is None:
            elem.elem_id = f"{ELEM_ID_PREFIX}-{tab}-{name}"


def _move_before(block: Any, anchor: Any) -> bool:
    """Move ``block`` just before ``anchor`` among their parent's children (both must share
    one parent); returns whether it moved."""
    parent = getattr(block, "parent", None)
    if anchor is None or parent is None or getattr(anchor, "parent", None) is not parent:
        return False
    parent.children.remove(block)
    parent.children.insert(parent.children.index(anchor), block)
    return True


def _wrap_create_train_tab(original: Callable[[Any], dict[str, Any]]) -> Callable[[Any], Any]:
    def create_train_tab(engine: Any) -> dict[str, Any]:
        import gradio as gr
        from llamafactory.extras.constants import TRAINING_STAGES
        from llamafactory.extras.misc import is_accelerator_available

        _last_engine[:] = [engine]
        components = {f.name: f.make_component() for f in (*MAPPO_FIELDS, *RETRIEVER_FIELDS)}
        manager = engine.manager
        base_elems = manager.get_base_elems
        manager.get_base_elems = lambda: base_elems() | set(components.values())
        try:
            elems = original(engine)
        finally:
            del manager.get_base_elems  # the class method again
        with gr.Accordion(MAPPO_STAGE_LABEL, open=False,
                          elem_id=f"{ELEM_ID_PREFIX}-train-mappo_tab") as mappo_tab:
            gr.Markdown("Used when the stage is **MAPPO**. Each field is the YAML key shown in "
                        "Preview; the extra-arguments box may override any of them.")
            for row in MAPPO_ROWS:
                with gr.Row():
                    for name in row:
                        components[name].render()

        with gr.Accordion(RETRIEVER_STAGE_LABEL, open=False,
                          elem_id=f"{ELEM_ID_PREFIX}-train-retriever_tab") as retriever_tab:
            gr.Markdown(
                "Used when the stage is **Retriever RL**: the query encoder is trained with "
                "GRPO on sampled retrievals while the model above stays frozen (it answers for "
                "the F1 reward). Of the fields above the stage reads the model, template, "
                "dataset, output dir, learning rate, logging/save steps and max samples; the "
                "schedule is constant and the batch, epoch and fine-tuning fields do not "
                "apply. Other `retriever_*` keys go in the extra-arguments box "
                "(docs/retriever_rl.md).")
            for row in RETRIEVER_ROWS:
                with gr.Row():
                    for name in row:
                        components[name].render()

        # Under the stage/dataset rows, where the stage is chosen, instead of below Start and
        # the log (gradio lays a tab out in the order of its children until launch).
        _move_before(mappo_tab, elems.get("extra_tab"))
        _move_before(retriever_tab, elems.get("extra_tab"))

        def open_for_stage(label: str) -> tuple[Any, Any]:
            stage = TRAINING_STAGES.get(label)
            return (gr.Accordion(open=stage == MAPPO_STAGE),
                    gr.Accordion(open=stage == RETRIEVER_RL_STAGE))

        elems["training_stage"].change(open_for_stage, [elems["training_stage"]],
                                       [mappo_tab, retriever_tab], queue=False)
        if not is_accelerator_available():
            elems["compute_type"].value = "fp32"  # bf16 fails on CPU
        _tag_elements("train", elems)
        top = {manager.get_id_by_elem(e).split(".", 1)[1]: e for e in manager.get_elem_list()
               if manager.get_id_by_elem(e).startswith("top.")}
        _tag_elements("top", top)
        return {**elems, "mappo_tab": mappo_tab, "retriever_tab": retriever_tab, **components}

    create_train_tab.__wrapped__ = original  # type: ignore[attr-defined]
    return create_train_tab


# -------------------------------------------------------------------- 7. the playground tab


def _wrap_create_footer(original: Callable[[], dict[str, Any]]) -> Callable[[], Any]:
    def create_footer() -> dict[str, Any]:
        import gradio as gr

        from mmoa.webui.playground import create_playground_tab

        with gr.Tab("RAG Playground", elem_id=f"{ELEM_ID_PREFIX}-playground-tab"):
            create_playground_tab()
        return original()

    create_footer.__wrapped__ = original  # type: ignore[attr-defined]
    return create_footer


# ------------------------------------------------------------------------- user config


def save_user_config(lang: str, hub_name: str | None = None, model_name: str | None = None,
                     model_path: str | None = None) -> None:
    """LlamaBoard's ``save_config`` (same file, same keys), safe under concurrent calls."""
    from llamafactory.webui import common

    with _user_config_lock:
        user_config = common.load_config() or {}
        user_config.setdefault("path_dict", {})
        user_config["lang"] = lang or user_config.get("lang")
        if hub_name:
            user_config["hub_name"] = hub_name
        if model_name:
            user_config["last_model"] = model_name
        if model_name and model_path:
            user_config["path_dict"][model_name] = model_path
        atomic_write_text(common._get_config_path(), yaml.safe_dump(user_config))


#: The webui modules that bound ``save_config`` by name at import.
_SAVE_CONFIG_HOLDERS = ("common", "components.top", "interface")


def _save_config_modules() -> list[Any]:
    import importlib

    return [importlib.import_module(f"llamafactory.webui.{name}") for name in _SAVE_CONFIG_HOLDERS]


# ------------------------------------------------------------------------------- apply


def apply_patches() -> None:
    """Patch LlamaBoard in memory; idempotent. Call before ``create_ui()``."""
    if _originals:
        return
    from llamafactory.extras.constants import TRAINING_STAGES
    from llamafactory.webui import interface, runner

    _originals.update({
        "parse": runner.Runner._parse_train_args, "initialize": runner.Runner._initialize,
        "popen": runner.Popen, "gen_cmd": runner.gen_cmd, "monitor": runner.Runner.monitor,
        "trainer_info": runner.get_trainer_info,
        "train_tab": interface.create_train_tab, "footer": interface.create_footer,
        "save_config": [module.save_config for module in _save_config_modules()],
    })
    TRAINING_STAGES[MAPPO_STAGE_LABEL] = MAPPO_STAGE
    TRAINING_STAGES[RETRIEVER_STAGE_LABEL] = RETRIEVER_RL_STAGE
    runner.Runner._parse_train_args = _wrap_parse_train_args(_originals["parse"])
    runner.Runner._initialize = _wrap_initialize(_originals["initialize"])
    runner.Runner.monitor = _wrap_monitor(_originals["monitor"])
    runner.Popen = RoutingPopen
    runner.gen_cmd = _wrap_gen_cmd(_originals["gen_cmd"])
    runner.get_trainer_info = _wrap_trainer_info(_originals["trainer_info"])
    interface.create_train_tab = _wrap_create_train_tab(_originals["train_tab"])
    interface.create_footer = _wrap_create_footer(_originals["footer"])
    for module in _save_config_modules():
        module.save_config = save_user_config


def remove_patches() -> None:
    """Undo :func:`apply_patches` (tests use it to leave llamafactory as they found it)."""
    if not _originals:
        return
    from llamafactory.extras.constants import TRAINING_STAGES
    from llamafactory.webui import interface, runner

    TRAINING_STAGES.pop(MAPPO_STAGE_LABEL, None)
    TRAINING_STAGES.pop(RETRIEVER_STAGE_LABEL, None)
    runner.Runner._parse_train_args = _originals["parse"]
    runner.Runner._initialize = _originals["initialize"]
    runner.Runner.monitor = _originals["monitor"]
    runner.Popen = _originals["popen"]
    runner.gen_cmd = _originals["gen_cmd"]
    runner.get_trainer_info = _originals["trainer_info"]
    interface.create_train_tab = _originals["train_tab"]
    interface.create_footer = _originals["footer"]
    for module, original in zip(_save_config_modules(), _originals["save_config"], strict=True):
        module.save_config = original
    _originals.clear()
    _last_engine.clear()


def last_engine() -> Any:
    """The LlamaBoard ``Engine`` of the last UI built (``create_ui`` does not return it)."""
    if not _last_engine:
        raise RuntimeError("no web UI has been built since apply_patches()")
    return _last_engine[0]
