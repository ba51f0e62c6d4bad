"""Every method side by side: one server, one corpus, one model, one split, one command.

Rows (``--methods``, default all, in this order; a row's dependencies are added):

====================  =========================================================================
``zero_shot``         the base model, three-agent pipeline (``qr_s_g``)
``zero_shot_rag``     the base model, ``rag`` (retrieve with the question, then generate)
``sft``               three-agent SFT (the warm start; ``--warm-start DIR`` reuses one), qr_s_g
``sft_rag``           the warm start in ``rag``
``sft_rag1``          the warm start in ``rag`` with one candidate (K = 1): the "keep the top
                      candidate" baseline a Selector must beat
``mappo``             three-agent MAPPO from the warm start (the model's MAPPO config)
``grpo``              three-agent GRPO from the warm start (the model's GRPO config)
``search_sft``        search agent (RAG-R1 / Search-R1): format SFT from the base model
``search_rl``         search agent: GRPO from its SFT
``decision_sft``      decision agent (SmartRAG): SFT from the base model
``decision_rl``       decision agent: GRPO from its SFT
``harr``              the warm start in ``rag`` with the query encoder trained by retriever RL
                      (HARR; reward: the gold passages' recall on the demo world, else the
                      warm start's answer F1; the server's encoder swapped for the evaluation
                      and put back)
====================  =========================================================================

Each row is trained and evaluated by the functions of the bench that owns the method
(``learning_signal.py``: warm start, MAPPO / GRPO and the three-agent evaluation;
``search_agent.py``, ``decision_agent.py``, ``retriever_rl.py``), with the datasets built from
``--train-file`` by the project's data builders (``mmoa-cli data sft / mappo / search-sft /
decision-sft``) into the work folder's own ``dataset_info.json``. Every row is evaluated greedily
on the same questions (``--eval-split``, first ``--max-eval``) with the same scoring. The
decision agent's SFT data come from the train file alone (no closed-book ``known`` group), so
its warm start always searches; RL may learn to skip a search.

Columns: F1 +- its standard error and EM (from the evaluation's ``metrics.json``), the paired
gain of the row over the row it starts from on the same questions (``vs``: MAPPO, GRPO over the
warm start; an RL row over its SFT; HARR over ``sft_rag``, the same generator with the frozen
encoder; an SFT row over the base model: ``zero_shot`` / ``zero_shot_rag``) with the standard
error of the paired difference, the candidates' recall of the gold passages where the pipeline
retrieves a fixed candidate list (``qr_s_g``, ``rag``), and the row's wall time (its own training
and evaluation, summed over the invocations that ran it; a dependency's time is in its own row).

Resumable run by run: each finished row is written to the JSON at once; a rerun skips every row
whose method and settings (its key: the table's files and model, the precision, the row's
overrides and the keys of the rows it starts from) match a finished one, and an interrupted
training resumes from its last checkpoint. A trained row trains in its own folder
(``<work-dir>/<method>-train-<key>``, keyed by the same settings less the evaluation's: the
split, the files evaluated, ``--max-eval``, ``--rl-step``) and is evaluated in the row's
(``<work-dir>/<method>-<key>``): a test table run in the same work folder as the dev table
evaluates the dev table's trainings instead of training them again, and ``--rl-step N``
evaluates the MAPPO / GRPO rows at the checkpoint chosen on dev. A row's wall time is its
training's and its evaluation's. The keys do not cover the contents of a row's config file:
after editing one, remove that row's folders to rerun it. A failed row is recorded with its
error and the others still run; the next invocation tries it again. A JSON holds one table: a
rerun with other files, model, split or ``--max-eval`` is refused (give another
``--json-out``). MAPPO with several seeds: one JSON per ``--seed`` in one work folder (the
seeds share the warm start and the baselines, which do not depend on the seed), then
``bench/seed_table.py`` pools them.

Overrides: ``key=value`` goes to every training, ``METHOD.key=value`` to that row's training
only (e.g. ``mappo.max_steps=4 grpo.learning_rate=1e-5 harr.retriever_reward=f1``), anywhere on
the command line, each key once.

JSON (``--json-out``, default ``<work-dir>/side_by_side.json``)::

    {"bench": "side_by_side", "schema": 1,
     "table": {"model", "base_model", "train_file", "dev_file", "test_file", "eval_split",
               "eval_file", "scoring", "max_eval"},
     "config": {...this invocation's options...},
     "order": [method, ...],                      # the table's rows, in order
     "rows": {method: {
         "method", "label", "pipeline",           # pipeline: qr_s_g, rag, search_agent, ...
         "status": "ok" | "failed", "key", "settings", "vs": method | null,
         "seconds", "finished", "code",           # wall time of the row, ISO time, commit
         # ok rows:
         "model", "num_questions", "f1", "f1_se", "em", "em_se", "acc",
         "candidate_recall": float | null, "scoring_profile", "eval_dir",
         "per_question_f1": {id: f1}, "encoder" (harr only: the trained query encoder),
         "paired": {"vs", "gain", "gain_se", "n"} | null,   # fractions, as F1
         "training": {key: [value per logged step]},  # RL rows: reward, answer_f1,
                                                      # grpo/zero_variance_fraction, time/step;
                                                      # every step trained, also past --rl-step
         # failed rows:
         "error"}}}

Needs the retrieval server of the world's corpus. The demo world (``bash run_demo.sh`` leaves
it; ``bash run_server.sh --index data/demo/index &``)::

    python bench/side_by_side.py --world demo --model smollm2 \\
        --json-out bench/results/side_by_side_demo_smollm2.json \\
        --markdown bench/results/side_by_side_demo_smollm2.md

The real HotpotQA files (``../shared/data/hotpotqa_fullwiki_486``; corpus and index from
``data_builders/build_corpus.py`` + ``build_index.py``)::

    bash run_server.sh --index data/hotpotqa_real/index --port 8010 &
    python bench/side_by_side.py --world real --model smollm2 \\
        --retriever-url http://127.0.0.1:8010 --index data/hotpotqa_real/index \\
        --json-out bench/results/side_by_side_real_smollm2.json

Exits 1 when a row of this run failed (after writing the table, whose failed rows say why), so
that a chain of commands stops there; rerunning the same command retries those rows.

``--report JSON`` prints the table of an existing JSON (and writes ``--markdown`` / ``--plot``)
without running anything. ``--report REAL.json DEMO.json --readme README.md`` writes one table
with a column per JSON (F1 +- SE and the paired gain of each row) between the README's
``<!-- side-by-side:begin`` and ``<!-- side-by-side:end -->`` lines, the results table the
README shows. Prints the table; writes the JSON, the markdown and a bar plot of F1
+- SE per row (PNG, default beside the JSON).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import textwrap
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import decision_agent
import learning_signal
import retriever_rl
import search_agent
import yaml
from bench_runs import (
    ROOT,
    add_precision_option,
    check_overrides,
    code_version,
    fail,
    load_json_or_exit,
    mmoa_cli,
    paired_gain,
    per_question_f1,
    percent,
    portable,
    run_logged,
    stage,
    train_to_end,
    training_series,
    without_commit,
    write_result,
)

from mmoa.data.sft_builder import CANDIDATE_ORDERS, DEFAULT_CANDIDATE_ORDER

SCRIPT = "bench/side_by_side.py"
SCHEMA = 1
#: What a table JSON must hold to be printed or resumed (bench_runs.read_json_object).
RESULT_KEYS = {"rows": dict, "table": dict, "table.model": str, "table.eval_split": str,
               "table.eval_file": str, "table.scoring": str}
WHAT = "a side_by_side result JSON"
REAL_DIR = ROOT.parent / "shared" / "data" / "hotpotqa_fullwiki_486"
DISTRACTOR_DIR = ROOT.parent / "shared" / "data" / "hotpotqa_distractor_1k"
#: The distractor world's Query Rewriter labels, committed beside their report
#: (``bench/results/qr_labels_distractor.json``).
DISTRACTOR_REWRITES = "bench/results/qr_labels_distractor_rewrites.jsonl"
WORLDS: dict[str, dict[str, str]] = {
    # the files, the scoring and the index of each named world
    "demo": {"train_file": str(ROOT / "data/demo/train.jsonl"),
             "dev_file": str(ROOT / "data/demo/dev.jsonl"),
             "test_file": str(ROOT / "data/demo/test.jsonl"),
             "scoring": "demo", "index": str(ROOT / "data/demo/index"),
             "label_source": "heuristic", "harr_reward": "recall"},
    "real": {"train_file": str(REAL_DIR / "hotpot_fullwiki_train.json"),
             "dev_file": str(REAL_DIR / "hotpot_fullwiki_dev.json"),
             "test_file": str(REAL_DIR / "hotpot_fullwiki_test.json"),
             "scoring": "hotpotqa", "index": "", "label_source": "supporting",
             "harr_reward": "f1"},
    # every gold paragraph in the corpus; the Query Rewriter's labels are the committed output
    # of ``mmoa-cli data qr-rewrites`` on the train split (docs/real_workflow.md): an hour of
    # sampling on 2 cores that a fresh checkout need not repeat
    "distractor": {"train_file": str(DISTRACTOR_DIR / "hotpot_distractor_train.json"),
                   "dev_file": str(DISTRACTOR_DIR / "hotpot_distractor_dev.json"),
                   "test_file": str(DISTRACTOR_DIR / "hotpot_distractor_test.json"),
                   "scoring": "hotpotqa", "index": str(ROOT / "data/hotpotqa_distractor/index"),
                   "label_source": "supporting", "harr_reward": "f1",
                   "rewrites_file": str(ROOT / DISTRACTOR_REWRITES)},
}
#: HARR's training reward where no world names one: the answer F1 of the frozen warm start
#: (HARR's own; ``harr.retriever_reward=recall`` trains on the gold passages' recall, by id or
#: by HotpotQA's titles).
HARR_REWARD = "f1"
#: ``--scoring`` -> the evaluator's profile (``demo``: its default, MMOA-RAG's normaliser).
SCORING_PROFILES = {"demo": None, "hotpotqa": "hotpotqa"}
DEMO = "LLaMA-Factory/examples/demo"
#: The training configs of each model, per training row. Where the tiny model has no config of
#: its own, SmolLM2's is used with the tiny model's template (``TEMPLATE_OVERRIDES``).
CONFIGS: dict[str, dict[str, str]] = {
    "smollm2": {"sft": learning_signal.MODELS["smollm2"][2],
                "mappo": learning_signal.MODELS["smollm2"][3],
                "grpo": learning_signal.GRPO_CONFIGS["smollm2"],
                "search_sft": search_agent.SFT_CONFIG, "search_rl": search_agent.RL_CONFIG,
                "decision_sft": decision_agent.SFT_CONFIG,
                "decision_rl": decision_agent.RL_CONFIG, "harr": retriever_rl.CONFIG},
    "tiny": {"sft": learning_signal.MODELS["tiny"][2],
             "mappo": learning_signal.MODELS["tiny"][3],
             "grpo": learning_signal.GRPO_CONFIGS["tiny"],
             "search_sft": search_agent.SFT_CONFIG,
             "search_rl": f"{DEMO}/tiny_search_agent_grpo.yaml",
             "decision_sft": decision_agent.SFT_CONFIG,
             "decision_rl": f"{DEMO}/tiny_decision_agent_grpo.yaml",
             "harr": retriever_rl.CONFIG},
}
TEMPLATES = {name: spec[1] for name, spec in learning_signal.MODELS.items()}
#: Dataset names in the work folder's own ``dataset_info.json``.
DATASETS = {"sft": "sbs_sft", "mappo": "sbs_mappo", "search": "sbs_search_sft",
            "decision": "sbs_decision_sft"}


@dataclass(frozen=True)
class Method:
    """One row: its label, the pipeline it is evaluated in, the rows it starts from (run
    first), the row its paired gain is measured against, and the datasets it trains on."""

    name: str
    label: str
    pipeline: str
    needs: tuple[str, ...] = ()
    vs: str | None = None
    data: tuple[str, ...] = ()


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("zero_shot", "zero-shot (base model)", "qr_s_g"),
    Method("zero_shot_rag", "zero-shot rag (base model)", "rag"),
    Method("sft", "three-agent SFT (warm start)", "qr_s_g", vs="zero_shot", data=("sft",)),
    Method("sft_rag", "rag, warm start", "rag", needs=("sft",), vs="zero_shot_rag"),
    Method("sft_rag1", "rag K = 1, warm start", "rag", needs=("sft",), vs="sft_rag"),
    Method("mappo", "three-agent MAPPO", "qr_s_g", needs=("sft",), vs="sft", data=("mappo",)),
    Method("grpo", "three-agent GRPO", "qr_s_g", needs=("sft",), vs="sft", data=("mappo",)),
    Method("search_sft", "search agent SFT", "search_agent", vs="zero_shot_rag",
           data=("search",)),
    Method("search_rl", "search agent GRPO", "search_agent", needs=("search_sft",),
           vs="search_sft", data=("mappo",)),
    Method("decision_sft", "decision agent SFT", "decision_agent", vs="zero_shot_rag",
           data=("decision",)),
    Method("decision_rl", "decision agent GRPO", "decision_agent", needs=("decision_sft",),
           vs="decision_sft", data=("mappo",)),
    Method("harr", "rag, warm start + HARR query encoder", "rag", needs=("sft",),
           vs="sft_rag", data=("mappo",)),
)}
TRAINED = {name for name, m in METHODS.items() if m.data}
#: The rows ``--rl-step`` evaluates at a checkpoint.
RL_ROWS = ("mappo", "grpo")
#: The folder in an RL row's training folder its trainer writes the model (and
#: trainer_state.json) to.
RL_OUTPUT = {"mappo": "mappo", "grpo": "mappo", "search_rl": "model", "decision_rl": "model"}
#: The rows whose training draws from ``--seed`` (the RL rows, HARR's retriever RL); the SFT
#: rows train with their config's seed, so the tables of several seeds share them.
SEEDED = (*RL_OUTPUT, "harr")
#: What an RL row reports of its training, step by step (the JSON's ``training``): the rollout
#: reward and answer F1, and for GRPO the share of groups with no reward variance.
TRAINING_KEYS = ("reward", "answer_f1", "grpo/zero_variance_fraction", "time/step")
#: The table's keys that only its evaluation reads: a training's key leaves them out.
EVALUATION_KEYS = ("eval_split", "eval_file", "dev_file", "test_file", "max_eval")


class RowFailed(Exception):
    """A row could not run (a dependency failed, an option it needs is missing)."""


def split_overrides(overrides: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``key=value`` (every training) and ``METHOD.key=value`` (one row's training) apart."""
    common: list[str] = []
    per_method: dict[str, list[str]] = {name: [] for name in TRAINED}
    given: dict[str, str] = {}
    for item in check_overrides(overrides):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"override {item!r}: expected key=value or METHOD.key=value")
        if key in given:  # overrides may come anywhere on the line: their order says nothing
            raise SystemExit(f"override {key!r} given twice ({given[key]!r} and {item!r}): "
                             f"give it once")
        given[key] = item
        method, dot, rest = key.partition(".")
        if not dot:
            common.append(item)
        elif method in TRAINED:
            per_method[method].append(f"{rest}={value}")
        else:
            raise SystemExit(f"override {item!r}: {method!r} is not a trained method "
                             f"({', '.join(sorted(TRAINED))})")
    return common, per_method


