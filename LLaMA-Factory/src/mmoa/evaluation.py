"""Evaluation of the whole pipeline: Acc / EM / F1 plus per-agent statistics.

``mode`` picks the registered pipeline that runs it (:func:`mmoa.pipelines.pipeline_for_mode`):
the pipeline builds the run, writes each question's row and its own columns; this module loads
the data, runs the batches, aggregates and reports, whatever the pipeline.

``mode: search_agent`` evaluates the multi-turn search agent (:mod:`mmoa.agents.search_agent`)
with the same scores, and records per question its turns, retrieval rounds, queries, retrieved
tokens and seconds (the batch's wall time over its questions); every mode reports seconds per
question, so one table compares the search agent with the three-agent modes.

``mode: decision_agent`` evaluates the retrieve-or-answer decision agent (SmartRAG,
:mod:`mmoa.agents.decision_agent`) with ``decision_policy`` ``model`` (the policy decides),
``always`` (retrieve once with the question, then answer) or ``never`` (answer closed book):
besides the scores it reports the retrieval rate (share of questions that searched) and the
searches per question. Whenever the records carry a ``group`` (``known`` / ``world`` in the
decision agent's mixed sets) ``metrics.json`` has ``by_group`` (n, EM, F1, retrieval rate,
searches per group) and the table a row per group under the run's row.

``mode: gold_g`` is an oracle, not a deployable mode: the Generator answers from each record's
gold supporting passages, read from ``gold_corpus`` (:mod:`mmoa.retrieval.gold`), with no Query
Rewriter, Selector or retrieval server. Its F1 bounds what the retrieval side can give the
Generator; the gap to ``rag`` or ``qr_s_g`` is the room the retrieval-side agents leave.

The pipeline runs greedily over a QA set in batches; every question's trace and scores go to
``predictions.jsonl`` and the aggregate to ``metrics.json``. The scores come from
:mod:`mmoa.metrics`, the same functions the MAPPO reward uses, under a named scoring profile
(``EvalConfig.scoring``) that ``metrics.json`` records and every printed table names, so a
reader knows which published script the figures are comparable with.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

from mmoa.agents.generation_cache import check_generation_cache, resolve_generation_cache
from mmoa.agents.modes import ORACLE_MODES
from mmoa.config_values import check_at_least, check_temperature, check_top_p
from mmoa.data.loaders import AMBIGQA_ANSWER_SETS, DEFAULT_AMBIGQA_ANSWERS
from mmoa.data.records import QARecord
from mmoa.data.registry import load_dataset_records
from mmoa.defaults import (
    DECISION_MAX_NEW_TOKENS,
    DECISION_MAX_SEARCHES,
    DECISION_TOP_K,
    GENERATION_CACHE,
    MAX_NEW_TOKENS,
    ROLLOUT_TEMPERATURE,
    ROLLOUT_TOP_P,
    SEARCH_MAX_NEW_TOKENS,
    SEARCH_MAX_QUERIES,
    SEARCH_MAX_TURNS,
    SEARCH_TOP_K,
)
from mmoa.fileio import atomic_write_json, atomic_write_jsonl
from mmoa.metrics import DEFAULT_PROFILE, get_profile
from mmoa.pipelines import eval_modes, pipeline_for_mode
from mmoa.pipelines.decision_agent import score_decision_trajectory
from mmoa.pipelines.qr_s_g import score_trace
from mmoa.pipelines.scoring import rouge_l as _rouge_l
from mmoa.pipelines.scoring import support_precision as _support_precision
from mmoa.pipelines.scoring import support_recall as _support_recall
from mmoa.pipelines.search_agent import score_search_trajectory
from mmoa.precision import (
    autocast,
    check_precision_name,
    device_type_of,
    emulated_bf16_warning,
    resolve_precision,
)

# Each pipeline's rows are written by its own module (mmoa.pipelines); these names are where
# tests and scripts have always imported them from.
__all__ = ["DECISION_AGENT_MODE", "DECISION_POLICIES", "EVAL_MODES", "METRICS_FILE",
           "PREDICTIONS_FILE", "SEARCH_AGENT_MODE", "EvalConfig", "_rouge_l", "_support_precision",
           "_support_recall", "check_context", "check_question_lengths", "check_server_limits",
           "evaluate", "format_paired_gains", "format_table", "load_metrics", "load_records",
           "paired_gain", "per_question_f1", "score_decision_trajectory",
           "score_search_trajectory", "score_trace", "scoring_label", "scoring_legend",
           "standard_error", "summarize"]

#: The search agent's evaluation mode, beside the three-agent pipeline's modes.
SEARCH_AGENT_MODE = "search_agent"
#: The decision agent's evaluation mode (SmartRAG: answer or search, with a retrieval rate).
DECISION_AGENT_MODE = "decision_agent"
#: Every registered pipeline's evaluation modes (:func:`mmoa.pipelines.eval_modes`).
EVAL_MODES: tuple[str, ...] = eval_modes()
#: ``decision_policy``: the policy decides, or one of the two baselines.
DECISION_POLICIES: tuple[str, ...] = ("model", "always", "never")
PREDICTIONS_FILE = "predictions.jsonl"
METRICS_FILE = "metrics.json"


@dataclass
class EvalConfig:
    """Everything one evaluation run needs (the CLI maps its arguments onto this)."""

    model_name_or_path: str
    template: str
    output_dir: str
    adapter_name_or_path: str | None = None
    dataset: str | None = None
    dataset_dir: str = "data"
    data_file: str | None = None
    data_format: str = "auto"
    retriever_url: str = "http://127.0.0.1:8000"
    retriever_token: str | None = None
    mode: str = "qr_s_g"
    k: int = 10
    batch_size: int = 16
    max_samples: int | None = None
    #: The scoring profile of :mod:`mmoa.metrics` (``mmoa``, ``squad`` or ``hotpotqa``).
    scoring: str = DEFAULT_PROFILE
    #: The gold answer set of an AmbigQA file (see :mod:`mmoa.data.loaders`).
    ambigqa_answers: str = DEFAULT_AMBIGQA_ANSWERS
    max_new_tokens_qr: int = MAX_NEW_TOKENS["qr"]
    max_new_tokens_selector: int = MAX_NEW_TOKENS["selector"]
    max_new_tokens_generator: int = MAX_NEW_TOKENS["generator"]
    #: ``mode: search_agent``: search rounds before the answer is forced, queries per search,
    #: documents per query and new tokens per model turn.
    search_max_turns: int = SEARCH_MAX_TURNS
    search_max_queries: int = SEARCH_MAX_QUERIES
    search_top_k: int = SEARCH_TOP_K
    max_new_tokens_search: int = SEARCH_MAX_NEW_TOKENS
    #: ``mode: decision_agent``: searches before the answer is forced, documents per search,
    #: new tokens per turn, and who decides (``model``, or the ``always`` / ``never`` baseline).
    decision_max_searches: int = DECISION_MAX_SEARCHES
    decision_top_k: int = DECISION_TOP_K
    max_new_tokens_decision: int = DECISION_MAX_NEW_TOKENS
    decision_policy: str = "model"
    #: ``auto`` (bf16 autocast where the hardware has bf16, see :mod:`mmoa.precision`), ``bf16``
    #: or ``fp32``.
    precision: str = "auto"
    #: The KV cache of the ``generate`` calls: ``dynamic``, ``static`` (compiled decoding on
    #: CUDA) or ``auto`` (:mod:`mmoa.agents.generation_cache`).
    generation_cache: str = GENERATION_CACHE
    #: Sampled instead of greedy decoding, with the RL rollouts' defaults: what a policy does as
    #: it is trained (greedy decoding can hide a shift of probability mass that sampling shows).
    #: ``seed`` makes a sampled run repeatable.
    do_sample: bool = False
    temperature: float = ROLLOUT_TEMPERATURE
    top_p: float = ROLLOUT_TOP_P
    seed: int = 0
    #: ``mode: gold_g``: where the gold passages are read from (the corpus file, or the index
    #: folder, that the records' supporting ids or titles name); refused by the other modes.
    gold_corpus: str | None = None

    def validate(self) -> None:
        pipeline_for_mode(self.mode)  # "mode must be one of ...": the registered modes
        check_precision_name(self.precision)
        check_generation_cache(self.generation_cache)
        get_profile(self.scoring)
        if self.ambigqa_answers not in AMBIGQA_ANSWER_SETS:
            raise ValueError(f"ambigqa_answers must be one of {', '.join(AMBIGQA_ANSWER_SETS)}, "
                             f"got {self.ambigqa_answers!r}")
        if (self.dataset is None) == (self.data_file is None):
            raise ValueError("give exactly one of --dataset (a registered name) or --data_file")
        for name in ("k", "batch_size", "search_max_turns", "search_max_queries",
                     "search_top_k", "max_new_tokens_search", "decision_top_k",
                     "max_new_tokens_decision"):
            check_at_least(name, getattr(self, name))
        # the ranges every sampled stage shares (mmoa.config_values): 1e-320 sampled with
        # every logit inf (a traceback)
        self.temperature = check_temperature("temperature", self.temperature)
        self.top_p = check_top_p("top_p", self.top_p)
        check_at_least("decision_max_searches", self.decision_max_searches, 0)
        if self.decision_policy not in DECISION_POLICIES:
            raise ValueError(f"decision_policy must be one of {', '.join(DECISION_POLICIES)}, "
                             f"got {self.decision_policy!r}")
        if self.decision_policy != "model" and self.mode != DECISION_AGENT_MODE:
            raise ValueError(f"decision_policy {self.decision_policy} needs mode "
                             f"{DECISION_AGENT_MODE}, got mode {self.mode}")
        if self.mode in ORACLE_MODES:
            if self.gold_corpus is None:
                raise ValueError(f"mode {self.mode} needs --gold_corpus: the corpus file or index "
                                 "folder the records' gold passages are read from")
            if not Path(self.gold_corpus).exists():
                raise ValueError(f"gold_corpus {self.gold_corpus} not found (a corpus "
                                 ".jsonl/.tsv file or an index folder)")
        elif self.gold_corpus is not None:
            raise ValueError(f"gold_corpus is read only by mode {', '.join(ORACLE_MODES)} (the "
                             f"Generator on the gold passages), got mode {self.mode}")
        out = Path(self.output_dir)
        if out.exists() and not out.is_dir():
            # else the whole run went by and the write at the end failed with a traceback
            raise ValueError(f"output_dir {out} exists and is not a folder (predictions.jsonl "
                             f"and metrics.json are written into it)")
        # a file on the way to it (output_dir=metrics.json/run) was a NotADirectoryError
        # traceback when the folder was made
        above = next((p for p in out.parents if p.exists()), None)
        if above is not None and not above.is_dir():
            raise ValueError(f"output_dir {out} cannot be made: {above} is a file, not a folder")

    @property
    def retrieval_k(self) -> tuple[str, int] | None:
        """``(option, documents per query)`` of the mode's retrievals; ``None``: none (the
        mode's pipeline says)."""
        return pipeline_for_mode(self.mode).eval_retrieval_k(self)

    @property
    def needs_retriever(self) -> bool:
        """Whether the run sends queries to the retrieval server (closed-book runs need none,
        and the oracle modes read the gold passages from ``gold_corpus`` instead)."""
        return self.retrieval_k is not None and self.mode not in ORACLE_MODES


