"""Pre-flight checks: the model folders and datasets a command names exist, before anything loads.

Why: LLaMA-Factory and transformers report a missing local model as a failed hub lookup (a
100-line traceback ending "Failed to load tokenizer.", or "We couldn't connect to
'https://huggingface.co'") and a missing dataset registry as an ``open()`` error, after a long
start-up. Every entry point (``mmoa-cli train`` and with it ``run_sft.sh`` / ``run_mappo.sh``,
``mmoa-cli export``, ``mmoa-cli eval`` and ``evaluate/evaluate_qr_s_g.py``) asks here first, so a
new user reads one line naming what is missing and one line with the command that makes it.

Every hint command is written once, here, relative to the repository root; when the user runs
from another folder (``cd LLaMA-Factory && bash run_sft.sh``) it is prefixed with the ``cd`` that
gets there. The shell wrappers ``cd`` to the root themselves and pass the folder the user typed
the command in as ``MMOA_CALLER_DIR``.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mmoa.agent_adapters import MARKER_FILE

#: Set by the shell wrappers (which ``cd`` to the repository root) to the user's own folder.
CALLER_DIR_ENV = "MMOA_CALLER_DIR"

#: Where the shipped training configs live (relative to the repository root); a missing model
#: folder that one of them writes (``output_dir`` / ``export_dir``) is made by running it.
EXAMPLES_DIR = "LLaMA-Factory/examples"

# The commands that make things, each defined once (run from the repository root).
RUN_DEMO = "bash run_demo.sh"
GET_SMOLLM2 = "python models/get_smollm2.py"
MAKE_TINY_MODEL = "python models/make_tiny_model.py"
MAKE_WORLD = "python data_builders/make_demo_world.py --out {world}"
SFT_BUILDER = "python data_builders/qr_s_g_sft_data_alpaca.py"
MAPPO_BUILDER = "python data_builders/get_ppo_data_alpaca.py"
PRETRAIN_BUILDER = "python data_builders/make_pretrain_text.py"
TRAIN = "mmoa-cli train"
EXPORT = "mmoa-cli export"
#: The wrapper script of each stage (the others go through ``mmoa-cli train`` directly).
STAGE_SCRIPTS: dict[str, str] = {
    "sft": "bash LLaMA-Factory/run_sft.sh",
    "mappo": "bash LLaMA-Factory/run_mappo.sh",
}
#: Model folders made by a script rather than by a training config.
SCRIPT_MODELS: dict[str, str] = {
    "models/smollm2-135m-instruct": GET_SMOLLM2,
    "models/tiny-llama3": MAKE_TINY_MODEL,
}
#: Top-k of the demo (run_demo.sh's K, the demo MAPPO config's ``mappo_top_k``).
DEMO_K = 5

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_FALSE = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Problem:
    """One missing thing: ``what`` is missing (one line) and ``hint``, how to make it."""

    what: str
    hint: str

    def lines(self, prefix: str) -> list[str]:
        return [f"{prefix} {self.what}", f"  {self.hint}"]


class PreflightError(ValueError):
    """Something a command needs is missing; ``problems`` says what and how to make it."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(p.what for p in problems))
        self.problems = list(problems)

    def report(self, prefix: str) -> str:
        """Two lines per problem, the first after ``prefix`` (``"mmoa-cli train: error:"``)."""
        return "\n".join(line for p in self.problems for line in p.lines(prefix))


def project_root(start: Path | None = None) -> Path | None:
    """The repository root at or above ``start`` (default: the current folder), else ``None``."""
    start = (start or Path.cwd()).resolve()
    for folder in (start, *start.parents):
        if (folder / "LLaMA-Factory" / "run_sft.sh").is_file():
            return folder
    return None


def caller_dir() -> Path:
    """The folder the user typed the command in (the shell wrappers pass it on)."""
    return Path(os.environ.get(CALLER_DIR_ENV) or os.getcwd()).resolve()


def command_here(command: str, root: Path | None) -> str:
    """``command`` (written for the repository root) as the user types it where they are."""
    if root is None:
        return command
    here = caller_dir()
    root = root.resolve()
    if here == root:
        return command
    relative = os.path.relpath(root, here)
    where = str(root) if relative.count("..") > 2 else relative
    return f"cd {shlex.quote(where)} && {command}"


