"""What the long training benches share: running a stage with its output in a log, training
through ``mmoa-cli``, resuming from the last checkpoint, keeping each finished stage's result on
disk, paired per-question gains, and the command line every such bench starts from.

The benches (``learning_signal.py``, ``decision_agent.py``, ``retriever_rl.py``,
``search_agent.py``) run for hours on a CPU and span sessions, so each stage writes
``<work-dir>/<stage>/result.json`` when it is done and a later invocation skips it.

Every bench writes its result JSON through :func:`write_result`, which names the commit it was
measured at and keeps no path of the machine it ran on (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any, NoReturn

from mmoa.agent_adapters import MARKER_FILE
from mmoa.evaluation import paired_gain as paired_gain  # the benches import them from here
from mmoa.evaluation import per_question_f1 as per_question_f1
from mmoa.fileio import atomic_write_json
from mmoa.precision import PRECISION_CHOICES
from mmoa.train.restart_check import newest_checkpoint

ROOT = Path(__file__).resolve().parents[1]
RESULT = "result.json"
ATTEMPT = "attempt.json"


class BenchInputError(ValueError):
    """A file or argument a bench was given that it cannot use: the message names it and
    what is wrong, in one line."""


def fail(message: str, prog: str | None = None) -> NoReturn:
    """Stop a bench on bad input: one line on stderr, exit status 2 (argparse's), nothing
    written. A ``SystemExit(message)`` exits with 1 and a traceback is no message at all."""
    print(f"{prog or Path(sys.argv[0]).name}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


#: ``required`` of :func:`read_json_object`: a key (``a.b`` for a nested one) and the JSON
#: type(s) its value must have.
Required = dict[str, type | tuple[type, ...]]
_JSON_TYPE_NAMES = {dict: "object", list: "list", str: "string", int: "integer",
                    float: "number", bool: "true/false"}


def _type_names(kinds: type | tuple[type, ...]) -> str:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return " or ".join(_JSON_TYPE_NAMES.get(k, k.__name__) for k in kinds)


def read_json_object(path: str | Path, what: str, required: Required | None = None
                     ) -> dict[str, Any]:
    """``path`` read as the JSON object ``what`` says it is (e.g. "a side_by_side result"),
    or :class:`BenchInputError` naming the file and what is wrong: missing, not a file,
    unreadable, not UTF-8, not JSON (line and column), a JSON list or anything but an
    object, a ``required`` key missing or of another type. One check for every bench that
    reads back its own JSON (``--report``, ``--readme``, a resume), where a corrupt, empty or
    hand-edited file was a traceback."""
    path = Path(path)
    if not path.exists():
        raise BenchInputError(f"{path}: no such file ({what} expected)")
    if not path.is_file():
        raise BenchInputError(f"{path}: not a regular file ({what} expected)")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise BenchInputError(f"{path}: cannot be read ({err.strerror})") from err
    except UnicodeDecodeError as err:
        raise BenchInputError(f"{path}: not UTF-8 text (byte {err.start}); expected {what}"
                              ) from err
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise BenchInputError(f"{path}: not valid JSON ({err.msg} at line {err.lineno} column "
                              f"{err.colno}); expected {what}") from err
    except (ValueError, RecursionError) as err:
        raise BenchInputError(f"{path}: cannot be read as JSON ({err}); expected {what}"
                              ) from err
    if not isinstance(value, dict):
        raise BenchInputError(f"{path}: holds a JSON {_type_names(type(value))}, expected "
                              f"{what} (a JSON object)")
    for key, kinds in (required or {}).items():
        node: Any = value
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                raise BenchInputError(f"{path}: no {key!r} in it; expected {what}" + (
                    " (the file is an empty object)" if not value else ""))
            node = node[part]
        if not isinstance(node, kinds) or (isinstance(node, bool) and bool not in (
                kinds if isinstance(kinds, tuple) else (kinds,))):
            raise BenchInputError(f"{path}: {key!r} is a JSON {_type_names(type(node))}, "
                                  f"expected a JSON {_type_names(kinds)} ({what})")
    return value


def load_json_or_exit(path: str | Path, what: str, required: Required | None = None,
                      prog: str | None = None) -> dict[str, Any]:
    """:func:`read_json_object`, or :func:`fail` with its one line (exit status 2)."""
    try:
        return read_json_object(path, what, required)
    except BenchInputError as err:
        fail(str(err), prog)


_OVERRIDE_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)?")


def check_overrides(items: list[str], option: str = "override") -> list[str]:
    """``KEY=VALUE`` overrides (``METHOD.KEY=VALUE`` too) as given, or :func:`fail` naming the
    first that is not one: ``=x`` (no key) was passed on to the training, ``x`` too."""
    for item in items:
        key, sep, _ = item.partition("=")
        if not sep or not _OVERRIDE_KEY.fullmatch(key):
            fail(f"{option} {item!r}: expected KEY=VALUE with a key of letters, digits and "
                 f"underscores (e.g. max_steps=4, or METHOD.max_steps=4)")
    return items


def percent(value: float | None) -> str:
    """A fraction as a percent with one decimal, the benches' tables' unit; "-" where it is
    missing (or NaN: a mean over no questions)."""
    return "-" if value is None or value != value else f"{100 * value:.1f}"


def run_logged(command: list[str], log: Path) -> None:
    """One stage, its output appended to ``log`` (the bench prints one line per stage)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(f"\n$ {' '.join(command)}\n")
        handle.flush()
        result = subprocess.run(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT,
                                check=False)
    if result.returncode != 0:
        raise SystemExit(f"failed ({exit_reason(result.returncode)}): {' '.join(command)}\n"
                         f"  see {log}")


def exit_reason(returncode: int) -> str:
    """A process's exit status in words: the code, or the signal that ended it (a SIGKILL
    nobody sent is usually the kernel's out-of-memory killer; the log then just stops)."""
    if returncode >= 0:
        return str(returncode)
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    hint = ", out of memory? see dmesg" if -returncode == signal.SIGKILL else ""
    return f"{returncode}, {name}{hint}"


def mmoa_cli(*argv: str) -> list[str]:
    """``mmoa-cli ARGV`` with this interpreter (the bench's virtual environment)."""
    return [sys.executable, "-m", "mmoa.cli", *argv]


def train(config: str, overrides: list[str], log: Path) -> None:
    """``mmoa-cli train CONFIG key=value ...``, its output in ``log``."""
    run_logged(mmoa_cli("train", config, *overrides), log)


def resume_overrides(output_dir: Path) -> list[str]:
    """The overrides that resume a training cut before its end from ``output_dir``'s last
    checkpoint (``[]`` where it has none): a run longer than a session then spans sessions.
    A config that saves no checkpoints (``save_strategy: "no"``) restarts from scratch."""
    checkpoint = newest_checkpoint(output_dir)
    if checkpoint is None:
        return []
    print(f"[{output_dir}] resuming from {checkpoint.name}", flush=True)
    return [f"resume_from_checkpoint={checkpoint}", "overwrite_output_dir=false"]


def train_to_end(config: str, overrides: list[str], output_dir: Path, log: Path,
                 keep_checkpoints: bool = False) -> None:
    """Train ``config`` into ``output_dir`` once: resumed from its last checkpoint where an
    earlier attempt was cut, skipped where a ``trained`` marker beside ``output_dir`` says it
    finished (an attempt cut during its evaluation must not train again). Its checkpoints,
    kept only to resume, are removed once it has trained unless ``keep_checkpoints`` (for
    ``bench/dev_curve.py``); the final model is in ``output_dir`` itself."""
    trained = output_dir.parent / "trained"
    if trained.exists():
        return
    train(config, [*overrides, *resume_overrides(output_dir)], log)
    trained.touch()
    for checkpoint in [] if keep_checkpoints else output_dir.glob("checkpoint-*"):
        shutil.rmtree(checkpoint, ignore_errors=True)


def model_arguments(model: Path, base: str | Path | None = None) -> list[str]:
    """The evaluator's model options for a training output: a full model is the model itself;
    a LoRA output (``finetuning_type: lora``: one adapter, or one per agent under
    ``mappo_adapter_per_agent``) is an adapter over ``base``, the model it was trained from."""
    if (model / "config.json").is_file():
        return ["--model_name_or_path", str(model)]
    if (model / "adapter_config.json").is_file() or (model / MARKER_FILE).is_file():
        if base is None:
            raise SystemExit(f"{model} holds LoRA adapters: the model they were trained from "
                             "must be given to evaluate them")
        return ["--model_name_or_path", str(base), "--adapter_name_or_path", str(model)]
    raise SystemExit(f"{model}: neither a model (config.json) nor LoRA adapters "
                     "(adapter_config.json, agent_adapters.json)")


def code_version(script: str) -> str:
    """The commit a run trains with (``+dirty`` when the library, the evaluation or ``script``
    has uncommitted changes): runs of one table must come from the same trainer code, and a
    resumed bench may span sessions."""
    def git(*argv: str) -> str:
        try:
            out = subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                                 check=False)
        except OSError:  # no git on this machine (the GPU check's): "unknown"
            return ""
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    # the code a run depends on; the results the bench writes are not
    # untracked files count: a module or script never committed is not that commit's code
    changed = git("status", "--porcelain", "--", "LLaMA-Factory", "evaluate", script)
    return commit + ("+dirty" if changed else "")


