"""The console without walls of numbers: LLaMA-Factory's tokenized training example
(``input_ids`` / ``label_ids``, two lines of about 20,000 characters in the demo) goes to the
run's library.log, not to the console (issue 45, item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SFT_YAML = ROOT / "LLaMA-Factory" / "examples" / "demo" / "tiny_full_sft.yaml"
#: The longest console line a person can still read past; a tokenized example is far longer.
MAX_LINE = 2000


def _quiet_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MMOA_VERBOSE", "LLAMABOARD_ENABLED", "RANK")}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT / "LLaMA-Factory" / "src"),
                                           env.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    return env


def test_the_loaders_print_goes_to_the_log_and_comes_back(tmp_path: Path) -> None:
    """In process: while a block is routed, what the data loader prints is a library.log
    record; after it, the module's own ``print`` (the builtin) is back."""
    probe = (
        "import sys\n"
        "from mmoa.console import routed_library_logs\n"
        "import llamafactory.data.loader as loader\n"
        "import llamafactory.data.processor.supervised as supervised\n"
        "with routed_library_logs(sys.argv[1]):\n"
        "    loader.print('training example:')\n"
        "    supervised.print('input_ids:\\n{}'.format(list(range(3000))))\n"
        "    supervised.print('to stderr', file=sys.stderr)\n"
        "print('restored', 'print' not in vars(loader), 'print' not in vars(supervised))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "run")], cwd=ROOT,
                            env=_quiet_env(), capture_output=True, text=True, timeout=300,
                            check=True)
    assert result.stdout.strip() == "restored True True"
    assert result.stderr.strip().endswith("to stderr"), "other files are left alone"
    log = (tmp_path / "run" / "library.log").read_text()
    assert "training example:" in log and "input_ids:\n[0, 1, 2" in log


def _long_alpaca(world_dir: Path, data: Path) -> None:
    """A few Alpaca records whose instructions are many passages long, so that the tokenized
    example (input_ids) is thousands of characters: the line this test must not see."""
    passages = [json.loads(line) for line in (world_dir / "corpus.jsonl").read_text().splitlines()]
    questions = [json.loads(line) for line in (world_dir / "train.jsonl").read_text().splitlines()]
    rows = []
    for i, question in enumerate(questions[:8]):
        context = " ".join(p["text"] for p in passages[i * 12:(i + 1) * 12])
        rows.append({"instruction": f"{context}\n{question['question']}", "input": "",
                     "output": question["answers"][0]})
    (data / "long_qa.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps({"long_qa": {"file_name": "long_qa.json"}}))


@pytest.mark.slow
def test_a_tiny_sft_run_prints_no_wall_of_numbers(tiny_model_dir: Path, tiny_world_dir: Path,
                                                  tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _long_alpaca(tiny_world_dir, data)
    out = tmp_path / "sft"
    overrides = [f"model_name_or_path={tiny_model_dir}", "dataset=long_qa",
                 f"dataset_dir={data}", f"output_dir={out}", "max_steps=1", "logging_steps=1",
                 "per_device_train_batch_size=2", "cutoff_len=512",
                 "preprocessing_num_workers=1", "plot_loss=false", "report_to=none"]
    result = subprocess.run([sys.executable, "-m", "mmoa.cli", "train", str(SFT_YAML),
                             *overrides], cwd=tmp_path, env=_quiet_env(), capture_output=True,
                            text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    console = result.stdout.splitlines() + result.stderr.splitlines()
    longest = max(console, key=len, default="")
    assert len(longest) <= MAX_LINE, f"a {len(longest)}-character console line: {longest[:200]}"
    log = (out / "library.log").read_text()
    assert "input_ids:" in log and "label_ids:" in log
    assert max(map(len, log.splitlines())) > MAX_LINE, "the example is long: the test can fail"
