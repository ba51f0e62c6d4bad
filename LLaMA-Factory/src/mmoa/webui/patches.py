"""In-memory patches that put our stages (``mappo``, ``retriever_rl``) into LLaMA-Factory's
LlamaBoard.

We never edit the installed ``llamafactory`` package (a reinstall would undo it, and users compare
our UI with theirs). Instead :func:`apply_patches` changes a few module-level names before
``create_ui()`` runs; every patch point is one that LlamaBoard looks up at call time:

1. ``extras.constants.TRAINING_STAGES`` gets ``"MAPPO (RAG)": "mappo"`` and
   ``"Retriever RL (HARR)": "retriever_rl"`` first (so MAPPO is the default stage), reordered in
   place because every webui module holds a reference to the same dict;
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
5. ``runner.get_trainer_info`` plots loss and reward for our stages' runs
   (:mod:`mmoa.webui.plots`);
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
   went wrong and the run's last lines, with a warning toast;
10. ``Runner._launch`` asks the retrieval server's ``/health`` before a run of our stages and,
    when nothing answers, puts one line in the output box (the URL and the command that starts
    a server) instead of launching; a launched run starts with the plot cleared. The MAPPO
    accordion has a "Check server" button (:mod:`mmoa.webui.server_check`), the CPU demo
    preset and a Max steps field; Preview and Start warn when ``logging_steps`` > ``max_steps``;
11. the per-agent panels under the log (:func:`watch_agent_panels`, a second event on Start and
    on LlamaBoard's resume) are emptied when a run begins and redrawn from its
    ``trainer_log.jsonl``;
12. ``locales.LOCALES`` title and subtitle say what this is (and, without a GPU, that runs use
    the CPU, once), and ``runner.is_accelerator_available`` stops LlamaBoard's "CUDA environment
    was not detected" toast on every Start;
13. a MAPPO run's progress bar follows the step under way from ``step_progress.json``
    (rollout questions, update micro-batches, ETA; :mod:`mmoa.webui.run_status`), and
    ``Runner.monitor`` shows an Abort as "Stopping after step N" above the log (a second Abort
    kills the run at once) and ends with what was saved ("Stopped at step N, checkpoint ...",
    never "Finished." when nothing was).

It also makes the defaults CPU-friendly when no accelerator is present: fp32 instead of bf16,
and no more preprocessing workers than cores.
"""

from __future__ import annotations

import contextlib
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
    CPU_DEMO_PRESET,
    MAPPO_FIELDS,
    MAPPO_ROWS,
    MAPPO_STAGE_LABEL,
    config_from_values,
    describe_preset,
    logging_warning,
    validate_config,
)
from mmoa.webui.retriever_fields import (
    RETRIEVER_FIELDS,
    RETRIEVER_ROWS,
    RETRIEVER_STAGE_LABEL,
    stage_config,
)
from mmoa.webui.server_check import START_COMMAND

if TYPE_CHECKING:
    from gradio.components import Component

#: Keys LlamaBoard adds for a validation split; the MAPPO stage evaluates with ``mmoa-cli eval``.
EVAL_KEYS = ("val_size", "eval_strategy", "eval_steps", "per_device_eval_batch_size")
#: The stages that run through ``mmoa-cli train`` (LlamaBoard's CLI would refuse them).
OUR_STAGES = (MAPPO_STAGE, RETRIEVER_RL_STAGE)
#: Prefix of the ``elem_id`` given to LlamaBoard's components (stable hooks for CSS and tests).
ELEM_ID_PREFIX = "mmoa"
#: The config keys the MAPPO widgets write that are not ``mappo_*`` (the box overrides them too).
FIELD_KEYS = frozenset(f.key for f in MAPPO_FIELDS)
#: Seconds between two redraws of the per-agent panels while a run goes on (LlamaBoard's
#: monitor polls every 2 s as well).
PANEL_POLL_S = 2.0
#: Seconds the per-agent panels wait, after Start, for the run to begin (the server check and
#: the form's checks come first); a refused Start leaves them as they were.
PANEL_START_WAIT_S = 30.0

#: The first screen: what this is, in one short paragraph (LlamaBoard's title and subtitle).
TITLE_HTML = ("<h1><center>MMOA-RAG: multi-agent reinforcement learning for a RAG pipeline"
              "</center></h1>")