def with_dependencies(methods: list[str]) -> list[str]:
    """``methods`` in the order given, each preceded by the rows it starts from."""
    planned: list[str] = []

    def add(name: str) -> None:
        if name not in planned:
            for need in METHODS[name].needs:
                add(need)
            planned.append(name)

    for name in methods:
        add(name)
    return planned


def config_value(config: str, key: str) -> Any:
    """A key of a YAML training config (the value a row's bench option defaults to)."""
    return yaml.safe_load((ROOT / config).read_text()).get(key)


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:12]


def file_digest(path: Path) -> str:
    """A file's contents as a key: a re-synthesised rewrites file makes new SFT data."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


class SideBySide:
    """One invocation: the table's settings, the rows' keys, the datasets and the runners."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work_dir).resolve()
        self.json_path = Path(args.json_out or self.work / "side_by_side.json").resolve()
        self.common, self.per_method = split_overrides(args.overrides)
        for item in [*self.common, *(o for given in self.per_method.values() for o in given)]:
            if item.partition("=")[0] == "mappo_top_k":  # one K for data, rollouts, evaluation
                raise SystemExit(f"override {item!r}: give the candidates with --k, which "
                                 "sets the SFT data's, the rollouts' and the evaluations' K")
        self.configs = CONFIGS[args.model]
        self.template = TEMPLATES[args.model]
        self.base_model = str(Path(args.base_model or ROOT / learning_signal.MODELS[
            args.model][0]).resolve())
        self.eval_file = args.dev_file if args.eval_split == "dev" else args.test_file
        self.scoring = SCORING_PROFILES[args.scoring]
        config_k = int(config_value(self.configs["mappo"], "mappo_top_k"))
        self.k = config_k if args.k is None else args.k
        self.table = {"model": args.model, "base_model": self.base_model,
                      "train_file": args.train_file, "dev_file": args.dev_file,
                      "test_file": args.test_file, "eval_split": args.eval_split,
                      "eval_file": self.eval_file, "scoring": args.scoring,
                      "max_eval": args.max_eval}
        if self.k != config_k:  # the config's K keeps the keys of tables run before --k
            self.table["k"] = self.k
        sources = [args.train_file, args.label_source, self.k]
        if args.rewrites_file:  # kept out of the digest where absent: old folders stay valid
            sources.append(file_digest(Path(args.rewrites_file)))
        if args.candidate_order != DEFAULT_CANDIDATE_ORDER:  # likewise
            sources.append(args.candidate_order)
        self.data_dir = self.work / f"data-{digest(sources)}"
        self.harr_reward = WORLDS.get(args.world or "", {}).get("harr_reward", HARR_REWARD)
        self._keys: dict[str, str] = {}

    # -- keys -------------------------------------------------------------------------------

    def settings(self, name: str) -> dict[str, Any]:
        """What a row's result depends on beyond the table: its key is their digest."""
        method = METHODS[name]
        out: dict[str, Any] = {"method": name, "table": digest(self.table),
                               "precision": self.args.precision,
                               "needs": {need: self.key(need) for need in method.needs}}
        if method.data:
            out.update(overrides=self.training(name)[1:], label_source=self.args.label_source)
            if self.args.rewrites_file and "sft" in method.data:
                out.update(rewrites=file_digest(Path(self.args.rewrites_file)))
            if self.args.candidate_order != DEFAULT_CANDIDATE_ORDER and "sft" in method.data:
                out.update(candidate_order=self.args.candidate_order)  # else the old keys
        if name in SEEDED:
            out.update(seed=self.args.seed)
        if name == "sft" and self.args.warm_start:
            out = {**out, "warm_start": str(Path(self.args.warm_start).resolve()),
                   "overrides": [], "label_source": None}
        if name == "harr":
            out.update(index=self.args.index, reward=self.harr_reward)
        if name in RL_ROWS and self.args.rl_step:
            out.update(rl_step=self.args.rl_step)
        return out

    def training_settings(self, name: str) -> dict[str, Any]:
        """What a trained row's training depends on: its settings less the evaluation's (the
        split, the files evaluated, ``--max-eval``, ``--rl-step``), so that a dev table and
        a test table of the same trainings share them instead of training twice."""
        table = {k: v for k, v in self.table.items() if k not in EVALUATION_KEYS}
        settings = {k: v for k, v in self.settings(name).items() if k != "rl_step"}
        return {**settings, "table": digest(table),
                "needs": {need: self.training_key(need) for need in METHODS[name].needs}}

    def key(self, name: str) -> str:
        if name not in self._keys:
            self._keys[name] = digest(self.settings(name))
        return self._keys[name]

    def training_key(self, name: str) -> str:
        return digest(self.training_settings(name))

    def folder(self, name: str) -> Path:
        """The row's folder: its evaluation on this table."""
        return self.work / f"{name}-{self.key(name)}"

    def training_folder(self, name: str) -> Path:
        """Where a trained row trains, shared by every table that evaluates that training."""
        return self.work / f"{name}-train-{self.training_key(name)}"

    def rl_output(self, name: str) -> Path:
        """Where the RL row ``name`` trains its model."""
        return self.training_folder(name) / RL_OUTPUT[name]

    def trained(self, name: str, train: Callable[[Path], object]) -> dict[str, Any]:
        """``train(folder)`` once for the row ``name``, in its training folder (resumed where
        it was cut; a later table's row finds it done): its result, with its seconds."""
        folder = self.training_folder(name)

        def produce() -> dict[str, Any]:
            train(folder)
            return {"folder": str(folder)}

        return stage(folder, "training", produce, SCRIPT)

    def evaluated(self, name: str, training: dict[str, Any],
                  evaluate: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
        """``evaluate(eval_dir)`` of a trained row on this table, once: its result, its
        seconds those of the training and the evaluation."""
        folder = self.folder(name)
        done = stage(folder, "row", lambda: evaluate(folder / "eval"), SCRIPT)
        return {**done, "seconds": round(done["seconds"] + training["seconds"], 1)}

    # -- data -------------------------------------------------------------------------------

    def dataset(self, kind: str) -> str:
        """Build the dataset ``kind`` from the train file once (kept by its marker)."""
        name = DATASETS[kind]
        url = self.args.retriever_url
        source = ["--data_file", self.args.train_file, "--dataset_dir", str(self.data_dir),
                  "--name", name]
        commands = {
            "sft": mmoa_cli("data", "sft", *source, "--retriever_url", url, "--k", str(self.k),
                            "--label_source", self.args.label_source,
                            "--candidate_order", self.args.candidate_order,
                            *(["--rewrites_file", self.args.rewrites_file]
                              if self.args.rewrites_file else [])),
            "mappo": mmoa_cli("data", "mappo", *source),
            "search": mmoa_cli("data", "search-sft", *source, "--retriever_url", url),
            "decision": mmoa_cli("data", "decision-sft", *source, "--retriever_url", url),
        }

        def build() -> dict[str, Any]:
            run_logged(commands[kind], self.data_dir / f"{kind}.log")
            return {"dataset": name, "train_file": self.args.train_file}

        stage(self.data_dir, f"built-{kind}", build, SCRIPT)
        return name

    def training(self, name: str) -> list[str]:
        """The overrides of a row's training: its datasets' folder, the model's template where
        the config is SmolLM2's, the precision (the LLM trainings; HARR's query encoder
        trains in fp32), then ``key=value`` and ``METHOD.key=value``."""
        template = [] if self.args.model == "smollm2" else [f"template={self.template}"]
        precision = [] if name == "harr" else self.args.train_precision
        return [f"dataset_dir={self.data_dir}", *template, *precision, *self.common,
                *self.per_method[name]]

    # -- the benches' namespaces ------------------------------------------------------------

    def three_agent(self, **extra: Any) -> argparse.Namespace:
        """What ``learning_signal``'s warm start, MAPPO run and evaluation read."""
        fields = dict(model=self.args.model, base_model=self.base_model,
                      warm_start=self.args.warm_start, eval_file=self.eval_file, k=self.k,
                      retriever_url=self.args.retriever_url, eval_retriever_url=None,
                      precision=self.args.precision, max_eval=self.args.max_eval,
                      scoring=self.scoring, algorithm="ppo",
                      sft_overrides=[], mappo_overrides=[], overrides=[])
        return argparse.Namespace(**{**fields, **extra})

    def agent_ns(self, **extra: Any) -> argparse.Namespace:
        """What ``search_agent`` / ``decision_agent`` / ``retriever_rl`` read."""
        fields = dict(retriever_url=self.args.retriever_url, precision=self.args.precision,
                      max_eval=self.args.max_eval, world_dir="", split_dir="", known_repeat=1,
                      sft_overrides=[], overrides=[])
        return argparse.Namespace(**{**fields, **extra})

    # -- rows -------------------------------------------------------------------------------

    def evaluate_three_agent(self, name: str, model: str, mode: str,
                             k: int | None = None) -> dict[str, Any]:
        """``learning_signal.evaluate`` of ``model`` in ``mode`` (``k`` candidates, default
        the MAPPO config's), kept as a stage."""
        folder = self.folder(name)
        return stage(folder, "row", lambda: self.three_agent_eval(model, mode, folder / "eval",
                                                                   k=k), SCRIPT)

    def three_agent_eval(self, model: str, mode: str, out: Path, k: int | None = None,
                         base: str | None = None) -> dict[str, Any]:
        learning_signal.evaluate(Path(model), self.three_agent(), out, mode, base=base, k=k)
        return {"model": model, "eval_dir": str(out)}

    def run_zero_shot(self) -> dict[str, Any]:
        return self.evaluate_three_agent("zero_shot", self.base_model, "qr_s_g")

    def run_zero_shot_rag(self) -> dict[str, Any]:
        return self.evaluate_three_agent("zero_shot_rag", self.base_model, "rag")

    def run_sft(self) -> dict[str, Any]:
        if self.args.warm_start:
            return self.evaluate_three_agent("sft", str(Path(self.args.warm_start).resolve()),
                                             "qr_s_g")
        self.dataset("sft")
        ns = self.three_agent(sft_overrides=[f"dataset={DATASETS['sft']}",
                                             *self.training("sft")])
        model = self.training_folder("sft") / "sft"
        training = self.trained("sft", lambda folder: learning_signal.train_warm_start(ns, model))
        return self.evaluated("sft", training,
                              lambda out: self.three_agent_eval(str(model), "qr_s_g", out))

    def model_of(self, name: str) -> str:
        """The model a finished row trained (or evaluated), for the rows that start from it."""
        row = self.rows.get(name, {})
        if row.get("status") != "ok" or row.get("key") != self.key(name):
            raise RowFailed(f"needs the row {name!r}, which "
                            f"{'failed: ' + row.get('error', '') if row else 'did not run'}")
        return row["model"]

    def run_sft_rag(self) -> dict[str, Any]:
        return self.evaluate_three_agent("sft_rag", self.model_of("sft"), "rag")

    def run_sft_rag1(self) -> dict[str, Any]:
        return self.evaluate_three_agent("sft_rag1", self.model_of("sft"), "rag", k=1)

    def run_rl(self, name: str) -> dict[str, Any]:
        """MAPPO or GRPO by ``learning_signal.train_rl`` from the warm start; evaluated at
        its end, or at its checkpoint of step ``--rl-step``."""
        warm = self.model_of("sft")
        self.dataset("mappo")
        ns = self.three_agent(algorithm="ppo" if name == "mappo" else "grpo",
                              mappo_overrides=[f"dataset={DATASETS['mappo']}",
                                               *self.training(name)])
        output = self.rl_output(name)
        training = self.trained(name, lambda folder: learning_signal.train_rl(
            ns, output, self.args.seed, ",".join(learning_signal.AGENTS), warm,
            keep_checkpoints=self.args.keep_checkpoints or bool(self.args.rl_step)))
        model = output
        if self.args.rl_step:
            model = output / f"checkpoint-{self.args.rl_step}"
            if not model.is_dir():
                raise RowFailed(f"{model} does not exist: --rl-step needs a step the training "
                                "saved, kept by --keep-checkpoints in the run that trained it")
        return self.evaluated(name, training,
                              lambda out: self.three_agent_eval(str(model), "qr_s_g", out,
                                                                base=warm))

    def run_mappo(self) -> dict[str, Any]:
        return self.run_rl("mappo")

    def run_grpo(self) -> dict[str, Any]:
        return self.run_rl("grpo")

    def run_search_sft(self) -> dict[str, Any]:
        config = self.configs["search_sft"]
        model = self.training_folder("search_sft") / "model"
        ns = self.agent_ns(sft_steps=config_value(config, "max_steps"), sft_overrides=[
            f"dataset={self.dataset('search')}", f"model_name_or_path={self.base_model}",
            *self.training("search_sft")])
        training = self.trained("search_sft", lambda folder: search_agent.train_sft(
            ns, "multi", model, config=config))
        return self.evaluated("search_sft", training,
                              lambda out: self.search_eval(ns, model, out))

    def search_eval(self, ns: argparse.Namespace, model: Path, out: Path) -> dict[str, Any]:
        search_agent.evaluate(ns, model, out, None, template=self.template,
                              data_file=self.eval_file, scoring=self.scoring,
                              rl_config=self.configs["search_rl"])
        return {"model": str(model), "eval_dir": str(out)}

    def run_search_rl(self) -> dict[str, Any]:
        warm = Path(self.model_of("search_sft"))
        config = self.configs["search_rl"]
        model = self.rl_output("search_rl")
        ns = self.agent_ns(steps=config_value(config, "max_steps"), overrides=[
            f"dataset={self.dataset('mappo')}", *self.training("search_rl")])
        training = self.trained("search_rl", lambda folder: search_agent.train_rl(
            ns, warm, model, self.args.seed, [], config=config))
        return self.evaluated("search_rl", training,
                              lambda out: self.search_eval(ns, model, out))

    def decision_eval(self, model: Path, out: Path) -> dict[str, Any]:
        decision_agent.evaluate(self.agent_ns(), model, out, data_file=self.eval_file,
                                template=self.template, scoring=self.scoring,
                                max_samples=self.args.max_eval)
        return {"model": str(model), "eval_dir": str(out)}

    def run_decision_sft(self) -> dict[str, Any]:
        model = self.training_folder("decision_sft") / "model"
        overrides = [f"output_dir={model}", f"dataset={self.dataset('decision')}",
                     f"model_name_or_path={self.base_model}", *self.training("decision_sft")]
        training = self.trained("decision_sft", lambda folder: train_to_end(
            self.configs["decision_sft"], overrides, model, folder / "train.log"))
        return self.evaluated("decision_sft", training,
                              lambda out: self.decision_eval(model, out))

    def run_decision_rl(self) -> dict[str, Any]:
        warm = Path(self.model_of("decision_sft"))
        config = self.configs["decision_rl"]
        model = self.rl_output("decision_rl")
        ns = self.agent_ns(steps=config_value(config, "max_steps"), overrides=[
            f"dataset={self.dataset('mappo')}", *self.training("decision_rl")])
        training = self.trained("decision_rl", lambda folder: decision_agent.train_rl(
            ns, warm, model, self.args.seed,
            config_value(config, "mappo_decision_retrieval_cost"), config=config))
        return self.evaluated("decision_rl", training,
                              lambda out: self.decision_eval(model, out))

    def run_harr(self) -> dict[str, Any]:
        """Retriever RL of the query encoder (``retriever_rl.train_encoder``, the warm start as
        the frozen generator), then ``rag`` with the warm start while the server serves the
        trained encoder; the server gets its own encoder back."""
        from mmoa.retrieval.client import RetrievalClient

        if not self.args.index:
            raise RowFailed("harr needs --index: the index folder the retrieval server serves "
                            "(retriever RL reads its passage vectors)")
        warm = self.model_of("sft")
        config = self.configs["harr"]
        ns = self.agent_ns(
            model=warm, steps=config_value(config, "max_steps"),
            lr=config_value(config, "learning_rate"),
            save_steps=config_value(config, "save_steps"),
            top_k=config_value(config, "retriever_top_k"),
            max_new_tokens=int(config_value(self.configs["mappo"],
                                            "mappo_max_new_tokens_generator")),
            reward=self.harr_reward, overrides=[f"dataset={self.dataset('mappo')}",
                                        f"retriever_index={self.args.index}",
                                        *self.training("harr")])

        training = self.trained("harr", lambda folder: retriever_rl.train_encoder(
            ns, folder, self.args.seed, False, config=config))
        encoder = retriever_rl.encoder_path(self.training_folder("harr"))

        def evaluate(out: Path) -> dict[str, Any]:
            client = RetrievalClient(self.args.retriever_url, timeout=120)
            client.reload_encoder(str(encoder.resolve()))
            try:
                learning_signal.evaluate(Path(warm), self.three_agent(), out, "rag")
            finally:
                client.reload_encoder(None)
            return {"model": warm, "encoder": str(encoder), "eval_dir": str(out)}

        return self.evaluated("harr", training, evaluate)

    # -- the table --------------------------------------------------------------------------

    def load(self) -> dict[str, Any]:
        """The JSON so far; refused when it holds another table."""
        if not self.json_path.is_file():
            return {"bench": "side_by_side", "schema": SCHEMA, "table": self.table,
                    "rows": {}, "order": []}
        result = load_json_or_exit(self.json_path, f"{WHAT} to resume (or give another "
                                                    f"--json-out)", RESULT_KEYS)
        table = portable(self.table)  # the JSON holds it machine-free (write_result)
        if result.get("table") != table:
            changed = sorted(k for k in table if result.get("table", {}).get(k) != table[k])
            raise SystemExit(f"{self.json_path} holds another table (it differs in "
                             f"{', '.join(changed)}): give another --json-out")
        return result

    def run(self) -> dict[str, Any]:
        from mmoa.retrieval.client import RetrievalClient

        result = without_commit(self.load())  # stamped afresh by this run's config.code
        result["config"] = {k: v for k, v in vars(self.args).items() if k != "report"}
        result["config"]["code"] = code_version(SCRIPT)
        self.rows: dict[str, Any] = result["rows"]
        planned = with_dependencies(self.args.methods)
        result["order"] = [m for m in METHODS if m in planned or m in self.rows]
        RetrievalClient(self.args.retriever_url, timeout=120).wait_until_ready(timeout=60)
        for name in planned:
            row = self.rows.get(name)
            if row and row.get("status") == "ok" and row.get("key") == self.key(name):
                print(f"[{name}] finished before (key {row['key']}), skipped", flush=True)
                continue
            self.rows[name] = self.run_row(name)
            add_paired(result)
            write_result(self.json_path, result, SCRIPT)
            print(f"[{name}] {row_line(self.rows[name])}", flush=True)
        add_paired(result)
        write_result(self.json_path, result, SCRIPT)
        return result

    def run_row(self, name: str) -> dict[str, Any]:
        """One row, ok or failed; a failure is the row's, never the table's."""
        method = METHODS[name]
        runner: Callable[[], dict[str, Any]] = getattr(self, f"run_{name}")
        row: dict[str, Any] = {"method": name, "label": method.label,
                               "pipeline": method.pipeline, "key": self.key(name),
                               "settings": self.settings(name), "vs": method.vs}
        started = time.perf_counter()
        print(f"[{name}] running ({self.folder(name)})", flush=True)
        try:
            done = runner()
            row.update(status="ok", model=done["model"], **columns(Path(done["eval_dir"])),
                       seconds=done.get("seconds", round(time.perf_counter() - started, 1)))
            if "encoder" in done:
                row["encoder"] = done["encoder"]
            if name in RL_OUTPUT:
                row["training"] = training_series(self.rl_output(name), TRAINING_KEYS)
        except (Exception, SystemExit) as exc:  # a failed stage exits (run_logged)
            message = str(exc) if isinstance(exc, (SystemExit, RowFailed)) else \
                "".join(traceback.format_exception(exc)[-3:])
            row.update(status="failed", error=message.strip()[-2000:],
                       seconds=round(time.perf_counter() - started, 1))
        row["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        row["code"] = code_version(SCRIPT)
        return row


def columns(eval_dir: Path) -> dict[str, Any]:
    """The table's figures of one evaluation, read from its ``metrics.json`` (every pipeline
    writes the same keys), and its per-question F1 for the paired gains."""
    metrics = json.loads((eval_dir / "metrics.json").read_text())
    return {"num_questions": metrics["num_questions"], "f1": metrics["f1"],
            "f1_se": metrics.get("f1_se"), "em": metrics["em"], "em_se": metrics.get("em_se"),
            "acc": metrics.get("acc"),
            "candidate_recall": metrics.get("agents", {}).get("retrieval", {}).get(
                "candidate_support_recall"),
            "scoring_profile": metrics.get("scoring", {}).get("profile", "mmoa"),
            "eval_dir": str(eval_dir), "per_question_f1": per_question_f1(eval_dir)}


def add_paired(result: dict[str, Any]) -> None:
    """Each ok row's paired gain over its ``vs`` row, where that row is ok in this table."""
    rows = result["rows"]
    for row in rows.values():
        base = rows.get(row.get("vs") or "")
        row["paired"] = None
        if row["status"] == "ok" and base is not None and base["status"] == "ok":
            row["paired"] = {"vs": row["vs"], **paired_gain(base["per_question_f1"],
                                                            row["per_question_f1"])}


# -- output ------------------------------------------------------------------------------------

def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f} s" if value < 120 else f"{value / 60:.1f} min"


def _f1(row: dict[str, Any]) -> str:
    """An ok row's F1 +- SE (percent)."""
    return f"{percent(row['f1'])} +- {percent(row['f1_se'])}"


def _gain(paired: dict[str, Any]) -> str:
    """A paired gain +- SE and the row it is measured against."""
    return f"{100 * paired['gain']:+.1f} +- {percent(paired['gain_se'])} vs {paired['vs']}"


def table_cells(row: dict[str, Any]) -> list[str]:
    """A row's cells: method, pipeline, F1 +- SE, EM, paired gain +- SE (vs), cand. recall,
    wall time."""
    if row["status"] != "ok":
        return [row["label"], row["pipeline"], "failed (below)", "-", "-", "-",
                _seconds(row.get("seconds"))]
    paired = row.get("paired")
    return [row["label"], row["pipeline"], _f1(row), percent(row["em"]),
            _gain(paired) if paired else "-", percent(row.get("candidate_recall")),
            _seconds(row.get("seconds"))]


HEADER = ["method", "pipeline", "F1 +- SE", "EM", "paired F1 gain +- SE", "cand. recall",
          "wall time"]


def _ordered(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [result["rows"][m] for m in result.get("order", result["rows"])
            if m in result["rows"]]


def _failures(result: dict[str, Any]) -> list[str]:
    """One line per failed row: its method and the last line of its error."""
    lines = []
    for row in _ordered(result):
        if row["status"] != "ok":
            error = row.get("error", "").strip().splitlines() or ["(no message)"]
            lines.append(f"{row['method']} failed: {error[-1][:200]}")
    return lines


def _num_questions(result: dict[str, Any]) -> str:
    """The questions the table's rows were evaluated on ("?" before any row finished)."""
    n = next((r["num_questions"] for r in _ordered(result) if r["status"] == "ok"), None)
    return "?" if n is None else str(n)


def _caption(result: dict[str, Any]) -> str:
    table = result["table"]
    return (f"model {table['model']}, {table['eval_split']} split "
            f"{Path(table['eval_file']).name}"
            f" ({_num_questions(result)} questions), scoring {table['scoring']}"
            + (f", K = {table['k']} candidates" if "k" in table else ""))


def format_table(result: dict[str, Any]) -> str:
    """The short printed table (fixed-width text)."""
    cells = [HEADER, *(table_cells(r) for r in _ordered(result))]
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADER))]
    lines = [_caption(result)]
    for index, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if index == 0:
            lines.append("-" * len(lines[-1]))
    return "\n".join(lines + _failures(result))


