"""Greedy evaluation of a query encoder: the rollout's retrieval rounds without sampling.

What the ``retriever_rl`` stage trains is measured with the same states it trained on: one
greedy retrieval per sub-query (``retriever_queries``), each state with or without its history
(``retriever_history``), the history observing the top ``top_k`` passages as the rollout does.
Per question: the recall of its gold passages (``supporting_ids``, or the titles of
``supporting_titles`` for HotpotQA / 2Wiki: :class:`mmoa.data.support.GoldSupport`) among the
top ``k`` of every round, for each ``k`` of ``recall_at`` (the top ``k`` of each round
together, duplicates once), and, with a generator, the answer's EM and F1 when the frozen
generator answers from the top ``top_k`` of every round (the rollout's documents).

The server embeds the queries with whichever encoder it serves: make it serve the one to be
measured first (``RetrievalClient.reload_encoder``). For ``retriever_queries: question`` the
recall@5 here equals ``mmoa-cli eval --mode rag --k 5``'s ``candidate_support_recall``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from mmoa.data.records import QARecord
from mmoa.data.support import GoldSupport
from mmoa.evaluation import standard_error

#: The ``k`` of the recall reported by default (recall@k of the gold passages).
RECALL_AT = (3, 5)


def frozen_generator(model_name_or_path: str, template: str, max_new_tokens: int,
                     batch_size: int, use_cpu: bool = False) -> Any:
    """The frozen answerer of the stage and of its evaluation, loaded from a model folder
    (on the CPU with ``use_cpu`` even where CUDA is present)."""
    from mmoa.modeling import load_for_inference

    model, tokenizer = load_for_inference(model_name_or_path, template, use_cpu=use_cpu)
    return rag_generator(model, tokenizer, template, max_new_tokens, batch_size)


def rag_generator(model: Any, tokenizer: Any, template: Any, max_new_tokens: int,
                  batch_size: int) -> Any:
    """The plain RAG Generator over a loaded model, greedy, so that its answer depends on the
    retrieved documents alone (the joint MAPPO option passes its live policy)."""
    from mmoa.agents.pipeline import GenerationSettings, RagPipeline

    settings = GenerationSettings(do_sample=False)
    settings.max_new_tokens["generator"] = max_new_tokens
    return RagPipeline(model, tokenizer, template, None, mode="g", settings=settings,
                       batch_size=batch_size)


def answer_documents(generator: Any, questions: Sequence[str],
                     documents: Sequence[Sequence[str]]) -> list[str]:
    """The generator's parsed answer to each question from its documents (the project's RAG
    prompt), one batched pass."""
    from mmoa.agents.parsers import parse_answer
    from mmoa.agents.prompts import generator_prompt

    prompts = [generator_prompt(q, list(d)) for q, d in zip(questions, documents, strict=True)]
    return [parse_answer(call.response_text).answer
            for call in generator.generate("generator", prompts)]


def has_gold_passages(record: QARecord) -> bool:
    """Whether ``record`` names its gold passages (ids, or titles), as the recall needs."""
    return GoldSupport.of(record) is not None


#: What a question needs for the recall (the errors that refuse one without say it).
GOLD_PASSAGES = "gold passages (supporting_ids, or supporting_titles for HotpotQA / 2Wiki)"


def support_recall(record: QARecord, documents: Iterable[dict[str, Any]]) -> float:
    """Fraction of ``record``'s gold passages among the retrieved ``{"id", "contents"}``
    documents: the project's one matching rule (:class:`mmoa.data.support.GoldSupport`; its
    passages are read as candidates, whose position plays no part). The record must name its
    gold passages."""
    from mmoa.agents.candidates import Candidate

    support = GoldSupport.of(record)
    if support is None:
        raise ValueError(f"record {record.id!r} names no gold passage")
    return support.recall([Candidate(doc, 0, 0) for doc in documents])


def evaluate_encoder(records: Sequence[QARecord], client: Any, *, queries: str, history: bool,
                     top_k: int, recall_at: Sequence[int] = RECALL_AT,
                     generator: Any = None) -> dict[str, Any]:
    """Recall@k of the gold passages and, with ``generator``, answer EM/F1 for ``records``.

    Returns ``{"summary": {...}, "rows": [...]}``: a row per question (``id``, ``type``,
    ``recall@k`` ..., ``documents`` the ids the generator is given, and ``answer``, ``em``,
    ``f1`` with a generator), the summary the means overall and by question type (with the
    F1's standard error).
    """
    from mmoa.metrics import exact_match, f1_score
    from mmoa.train.retriever_rl.state import retrieval_rounds, sub_queries

    if not records:
        raise ValueError("no questions to evaluate")
    unlabelled = [r.id for r in records if not has_gold_passages(r)]
    if unlabelled:
        raise ValueError(f"recall needs the {GOLD_PASSAGES} of every question; "
                         f"{len(unlabelled)} have none (e.g. {unlabelled[0]!r})")
    depth = max(top_k, *recall_at)

    def greedy(states: list[str], _hop: int) -> list[dict[str, Any]]:
        return [{"documents": docs} for docs in client.retrieve(states, topk=depth)]

    subs = [sub_queries(r, queries) for r in records]
    documents, events = retrieval_rounds(subs, history, greedy, keep=top_k)
    ranked: list[list[list[dict[str, Any]]]] = [[] for _ in records]  # per question, round
    for i, _state, result in events:
        ranked[i].append(result["documents"])
    rows: list[dict[str, Any]] = []
    for record, rounds, docs in zip(records, ranked, documents, strict=True):
        row: dict[str, Any] = {"id": record.id, "type": record.type, "rounds": len(rounds),
                               "documents": list(docs)}
        for k in recall_at:
            row[f"recall@{k}"] = support_recall(record, [d for r in rounds for d in r[:k]])
        rows.append(row)
    if generator is not None:
        answers = answer_documents(generator, [r.question for r in records],
                                   [[d["contents"] for d in docs.values()] for docs in documents])
        for row, record, answer in zip(rows, records, answers, strict=True):
            row.update(answer=answer, em=exact_match(answer, record.answers),
                       f1=f1_score(answer, record.answers))
    return {"summary": summarize(rows), "rows": rows}


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means of every score column overall and by question type; ``f1_se`` beside ``f1``."""
    columns = [c for c in rows[0] if c.startswith("recall@") or c in ("em", "f1")]

    def means(group: Sequence[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {"n": len(group)}
        for column in columns:
            values = [float(r[column]) for r in group]
            out[column] = sum(values) / len(values)
            if column == "f1":
                out["f1_se"] = standard_error(values)
        return out

    by_type: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_type[str(row["type"])].append(row)
    return {**means(rows), "by_type": {t: means(g) for t, g in sorted(by_type.items())}}