def load_records(config: EvalConfig) -> list[QARecord]:
    return load_dataset_records(config.dataset, config.dataset_dir, config.data_file,
                                config.data_format, config.max_samples,
                                ambigqa_answers=config.ambigqa_answers)


def standard_error(values: Sequence[float]) -> float | None:
    """Standard error of the mean, ``stdev / sqrt(n)`` (``None`` for fewer than 2 values)."""
    if len(values) < 2:
        return None
    return stdev(values) / math.sqrt(len(values))


def _group_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per ``group`` of the records: n, EM, F1 and, for the decision agent, the retrieval rate
    and searches per question (empty when no record has a group)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("group") is not None:
            groups.setdefault(r["group"], []).append(r)
    out: dict[str, Any] = {}
    for name, members in sorted(groups.items()):
        stats = [m["agent_stats"]["decision"] for m in members
                 if "decision" in m["agent_stats"]]
        out[name] = {"num_questions": len(members),
                     **{m: _mean([r["scores"][m] for r in members]) for m in ("em", "f1")},
                     "retrieval_rate": _mean([s["retrieved"] for s in stats]),
                     "mean_searches": _mean([s["searches"] for s in stats])}
    return out


def _mean(values: list[Any]) -> float | None:
    numbers = [float(v) for v in values if v is not None]
    return fmean(numbers) if numbers else None