def format_markdown(result: dict[str, Any]) -> str:
    lines = [f"{_caption(result)}.", "", "| " + " | ".join(HEADER) + " |",
             "| --- | --- |" + " ---: |" * (len(HEADER) - 2)]
    lines += ["| " + " | ".join(table_cells(r)) + " |" for r in _ordered(result)]
    failures = _failures(result)
    lines += ["", *(f"- {line}" for line in failures)] if failures else []
    return "\n".join(lines) + "\n"


def write_plot(result: dict[str, Any], path: Path) -> None:
    """Bars of F1 +- SE per finished row (percent)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in _ordered(result) if r["status"] == "ok"]
    figure, axes = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 4.5))
    positions = range(len(rows))
    axes.bar(positions, [100 * r["f1"] for r in rows],
             yerr=[100 * (r.get("f1_se") or 0.0) for r in rows], capsize=4, color="#4c72b0")
    axes.set_xticks(list(positions), [r["label"] for r in rows], rotation=30, ha="right",
                    fontsize=8)
    for position, row in zip(positions, rows, strict=True):
        axes.annotate(f"{100 * row['f1']:.1f}", (position, 100 * row["f1"]),
                      textcoords="offset points", xytext=(8, 3), fontsize=8)
    axes.set_ylim(bottom=0, top=max([5.0, *(100 * (r["f1"] + (r.get("f1_se") or 0.0)) * 1.15
                                            for r in rows)]))
    axes.set_ylabel("F1 (%) +- standard error")
    axes.set_title(textwrap.fill(_caption(result), 70), fontsize=9)  # long file names wrap
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)


#: Column titles of the named worlds in the combined (README) table.
WORLD_TITLES = {"demo": "demo world", "real": "real HotpotQA",
                "distractor": "HotpotQA distractor"}
README_BEGIN = "<!-- side-by-side:begin"
README_END = "<!-- side-by-side:end -->"


def column_title(result: dict[str, Any]) -> str:
    """A JSON's column in the combined table: its world (or test file), split and size."""
    table = result["table"]
    name = WORLD_TITLES.get(result.get("config", {}).get("world") or "",
                            Path(table["eval_file"]).stem)
    return f"{name}, {table['eval_split']} ({_num_questions(result)} q.)"