#: Where a result JSON names the commit it was measured at, in the order looked at: its own
#: ``code`` (what :func:`write_result` stamps), a hand-written ``commit``, or the ``code`` of its
#: ``config`` block (the training benches record it there).
COMMIT_KEYS: tuple[tuple[str, ...], ...] = (("code",), ("commit",), ("config", "code"))

#: Top-level folders that are the same on every Linux machine: a path under them names no
#: machine and is kept as it is.
SYSTEM_ROOTS = frozenset({"usr", "bin", "sbin", "lib", "lib32", "lib64", "etc", "dev", "proc",
                          "sys"})

#: Top-level folders where machines keep their own files (besides those of the machine a
#: rewriting runs on): a path under them names the machine it ran on.
MACHINE_ROOTS = frozenset({"work", "workspace", "opt", "mnt", "media", "srv", "data", "scratch",
                           "var", "content", "Volumes", "private"})

#: An absolute POSIX path inside any text: a ``/`` that does not continue a word, a relative
#: path, a URL (``http://host/x``), ``~/``, ``../`` or a marker this module wrote (``<tmp>/``),
#: then path characters up to a space, a quote, a colon, a comma, a bracket ...
_PATH_TOKEN = re.compile(r"(?<![\w.~/:<>@-])/[\w.+@%~-]+(?:/[\w.+@%~-]*)*")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def result_commit(result: Any) -> str | None:
    """The commit a result JSON says it was measured at (see :data:`COMMIT_KEYS`), or None
    where it names none or only ``unknown`` (measured outside a git checkout)."""
    for keys in COMMIT_KEYS:
        value = result
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and value and not value.startswith("unknown"):
            return value
    return None