def selector_choices(selections: Sequence[Sequence[int]]) -> dict[str, Any]:
    """How a Selector chose over the questions (each selection: the candidate indices it
    kept): the share of questions by number of documents kept, the share that kept each
    candidate index, how many distinct choices it made and its most frequent one with its
    share. A Selector that learnt one constant answer, such as "keep the top candidate"
    (``rag`` with K = 1), shows ``most_common_share`` 1.0: the mean number kept cannot tell it
    from one that keeps one document chosen per question."""
    n = len(selections)
    if n == 0:
        return {}
    chosen = [tuple(sorted(set(s))) for s in selections]
    sizes = Counter(len(c) for c in chosen)
    positions = Counter(i for c in chosen for i in c)
    top, count = Counter(chosen).most_common(1)[0]
    return {"num_selected_share": {str(k): sizes[k] / n for k in sorted(sizes)},
            "position_share": {str(k): positions[k] / n for k in sorted(positions)},
            "distinct_choices": len(set(chosen)),
            "most_common_choice": list(top), "most_common_share": count / n}


def summarize(rows: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    """Aggregate metrics (fractions in [0, 1]) and per-agent statistics."""
    def column(agent: str, key: str) -> list[Any]:
        return [r["agent_stats"][agent][key] for r in rows if agent in r["agent_stats"]]

    metrics: dict[str, Any] = {
        "mode": mode,
        "num_questions": len(rows),
        **{m: _mean([r["scores"][m] for r in rows]) for m in ("acc", "em", "f1", "rouge_l")},
        **{f"{m}_se": standard_error([float(r["scores"][m]) for r in rows])
           for m in ("acc", "em", "f1")},
        "agents": {},
    }
    agents = metrics["agents"]
    if column("qr", "num_subquestions"):
        agents["qr"] = {"mean_subquestions": _mean(column("qr", "num_subquestions")),
                        "well_formed_rate": _mean(column("qr", "well_formed"))}
    if column("retrieval", "support_recall"):
        agents["retrieval"] = {"candidate_support_recall":
                               _mean(column("retrieval", "support_recall"))}
    if column("selector", "num_selected"):
        agents["selector"] = {"mean_selected": _mean(column("selector", "num_selected")),
                              "well_formed_rate": _mean(column("selector", "well_formed")),
                              "support_recall": _mean(column("selector", "support_recall")),
                              "support_precision": _mean(column("selector",
                                                                "support_precision")),
                              "choices": selector_choices([r["selected_ids"] for r in rows
                                                           if "selector" in r["agent_stats"]])}
    if column("search", "turns"):
        agents["search"] = {"mean_turns": _mean(column("search", "turns")),
                            "mean_searches": _mean(column("search", "searches")),
                            "mean_queries": _mean(column("search", "queries")),
                            "mean_retrieved_tokens": _mean(column("search", "retrieved_tokens")),
                            "well_formed_rate": _mean(column("search", "well_formed")),
                            "forced_rate": _mean(column("search", "forced"))}
    if column("decision", "searches"):
        agents["decision"] = {"retrieval_rate": _mean(column("decision", "retrieved")),
                              "mean_searches": _mean(column("decision", "searches")),
                              "mean_retrieved_tokens": _mean(column("decision",
                                                                    "retrieved_tokens")),
                              "well_formed_rate": _mean(column("decision", "well_formed")),
                              "forced_rate": _mean(column("decision", "forced"))}
    by_group = _group_metrics(rows)
    if by_group:
        metrics["by_group"] = by_group
    if column("generator", "answer_words"):
        agents["generator"] = {"mean_answer_words": _mean(column("generator", "answer_words")),
                               "well_formed_rate": _mean(column("generator", "well_formed"))}
    by_type: dict[str, list[float]] = {}
    for r in rows:
        by_type.setdefault(r.get("type") or "all", []).append(r["scores"]["f1"])
    metrics["f1_by_type"] = {t: fmean(v) for t, v in sorted(by_type.items())}
    return metrics


def check_server_limits(config: EvalConfig, health: dict[str, Any]) -> None:
    """The documents per query the mode asks for against the server's ``max_k`` (from
    ``/health``; not checked where the server does not report it): a ``ValueError`` naming
    the option before the model loads, instead of the server's 400 at the first batch."""
    limits = health.get("limits") if isinstance(health, dict) else None
    max_k = limits.get("max_k") if isinstance(limits, dict) else None
    wanted = config.retrieval_k
    if wanted is None or not isinstance(max_k, int) or isinstance(max_k, bool):
        return
    option, k = wanted
    if k > max_k:
        raise ValueError(f"--{option} {k} exceeds the retrieval server's max_k ({max_k}) at "
                         f"{config.retriever_url}: lower --{option}, or restart the server "
                         f"with --max-k {k}")


def check_question_lengths(config: EvalConfig, records: Sequence[QARecord],
                           health: dict[str, Any]) -> None:
    """Every question against the server's ``max_query_chars`` (from ``/health``), before the
    model loads: every retrieving mode may search the question itself (``rag`` always, the
    Query Rewriter's modes when its output is unusable), and the server's 400 at that batch
    ended the run after the model had loaded, or a qr_s_g run went through because the
    rewriter happened to write short queries. The Playground refuses the same questions."""
    limits = health.get("limits") if isinstance(health, dict) else None
    limit = limits.get("max_query_chars") if isinstance(limits, dict) else None
    if config.retrieval_k is None or not isinstance(limit, int) or isinstance(limit, bool):
        return
    long = [r for r in records if len(r.question) > limit]
    if long:
        first, longest = long[0], max(len(r.question) for r in long)
        raise ValueError(f"{len(long)} question(s) longer than the retrieval server's "
                         f"max_query_chars ({limit:,}) at {config.retriever_url}, e.g. id "
                         f"{first.id!r} ({len(first.question):,} characters): shorten them, "
                         f"drop them from the file, or restart the server with "
                         f"--max-query-chars {longest}")


def check_context(config: EvalConfig, model: Any, tokenizer: Any,
                  records: Sequence[QARecord]) -> None:
    """Every question against the model's context, before anything is generated: each prompt
    of ``config.mode`` that holds the question, plus the tokens that agent may write, must
    fit (:mod:`mmoa.agents.context_limit`). Refused in one line naming the first question's
    id and both sizes, not truncated: a cut question is scored against another question's
    gold answer."""
    from mmoa.agents.context_limit import check_questions_fit, model_context, question_prompts
    from mmoa.agents.render import PromptRenderer

    budgets = {"qr": config.max_new_tokens_qr, "selector": config.max_new_tokens_selector,
               "generator": config.max_new_tokens_generator,
               "search": config.max_new_tokens_search,
               "decision": config.max_new_tokens_decision}
    prompts = question_prompts(config.mode, budgets,
                               search_max_queries=config.search_max_queries)
    check_questions_fit(PromptRenderer(tokenizer, config.template),
                        model_context(model, tokenizer), [r.question for r in records],
                        prompts, [r.id for r in records])


def evaluate(config: EvalConfig, *, progress: bool = True) -> dict[str, Any]:
    """Runs the pipeline of ``config.mode`` (:func:`mmoa.pipelines.pipeline_for_mode`) over the
    dataset and writes ``predictions.jsonl`` and ``metrics.json``."""
    from tqdm.auto import tqdm

    from mmoa.modeling import load_for_inference
    from mmoa.retrieval.client import RetrievalClient

    config.validate()
    records = load_records(config)
    retriever: Any = None
    if config.mode in ORACLE_MODES:
        from mmoa.retrieval.gold import GoldPassages

        # every record's gold passages, before the model loads (the errors name what is wrong)
        assert config.gold_corpus is not None  # validate()
        retriever = GoldPassages.from_records(records, config.gold_corpus, per_title=config.k)
    elif config.needs_retriever:
        retriever = RetrievalClient(config.retriever_url, token=config.retriever_token)
        # fail before the model is loaded when the server is not there, or cannot answer k
        # or a question
        health = retriever.health()
        check_server_limits(config, health)
        check_question_lengths(config, records, health)
    precision = resolve_precision(config.precision)  # once: the weights and the autocast agree
    try:
        model, tokenizer = load_for_inference(
            config.model_name_or_path, config.template, config.adapter_name_or_path,
            precision=precision)
    except OSError as err:  # transformers' "Failed to load tokenizer." and the like: a traceback
        raise ValueError(f"model_name_or_path {config.model_name_or_path} cannot be loaded "
                         f"({type(err).__name__}: {str(err).strip().splitlines()[0]}); is it a "
                         f"complete model folder (config.json, weights, tokenizer)?") from err
    check_context(config, model, tokenizer, records)
    from mmoa.agents.pipeline import GenerationSettings

    settings = GenerationSettings(
        do_sample=config.do_sample, temperature=config.temperature, top_p=config.top_p,
        max_new_tokens={"qr": config.max_new_tokens_qr,
                        "selector": config.max_new_tokens_selector,
                        "generator": config.max_new_tokens_generator},
        cache=config.generation_cache)
    if config.do_sample:
        from transformers import set_seed

        set_seed(config.seed)
    pipeline = pipeline_for_mode(config.mode)
    run = pipeline.evaluator(model, tokenizer, retriever, settings, config)
    device_type = device_type_of(model)
    if (warning := emulated_bf16_warning(precision == "bf16", device_type == "cuda")) is not None:
        print(f"[eval] warning: {warning}", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    timings: dict[str, float] = {}
    start = time.perf_counter()
    batches = range(0, len(records), config.batch_size)
    label = pipeline.eval_label(config)
    for offset in tqdm(batches, desc=f"evaluate {label}", unit="batch", disable=not progress):
        batch = records[offset: offset + config.batch_size]
        with autocast(precision, device_type):
            result = run([r.question for r in batch])
        for key, seconds in result.timings.as_dict().items():
            timings[key] = timings.get(key, 0.0) + seconds
        rows.extend(pipeline.eval_row(record, trace, config)
                    for record, trace in zip(batch, result.traces, strict=True))
    metrics = summarize(rows, config.mode)
    metrics.update(pipeline.eval_metrics(config))
    metrics["scoring"] = get_profile(config.scoring).as_dict()
    total = time.perf_counter() - start
    metrics["seconds"] = {"total": total, **timings}
    metrics["seconds_per_question"] = total / len(rows) if rows else None
    weights = str(next(model.parameters()).dtype).removeprefix("torch.")
    metrics["config"] = {**asdict(config), "precision": precision, "weights_dtype": weights,
                         "generation_cache_used": resolve_generation_cache(
                             config.generation_cache, device_type)}
    out = Path(config.output_dir)
    atomic_write_jsonl(out / PREDICTIONS_FILE, rows)
    atomic_write_json(out / METRICS_FILE, metrics)
    return metrics


# -- reports ---------------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


#: Label of a run from before scoring profiles that used the SQuAD normaliser: it kept answer
#: extraction and the yes/no rule, so it matches none of the profiles.
_LEGACY_SQUAD = "squad*"


def scoring_label(metrics: dict[str, Any]) -> str:
    """The scoring profile a ``metrics.json`` was scored with (older files: from the config)."""
    scoring = metrics.get("scoring")
    if isinstance(scoring, dict) and isinstance(scoring.get("profile"), str):
        return scoring["profile"]
    normalizer = metrics.get("config", {}).get("normalizer")
    if normalizer is None:
        return "?"
    return DEFAULT_PROFILE if normalizer == DEFAULT_PROFILE else _LEGACY_SQUAD


def scoring_legend(named_metrics: Sequence[tuple[str, dict[str, Any]]]) -> list[str]:
    """One line per scoring profile in a table: what its name in the ``scoring`` column means."""
    lines = []
    for label in dict.fromkeys(scoring_label(m) for _, m in named_metrics):
        if label == _LEGACY_SQUAD:
            lines.append(f"{label}: squad normaliser with answer extraction and the yes/no rule "
                         "(a run from before scoring profiles; matches no published script)")
        elif label == "?":
            lines.append("?: the metrics file does not say how it was scored")
        else:
            lines.append(get_profile(label).describe())
    return ["scoring " + line for line in lines]


def format_table(named_metrics: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """One table: a row per run with its scoring profile, Acc / EM / F1, the per-agent
    statistics, the search agent's retrieval rounds, queries and retrieved tokens per question
    and its well-formed rate, the decision agent's retrieval rate (``ret%``; its searches are in
    ``rounds``), and seconds per question for every mode (:func:`scoring_legend` says what the
    profile names mean; a sampled run's mode says so). A run whose records have groups gets a
    row per group below its own (``run / group``: n, EM, F1, retrieval rate and searches of the
    group)."""
    header = ["run", "mode", "scoring", "n", "Acc", "EM", "F1", "+-F1", "QR subq", "QR ok%",
              "cand rec%", "S sel", "S ok%", "S rec%", "G words", "G ok%", "rounds",
              "queries", "ret tok", "fmt ok%", "ret%", "s/q"]
    lines = []
    for name, m in named_metrics:
        agents = m.get("agents", {})
        qr, sel = agents.get("qr", {}), agents.get("selector", {})
        gen, ret = agents.get("generator", {}), agents.get("retrieval", {})
        search = agents.get("search") or agents.get("decision") or {}
        ret_tokens = search.get("mean_retrieved_tokens")
        mode = str(m.get("mode", "?"))
        if m.get("decision_policy") not in (None, "model"):
            mode = f"{mode}/{m['decision_policy']}"
        if m.get("config", {}).get("do_sample"):
            mode = f"{mode} (sampled)"
        lines.append([
            name, mode, scoring_label(m), str(m.get("num_questions", "?")),
            _pct(m.get("acc")),
            _pct(m.get("em")), _pct(m.get("f1")), _pct(m.get("f1_se")),
            _num(qr.get("mean_subquestions")),
            _pct(qr.get("well_formed_rate")), _pct(ret.get("candidate_support_recall")),
            _num(sel.get("mean_selected")), _pct(sel.get("well_formed_rate")),
            _pct(sel.get("support_recall")), _num(gen.get("mean_answer_words")),
            _pct(gen.get("well_formed_rate")), _num(search.get("mean_searches")),
            _num(search.get("mean_queries")),
            "-" if ret_tokens is None else f"{ret_tokens:.0f}",
            _pct(search.get("well_formed_rate")), _pct(search.get("retrieval_rate")),
            _num(m.get("seconds_per_question")),
        ])
        for group, g in m.get("by_group", {}).items():
            row = ["-"] * len(header)
            row[:4] = [f"{name} / {group}", mode, scoring_label(m), str(g["num_questions"])]
            row[5], row[6] = _pct(g.get("em")), _pct(g.get("f1"))
            row[header.index("rounds")] = _num(g.get("mean_searches"))
            row[header.index("ret%")] = _pct(g.get("retrieval_rate"))
            lines.append(row)
    widths = [max(len(str(row[i])) for row in [header, *lines]) for i in range(len(header))]
    def fmt(row: list[str]) -> str:
        return "  ".join(str(c).ljust(w) if i < 3 else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True)))
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(header), rule, *(fmt(row) for row in lines)])