INTRO_HTML = (
    "<p style='text-align:center;max-width:60em;margin:0 auto'>Trains a retrieval-augmented "
    "generation pipeline (Query Rewriter → Retriever → Selector → Generator) as a team of "
    "cooperating agents on one LLM: a supervised warm start (<i>Supervised Fine-Tuning</i>), "
    "then the stage <b>MAPPO (RAG)</b>, first in the stage list. Start a retrieval server "
    "first (<code>bash run_server.sh --index data/demo/index</code>; <i>Check server</i> shows "
    "what it serves), and try a checkpoint in the <b>RAG Playground</b> tab. Built on "
    "LLaMA-Factory's LlamaBoard: its other stages work as usual.{cpu}</p>")
#: Said once on the first screen of a machine without an accelerator, instead of LlamaBoard's
#: "CUDA environment was not detected" toast on every Start.
CPU_NOTE = (" <b>No GPU found: runs use the CPU</b> (compute type fp32); the <i>CPU demo</i> "
            "preset in the MAPPO accordion gives a first logged step within about a minute.")

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
        algorithm = extra.get("mappo_algorithm")
        args.update(config_from_values(_mappo_values(self, data),
                                       algorithm if isinstance(algorithm, str) else None))
        # The extra-arguments box wins over the widgets, as it does for every LlamaBoard field.
        args.update({k: v for k, v in extra.items() if k.startswith("mappo_")
                     or k in FIELD_KEYS})
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
        else:
            try:
                config = config_from_values(_mappo_values(self, data))
                if not config.get("mappo_retriever_url", "").startswith(("http://", "https://")):
                    raise ValueError("the retriever URL must start with http:// or https:// "
                                     f"(start a server with: {START_COMMAND})")
                validate_config(config)
            except (ValueError, TypeError) as err:
                return f"MAPPO: {err}"
        # Once per click: Start checks the form with from_preview=True first (_wrap_launch),
        # then LlamaBoard's _launch checks it again with from_preview=False.
        warning = logging_warning(self._parse_train_args(data)) if from_preview else None
        if warning:
            import gradio as gr

            gr.Warning(warning)
        return ""

    _initialize.__wrapped__ = original  # type: ignore[attr-defined]
    return _initialize


def server_url_of(config: dict[str, Any]) -> tuple[str, str | None]:
    """``(retriever URL, token)`` a run of our stages will call (after the extra-arguments box)."""
    if config.get("stage") == RETRIEVER_RL_STAGE:
        return str(config.get("retriever_url") or ""), config.get("retriever_token")
    return str(config.get("mappo_retriever_url") or ""), config.get("mappo_retriever_token")


def _wrap_launch(original: Callable[..., Any]) -> Callable[..., Any]:
    """Start of a run of our stages: the retrieval server is asked first; when it does not
    answer the run is not launched and one line (URL + the command that starts a server) goes
    to the output box, once: no toast, no failed run's stderr. A launched run starts with
    LlamaBoard's plot cleared, so a run that fails before its first step leaves no curves of
    the previous run on screen."""
    def _launch(self: Any, data: dict[Component, Any], do_train: bool) -> Any:
        if not do_train or self.running or _stage_of(self, data) not in OUR_STAGES \
                or self._initialize(data, True, True):
            yield from original(self, data, do_train)  # LlamaBoard says what is wrong
            return
        from mmoa.webui.server_check import check_server, refusal_line

        get = self.manager.get_elem_by_id
        url, token = server_url_of(self._parse_train_args(data))
        report = check_server(url, token=token if isinstance(token, str) else None)
        if not report.ok:
            yield {get("train.output_box"): refusal_line(report)}
            return
        from mmoa.webui.run_status import progress_path

        # the previous run's progress (its "stopped at step N") must not show for this one
        with contextlib.suppress(OSError):
            progress_path(self._parse_train_args(data)["output_dir"]).unlink()
        yield {get("train.loss_viewer"): None}
        yield from original(self, data, do_train)

    _launch.__wrapped__ = original  # type: ignore[attr-defined]
    return _launch


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
    """A failed run's readable report (9.) and, for a MAPPO run, what Abort does (13.): while
    the run stops, the output box says after which step and keeps the log, the progress bar
    stays; the final text says what was saved instead of "Finished." (LlamaBoard says that for
    every aborted run, saved or not)."""
    def monitor(self: Any) -> Any:
        from llamafactory.webui.locales import ALERTS

        from mmoa.webui.run_status import final_status

        output_box = self.manager.get_elem_by_id("train.output_box")
        process = getattr(self, "trainer", None)  # _finalize clears it before the last update
        output_path: str | None = None
        lang = "en"
        if getattr(self, "do_train", False) and getattr(self, "running_data", None) is not None:
            try:
                path, stage = run_output_path(self)
                lang = self.running_data[self.manager.get_elem_by_id("top.lang")] or "en"
            except (KeyError, TypeError):
                path, stage = "", None
            output_path = path if stage == MAPPO_STAGE else None
        aborted = False
        for update in original(self):
            text = update.get(output_box) if isinstance(update, dict) else None
            aborted = aborted or bool(getattr(self, "aborted", False))
            if output_path is not None and self.running and self.aborted \
                    and text == ALERTS["info_aborting"].get(lang, ALERTS["info_aborting"]["en"]):
                yield _stopping_update(self, output_path, lang)
                continue
            if output_path is not None and not self.running and isinstance(text, str):
                status = final_status(output_path, process.returncode if process else None,
                                      aborted)
                if status is not None:
                    yield {**update, output_box: _with_status(status, text, lang)}
                    continue
            failure = _readable_failure(text) if isinstance(text, str) else None
            if failure is not None:
                import gradio as gr

                update = {**update, output_box: failure[0]}
                gr.Warning(f"The run failed: {failure[1]}")
            yield update

    monitor.__wrapped__ = original  # type: ignore[attr-defined]
    return monitor


