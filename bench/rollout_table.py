"""A MAPPO / GRPO run's rollout statistics as a table of step blocks: what each agent did while
it trained, read from the run's log.

Why: the agents' own statistics (documents the Selector keeps, their gold precision and recall,
the Query Rewriter's sub-questions and candidate recall, each agent's entropy and KL, the share
of GRPO groups without reward variance) say whether an agent learnt a per-question choice or
kept a constant, which the evaluation's F1 alone does not. One step is 16 questions, so single
steps are noisy; means over blocks of ``--every`` steps are what the docs' tables show. A
block's range (min-max of its steps) is given for the Selector's documents, where a constant
shows as a range of zero width.

It reads ``trainer_state.json``'s ``log_history`` (every logged key; the steps under ``step``)
or, for a run still going, ``trainer_log.jsonl`` (the web UI's log: the plotted keys; steps under
``current_steps``), from a run's output folder or the file itself::

    python bench/rollout_table.py saves/run/mappo --every 4 --json-out rollouts.json

Prints one JSON object and a markdown table; ``--json-out`` writes the JSON too. A column whose
key the run never logged is left out.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    #: Shown as a percentage (a share in [0, 1]).
    percent: bool = False
    #: The block's min-max is shown beside its mean.
    with_range: bool = False


COLUMNS: tuple[Column, ...] = (
    Column("reward", "reward"),
    Column("answer_f1", "answer F1"),
    Column("num_selected", "Selector documents", with_range=True),
    Column("selected_gold_precision", "gold precision", percent=True),
    Column("selected_gold_recall", "gold recall", percent=True),
    Column("selection_reward/selector", "selection reward"),
    Column("candidate_gold_recall", "candidate recall", percent=True),
    Column("num_subquestions", "QR sub-questions"),
    Column("retrieval_reward/qr", "retrieval reward"),
    Column("entropy/qr", "QR entropy"),
    Column("entropy/selector", "Selector entropy"),
    Column("kl/qr", "QR KL"),
    Column("kl/selector", "Selector KL"),
    Column("cf_beat/selector", "Selector beats its default", percent=True),
    Column("cf_beat/qr", "QR beats its default", percent=True),
    Column("grpo/zero_variance_fraction", "zero-variance groups", percent=True),
)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The run's log entries as ``{"step": n, key: value, ...}``, one per logged step, in step
    order: ``trainer_state.json`` where the folder has one, else ``trainer_log.jsonl``."""
    path = Path(path)
    if path.is_dir():
        state = path / "trainer_state.json"
        path = state if state.exists() else path / "trainer_log.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"no trainer_state.json or trainer_log.jsonl at {path}")
    if path.suffix == ".jsonl":
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        entries = [{**line, "step": line["current_steps"]} for line in lines
                   if "current_steps" in line]
    else:
        entries = [entry for entry in json.loads(path.read_text()).get("log_history", [])
                   if "step" in entry]
    by_step: dict[int, dict[str, Any]] = {}
    for entry in entries:  # a resumed run may log a step twice: the later line wins
        by_step.setdefault(int(entry["step"]), {}).update(entry)
    return [by_step[step] for step in sorted(by_step)]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def block_rows(entries: Sequence[Mapping[str, Any]], every: int,
               columns: Sequence[Column] = COLUMNS) -> list[dict[str, Any]]:
    """One row per block of ``every`` consecutive steps (by step number: steps 1-4, 5-8, ...;
    the last block may be shorter): ``first``/``last`` step, ``steps`` logged in it, and per
    column the mean over the steps that logged a number for it (``min``/``max`` too where the
    column asks)."""
    if every < 1:
        raise ValueError(f"--every must be at least 1, got {every}")
    blocks: dict[int, list[Mapping[str, Any]]] = {}
    for entry in entries:
        blocks.setdefault((int(entry["step"]) - 1) // every, []).append(entry)
    rows = []
    for index in sorted(blocks):
        block = blocks[index]
        row: dict[str, Any] = {"first": index * every + 1, "last": index * every + every,
                               "steps": len(block)}
        for column in columns:
            values = [v for e in block if (v := _number(e.get(column.key))) is not None]
            if not values:
                continue
            row[column.key] = sum(values) / len(values)
            if column.with_range:
                row[f"{column.key}:min"], row[f"{column.key}:max"] = min(values), max(values)
        rows.append(row)
    return rows


def logged_columns(rows: Sequence[Mapping[str, Any]],
                   columns: Sequence[Column] = COLUMNS) -> list[Column]:
    """The columns at least one block has a value for."""
    return [c for c in columns if any(c.key in row for row in rows)]


def _cell(row: Mapping[str, Any], column: Column) -> str:
    if column.key not in row:
        return ""
    value = row[column.key]
    if column.percent:
        return f"{100 * value:.0f} %"
    text = f"{value:.2f}" if column.with_range else f"{value:.3f}"
    if column.with_range:
        text += f" ({row[column.key + ':min']:.2f}-{row[column.key + ':max']:.2f})"
    return text


def markdown(rows: Sequence[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """The blocks as a markdown table, one row per block."""
    head = "| steps | " + " | ".join(c.label for c in columns) + " |"
    rule = "| --- | " + " | ".join("---:" for _ in columns) + " |"
    lines = [head, rule]
    for row in rows:
        steps = f"{row['first']}-{row['last']}" if row["steps"] > 1 else str(row["first"])
        lines.append(f"| {steps} | " + " | ".join(_cell(row, c) for c in columns) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run's output folder, its trainer_state.json or its "
                                    "trainer_log.jsonl")
    parser.add_argument("--every", type=int, default=4, help="steps a block (default 4)")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    try:
        entries = read_log(args.run)
        rows = block_rows(entries, args.every)
    except (FileNotFoundError, ValueError, json.JSONDecodeError) as err:
        raise SystemExit(f"rollout_table: {err}") from None
    columns = logged_columns(rows)
    result = {"run": str(args.run), "every": args.every, "logged_steps": len(entries),
              "columns": {c.key: c.label for c in columns}, "blocks": rows}
    print(json.dumps(result, indent=1))
    print(markdown(rows, columns))
    if args.json_out:
        from bench_runs import write_result  # a sibling: bench/ is first on sys.path

        write_result(args.json_out, result, "bench/rollout_table.py")


if __name__ == "__main__":
    main()