def make_with(command: str, root: Path | None, note: str = "") -> str:
    return f"make it with: {command_here(command, root)}{note}"


# ---------------------------------------------------------------------------------------------
# models


def _in_hub_cache(name: str, filename: str) -> bool:
    """A hub id whose files are in the local Hugging Face cache loads offline; so does any hub
    id when the user explicitly allowed downloads (``HF_HUB_OFFLINE=0``)."""
    if not _REPO_ID.match(name) or name.startswith(("./", "../")):
        return False
    if os.environ.get("HF_HUB_OFFLINE", "1").strip().lower() in _FALSE:
        return True
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, filename), str)


def _example_configs(root: Path) -> Iterable[tuple[Path, dict[str, Any]]]:
    import yaml

    for path in sorted((root / EXAMPLES_DIR).rglob("*.yaml")):
        try:
            config = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(config, dict):
            yield path, config


def model_maker(path: Path, root: Path | None) -> str | None:
    """The command (from the repository root) that makes the model folder ``path``, if known:
    a model script, or the shipped config whose ``output_dir`` / ``export_dir`` it is."""
    if root is None:
        return None
    target = path.resolve()
    for name, command in SCRIPT_MODELS.items():
        if (root / name).resolve() == target:
            return command
    for config_path, config in _example_configs(root):
        config_name = config_path.relative_to(root).as_posix()
        if config.get("export_dir") and (root / str(config["export_dir"])).resolve() == target:
            return f"{EXPORT} {config_name}"
        if config.get("output_dir") and (root / str(config["output_dir"])).resolve() == target:
            stage = str(config.get("stage", "sft"))
            return f"{STAGE_SCRIPTS.get(stage, TRAIN)} {config_name}"
    return None


def model_problem(value: Any, key: str = "model_name_or_path", *, adapter: bool = False,
                  root: Path | None = None) -> Problem | None:
    """``None`` when ``value`` is a local model (or adapter) folder with its config file.

    Models are local folders in this project (nothing is downloaded), so a path that does not
    exist is reported here instead of becoming a hub lookup inside transformers.
    """
    config_file = "adapter_config.json" if adapter else "config.json"
    if value is None or str(value).strip() == "":
        return Problem(f"the config sets no {key}",
                       f"add {key}=<a local model folder> (python models/get_smollm2.py makes "
                       "models/smollm2-135m-instruct)")
    name = str(value).strip()
    path = Path(name).expanduser()
    if path.is_dir() and (path / config_file).is_file():
        return None
    if adapter and path.is_dir() and (path / MARKER_FILE).is_file():
        return None  # one adapter per agent (mappo_adapter_per_agent), each in its sub-folder
    if not path.exists() and _in_hub_cache(name, config_file):
        return None
    root = root if root is not None else project_root()
    if path.is_dir():
        what = f"{key}: {name} has no {config_file} (an unfinished conversion or training?)"
    else:
        kind = "adapter" if adapter else "model"
        what = f"{key}: no {kind} folder {name} (models are local folders; nothing is downloaded)"
    command = model_maker(path, root)
    if command is not None:
        return Problem(what, make_with(command, root))
    return Problem(what, f"point {key} at a local {'adapter' if adapter else 'model'} folder "
                         f"({GET_SMOLLM2} makes models/smollm2-135m-instruct)")


def model_problems(config: Mapping[str, Any], root: Path | None = None) -> list[Problem]:
    """The base model and every LoRA adapter (``adapter_name_or_path`` is a comma list)."""
    problems = [model_problem(config.get("model_name_or_path"), root=root)]
    adapters = config.get("adapter_name_or_path")
    if adapters:
        items = adapters if isinstance(adapters, list) else str(adapters).split(",")
        problems += [model_problem(a.strip(), "adapter_name_or_path", adapter=True, root=root)
                     for a in map(str, items) if a.strip()]
    return [p for p in problems if p is not None]


# ---------------------------------------------------------------------------------------------
# datasets


def _names(value: Any) -> list[str]:
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(item).strip() for item in items if str(item).strip()]


def from_root(path: str | Path, root: Path | None) -> str:
    """``path`` (relative to the current folder) as seen from ``root``, where hints run."""
    if root is None:
        return Path(path).as_posix()
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(root.resolve()).as_posix() or "."
    except ValueError:
        return str(absolute)