def _stopping_update(runner: Any, output_path: str, lang: str) -> dict[Any, Any]:
    """The monitor's update while an aborted MAPPO run stops: the stopping line above the
    run's log, the progress bar and the plot as while it ran."""
    from llamafactory.webui import runner as runner_module

    from mmoa.train.progress import read_progress
    from mmoa.webui.run_status import progress_path, stopping_line

    get = runner.manager.get_elem_by_id
    running_log, progress, info = runner_module.get_trainer_info(lang, output_path, True)
    update = {get("train.output_box"): stopping_line(read_progress(progress_path(output_path)))
              + "\n\n" + running_log,
              get("train.progress_bar"): progress}
    if "loss_viewer" in info:
        update[get("train.loss_viewer")] = info["loss_viewer"]
    return update


def _with_status(status: str, text: str, lang: str) -> str:
    """LlamaBoard's final text with its head ("Finished." / "Failed. Exit code: N") replaced
    by ``status``; what followed (the log, or the failure's last lines) stays under it."""
    from llamafactory.webui.locales import ALERTS

    finished = ALERTS["info_finished"].get(lang, ALERTS["info_finished"]["en"])
    if text.startswith(finished):
        return status + text[len(finished):]
    failure = _readable_failure(text)
    return f"{status}\n\n{failure[0] if failure is not None else text}"


# ------------------------------------------------------------------------ 5. reward plot


def _wrap_trainer_info(original: Callable[..., Any]) -> Callable[..., Any]:
    """Our stages' plot, and a MAPPO run's progress bar from its ``step_progress.json``
    (where the step under way is, with elapsed time and ETA) instead of from the last logged
    step."""
    def get_trainer_info(lang: str, output_path: Any, do_train: bool) -> Any:
        running_log, progress, info = original(lang, output_path, do_train)
        if not do_train:
            return running_log, progress, info
        from llamafactory.extras.constants import TRAINER_LOG, TRAINING_ARGS

        if read_stage(os.path.join(output_path, TRAINING_ARGS)) not in OUR_STAGES:
            return running_log, progress, info
        import gradio as gr

        if "loss_viewer" in info:
            from mmoa.webui.plots import mappo_plot, read_trainer_log

            log = read_trainer_log(os.path.join(output_path, TRAINER_LOG))
            info["loss_viewer"] = gr.Plot(mappo_plot(log))
        from mmoa.webui.run_status import live_record, loading_label, progress_label

        record = live_record(output_path)
        if record is not None:
            progress = gr.Slider(label=progress_label(record),
                                 value=float(record.get("percentage") or 0.0), visible=True)
        elif (label := loading_label(output_path)) is not None:
            progress = gr.Slider(label=label, value=0.0, visible=True)
        return running_log, progress, info

    return get_trainer_info


