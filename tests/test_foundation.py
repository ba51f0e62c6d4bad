"""Foundation: pinned environment, layout, offline switches and the CLI entry point."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import mmoa
from mmoa.env import OFFLINE_ENV, configure_offline

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = [
    "LLaMA-Factory", "LLaMA-Factory/examples", "data_builders", "evaluate", "data", "models",
    "bench", "tests",
]
PACKAGES = ["agents", "retrieval", "data", "train/mappo", "webui"]


def _requirement_pins(requirements: list[str]) -> dict[str, str]:
    pins = {}
    for req in requirements:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", req.strip())
        assert match, f"dependency {req!r} is not pinned with =="
        pins[match.group(1).lower().replace("_", "-")] = match.group(2)
    return pins


def test_every_dependency_is_pinned_and_agrees_with_the_lock_file() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _requirement_pins(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        pins.update(_requirement_pins(extra))
    lock = _requirement_pins(
        [line for line in (ROOT / "requirements.lock").read_text().splitlines()
         if line.strip() and not line.startswith("#")]
    )
    for name in ("torch", "torchvision", "torchaudio", "llamafactory", "transformers"):
        assert name in pins
    assert pins["torch"] == "2.11.0" and pins["llamafactory"] == "0.9.5"
    for name, version in pins.items():
        if name in lock:  # optional GPU/DeepSpeed extras are not in the CPU lock
            assert lock[name] == version, f"{name}: pyproject {version} != lock {lock[name]}"
    missing = {n for n in _requirement_pins(project["dependencies"]) if n not in lock}
    assert not missing, f"runtime dependencies missing from requirements.lock: {missing}"


def test_layout_folders_exist_with_a_readme() -> None:
    for folder in LAYOUT:
        assert (ROOT / folder / "README.md").is_file(), folder
    for package in PACKAGES:
        assert (ROOT / "LLaMA-Factory/src/mmoa" / package / "__init__.py").is_file(), package


def test_configure_offline_sets_only_missing_variables() -> None:
    env = {"HF_HUB_OFFLINE": "0"}
    applied = configure_offline(env)
    assert env["HF_HUB_OFFLINE"] == "0", "a user's explicit choice must win"
    assert "HF_HUB_OFFLINE" not in applied
    assert env["GRADIO_ANALYTICS_ENABLED"] == "False"
    assert set(env) == set(OFFLINE_ENV)


def test_shell_entry_points_switch_off_the_hub() -> None:
    for script in ("run_demo.sh", "run_tests.sh"):
        text = (ROOT / script).read_text()
        assert "HF_HUB_OFFLINE=1" in text and "GRADIO_ANALYTICS_ENABLED=False" in text, script
    assert "run_tests.sh" in (ROOT / ".ci/run").read_text()


def test_importing_mmoa_switches_off_the_hub_in_a_clean_process() -> None:
    code = (
        "import os, mmoa; "
        "print(os.environ['HF_HUB_OFFLINE'], os.environ['GRADIO_ANALYTICS_ENABLED'])"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "LLaMA-Factory/src")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout.split() == ["1", "False"]


def test_cli_version_and_help() -> None:
    run = [sys.executable, "-m", "mmoa.cli"]
    version = subprocess.run([*run, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"mmoa {mmoa.__version__}"
    help_text = subprocess.run([*run, "--help"], capture_output=True, text=True, check=True)
    assert "usage: mmoa-cli" in help_text.stdout and "version" in help_text.stdout