def _below(path: str, base: str) -> str | None:
    """``path`` relative to the folder ``base`` ("" for ``base`` itself), or None outside."""
    base = base.rstrip("/")
    if not base or path == base:
        return "" if base else None
    return path[len(base) + 1:] if path.startswith(base + "/") else None


def _machine_free_path(path: str, root: Path) -> str:
    """One absolute path by :func:`portable_text`'s rules."""
    if path.endswith(".") and len(path) > 2 and path[-2] not in "./":
        return _machine_free_path(path[:-1], root) + "."  # the full stop of a sentence
    marked: list[tuple[str, str]] = [(str(root), "."), (str(root.parent / "shared"), "../shared")]
    marked += [(tmp, "<tmp>") for tmp in
               sorted({tempfile.gettempdir(), "/tmp", "/var/tmp"}, key=len, reverse=True)]
    try:
        home = str(Path.home())
    except RuntimeError:  # no home folder known
        home = ""
    if home.count("/") >= 2 or home == "/root":  # not "/" itself
        marked.append((home, "~"))
    if user_home := re.match(r"/(?:home|Users)/[^/]+|/root(?=/|$)", path):
        marked.append((user_home.group(0), "~"))
    for base, label in marked:
        rest = _below(path, base)
        if rest is not None:
            if label == ".":
                return rest or "."
            return f"{label}/{rest}" if rest else label
    parts = [part for part in path.split("/") if part]
    if len(parts) < 2 or parts[0] in SYSTEM_ROOTS or parts[0] in (".", "..") or not (
            parts[0] in MACHINE_ROOTS or os.path.isdir(f"/{parts[0]}")):
        return path
    return f"<elsewhere>/{parts[-1]}"