def dataset_hint(name: str, dataset_dir: str, stage: str, root: Path | None) -> str:
    """How dataset ``name`` gets into ``dataset_dir``: the demo's exact builder command, the
    stage's builder, or (another stage) the registry to edit."""
    shown_dir = from_root(dataset_dir, root)
    extra = "" if shown_dir == "data" else f" --dataset_dir {shlex.quote(shown_dir)}"
    world = f"{shown_dir}/demo"
    train = f"{world}/train.jsonl"
    if name == "demo_sft":
        command = f"{SFT_BUILDER} --data_file {train} --name demo_sft --k {DEMO_K}{extra}"
        return make_with(RUN_DEMO, root, f" (the whole demo; the SFT data alone, with the demo "
                                         f"retrieval server running: {command})")
    if name == "demo_mappo":
        command = f"{MAPPO_BUILDER} --data_file {train} --name demo_mappo{extra}"
        if not (Path(dataset_dir) / "demo" / "train.jsonl").is_file():
            command = f"{MAKE_WORLD.format(world=world)} && {command}"
        return make_with(command, root)
    if name == "demo_pt":
        dataset_dir_arg = "" if not extra else f" --dataset-dir {shlex.quote(shown_dir)}"
        return make_with(f"{PRETRAIN_BUILDER} --exclude-corpus {world}/corpus.jsonl"
                         f"{dataset_dir_arg}", root)
    if stage == "sft":
        return make_with(f"{SFT_BUILDER} --data_file QA_FILE --name {name}{extra}", root,
                         " (with a retrieval server running)")
    if stage == "mappo":
        return make_with(f"{MAPPO_BUILDER} --data_file QA_FILE --name {name}{extra}", root)
    return (f"register it in {dataset_dir}/dataset_info.json (LLaMA-Factory's format, see "
            "data/README.md)")


def dataset_problems(names: Any, dataset_dir: str = "data", stage: str = "sft",
                     root: Path | None = None) -> list[Problem]:
    """Each name must be registered in ``dataset_dir/dataset_info.json`` and, where it is a
    local file (``file_name``), that file must exist; hub and script datasets are left to
    LLaMA-Factory."""
    wanted = _names(names) if names else []
    if not wanted or dataset_dir == "ONLINE" or dataset_dir.startswith("REMOTE:"):
        return []
    from mmoa.data.registry import DATASET_INFO, read_dataset_info

    root = root if root is not None else project_root()
    info_path = Path(dataset_dir) / DATASET_INFO
    try:
        info = read_dataset_info(dataset_dir) if info_path.exists() else None
    except (OSError, ValueError) as err:  # DataFormatError is a ValueError
        return [Problem(f"{info_path}: cannot be read ({err})",
                        "fix or delete it (the data builders write it again)")]
    problems = []
    for name in wanted:
        hint = dataset_hint(name, dataset_dir, stage, root)
        if info is None:
            what = f"dataset {name!r}: {info_path} does not exist (nothing is registered yet)"
        elif name not in info:
            registered = ", ".join(sorted(info)) or "none"
            what = f"dataset {name!r} is not registered in {info_path} (registered: {registered})"
        else:
            file_name = info[name].get("file_name") if isinstance(info[name], dict) else None
            remote = isinstance(info[name], dict) and any(
                key in info[name] for key in ("hf_hub_url", "ms_hub_url", "om_hub_url",
                                              "script_url", "cloud_file_name"))
            if remote or not file_name or (Path(dataset_dir) / str(file_name)).exists():
                continue
            what = f"dataset {name!r}: its file {Path(dataset_dir) / str(file_name)} is missing"
        problems.append(Problem(what, hint))
    return problems


def qa_file_problem(data_file: str | None, root: Path | None = None) -> Problem | None:
    """A QA file given to the evaluation must exist; a demo split is made by the world builder."""
    if not data_file or Path(data_file).exists():
        return None
    root = root if root is not None else project_root()
    path = Path(data_file)
    if path.parent.name == "demo" and path.name in ("train.jsonl", "dev.jsonl", "test.jsonl"):
        hint = make_with(MAKE_WORLD.format(world=from_root(path.parent, root)), root)
    else:
        hint = "give an existing QA file (HotpotQA, 2Wiki, AmbigQA, FlashRAG, NQ-open or demo)"
    return Problem(f"--data_file: no file {data_file}", hint)


# ---------------------------------------------------------------------------------------------
# the retrieval server (stage mappo)