def per_question_f1(eval_dir: str | Path) -> dict[str, float]:
    """Question id -> F1, from an evaluation's ``predictions.jsonl``."""
    lines = (Path(eval_dir) / PREDICTIONS_FILE).read_text(encoding="utf-8").splitlines()
    rows = [json.loads(line) for line in lines if line.strip()]
    return {row["id"]: float(row["scores"]["f1"]) for row in rows}


def paired_gain(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean per-question F1 gain of ``after`` over ``before`` on the questions both scored, and
    its standard error (paired: the question-to-question spread both runs share cancels out)."""
    diffs = [after[q] - before[q] for q in before if q in after]
    if not diffs:
        raise ValueError("the two runs share no question")
    se = standard_error(diffs)
    return {"gain": fmean(diffs), "gain_se": float("nan") if se is None else se,
            "n": len(diffs)}


def format_paired_gains(named_dirs: Sequence[tuple[str, str | Path]], of: str) -> list[str]:
    """Lines with the paired F1 gain of run ``of`` over each other run (on the questions both
    answered, from their ``predictions.jsonl``): what tells two rows apart on the same
    questions, where the rows' own standard errors overlap. Runs without predictions are left
    out."""
    dirs = {name: Path(path) if Path(path).is_dir() else Path(path).parent
            for name, path in named_dirs}
    if of not in dirs:
        raise ValueError(f"--paired {of!r}: no such run (runs: {', '.join(dirs)})")
    if not (dirs[of] / PREDICTIONS_FILE).is_file():
        return []
    after = per_question_f1(dirs[of])
    lines = [f"paired F1 gain of {of} (same questions, +- standard error):"]
    for name, folder in dirs.items():
        if name == of or not (folder / PREDICTIONS_FILE).is_file():
            continue
        gain = paired_gain(per_question_f1(folder), after)
        lines.append(f"  over {name}: {100 * gain['gain']:+.1f} +- {100 * gain['gain_se']:.1f}"
                     f" (n={gain['n']})")
    return lines if len(lines) > 1 else []


def load_metrics(path: str | Path) -> dict[str, Any]:
    source = Path(path)
    if source.is_dir():
        source = source / METRICS_FILE
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no metrics file (run an evaluation first)")
    try:
        return json.loads(source.read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError and undecodable bytes alike
        raise ValueError(f"{source}: not a metrics file ({err})") from err
