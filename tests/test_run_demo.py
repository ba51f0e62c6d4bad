"""The whole demo end to end, shortened: ``MODEL=tiny DEMO_SCALE=small bash run_demo.sh`` in a temp
folder.

Every stage of the real demo runs (set-up, world, tiny model, pre-training, index, server, SFT
data, warm start, MAPPO data, MAPPO, five evaluations, table and plots), on a smaller world and
with a few steps per training, so that CI checks the chain itself: the files each stage hands to
the next, the server started in the background and stopped on exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.retrieval_fixtures import free_port

ROOT = Path(__file__).resolve().parents[1]
EVALS = ("untrained", "base", "sft", "mappo", "rag_sft")


def _server_is_down(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_shortened_demo_runs_end_to_end(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "MODEL": "tiny", "DEMO_SCALE": "small", "PORT": str(port), "PRECISION": "fp32",
        "DATA_DIR": str(tmp_path / "data"), "MODEL_DIR": str(tmp_path / "models/tiny"),
        "SAVES": str(tmp_path / "saves"), "OUT": str(tmp_path / "out"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }
    result = subprocess.run(["bash", str(ROOT / "run_demo.sh")], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=880, check=False)
    assert result.returncode == 0, (result.stdout[-4000:], result.stderr[-4000:])
    out = tmp_path / "out"
    for name in EVALS:
        metrics = json.loads((out / f"eval_{name}" / "metrics.json").read_text())
        assert metrics["num_questions"] == 20
        assert 0.0 <= metrics["f1"] <= 1.0
    table = (out / "results.txt").read_text()
    # rows named as the README names them, not by folder
    for row in ("untrained model", "pre-trained base", "warm start (SFT)", "MAPPO",
                "RAG baseline (warm start)"):
        assert row in table, row
    assert "eval_" not in table
    # headed as what it is, with F1's standard error and MAPPO's paired gains
    assert table.startswith("SMOKE TEST (DEMO_SCALE=small)")
    assert "+-F1" in table and "paired F1 gain of MAPPO" in table
    assert "over warm start (SFT): " in table and "over RAG baseline (warm start): " in table
    # the libraries' INFO lines went to the runs' library.log, not to the console
    assert "Model config" not in result.stdout + result.stderr
    assert "Model config" in (tmp_path / "saves/full/sft" / "library.log").read_text()
    assert (out / "eval_mappo" / "library.log").is_file()
    for plot in ("mappo_training_reward.png", "mappo_training_loss.png",
                 "sft_training_loss.png", "pt_training_loss.png"):
        assert (out / plot).stat().st_size > 0, plot
    log = (tmp_path / "saves/full/mappo/trainer_log.jsonl").read_text().splitlines()
    assert len(log) == 2 and all("reward" in json.loads(line) for line in log)
    # Every stage printed its header, and the background server is gone.
    assert all(f"== [{i}/11]" in result.stdout for i in range(1, 12))
    assert "stopping the retrieval server" in result.stdout
    assert _server_is_down(port)
