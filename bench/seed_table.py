"""The seeds of a side-by-side table's RL rows, pooled: do they beat every baseline?

One RL run is one draw: a gain over a baseline is only the method's when it holds over seeds.
``bench/side_by_side.py`` runs one seed per JSON (``--seed N --json-out ...``); run in one
``--work-dir`` with the same files and options, the seeds' tables share their warm start and
baseline rows (the same trainings and evaluations: their keys match) and differ in the RL rows.
This bench reads those JSONs and reports, for each row that depends on the seed present in them
(MAPPO, GRPO, the single-policy agents' RL, HARR):

- each seed's F1 +- SE and its paired F1 gain over each reference row: the row the RL row
  starts from (its ``vs``, the warm start) and the trivial baselines (``--baselines``, default
  ``rag`` K = 5 and K = 1 of the warm start: ``sft_rag sft_rag1``);
- how many seeds are above each reference (a positive paired gain);
- the pooled gain over each reference (``learning_signal.pooled_gain``: each question's F1
  averaged over the seeds first, so the question-to-question spread counts once) and over the
  strongest reference (the one with the highest F1), with the gain in standard errors.

The JSONs must hold the same table (model, files, split, questions) and the same reference
rows (equal keys), and name distinct seeds; otherwise the bench stops and says which differ.
A JSON where a row failed or is missing is left out of that row's seeds, and the table says
so. Prints JSON and a table; ``--json-out`` / ``--markdown`` write them::

    python bench/seed_table.py saves/d70/side_by_side_test_seed{1,2,3}.json \\
        --json-out bench/results/seeds_distractor_test.json \\
        --markdown bench/results/seeds_distractor_test.md
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench_runs import fail, load_json_or_exit, paired_gain, percent, portable, write_result
from learning_signal import pooled_gain
from side_by_side import METHODS, SEEDED

SCRIPT = "bench/seed_table.py"
WHAT = "a side_by_side result JSON"
REQUIRED = {"rows": dict, "table": dict, "config": dict}
#: The trivial baselines every RL row is compared with (``rag`` K = 5 and K = 1).
DEFAULT_BASELINES = ("sft_rag", "sft_rag1")


def seed_of(result: dict[str, Any], path: str) -> int:
    seed = result["config"].get("seed")
    if not isinstance(seed, int):
        fail(f"{path}: its config names no seed (a side_by_side.py JSON records --seed)")
    return seed


def check_same_table(results: dict[str, dict[str, Any]]) -> None:
    """One table: the same model, files, split and questions; distinct seeds."""
    first_path, first = next(iter(results.items()))
    for path, result in results.items():
        if result["table"] != first["table"]:
            differ = sorted(k for k in {*result["table"], *first["table"]}
                            if result["table"].get(k) != first["table"].get(k))
            fail(f"{path} holds another table than {first_path} (they differ in "
                 f"{', '.join(differ)}): the seeds of one table only")
    seeds: dict[int, str] = {}
    for path, result in results.items():
        seed = seed_of(result, path)
        if seed in seeds:
            fail(f"{path} and {seeds[seed]} both ran seed {seed}: one JSON per seed")
        seeds[seed] = path


def reference_row(results: dict[str, dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The finished row ``name`` the JSONs share (None where none has it); refused where two
    JSONs finished it with other settings (another key: another training or evaluation)."""
    found = [(path, r["rows"][name]) for path, r in results.items()
             if r["rows"].get(name, {}).get("status") == "ok"]
    for path, row in found[1:]:
        if row["key"] != found[0][1]["key"]:
            fail(f"the row {name!r} differs between {found[0][0]} and {path} (keys "
                 f"{found[0][1]['key']} and {row['key']}): the seeds must share their warm "
                 f"start and baselines (one --work-dir, the same options)")
    return found[0][1] if found else None


def seeded_rows(results: dict[str, dict[str, Any]]) -> list[str]:
    """The rows that differ by seed (``side_by_side.SEEDED``: the RL rows and HARR) that any
    of the JSONs ran, in the bench's row order."""
    return [name for name in METHODS if name in SEEDED
            and any(name in r["rows"] for r in results.values())]


