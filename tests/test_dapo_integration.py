"""DAPO through the real trainer (issue #71): the tiny model against the live demo server, with
dynamic sampling's refill, the overlong shaping, and truncated importance sampling on the
rollout's recorded log-probs. The untrained tiny model answers nothing right, so the answer
reward is flat in every group and the refill must roll out more questions."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from mmoa.train.mappo.workflow import run_mappo
from tests.mappo_fixtures import tiny_mappo_config


def test_a_dapo_step_refills_shapes_and_weights(tiny_model_dir: Path,
                                                 tiny_mappo_data_dir: Path,
                                                 tiny_server_url: str, tmp_path: Path) -> None:
    out = tmp_path / "dapo"
    run_mappo(tiny_mappo_config(
        tiny_model_dir, tiny_mappo_data_dir, tiny_server_url, out, max_steps=1, save_steps=0,
        mappo_algorithm="dapo", mappo_group_size=2, mappo_questions_per_rollout=2,
        mappo_rollout_batch_size=4, mappo_dapo_max_rounds=1, mappo_overlong_buffer=0.5,
        mappo_tis_cap=2.0))
    history: list[dict[str, Any]] = json.loads(
        (out / "trainer_state.json").read_text())["log_history"]
    entry = next(h for h in history if "dapo/rounds" in h)
    # the answer reward is 0 everywhere: a group has a signal only through the length reward
    assert entry["answer_f1"] == 0.0
    rounds, sampled, kept = (entry[f"dapo/{k}"] for k in ("rounds", "groups_sampled",
                                                          "groups_kept"))
    assert rounds in (0.0, 1.0) and kept <= 2
    # a refill rolls out the step's 2 questions when none had a signal, and
    # ceil(1 missing / share 1/2 kept) = 2 when one had
    assert sampled == 2 + 2 * rounds and entry["grpo/groups"] == sampled
    assert rounds == 0.0 or 0 <= entry["dapo/groups_dropped"] <= 1
    assert -1.0 <= entry["overlong/reward"] <= 0.0
    if "tis/weight_mean" in entry:  # logged when the step updated
        assert 0 < entry["tis/weight_mean"] <= 2.0 and math.isfinite(entry["tis/weight_min"])
        assert "behaviour_ratio/mean" in entry
