"""``bench/rollout_table.py``: a run's logged rollout statistics as block means, against
hand-computed figures, from both log files a run writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench_fixtures import import_bench

#: Five logged steps of a three-agent run (as ``trainer_state.json`` keeps them; a loss-only
#: entry without agent keys at step 2, a non-finite KL at step 3).
STEPS = [
    {"step": 1, "reward": 0.2, "answer_f1": 0.1, "num_selected": 2.0, "kl/selector": 0.0,
     "selected_gold_recall": 0.5, "grpo/zero_variance_fraction": 0.25},
    {"step": 2, "reward": 0.4, "answer_f1": 0.3, "num_selected": 1.5, "kl/selector": 0.1,
     "selected_gold_recall": 0.7},
    {"step": 3, "reward": 0.6, "answer_f1": 0.5, "num_selected": 3.0, "kl/selector": float("nan"),
     "selected_gold_recall": 0.9, "grpo/zero_variance_fraction": 0.75},
    {"step": 4, "reward": 0.8, "answer_f1": 0.7, "num_selected": 2.5, "kl/selector": -0.3},
    {"step": 5, "reward": 1.0, "answer_f1": 0.9, "num_selected": 2.0, "kl/selector": 0.2},
]


@pytest.fixture(scope="module")
def table():
    return import_bench("rollout_table")


def write_state(folder: Path, steps: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    history = [*steps, {"train_runtime": 12.0}]  # the end-of-run entry has no step
    (folder / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    return folder


def test_block_means_and_the_selectors_range_are_the_hand_computed_ones(table, tmp_path) -> None:
    rows = table.block_rows(table.read_log(write_state(tmp_path / "run", STEPS)), every=2)
    assert [(r["first"], r["last"], r["steps"]) for r in rows] == [(1, 2, 2), (3, 4, 2), (5, 6, 1)]
    first, second, third = rows
    assert first["reward"] == pytest.approx(0.3)
    assert first["num_selected"] == pytest.approx(1.75)
    assert (first["num_selected:min"], first["num_selected:max"]) == (1.5, 2.0)
    assert first["grpo/zero_variance_fraction"] == pytest.approx(0.25)  # only step 1 logged it
    # the non-finite KL of step 3 is left out of its block's mean, not averaged in
    assert second["kl/selector"] == pytest.approx(-0.3)
    assert second["selected_gold_recall"] == pytest.approx(0.9)
    assert "selected_gold_recall" not in third
    assert third["answer_f1"] == pytest.approx(0.9)


def test_the_web_uis_log_of_a_resumed_run_counts_each_step_once(table, tmp_path) -> None:
    """``trainer_log.jsonl`` names steps ``current_steps``; a resumed run may write a step
    again: the later line wins."""
    lines = [{"current_steps": 1, "reward": 0.2}, {"current_steps": 2, "reward": 0.4},
             {"current_steps": 2, "reward": 0.8}, {"current_steps": 3, "reward": 0.6}]
    log = tmp_path / "trainer_log.jsonl"
    log.write_text("".join(json.dumps(line) + "\n" for line in lines))
    entries = table.read_log(tmp_path)
    assert [e["step"] for e in entries] == [1, 2, 3]
    (row,) = table.block_rows(entries, every=4)
    assert row["reward"] == pytest.approx((0.2 + 0.8 + 0.6) / 3)


def test_the_markdown_shows_only_logged_columns(table, tmp_path) -> None:
    rows = table.block_rows(table.read_log(write_state(tmp_path / "run", STEPS)), every=4)
    columns = table.logged_columns(rows)
    keys = [c.key for c in columns]
    assert "entropy/qr" not in keys and "num_selected" in keys
    text = table.markdown(rows, columns)
    lines = text.splitlines()
    assert lines[0].startswith("| steps | reward | answer F1 | Selector documents")
    # steps 1-4: documents (2 + 1.5 + 3 + 2.5) / 4 = 2.25, range 1.50-3.00; recall 70 %
    assert lines[2].startswith("| 1-4 | 0.500 | 0.400 | 2.25 (1.50-3.00) | 70 % |")
    assert lines[3].startswith("| 5 | 1.000 | 0.900 | 2.00 (2.00-2.00) |")


def test_bad_input_is_one_line(table, tmp_path, capsys) -> None:
    with pytest.raises(SystemExit, match=r"rollout_table: no trainer_state\.json"):
        table.main([str(tmp_path / "missing")])
    with pytest.raises(SystemExit, match="--every must be at least 1"):
        table.main([str(write_state(tmp_path / "run", STEPS)), "--every", "0"])


def test_the_command_writes_its_json(table, tmp_path, capsys) -> None:
    out = tmp_path / "rollouts.json"
    table.main([str(write_state(tmp_path / "run", STEPS)), "--every", "5",
                "--json-out", str(out)])
    result = json.loads(out.read_text())
    assert result["logged_steps"] == 5 and len(result["blocks"]) == 1
    assert result["blocks"][0]["reward"] == pytest.approx(0.6)
    assert "code" in result
    assert "| 1-5 |" in capsys.readouterr().out