#: Page styles added to LlamaBoard's (``interface.CSS``). The Train tab's progress bar is a
#: gradio slider (built non-interactive): with its number box, its knob and its 0/100 ends it
#: looked like a field to set. It is drawn as a bar here, and nothing in it takes the pointer.
#: (An update that passes ``interactive=False`` is no fix: gradio then re-creates the
#: component without the ``elem_id`` given after construction.)
PAGE_CSS = """
#mmoa-train-progress_bar input { pointer-events: none; }
#mmoa-train-progress_bar .tab-like-container, #mmoa-train-progress_bar .min_value,
#mmoa-train-progress_bar .max_value { display: none; }
#mmoa-train-progress_bar input[type=range]::-webkit-slider-thumb { opacity: 0; }
#mmoa-train-progress_bar input[type=range]::-moz-range-thumb { opacity: 0; }
"""


# ------------------------------------------------------------- the top row's template

#: Help under the top row's fields that LlamaBoard leaves without one (English).
TOP_HELP = {
    "lang": "Language of the labels and help texts of this page.",
    "finetuning_type": "lora: train a small adapter over frozen weights (least memory; the "
                       "run's output dir is then the adapter); full: train every weight; "
                       "freeze: only the last layers.",
    "checkpoint_path": "An earlier run of this model and method to continue from or to chat "
                       "with (its adapter or checkpoint); leave empty to start from the model "
                       "itself.",
    "template": "How prompts are wrapped for this model's chat format: smollm2 for SmolLM2, "
                "llama3 for Llama 3 and the tiny test model. The agents' prompts are rendered "
                "with it; a wrong one gives garbage.",
}

#: Words of a model folder's path and the template they mean.
_TEMPLATE_HINTS = (("smollm2", "smollm2"), ("smollm", "smollm"), ("llama-3", "llama3"),
                   ("llama3", "llama3"), ("qwen2", "qwen"), ("qwen", "qwen"))


def guess_template(model_path: str) -> str | None:
    """The chat template of a local model folder, from the demo models' table and its path's
    words; ``None`` when it cannot be told."""
    from mmoa.webui.playground import DEMO_MODELS

    path = (model_path or "").strip().rstrip("/")
    if not path:
        return None
    for folder, template in DEMO_MODELS:
        if path == folder or path.endswith("/" + folder) or path.startswith(folder + "/"):
            return template
    lowered = path.lower()
    return next((template for word, template in _TEMPLATE_HINTS if word in lowered), None)


def template_for_path(model_path: str, template: str) -> Any:
    """The top row's Template when the model path changes: the guessed one while the field
    still says ``default`` (a user's own choice is kept)."""
    import gradio as gr

    guessed = guess_template(model_path)
    if guessed is None or template not in (None, "", "default"):
        return gr.update()
    return gr.update(value=guessed)