def portable_text(text: str, root: Path = ROOT) -> str:
    """``text`` with every absolute path in it (the whole string, or inside a command or an
    error message) rewritten so that it names no machine, the rest of the text unchanged.

    A result JSON is read on other machines and committed: a path of the machine it ran on
    (``/work/main/saves/x``, ``/tmp/probe_k3j2/...``, a home folder) means nothing there and
    says who ran it where. The rules, first match wins:

    * under the checkout ``root``: relative to it (``saves/x``; the checkout itself is ``.``);
    * under its sibling ``../shared`` (the shared data folder): ``../shared/...``;
    * under the temporary folder (``tempfile.gettempdir()``, ``/tmp``, ``/var/tmp``):
      ``<tmp>/...``, the rest kept (the folder was the run's scratch space and is gone);
    * under a home folder (``$HOME``, ``/home/<user>``, ``/Users/<user>``, ``/root``):
      ``~/...``, the user's name dropped;
    * under a folder that is the same on every Linux machine (:data:`SYSTEM_ROOTS`: ``/usr``,
      ``/dev``, ``/proc`` ...): unchanged;
    * not a path at all: a single component (``/s`` in "tokens /s"), or a top folder that
      neither this machine has nor machines commonly keep files in (:data:`MACHINE_ROOTS`),
      such as the HTTP route in "POST /admin/reload_encoder": unchanged;
    * any other path of the machine (``/opt/venv/bin/python3``, a sibling of the checkout
      like ``/work/runs/x.json``): ``<elsewhere>/<its name>``: only the file's name is kept,
      and the marker says it lay outside the checkout there.

    Only POSIX paths are recognised; the rewriting is idempotent (a rewritten text is
    unchanged by a second pass)."""
    return _PATH_TOKEN.sub(lambda match: _machine_free_path(match.group(0), root), text)