def combined_cell(row: dict[str, Any] | None) -> str:
    """F1 +- SE and the paired gain over the row's ``vs`` row; "not run" / "failed"."""
    if row is None:
        return "not run"
    if row["status"] != "ok":
        return "failed"
    paired = row.get("paired")
    return f"{_f1(row)} ({_gain(paired)})" if paired else _f1(row)


def format_combined(results: list[dict[str, Any]]) -> str:
    """One markdown table of several JSONs (a column each), rows in the bench's method order;
    a method appears where at least one JSON has it."""
    methods = [m for m in METHODS if any(m in r["rows"] for r in results)]
    models = sorted({r["table"]["model"] for r in results})
    lines = [f"| method ({', '.join(models)}) | pipeline | "
             + " | ".join(column_title(r) for r in results) + " |",
             "| --- | --- |" + " ---: |" * len(results)]
    for method in methods:
        spec = METHODS[method]
        lines.append(f"| {spec.label} | `{spec.pipeline}` | "
                     + " | ".join(combined_cell(r["rows"].get(method)) for r in results)
                     + " |")
    return "\n".join(lines) + "\n"


def replace_readme_block(text: str, block: str) -> str:
    """``text`` with the lines between the side-by-side markers replaced by ``block`` (the
    marker lines kept); refused where the markers are missing or out of order."""
    lines = text.splitlines(keepends=True)
    begin = [i for i, line in enumerate(lines) if line.startswith(README_BEGIN)]
    end = [i for i, line in enumerate(lines) if line.strip() == README_END]
    if len(begin) != 1 or len(end) != 1 or end[0] < begin[0]:
        raise SystemExit(f"--readme: expected one {README_BEGIN!r} line and one "
                         f"{README_END!r} line after it")
    return "".join(lines[:begin[0] + 1]) + block + "".join(lines[end[0]:])