def retriever_problem(config: Mapping[str, Any], root: Path | None = None) -> Problem | None:
    """One quick probe of ``mappo_retriever_url``, used only when the run cannot start anyway
    (the MAPPO workflow checks the server itself, with the configured retries, before the model
    loads): a fresh clone then learns every missing piece at once."""
    from mmoa.retrieval.client import (
        RetrievalClient,
        RetrieverRequestError,
        RetrieverUnavailableError,
    )

    try:
        url, token, timeout = _retriever_keys(config)
        client = RetrievalClient(url, token=token, timeout=min(timeout, 5.0), retries=0)
        client.health()
    except (ValueError, TypeError, RetrieverRequestError):
        return None  # bad MAPPO keys or a server that answers: the workflow says what is wrong
    except RetrieverUnavailableError:
        return Problem(f"mappo_retriever_url: no retrieval server answers at {client.url}",
                       server_hint(client.url, str(config.get("dataset_dir") or "data"), root))
    return None


def _retriever_keys(config: Mapping[str, Any]) -> tuple[str, str | None, float]:
    """``(url, token, timeout)`` of a ``mappo`` config, typed as the stage reads them.

    Only these three keys are read (not the whole ``MappoArguments`` of the training layer,
    which this module sits below): a bad value of one of them is a ``ValueError`` and the probe
    is left to the workflow, which names the key."""
    from math import isfinite

    from mmoa.config_values import typed_value
    from mmoa.retrieval.client import DEFAULT_URL

    url = typed_value("mappo_retriever_url", config.get("mappo_retriever_url", DEFAULT_URL), str)
    token = typed_value("mappo_retriever_token", config.get("mappo_retriever_token"),
                        str | None)
    timeout = typed_value("mappo_retriever_timeout", config.get("mappo_retriever_timeout", 5.0),
                          float)
    if not (isfinite(timeout) and timeout > 0):
        raise ValueError(f"mappo_retriever_timeout must be a finite number > 0, got {timeout}")
    return url, token, timeout


def server_hint(url: str, dataset_dir: str, root: Path | None) -> str:
    """The command that serves the demo index on ``url``'s port (or says what it needs)."""
    from urllib.parse import urlsplit

    port = urlsplit(url).port
    port_arg = "" if port in (None, 8000) else f" --port {port}"
    index = Path(dataset_dir) / "demo" / "index"
    start = command_here(f"bash run_server.sh --index {from_root(index, root)}{port_arg}", root)
    if index.is_dir():
        return f"start it (in another shell) with: {start}"
    return (f"start one (in another shell) with: bash run_server.sh --index INDEX_DIR{port_arg} "
            f"(the demo's index, {from_root(index, root)}, is built by {RUN_DEMO})")


# ---------------------------------------------------------------------------------------------
# per command


def check_train_config(config: Mapping[str, Any]) -> None:
    """``mmoa-cli train``: the model, its adapters and the datasets, for every stage (and, for
    ``mappo``, when something else is missing too, whether the retrieval server answers)."""
    root = project_root()
    problems = model_problems(config, root)
    stage = str(config.get("stage", "sft"))
    tokenized = config.get("tokenized_path")
    if not (tokenized and Path(str(tokenized)).exists()):
        dataset_dir = str(config.get("dataset_dir") or "data")
        for key in ("dataset", "eval_dataset"):
            problems += dataset_problems(config.get(key), dataset_dir, stage, root)
    if problems and stage == "mappo":
        server = retriever_problem(config, root)
        problems += [server] if server is not None else []
    if problems:
        raise PreflightError(problems)


def check_export_config(config: Mapping[str, Any]) -> None:
    """``mmoa-cli export``: the base model and the adapters to merge."""
    problems = model_problems(config)
    if problems:
        raise PreflightError(problems)


def check_eval(model: str, adapter: str | None, data_file: str | None,
               dataset: str | None = None, dataset_dir: str = "data") -> None:
    """``mmoa-cli eval`` / ``evaluate_qr_s_g.py``: the model, its adapter and the QA set."""
    root = project_root()
    config = {"model_name_or_path": model, "adapter_name_or_path": adapter}
    problems = [*model_problems(config, root), qa_file_problem(data_file, root),
                *dataset_problems(dataset, dataset_dir, "eval", root)]
    found = [p for p in problems if p is not None]
    if found:
        raise PreflightError(found)