def check_template(lang: str, template: str) -> None:
    """Stands in for LlamaBoard's ``check_template``, which called any model whose template
    is ``default`` (every *Custom* model, SmolLM2-Instruct included) "a non-instruct model"
    and told the user to fine-tune it first."""
    if template == "default":
        import gradio as gr

        gr.Info("Chat template is 'default' (plain turns): choose the model's own template, "
                "e.g. smollm2 for SmolLM2 or llama3 for the tiny model; it is filled in when "
                "the model path names one.")


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
        first_stage = TRAINING_STAGES.get(elems["training_stage"].value)
        with gr.Accordion(MAPPO_STAGE_LABEL, open=first_stage == MAPPO_STAGE,
                          elem_id=f"{ELEM_ID_PREFIX}-train-mappo_tab") as mappo_tab:
            gr.Markdown("Used when the stage is **MAPPO**. Each field is the YAML key shown in "
                        "Preview; the extra-arguments box may override any of them. Fields that "
                        "do not apply to the chosen *Algorithm* are hidden and left out of the "
                        "YAML.")
            with gr.Row():
                preset_btn = gr.Button("CPU demo preset", scale=0, min_width=160,
                                       elem_id=f"{ELEM_ID_PREFIX}-train-preset_cpu")
                gr.Markdown(f"A first run that logs a step within about a minute on a 2-core "
                            f"CPU (demo model): {describe_preset(CPU_DEMO_PRESET)}.")
            mappo_check = _render_rows(MAPPO_ROWS, components, "mappo_retriever_url", "train")

        with gr.Accordion(RETRIEVER_STAGE_LABEL, open=first_stage == RETRIEVER_RL_STAGE,
                          elem_id=f"{ELEM_ID_PREFIX}-train-retriever_tab") as retriever_tab:

            gr.Markdown(
                "Used when the stage is **Retriever RL**: the query encoder is trained with "
                "GRPO on sampled retrievals while the model above stays frozen (it answers for "
                "the F1 reward). Of the fields above the stage reads the model, template, "
                "dataset, output dir, learning rate, logging/save steps and max samples; the "
                "schedule is constant and the batch, epoch and fine-tuning fields do not "
                "apply. Other `retriever_*` keys go in the extra-arguments box "
                "(docs/retriever_rl.md).")
            retriever_check = _render_rows(RETRIEVER_ROWS, components, "retriever_url",
                                           "train-retriever")
        agent_elems = _create_agent_panels(engine, elems)

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
        for button, url, info in (mappo_check, retriever_check):
            button.click(check_server_html, [url], [info])
        conditional = [f for f in MAPPO_FIELDS if f.only_for is not None]

        def show_for_algorithm(algorithm: str) -> list[Any]:
            return [gr.update(visible=f.applies_to(algorithm)) for f in conditional]

        components["mappo_algorithm"].change(show_for_algorithm, [components["mappo_algorithm"]],
                                             [components[f.name] for f in conditional],
                                             queue=False)
        preset_targets = [_element(elems, components, elem_id) for elem_id in CPU_DEMO_PRESET]
        preset_btn.click(lambda: list(CPU_DEMO_PRESET.values()), None, preset_targets,
                         queue=False)
        if not is_accelerator_available():
            elems["compute_type"].value = "fp32"  # bf16 fails on CPU
        # LlamaBoard's Save steps slider starts at 10: the CPU demo preset's 2 (a checkpoint
        # per step of a 2-step run) made Preview and Start fail with gradio's "Value 2 is less
        # than minimum value 10", naming no field. Every step may be saved. The constructor's
        # arguments too: gradio rebuilds a component from them in a session's state after an
        # update (the page's language is one), and checks inputs against that copy.
        save_steps = elems["save_steps"]
        save_steps.minimum, save_steps.step = 1, 1
        save_steps.constructor_args.update(minimum=1, step=1)
        _tag_elements("train", elems)
        top = {manager.get_id_by_elem(e).split(".", 1)[1]: e for e in manager.get_elem_list()
               if manager.get_id_by_elem(e).startswith("top.")}
        _tag_elements("top", top)
        if "model_path" in top and "template" in top:
            top["model_path"].change(template_for_path, [top["model_path"], top["template"]],
                                     [top["template"]], queue=False)
        return {**elems, "mappo_tab": mappo_tab, "retriever_tab": retriever_tab,
                "preset_cpu": preset_btn, "check_server": mappo_check[0],
                "server_info": mappo_check[2], **agent_elems, **components}

    create_train_tab.__wrapped__ = original  # type: ignore[attr-defined]
    return create_train_tab


def _element(elems: dict[str, Any], components: dict[str, Any], elem_id: str) -> Any:
    """The component of a ``train.<name>`` id: ours, else LlamaBoard's."""
    name = elem_id.split(".", 1)[1]
    return components[name] if name in components else elems[name]


def _render_rows(rows: tuple[tuple[str, ...], ...], components: dict[str, Any], url_name: str,
                 prefix: str) -> tuple[Any, Any, Any]:
    """Render an accordion's rows, with a "Check server" button beside its URL field and the
    check's result under the first row; returns ``(button, URL field, result)``."""
    import gradio as gr

    button = info = None
    for index, row in enumerate(rows):
        with gr.Row():
            for name in row:
                components[name].render()
                if name == url_name:
                    button = gr.Button("Check server", scale=0, min_width=120,
                                       elem_id=f"{ELEM_ID_PREFIX}-{prefix}-check_server")
        if index == 0:
            info = gr.HTML(elem_id=f"{ELEM_ID_PREFIX}-{prefix}-server_info")
    assert button is not None and info is not None, url_name
    return button, components[url_name], info


def check_server_html(url: str) -> str:
    """The "Check server" button: what the server at ``url`` serves, or why it cannot be used."""
    from mmoa.webui.server_check import check_server, render_report

    return render_report(check_server(url))