def row_line(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"failed: {row.get('error', '').strip().splitlines()[-1:]}"
    return (f"F1 {percent(row['f1'])} +- {percent(row['f1_se'])}  EM {percent(row['em'])}  "
            f"{_seconds(row.get('seconds'))}")


def write_outputs(result: dict[str, Any], args: argparse.Namespace, json_path: Path) -> None:
    """The markdown (``--markdown``) and the plot (``--plot``, default beside the JSON)."""
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(format_markdown(result))
    if not args.no_plot:
        write_plot(result, Path(args.plot) if args.plot else json_path.with_suffix(".png"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", choices=sorted(WORLDS),
                        help="the demo world's files or the real HotpotQA files (their "
                             "defaults; the options below override them)")
    parser.add_argument("--train-file", dest="train_file")
    parser.add_argument("--dev-file", dest="dev_file")
    parser.add_argument("--test-file", dest="test_file")
    parser.add_argument("--scoring", choices=sorted(SCORING_PROFILES),
                        help="demo (the evaluator's default profile) or hotpotqa (the "
                             "official script's EM/F1)")
    parser.add_argument("--label-source", dest="label_source",
                        choices=["heuristic", "supporting"],
                        help="the Selector's SFT labels (demo: heuristic, real: supporting)")
    parser.add_argument("--candidate-order", dest="candidate_order",
                        choices=CANDIDATE_ORDERS, default=DEFAULT_CANDIDATE_ORDER,
                        help="the Selector's candidates in its SFT records: shuffled (MMOA-RAG, "
                             "default) or ranked (the order the pipeline shows it: mmoa-cli data "
                             "sft --candidate_order)")
    parser.add_argument("--k", type=int, choices=range(1, 101), metavar="K",
                        help="candidates a question of the three-agent rows: the Selector's SFT "
                             "records and labels, the MAPPO / GRPO rollouts and the evaluations "
                             "(rag K = 1 stays 1; default: the MAPPO config's mappo_top_k, 5)")
    parser.add_argument("--index", help="the index folder the server serves (the HARR row "
                                        "needs it; demo: data/demo/index)")
    parser.add_argument("--rewrites-file", dest="rewrites_file",
                        help="the Query Rewriter's SFT labels (mmoa-cli data qr-rewrites; "
                             f"distractor: {DISTRACTOR_REWRITES})")
    parser.add_argument("--retriever-url", dest="retriever_url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", choices=sorted(CONFIGS), default="smollm2")
    parser.add_argument("--base-model", dest="base_model",
                        help="the base model (default: SmolLM2-135M-Instruct, or the tiny "
                             "model's pt save)")
    parser.add_argument("--warm-start", dest="warm_start",
                        help="an existing three-agent SFT model to use instead of training one")
    parser.add_argument("--methods", nargs="+", default=list(METHODS),
                        help=f"the rows to run, in this order ({', '.join(METHODS)}; default "
                             "all; the rows they start from are added before them)")
    parser.add_argument("--eval-split", dest="eval_split", choices=["dev", "test"],
                        default="test")
    parser.add_argument("--max-eval", dest="max_eval", type=int,
                        help="evaluate on the first N questions of the split only")
    parser.add_argument("--seed", type=int, default=1,
                        help="the seed of the RL rows and HARR's; the other rows do not depend "
                             "on it, so the tables of several seeds run in one --work-dir share "
                             "them (bench/seed_table.py pools the seeds)")
    parser.add_argument("--keep-checkpoints", dest="keep_checkpoints", action="store_true",
                        help="keep the MAPPO / GRPO rows' checkpoint-N folders after training, "
                             "for their dev curve (bench/dev_curve.py; they are deleted by "
                             "default)")
    parser.add_argument("--rl-step", dest="rl_step", type=int,
                        help="evaluate the MAPPO / GRPO rows at their checkpoint of this step "
                             "(chosen on dev with bench/dev_curve.py) instead of their end "
                             "(a training done before kept its checkpoints with "
                             "--keep-checkpoints; one run now keeps them)")
    add_precision_option(parser, default="auto")
    parser.add_argument("--work-dir", dest="work_dir",
                        help="default saves/bench/side_by_side/<world or files>-<model>")
    parser.add_argument("--json-out", dest="json_out",
                        help="the JSON (default <work-dir>/side_by_side.json); read back to "
                             "resume")
    parser.add_argument("--markdown", help="also write the table as markdown here")
    parser.add_argument("--plot", help="the bar plot PNG (default: the JSON's path, .png)")
    parser.add_argument("--no-plot", dest="no_plot", action="store_true")
    parser.add_argument("--report", metavar="JSON", nargs="+",
                        help="print the table of each JSON (and write --markdown / --plot of "
                             "one); nothing is run")
    parser.add_argument("--readme", metavar="README",
                        help="with --report: write the JSONs' combined table (a column each) "
                             "between this file's side-by-side markers")
    parser.add_argument("overrides", nargs="*", metavar="[METHOD.]KEY=VALUE",
                        help="overrides of every training, or of one row's (e.g. "
                             "mappo.max_steps=4)")
    return parser


def resolve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Fill the files, scoring and index from ``--world``; absolute paths; the precision;
    the methods (``--methods`` takes what follows it, so overrides given after it are moved
    back to the overrides; ``a,b`` is ``a b``)."""
    methods = [m for item in args.methods if "=" not in item for m in item.split(",") if m]
    args.overrides = [*args.overrides, *(item for item in args.methods if "=" in item)]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        parser.error(f"--methods: unknown {unknown or 'none given'}; choose from "
                     f"{', '.join(METHODS)}")
    args.methods = methods
    world = WORLDS.get(args.world or "", {})
    for key in ("train_file", "dev_file", "test_file", "scoring", "label_source", "index"):
        if getattr(args, key) is None:
            setattr(args, key, world.get(key) or None)
    if args.rewrites_file is None and Path(world.get("rewrites_file") or "/").is_file():
        args.rewrites_file = world["rewrites_file"]
    missing = [k for k in ("train_file", "test_file", "scoring") if not getattr(args, k)]
    if args.eval_split == "dev" and not args.dev_file:
        missing.append("dev_file")
    if missing:
        parser.error(f"give --world, or {', '.join('--' + m.replace('_', '-') for m in missing)}")
    args.label_source = args.label_source or "supporting"
    for key in ("train_file", "dev_file", "test_file", "index", "warm_start", "base_model",
                "rewrites_file"):
        if getattr(args, key):
            setattr(args, key, str(Path(getattr(args, key)).resolve()))
    for key in ("train_file", "test_file", *(("dev_file",) if args.eval_split == "dev" else ()),
                *(("rewrites_file",) if args.rewrites_file else ())):
        if not Path(getattr(args, key)).is_file():
            parser.error(f"--{key.replace('_', '-')}: no such file {getattr(args, key)}")
    if args.work_dir is None:
        args.work_dir = str(ROOT / "saves" / "bench" / "side_by_side"
                            / f"{args.world or Path(args.train_file).stem}-{args.model}")
    import torch

    from mmoa.precision import resolve_precision, train_overrides

    args.precision = resolve_precision(args.precision)
    args.train_precision = train_overrides(args.precision, torch.cuda.is_available())


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_intermixed_args(argv)  # overrides before, between or after options
    if args.readme and not args.report:
        parser.error("--readme needs --report JSON [JSON ...]")
    if args.report:
        if len(args.report) > 1 and (args.markdown or args.plot):
            parser.error("--markdown / --plot take one --report JSON")
        paths = [Path(p) for p in args.report]
        results = [load_json_or_exit(p, WHAT, RESULT_KEYS) for p in paths]
        if args.readme and not Path(args.readme).is_file():
            fail(f"--readme {args.readme}: no such file")  # before anything is written
        for result in results:
            print(format_table(result), end="\n\n")
        if len(results) == 1:
            write_outputs(results[0], args, paths[0])
        if args.readme:
            readme = Path(args.readme)
            readme.write_text(replace_readme_block(readme.read_text(), format_combined(results)))
        return
    resolve(args, parser)
    split_overrides(args.overrides)  # a malformed override stops here, before any run
    bench = SideBySide(args)
    result = bench.run()
    print()
    print(format_table(result))
    write_outputs(result, args, bench.json_path)
    failed = failed_rows(result, with_dependencies(args.methods))
    if failed:  # the table is written; a chain of scripts must still stop here
        raise SystemExit(f"side_by_side: {len(failed)} row(s) failed ({', '.join(failed)}); "
                         f"the table is in {bench.json_path}: the same command "
                         f"reruns the failed rows and skips the finished ones")


def failed_rows(result: dict[str, Any], planned: list[str]) -> list[str]:
    """The rows of this run (``planned``) that failed, in the table's order."""
    return [name for name in result["order"]
            if name in planned and result["rows"].get(name, {}).get("status") == "failed"]


if __name__ == "__main__":
    main()