def pool_method(results: dict[str, dict[str, Any]], name: str,
                baselines: list[str]) -> dict[str, Any]:
    """One RL row over its seeds: per seed F1 and paired gains, seeds above each reference,
    the pooled gains."""
    runs = {seed_of(r, p): r["rows"][name] for p, r in results.items()
            if r["rows"].get(name, {}).get("status") == "ok"}
    missing = sorted(seed_of(r, p) for p, r in results.items()
                     if r["rows"].get(name, {}).get("status") != "ok")
    vs = next((row.get("vs") for row in runs.values() if row.get("vs")), None)
    names = list(dict.fromkeys([*([vs] if vs else []), *baselines]))
    references = {n: row for n in names if (row := reference_row(results, n)) is not None}
    out: dict[str, Any] = {"method": name, "seeds_missing": missing,
                           "references": {n: {"label": r.get("label", n), "f1": r["f1"],
                                              "f1_se": r.get("f1_se")}
                                          for n, r in references.items()},
                           "seeds": {}, "above": {}, "pooled": {}}
    if not runs:
        return out
    label = next(iter(runs.values())).get("label", name)
    out["label"] = label
    for seed, row in sorted(runs.items()):
        out["seeds"][str(seed)] = {
            "f1": row["f1"], "f1_se": row.get("f1_se"), "em": row.get("em"),
            "paired": {n: paired_gain(ref["per_question_f1"], row["per_question_f1"])
                       for n, ref in references.items()}}
    per_question = [row["per_question_f1"] for _, row in sorted(runs.items())]
    for n, ref in references.items():
        out["above"][n] = sum(s["paired"][n]["gain"] > 0 for s in out["seeds"].values())
        out["pooled"][n] = pooled_gain(ref["per_question_f1"], per_question)
    if references:
        strongest = max(references, key=lambda n: references[n]["f1"])
        pooled = out["pooled"][strongest]
        se = pooled["gain_se"]
        out["strongest"] = strongest
        out["pooled_vs_strongest"] = {**pooled, "vs": strongest,
                                      "in_se": pooled["gain"] / se if se and se == se else None}
    return out


def build(results: dict[str, dict[str, Any]], baselines: list[str]) -> dict[str, Any]:
    check_same_table(results)
    table = next(iter(results.values()))["table"]
    return {"bench": "seed_table", "schema": 1, "table": table,
            "inputs": {p: seed_of(r, p) for p, r in results.items()},
            "baselines": baselines,
            "methods": {name: pool_method(results, name, baselines)
                        for name in seeded_rows(results)}}


def _gain(paired: dict[str, Any]) -> str:
    return f"{100 * paired['gain']:+.1f} +- {percent(paired['gain_se'])}"


def format_markdown(result: dict[str, Any]) -> str:
    """A table per RL row: a line per seed (F1, gain over each reference), the pooled line,
    then the seeds above each reference and the pooled gain over the strongest one."""
    table = result["table"]
    lines = [f"Seeds pooled: model {table['model']}, {table['eval_split']} split "
             f"{Path(table['eval_file']).name}, scoring {table['scoring']}."]
    for method in result["methods"].values():
        refs = method["references"]
        lines += ["", f"**{method.get('label', method['method'])}**"
                      + (f" (no finished row for seeds {method['seeds_missing']})"
                         if method["seeds_missing"] else ""), ""]
        if not method["seeds"]:
            lines.append("no seed finished")
            continue
        lines += ["| seed | F1 +- SE | " + " | ".join(
                      f"gain vs {n} ({percent(r['f1'])})" for n, r in refs.items()) + " |",
                  "| --- | ---: |" + " ---: |" * len(refs)]
        for seed, run in method["seeds"].items():
            lines.append(f"| {seed} | {percent(run['f1'])} +- {percent(run['f1_se'])} | "
                         + " | ".join(_gain(run["paired"][n]) for n in refs) + " |")
        lines.append("| pooled | | " + " | ".join(_gain(method["pooled"][n]) for n in refs)
                     + " |")
        lines.append("| seeds above | | " + " | ".join(
            f"{method['above'][n]} of {len(method['seeds'])}" for n in refs) + " |")
        if "pooled_vs_strongest" in method:
            best = method["pooled_vs_strongest"]
            in_se = "-" if best["in_se"] is None else f"{best['in_se']:.1f}"
            lines += ["", f"Pooled gain over the strongest reference ({best['vs']}): "
                          f"{_gain(best)} F1 ({in_se} SE, {best['n']} questions, "
                          f"{best['seeds']} seeds)."]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jsons", nargs="+", metavar="JSON",
                        help="side_by_side.py JSONs of one table, one seed each")
    parser.add_argument("--baselines", nargs="+", default=list(DEFAULT_BASELINES),
                        help="reference rows besides each RL row's own warm start "
                             "(default: sft_rag sft_rag1, rag K = 5 and K = 1)")
    parser.add_argument("--json-out", dest="json_out")
    parser.add_argument("--markdown")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    results = {path: load_json_or_exit(path, WHAT, REQUIRED) for path in args.jsons}
    result = build(results, args.baselines)
    print(json.dumps(portable(result), indent=2))
    markdown = format_markdown(result)
    print(markdown)
    if args.json_out:
        write_result(args.json_out, result, SCRIPT)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(markdown)


if __name__ == "__main__":
    main()