# -------------------------------------------------------------- 10. the per-agent panels


def run_output_path(runner: Any) -> tuple[str, str | None]:
    """``(output folder, stage)`` of the run the runner is monitoring (LlamaBoard's rule)."""
    from llamafactory.extras.constants import TRAINING_STAGES
    from llamafactory.webui.common import get_save_dir

    def get(elem_id: str) -> Any:
        return runner.running_data[runner.manager.get_elem_by_id(elem_id)]

    path = get_save_dir(get("top.model_name"), get("top.finetuning_type"),
                        get("train.output_dir"))
    return str(path), TRAINING_STAGES.get(get("train.training_stage"))


def panels_of(output_path: str | Path) -> tuple[str, Any]:
    """``(summary HTML, figure)`` of a MAPPO run's folder, read from its ``trainer_log.jsonl``;
    the run-level curves are those of its algorithm (from its ``training_args.yaml``)."""
    from llamafactory.extras.constants import TRAINER_LOG, TRAINING_ARGS

    from mmoa.webui.plots import agent_figure, agent_summary, read_trainer_log, run_curve_keys

    try:
        algorithm = read_train_config([os.path.join(output_path, TRAINING_ARGS)]).get(
            "mappo_algorithm")
    except TrainConfigError:
        algorithm = None
    log = read_trainer_log(os.path.join(output_path, TRAINER_LOG))
    keys = run_curve_keys(algorithm if isinstance(algorithm, str) else None)
    return agent_summary(log), agent_figure(log, keys)


def watch_agent_panels(runner: Any, start_wait_s: float = PANEL_START_WAIT_S,
                       poll_s: float = PANEL_POLL_S) -> Any:
    """Yields ``(summary, figure)`` for the per-agent panels of the run being started: first
    empty ones (nothing of the previous run stays), then a redraw whenever the run's
    ``trainer_log.jsonl`` changes, until the run ends. A Start that never becomes a run (a
    refused form, no server) leaves the panels as they were."""
    import time

    from llamafactory.extras.constants import TRAINER_LOG

    deadline = time.monotonic() + start_wait_s
    while not (runner.running and runner.running_data is not None):
        if time.monotonic() > deadline:
            return
        time.sleep(0.25)
    try:
        output_path, stage = run_output_path(runner)
    except (KeyError, TypeError):  # the run ended between the two looks
        return
    yield "", None
    if stage != MAPPO_STAGE:
        return
    log_path = os.path.join(output_path, TRAINER_LOG)
    seen: tuple[int, int] | None = None
    while True:
        running = runner.running
        try:
            stat = os.stat(log_path)
            now: tuple[int, int] | None = (stat.st_mtime_ns, stat.st_size)
        except OSError:
            now = None
        if now is not None and now != seen:
            seen = now
            yield panels_of(output_path)
        if not running:
            return
        time.sleep(poll_s)


def _create_agent_panels(engine: Any, elems: dict[str, Any]) -> dict[str, Any]:
    """The per-agent panels under the log (full width: the plot column beside the log is too
    narrow for a dozen panels), redrawn while a MAPPO run goes on."""
    import gradio as gr

    with gr.Accordion("Per-agent panels (MAPPO)", open=True,
                      elem_id=f"{ELEM_ID_PREFIX}-train-agent_tab") as agent_tab:
        gr.Markdown("Each agent's reward, penalty rate, KL and entropy, the Selector's documents "
                    "and their gold recall, the Query Rewriter's sub-questions, the answer "
                    "length and F1, from the run's `trainer_log.jsonl`: the figures the run "
                    "saves as `training_agents.png` and `training_<key>.png`. Cleared when a "
                    "run starts.")
        summary = gr.HTML(elem_id=f"{ELEM_ID_PREFIX}-train-agent_summary")
        plot = gr.Plot(show_label=False, elem_id=f"{ELEM_ID_PREFIX}-train-agent_plot")

    def watch() -> Any:
        yield from watch_agent_panels(engine.runner)

    # No spinner: the watcher waits for the run (a refused Start would spin for 30 s).
    for trigger in (elems["start_btn"].click, elems["resume_btn"].change):
        trigger(watch, None, [summary, plot], concurrency_limit=None, show_progress="hidden")
    return {"agent_tab": agent_tab, "agent_summary": summary, "agent_plot": plot}