def portable(value: Any, root: Path = ROOT) -> Any:
    """``value`` (a JSON value: dicts, lists, strings, numbers ...) with every string, a dict's
    keys included, passed through :func:`portable_text`; a new value, ``value`` is left as it
    is (a bench goes on using its absolute paths). A ``Path`` becomes its portable string;
    numbers, booleans and None are returned as they are."""
    if isinstance(value, dict):
        return {portable(key, root): portable(item, root) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [portable(item, root) for item in value]
    if isinstance(value, PurePath):
        return portable_text(os.fspath(value), root)
    if isinstance(value, str):
        return portable_text(value, root)
    return value


def portable_json_text(text: str, root: Path = ROOT) -> str:
    """The JSON document ``text`` with :func:`portable_text` applied to each of its strings,
    everything else byte for byte as it was (layout, numbers as written, the escapes of the
    strings that hold no path): the committed result files are made portable in place, and a
    test checks that each is already (``portable_json_text(text) == text``)."""
    def rewrite(match: re.Match[str]) -> str:
        value = json.loads(match.group(0))
        new = portable_text(value, root)
        return match.group(0) if new == value else json.dumps(new, ensure_ascii=False)
    return _JSON_STRING.sub(rewrite, text)


def without_commit(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` without the commit :func:`write_result` stamped on it: a bench that merges a
    part re-run alone into its earlier JSON drops the earlier stamp, so the file is stamped
    with the current commit, the newest code any of its parts was measured at."""
    return {key: value for key, value in result.items() if key not in ("code", "code_source")}


def write_result(path: str | Path, result: dict[str, Any], script: str, *,
                 code: str | None = None, code_source: str | None = None,
                 indent: int | None = 2) -> dict[str, Any]:
    """Write a bench's result JSON (atomically) as every JSON under ``bench/results`` is kept:
    its paths machine-free (:func:`portable`) and naming the commit it was measured at.

    A figure is only comparable with another, or reproducible, when one knows the code that
    produced it; and a committed result must not depend on, nor disclose, the machine it ran
    on. Where ``result`` names no commit (:func:`result_commit`), ``"code"`` is added:
    ``code``, or ``code_version(script)`` (the checkout's commit, ``+dirty`` when the library,
    the evaluation or ``script`` has uncommitted changes); ``code_source`` says where a
    ``code`` given here comes from when it is not the checkout's own. ``result`` itself is
    not changed; the written value is returned."""
    kept = portable(result)
    if result_commit(kept) is None:
        kept["code"] = code if code is not None else code_version(script)
        if code_source is not None:
            kept["code_source"] = code_source
    atomic_write_json(path, kept, indent=indent)
    return kept


def publish(result: dict[str, Any], json_out: str | None, script: str,
            table: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    """The end of a measuring bench: its result JSON written where ``json_out`` asks
    (:func:`write_result`), then printed without its ``per_question`` rows (kept in the file),
    then its short ``table``. Returns the result as written."""
    if json_out:
        result = write_result(json_out, result, script)
    print(json.dumps({k: v for k, v in result.items() if k != "per_question"}, indent=1))
    print(table(result))
    return result


def rollout_limits(mappo_config: str) -> list[str]:
    """``--max_new_tokens_{qr,selector,generator} N`` from a MAPPO config's
    ``mappo_max_new_tokens_*``: evaluations and synthesised data generate with the limits the
    agents have in RL."""
    import yaml

    config = yaml.safe_load((ROOT / mappo_config).read_text())
    return [arg for agent in ("qr", "selector", "generator") for arg in
            (f"--max_new_tokens_{agent}", str(config[f"mappo_max_new_tokens_{agent}"]))]


class AttemptClock:
    """Wall time of a stage over all its attempts, kept in ``<folder>/attempt.json``.

    A stage of hours is often stopped before its end (a session's end, an out-of-memory kill)
    and resumed from its checkpoint by a later invocation; its time is the sum of its attempts,
    not the last one's. The clock writes its attempt's seconds every ``heartbeat_s`` seconds
    from a thread, so an attempt killed at once (SIGKILL) is still counted to within that, and
    a later attempt adds its own; ``finish`` removes the file once the stage's result is kept.
    """

    def __init__(self, folder: Path, heartbeat_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = folder / ATTEMPT
        self.heartbeat_s, self.clock = heartbeat_s, clock
        kept = load_json_or_exit(self.path, "an attempt record", {
            "attempts": int, "seconds": (int, float)}) if self.path.is_file() else {}
        self.earlier = kept.get("earlier_seconds", 0.0) + kept.get("seconds", 0.0)
        self.attempts = kept.get("attempts", 0) + 1
        self.started = 0.0
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    @property
    def seconds(self) -> float:
        """This attempt's seconds so far."""
        return self.clock() - self.started

    @property
    def total(self) -> float:
        """Every attempt's seconds, this one's so far included."""
        return self.earlier + self.seconds

    def _write(self) -> None:
        atomic_write_json(self.path, {"attempts": self.attempts, "earlier_seconds":
                                      round(self.earlier, 1), "seconds": round(self.seconds, 1)})

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self._write()

    def __enter__(self) -> AttemptClock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.started = self.clock()
        self._write()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)
        self._beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        self._write()

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)


def stage(work: Path, name: str, produce: Callable[[], dict[str, Any]], script: str
          ) -> dict[str, Any]:
    """Run ``produce()`` once: its result, with the seconds it took (every attempt's, see
    :class:`AttemptClock`), its number of attempts and the code version, is kept in
    ``<work>/<name>/result.json`` and read back by every later call."""
    path = work / name / RESULT
    if path.is_file():
        return load_json_or_exit(path, f"the result of the finished stage {name} (remove it "
                                       f"to run the stage again)")
    with AttemptClock(path.parent) as clock:
        result = produce()
    result["seconds"] = round(clock.total, 1)
    result["attempts"] = clock.attempts
    result["code"] = code_version(script)
    atomic_write_json(path, result)
    clock.finish()
    return result


def restore_archived_stages(work: Path, archive: Path) -> list[str]:
    """Copy each stage result kept in ``archive`` into ``work`` where ``work`` lacks it; the
    stages restored, by name.

    ``archive`` is a folder committed beside the bench JSON: a bench spanning sessions resumes
    from it on a fresh checkout (where ``work``, under the ignored ``saves/``, is gone) instead
    of repeating hours of CPU work."""
    restored = []
    for kept in sorted(archive.glob(f"*/{RESULT}")):
        path = work / kept.parent.name / RESULT
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(kept, path)
            restored.append(kept.parent.name)
    return restored


def archive_stages(work: Path, archive: Path, script: str = "bench/bench_runs.py") -> None:
    """Copy every finished stage's result of ``work`` into ``archive`` (see
    :func:`restore_archived_stages`), through :func:`write_result`: the archive is committed,
    so its paths become machine-free (a stage's ``code`` is already in it; ``script`` is the
    bench, for a stage result that lacks one)."""
    for result in sorted(work.glob(f"*/{RESULT}")):
        kept = archive / result.parent.name / RESULT
        kept.parent.mkdir(parents=True, exist_ok=True)
        write_result(kept, json.loads(result.read_text()), script)


def training_tail(output: Path, keep: Callable[[str], bool], last: int = 3) -> dict[str, float]:
    """Mean over the last ``last`` RL steps of the logged keys ``keep`` accepts.

    Read from ``trainer_state.json`` (every key the trainer logged per step); the
    ``trainer_log.jsonl`` beside it is the web UI's progress log and holds only the loss and
    the reward."""
    state = output / "trainer_state.json"
    if not state.is_file():
        return {}
    rows = [entry for entry in json.loads(state.read_text())["log_history"]
            if "reward" in entry][-last:]
    keys = sorted({k for r in rows for k in r if keep(k)})
    return {k: statistics.fmean(r[k] for r in rows if k in r) for k in keys}


def training_series(output: Path, keys: tuple[str, ...]) -> dict[str, list[float | None]]:
    """Each of ``keys`` at every logged RL step (None where a step did not log it; keys no step
    logged are left out), from ``trainer_state.json`` as :func:`training_tail`: a table row
    reports how its training went step by step, e.g. the share of GRPO groups with no reward
    variance (``grpo/zero_variance_fraction``), which gives no gradient."""
    state = output / "trainer_state.json"
    if not state.is_file():
        return {}
    rows = [entry for entry in json.loads(state.read_text())["log_history"] if "reward" in entry]
    return {k: [r.get(k) for r in rows] for k in keys if any(k in r for r in rows)}


def bench_parser(doc: str, work_dir: str, seeds: tuple[int, ...] = (1, 2, 3)
                 ) -> argparse.ArgumentParser:
    """The options every training bench has: seeds, the retrieval server, the work folder,
    the JSON out, and key=value overrides of its RL config."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(seeds))
    parser.add_argument("--retriever-url", dest="retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--work-dir", dest="work_dir", default=work_dir)
    parser.add_argument("--json-out", dest="json_out", help="also write the JSON here")
    parser.add_argument("overrides", nargs="*", help="extra key=value for the RL config")
    return parser


def add_variant_option(parser: argparse.ArgumentParser, example: str) -> None:
    """``--variant NAME``: a name for the RL overrides given, ending every RL run's folder name
    (``example``), so runs with other overrides never resume or reuse each other in one work
    dir while the warm starts are shared."""
    parser.add_argument("--variant", default="",
                        help=f"a name for the RL overrides given, appended to the RL runs' "
                             f"folders ({example}), so that runs with other overrides never "
                             f"resume or reuse each other in one work dir")


def variant_suffix(variant: str) -> str:
    """What a ``--variant`` name adds to an RL run's name: ``-NAME``, or nothing."""
    return f"-{variant}" if variant else ""


def add_precision_option(parser: argparse.ArgumentParser, default: str = "fp32") -> None:
    """``--precision`` of a bench's evaluations (:mod:`mmoa.precision`'s choices); the demo
    configs train in fp32, so bf16 also needs ``bf16=true use_cpu=true`` for the trainings."""
    parser.add_argument("--precision", default=default, choices=PRECISION_CHOICES,
                        help=f"of the evaluations (default {default}; the demo configs train "
                             "in fp32: with bf16 give bf16=true use_cpu=true to the trainings)")


def add_sft_eval_options(parser: argparse.ArgumentParser, world_dir: str = "data/demo"
                         ) -> None:
    """The options of a bench that trains its own warm starts and evaluates on a world's test
    split: the world, how many test questions, the evaluation's precision and overrides of the
    SFT config."""
    parser.add_argument("--world-dir", dest="world_dir", default=world_dir)
    parser.add_argument("--max-eval", dest="max_eval", type=int,
                        help="evaluate on the first N test questions only")
    add_precision_option(parser)
    parser.add_argument("--sft-override", dest="sft_overrides", action="append", default=[],
                        help="key=value for the warm-start config (repeatable)")


def print_result(result: dict[str, Any], table: str) -> None:
    """The bench's output: one JSON object, then its table."""
    print(json.dumps(result, indent=2))
    print(table)


def report_result(result: dict[str, Any], table: str, json_out: str | Path | None,
                  script: str) -> None:
    """A one-shot bench's ending: its output (:func:`print_result`), then ``result`` written to
    ``--json-out`` when one is given (:func:`write_result`, stamped with ``script``'s code)."""
    print_result(result, table)
    if json_out:
        write_result(json_out, result, script)
