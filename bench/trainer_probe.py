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
  accepted (the run trained).

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
    server = Server(work / "index", work / "server.log").start()
    fault = Server(work / "index", work / "fault_server.log", token=TOKEN).start()
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
    errors = run.error_lines()
    if run.returncode == 0:
        outcome = "wrongly accepted"
    elif run.tracebacks:
        outcome = "traceback"
    elif 1 <= len(errors) <= 2:
        outcome = "clean error"
    else:
        outcome = f"error of {len(errors)} lines"
    return {"config": name, "outcome": outcome, "returncode": run.returncode,
            "seconds": run.seconds, "tracebacks": run.tracebacks, "error_lines": len(errors),
            "error": " / ".join(errors[:2])[:400] if errors else
            (run.stderr.strip().splitlines() or [""])[-1][:400]}


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


GROUPS = ("corrupt", "signals", "server", "config")


def run_probe(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    groups = set(args.only.split(",")) if args.only else set(GROUPS)
    t0 = time.monotonic()
    with contextlib.redirect_stdout(sys.stderr):  # library chatter; stdout is the JSON's
        world = build_world(work)
    results: dict[str, Any] = {"steps": STEPS, "setup_seconds": round(time.monotonic() - t0, 1)}
    try:
        results["reference"] = reference_run(world)
        if results["reference"]["returncode"] != 0:
            raise RuntimeError("the uninterrupted run failed:\n"
                               + results["reference"]["stderr_tail"])
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
    print(json.dumps(results, indent=2))
    print_table(results["summary"])
    if args.json_out:
        from mmoa.fileio import atomic_write_json

        atomic_write_json(args.json_out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