# -------------------------------------------------------------------- 7. the playground tab


def _wrap_create_footer(original: Callable[[], dict[str, Any]]) -> Callable[[], Any]:
    def create_footer() -> dict[str, Any]:
        import gradio as gr

        from mmoa.webui.playground import create_playground_tab

        with gr.Tab("RAG Playground", elem_id=f"{ELEM_ID_PREFIX}-playground-tab"):
            playground = create_playground_tab()
        # the Playground asks the server the Train tab names (it forgot it: a user who set
        # another URL for training found the default one here)
        if _last_engine:
            with contextlib.suppress(KeyError):
                train_url = _last_engine[0].manager.get_elem_by_id("train.mappo_retriever_url")
                train_url.change(lambda url: url, [train_url], [playground["retriever_url"]],
                                 queue=False)
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

#: The LlamaBoard texts apply_patches rewrites (restored by remove_patches).
_LOCALE_KEYS = ("title", "subtitle", "dataset", *TOP_HELP)


def _no_start_warning() -> bool:
    """Stands in for ``is_accelerator_available`` in ``webui.runner``, whose only use there is
    the per-Start "CUDA environment was not detected" toast."""
    return True



def apply_patches() -> None:
    """Patch LlamaBoard in memory; idempotent. Call before ``create_ui()``."""
    if _originals:
        return
    from llamafactory.extras.constants import TRAINING_STAGES
    from llamafactory.extras.misc import is_accelerator_available
    from llamafactory.webui import interface, runner
    from llamafactory.webui.components import top
    from llamafactory.webui.locales import LOCALES

    _originals.update({
        "parse": runner.Runner._parse_train_args, "initialize": runner.Runner._initialize,
        "launch": runner.Runner._launch,
        "popen": runner.Popen, "gen_cmd": runner.gen_cmd, "monitor": runner.Runner.monitor,
        "trainer_info": runner.get_trainer_info,
        "train_tab": interface.create_train_tab, "footer": interface.create_footer,
        "save_config": [module.save_config for module in _save_config_modules()],
        "stages": dict(TRAINING_STAGES), "accelerator": runner.is_accelerator_available,
        "locales": {key: json.loads(json.dumps(LOCALES[key])) for key in _LOCALE_KEYS},
        "check_template": top.check_template, "css": interface.CSS,
    })
    # Our stages first (the dict is shared by every webui module: reordered in place).
    others = dict(TRAINING_STAGES)
    TRAINING_STAGES.clear()
    TRAINING_STAGES.update({MAPPO_STAGE_LABEL: MAPPO_STAGE,
                            RETRIEVER_STAGE_LABEL: RETRIEVER_RL_STAGE, **others})
    cpu = "" if is_accelerator_available() else CPU_NOTE
    for lang in LOCALES["title"]:
        LOCALES["title"][lang]["value"] = TITLE_HTML
        LOCALES["subtitle"][lang]["value"] = INTRO_HTML.format(cpu=cpu)
    LOCALES["dataset"]["en"]["info"] = ("MAPPO: a prompt set with gold answers, e.g. demo_mappo "
                                        "(mmoa-cli data mappo registers one)")
    for key, text in TOP_HELP.items():
        LOCALES[key]["en"]["info"] = text
    top.check_template = check_template
    interface.CSS = _originals["css"] + PAGE_CSS
    # LlamaBoard asks this only to toast "CUDA environment was not detected" on every Start;
    # the first screen says CPU once instead (CPU_NOTE).
    runner.is_accelerator_available = _no_start_warning
    runner.Runner._parse_train_args = _wrap_parse_train_args(_originals["parse"])
    runner.Runner._initialize = _wrap_initialize(_originals["initialize"])
    runner.Runner._launch = _wrap_launch(_originals["launch"])
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
    from llamafactory.webui.components import top
    from llamafactory.webui.locales import LOCALES

    TRAINING_STAGES.clear()
    TRAINING_STAGES.update(_originals["stages"])
    LOCALES.update(_originals["locales"])
    top.check_template = _originals["check_template"]
    interface.CSS = _originals["css"]
    runner.is_accelerator_available = _originals["accelerator"]
    runner.Runner._parse_train_args = _originals["parse"]
    runner.Runner._initialize = _originals["initialize"]
    runner.Runner._launch = _originals["launch"]
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
