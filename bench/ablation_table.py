"""The paper's ablation (its Figure 2, "w/o QR / S / G"; Table 3 in the issue that asked for it)
from learning-signal JSONs: joint MAPPO against MAPPO with one agent left out of optimisation,
each over its seeds, all from one warm start on one question set.

Each configuration is one ``bench/learning_signal.py`` JSON (its ``mappo`` seeds were trained
with that configuration's ``--agents``). The table gives, per configuration, each seed's F1,
the mean gain over the warm start (+- its standard error over seeds), the pooled gain (each
question's gain averaged over the seeds first, +- its standard error over questions) and the
pooled difference to the reference configuration (the first one, ``joint``) on the same
questions, with the agents' statistics averaged over the seeds. The JSONs must share the
warm start (weights digest) and the question set, or their gains would not be comparable::

    python bench/ablation_table.py \\
        joint=bench/results/learning_signal_heldout_demo_config.json \\
        no_qr=bench/results/learning_signal_heldout_ablation_no_qr.json \\
        no_selector=bench/results/learning_signal_heldout_ablation_no_selector.json \\
        no_generator=bench/results/learning_signal_heldout_ablation_no_generator.json \\
        --json-out bench/results/ablation_heldout.json

Prints the JSON and a markdown table; nothing is trained or evaluated.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from bench_runs import write_result
from learning_signal import AGENTS, mean_over_seeds, pooled_gain

#: The agents' statistics the table averages over a configuration's seeds.
STATISTICS = ("candidate_support_recall", "mean_subquestions", "mean_selected",
              "selector_support_recall")


def load_configuration(label: str, path: Path) -> dict[str, Any]:
    """One configuration: its warm start, its agents and the seeds paired with that warm
    start (a seed carried over from another warm start is left out, and said)."""
    result = json.loads(path.read_text())
    warm = result["warm_start"]
    if "per_question_f1" not in warm:
        raise SystemExit(f"{path}: its warm start has no per-question F1 to pair with")
    seeds, skipped = {}, []
    for name, run in sorted(result["mappo"].items()):
        if (run["warm_start"].get("weights_sha256") == warm.get("weights_sha256")
                and "per_question_f1" in run):
            seeds[name] = run
        else:
            skipped.append(name)
    if skipped:
        print(f"[{label}] seeds {', '.join(skipped)} left out: trained from another warm start "
              "or without per-question F1", file=sys.stderr)
    if not seeds:
        raise SystemExit(f"{path}: no seed paired with its warm start")
    config = result.get("config", {})
    return {"label": label, "path": str(path), "warm_start": warm, "seeds": seeds,
            "agents": config.get("agents", ",".join(AGENTS)),
            "eval_file": config.get("eval_file"), "max_eval": config.get("max_eval")}


def check_comparable(configurations: list[dict[str, Any]]) -> None:
    """One warm start and one question set for every configuration."""
    first = configurations[0]
    for other in configurations[1:]:
        for key in ("eval_file", "max_eval"):
            if other[key] != first[key]:
                raise SystemExit(f"{other['label']} was evaluated with {key}={other[key]!r}, "
                                 f"{first['label']} with {first[key]!r}: not comparable")
        if other["warm_start"].get("weights_sha256") != first["warm_start"].get("weights_sha256"):
            raise SystemExit(f"{other['label']} and {first['label']} start from different warm "
                             "starts (weights digests differ): their gains are not comparable")


def summarise(configuration: dict[str, Any], reference: dict[str, float] | None
              ) -> dict[str, Any]:
    """One row: per-seed F1 and gains, their mean and spread, the pooled gains."""
    warm = configuration["warm_start"]
    runs = list(configuration["seeds"].values())
    per_question = [run["per_question_f1"] for run in runs]
    gains = [run["paired"]["gain"] for run in runs]
    row: dict[str, Any] = {
        "label": configuration["label"], "agents": configuration["agents"],
        "seeds": list(configuration["seeds"]),
        "f1_per_seed": [run["test"]["f1"] for run in runs],
        "f1_mean": statistics.fmean(run["test"]["f1"] for run in runs),
        "gain_per_seed": gains,
        "gain_mean": statistics.fmean(gains),
        "gain_se_over_seeds": statistics.stdev(gains) / math.sqrt(len(gains))
        if len(gains) > 1 else None,
        "seeds_above_warm_start": sum(g > 0 for g in gains),
        "pooled_gain": pooled_gain(warm["per_question_f1"], per_question),
        "pooled_vs_reference": None if reference is None else pooled_gain(reference,
                                                                          per_question),
    }
    for key in STATISTICS:
        values = [run["test"].get(key) for run in runs]
        row[key] = statistics.fmean(values) if all(v is not None for v in values) else None
    return row


def build(configurations: list[dict[str, Any]]) -> dict[str, Any]:
    check_comparable(configurations)
    reference = mean_over_seeds([run["per_question_f1"]
                                 for run in configurations[0]["seeds"].values()])
    rows = [summarise(configurations[0], None)]
    rows += [summarise(c, reference) for c in configurations[1:]]
    warm = configurations[0]["warm_start"]
    return {"reference": configurations[0]["label"],
            "warm_start": {"model": warm["model"], "weights_sha256": warm.get("weights_sha256"),
                           **{k: warm["test"].get(k) for k in ("f1", "f1_se", *STATISTICS)}},
            "eval_file": configurations[0]["eval_file"],
            "max_eval": configurations[0]["max_eval"],
            "sources": {c["label"]: c["path"] for c in configurations},
            "rows": rows}


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_markdown(table: dict[str, Any]) -> str:
    warm = table["warm_start"]
    lines = ["| configuration | agents optimised | F1 per seed | mean F1 | gain over warm start "
             "(mean +- SE over seeds) | pooled gain +- SE | vs "
             f"{table['reference']} (pooled) | cand rec | sub-q | kept | Selector recall |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
             f"| warm start | - | - | {_pct(warm['f1'])} +- {_pct(warm['f1_se'])} | - | - | - | "
             f"{_pct(warm['candidate_support_recall'])} | {_num(warm['mean_subquestions'])} | "
             f"{_num(warm['mean_selected'])} | {_pct(warm['selector_support_recall'])} |"]
    for row in table["rows"]:
        spread = row["gain_se_over_seeds"]
        gain = _pct(row["gain_mean"], signed=True) + ("" if spread is None
                                                      else f" +- {_pct(spread)}")
        pooled = row["pooled_gain"]
        versus = row["pooled_vs_reference"]
        lines.append(
            f"| {row['label']} | {row['agents'].replace(',', ', ')} | "
            f"{' / '.join(_pct(f) for f in row['f1_per_seed'])} | {_pct(row['f1_mean'])} | "
            f"{gain} ({row['seeds_above_warm_start']} of {len(row['seeds'])} above) | "
            f"{_pct(pooled['gain'], signed=True)} +- {_pct(pooled['gain_se'])} | "
            + ("-" if versus is None else
               f"{_pct(versus['gain'], signed=True)} +- {_pct(versus['gain_se'])}")
            + f" | {_pct(row['candidate_support_recall'])} | {_num(row['mean_subquestions'])} | "
            f"{_num(row['mean_selected'])} | {_pct(row['selector_support_recall'])} |")
    return "\n".join(lines)


def parse_source(text: str) -> tuple[str, Path]:
    label, sep, path = text.partition("=")
    if not sep or not label or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=JSON")
    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{path}: no such file")
    return label, Path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="+", type=parse_source, metavar="LABEL=JSON",
                        help="the configurations, the reference (joint) first")
    parser.add_argument("--json-out", help="also write the JSON here")
    args = parser.parse_args()
    table = build([load_configuration(label, path) for label, path in args.sources])
    if args.json_out:
        write_result(args.json_out, table, "bench/ablation_table.py")
    print(json.dumps(table, indent=2))
    print()
    print(format_markdown(table))


if __name__ == "__main__":
    main()
