"""The multi-turn search agent pipeline (RAG-R1 / Search-R1) with parallel multi-query retrieval.

One model, one growing response per trajectory::

    prompt | turn 1 (model) | information 1 (appended) | turn 2 (model) | ... | answer (model)

Each round, every active trajectory generates one turn in batched ``generate`` calls that stop
at ``</search>`` or ``</answer>`` (stop strings) or at the end of turn, so the model never writes
the information itself. Then ALL queries of all trajectories that searched in that round go to
the retrieval server as ONE batched request (:meth:`DocumentRetriever.search_documents`, the
server's Search-R1 ``/retrieve`` API; each distinct query once), and each trajectory gets its
``<information>`` block. After ``max_turns`` search rounds the last block says no more searches
are allowed and the next turn is started with ``<answer>``, so the answer is forced.

The information is appended as an *observation* turn of the model's chat template (what
LLaMA-Factory's ShareGPT ``observation`` role renders), the very ids the format-learning SFT data
is trained on (:mod:`mmoa.data.search_agent_sft`). Every trajectory keeps a ``loss_mask`` over its
response ids: 1 on the tokens the model sampled, 0 on everything the pipeline appended (the
template's end-of-turn tail the model did not sample, the information turns, the forced
``<answer>``), which is what keeps retrieved text out of the RL loss and KL.

A turn that is neither a well-formed search nor an answer ends its trajectory at once with a
:class:`mmoa.agents.search_tags.StopReason` saying why.

The loop is shared: the retrieve-or-answer decision agent (:mod:`mmoa.agents.decision_agent`) is
a subclass that replaces only the prompt, the parser, the observation text, the stop strings and
the forced prefix (the ``_prompt``, ``_parse`` and ``_information`` hooks and the class
attributes below), so both agents run the same generation, retrieval and loss-mask code.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from mmoa.agents.generation_cache import cache_kwargs
from mmoa.agents.pipeline import DocumentRetriever, GenerationSettings, ModelPipeline
from mmoa.agents.prompts import ChatMessages
from mmoa.agents.render import PromptRenderer
from mmoa.agents.search_tags import (
    FORCED_ANSWER_PREFIX,
    STOP_STRINGS,
    StopReason,
    TurnParse,
    format_information,
    parse_turn,
    search_prompt,
)
from mmoa.config_values import check_at_least
from mmoa.defaults import (
    SEARCH_MAX_NEW_TOKENS,
    SEARCH_MAX_QUERIES,
    SEARCH_MAX_TURNS,
    SEARCH_TOP_K,
)

if TYPE_CHECKING:
    from transformers import LogitsProcessor, PreTrainedModel, PreTrainedTokenizerBase


@dataclass(frozen=True)
class RetrievedPassage:
    """A document shown to the model (``"title\ntext"``), for gold-support statistics."""

    id: str | None
    text: str


@dataclass
class SearchTurn:
    """One model turn: what it wrote, how it parsed, and the information appended after it."""

    text: str
    parse: TurnParse
    forced: bool = False
    information: str | None = None
    retrieved_tokens: int = 0


@dataclass
class SearchTrajectory:
    """Everything one rollout of one question did."""

    question: str
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    #: Same length as ``response_ids``: 1 where the model sampled the token, 0 where the pipeline
    #: appended it (information, template tails, the forced ``<answer>``).
    loss_mask: list[int] = field(default_factory=list)
    turns: list[SearchTurn] = field(default_factory=list)
    answer: str = ""
    #: A :class:`StopReason` (the decision agent: a ``DecisionStop``); ``None`` while running.
    stop_reason: Any = None
    #: Wall-clock seconds of the batch this trajectory ran in, divided by its trajectories.
    seconds: float = 0.0
    #: Every document shown in an ``<information>`` block, in order.
    retrieved_passages: list[RetrievedPassage] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def well_formed(self) -> bool:
        return self.stop_reason is not None and self.stop_reason.well_formed

    @property
    def num_searches(self) -> int:
        """Retrieval rounds of this trajectory."""
        return sum(t.information is not None for t in self.turns)

    @property
    def num_queries(self) -> int:
        return sum(len(t.parse.queries) for t in self.turns if t.information is not None)

    @property
    def retrieved_tokens(self) -> int:
        return sum(t.retrieved_tokens for t in self.turns)

    @property
    def model_tokens(self) -> int:
        return sum(self.loss_mask)

    def _append(self, ids: Sequence[int], sampled: bool) -> None:
        self.response_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (predictions files)."""
        return {
            "question": self.question,
            "prediction": self.answer,
            "stop_reason": None if self.stop_reason is None else self.stop_reason.value,
            "turns": [{"text": t.text, "action": t.parse.action, "queries": t.parse.queries,
                       "forced": t.forced, "has_think": t.parse.has_think,
                       "error": None if t.parse.error is None else t.parse.error.value,
                       "retrieved_tokens": t.retrieved_tokens} for t in self.turns],
            "num_turns": len(self.turns),
            "num_searches": self.num_searches,
            "num_queries": self.num_queries,
            "retrieved_tokens": self.retrieved_tokens,
            "model_tokens": self.model_tokens,
            "seconds": self.seconds,
        }


#: ``(trajectories of the generate call's rows, padded input width) -> LogitsProcessor``: an
#: extra decoding constraint per call (the tests script the model's turns with it).
ProcessorFactory = Callable[[list[SearchTrajectory], int], "LogitsProcessor"]


class SearchAgentPipeline(ModelPipeline):
    """Runs the search agent over batches of questions with one model and one retriever."""

    retriever: DocumentRetriever

    #: Generation of a turn stops right after one of these (besides the end of turn).
    STOP_STRINGS: tuple[str, ...] = STOP_STRINGS
    #: Written by the pipeline at the start of the forced last turn (mask 0).
    FORCED_PREFIX: str = FORCED_ANSWER_PREFIX
    #: The stop reasons of a well-formed answer, written freely or forced at the limit.
    ANSWERED: Any = StopReason.ANSWERED
    FORCED: Any = StopReason.FORCED_ANSWER
    #: The smallest ``max_turns`` (the decision agent allows 0: answer at once).
    MIN_TURNS = 1

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        template: str | PromptRenderer,
        retriever: DocumentRetriever,
        *,
        max_turns: int = SEARCH_MAX_TURNS,
        max_queries: int = SEARCH_MAX_QUERIES,
        top_k: int = SEARCH_TOP_K,
        max_new_tokens: int = SEARCH_MAX_NEW_TOKENS,
        settings: GenerationSettings | None = None,
        batch_size: int | None = None,
        logits_processor_for: ProcessorFactory | None = None,
    ) -> None:
        check_at_least("max_turns", max_turns, self.MIN_TURNS)
        for name, value in (("max_queries", max_queries), ("top_k", top_k),
                            ("max_new_tokens", max_new_tokens)):
            check_at_least(name, value)
        super().__init__(model, tokenizer, template, retriever, settings, batch_size)
        self.max_turns = max_turns
        self.max_queries = max_queries
        self.top_k = top_k
        self.max_new_tokens = max_new_tokens
        self.logits_processor_for = logits_processor_for
        self.stop_ids = self.renderer.stop_token_ids
        self.assistant_suffix = self.renderer.assistant_suffix_ids()
        self.forced_prefix = tokenizer.encode(self.FORCED_PREFIX, add_special_tokens=False)
        #: Seconds of the last :meth:`run`: ``generate`` and ``retrieve``.
        self.last_timings: dict[str, float] = {"generate": 0.0, "retrieve": 0.0}
        #: Queries sent per retrieval request of the last :meth:`run` (one request per round).
        self.last_requests: list[int] = []

    def run(self, questions: Sequence[str], group_size: int = 1) -> list[SearchTrajectory]:
        """Trajectories of the batch: ``group_size`` per question, a question's next to each
        other (GRPO groups). A question's prompt is encoded once."""
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        start = time.perf_counter()
        timings = {"generate": 0.0, "retrieve": 0.0}
        self.last_requests = []
        prompts = [self.renderer.prompt_ids(self._prompt(q)) for q in questions]
        trajectories = [SearchTrajectory(q, list(ids)) for q, ids in zip(questions, prompts,
                                                                         strict=True)
                        for _ in range(group_size)]
        first_round = self._open(trajectories, timings)
        for round_ in range(first_round, self.max_turns + 1):
            active = [t for t in trajectories if not t.done]
            if not active:
                break
            forced = round_ == self.max_turns
            if forced:
                for t in active:
                    t._append(self.forced_prefix, sampled=False)
            t0 = time.perf_counter()
            outputs = self._generate(active)
            timings["generate"] += time.perf_counter() - t0
            searching = []
            stop = set(self.stop_ids)
            for t, (ids, text) in zip(active, outputs, strict=True):
                t._append(ids, sampled=True)
                finished = (bool(ids) and ids[-1] in stop) \
                    or any(tag in text for tag in self.STOP_STRINGS)
                parse = self._parse(text, forced, finished)
                t.turns.append(SearchTurn(text=text, parse=parse, forced=forced))
                if parse.action == "answer":
                    t.answer = parse.answer
                    t.stop_reason = self.FORCED if forced else self.ANSWERED
                elif parse.action == "search":
                    searching.append(t)
                else:
                    assert parse.error is not None
                    t.stop_reason = parse.error
            if searching:
                t0 = time.perf_counter()
                self._inform(searching, last=round_ == self.max_turns - 1)
                timings["retrieve"] += time.perf_counter() - t0
        elapsed = time.perf_counter() - start
        for t in trajectories:
            t.seconds = elapsed / len(trajectories)
        self.last_timings = timings
        return trajectories

    # -- the hooks a pipeline with other tags replaces ------------------------------------------

    def _prompt(self, question: str) -> ChatMessages:
        """The first user message of a question's trajectories."""
        return search_prompt(question, self.max_queries)

    def _parse(self, text: str, forced: bool, finished: bool) -> TurnParse:
        """One model turn, parsed; ``finished``: it ended by itself, not at the token limit
        (the search agent reads that from its closing tags instead)."""
        return parse_turn(text, max_queries=self.max_queries, forced_answer=forced)

    def _information(self, queries: Sequence[str], documents: Sequence[Sequence[str]],
                     last: bool) -> str:
        """The observation after a search (``last``: no search is allowed after it)."""
        return format_information(queries, documents, force_answer=last)

    def _open(self, trajectories: list[SearchTrajectory], timings: dict[str, float]) -> int:
        """Turns the pipeline writes before the model's first one (none here); returns the
        round the model starts in."""
        return 0

    # -- retrieval --------------------------------------------------------------------------------

    def _inform(self, searching: list[SearchTrajectory], last: bool) -> None:
        """ONE retrieval request for every query of the round, then each trajectory's block."""
        unique = list(dict.fromkeys(q for t in searching for q in t.turns[-1].parse.queries))
        self.last_requests.append(len(unique))
        results = self.retriever.search_documents(unique, self.top_k)
        ranked = dict(zip(unique, results, strict=True))
        for t in searching:
            turn = t.turns[-1]
            queries = turn.parse.queries
            docs = [[str(d.get("contents", "")) for d in ranked[q]] for q in queries]
            t.retrieved_passages.extend(
                RetrievedPassage(None if d.get("id") is None else str(d["id"]),
                                 str(d.get("contents", ""))) for q in queries for d in ranked[q])
            turn.information = self._information(queries, docs, last)
            t._append(self._turn_tail(t.response_ids), sampled=False)
            observation = self.renderer.observation_ids(turn.information)
            turn.retrieved_tokens = len(observation)
            t._append(observation, sampled=False)

    def _turn_tail(self, response_ids: list[int]) -> list[int]:
        """The end of the assistant turn the model did not sample itself: the whole template
        suffix after a stop string, or what follows the end-of-turn token it did sample."""
        suffix = self.assistant_suffix
        if response_ids and response_ids[-1] in self.stop_ids:
            last = response_ids[-1]
            return suffix[suffix.index(last) + 1:] if last in suffix else []
        return list(suffix)

    # -- generation -------------------------------------------------------------------------------

    def _generate(self, rows: list[SearchTrajectory]) -> list[tuple[list[int], str]]:
        """``(sampled ids, text)`` of one turn per trajectory, in calls of ``batch_size``."""
        size = self.batch_size or len(rows)
        out: list[tuple[list[int], str]] = []
        for start in range(0, len(rows), size):
            out.extend(self._generate_rows(rows[start: start + size]))
        return out

    @torch.no_grad()
    def _generate_rows(self, rows: list[SearchTrajectory]) -> list[tuple[list[int], str]]:
        from transformers import LogitsProcessorList

        device = next(self.model.parameters()).device
        input_ids, attention, pad_id = self.left_padded(
            [t.prompt_ids + t.response_ids for t in rows])
        width = input_ids.shape[1]
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens, "eos_token_id": self.stop_ids,
            "pad_token_id": pad_id, "use_cache": True,
            **cache_kwargs(self.settings.cache, self.model),
        }
        if self.STOP_STRINGS:
            kwargs.update(stop_strings=list(self.STOP_STRINGS), tokenizer=self.tokenizer)
        s = self.settings
        if s.do_sample:
            kwargs.update(do_sample=True, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if self.logits_processor_for is not None:
            kwargs["logits_processor"] = LogitsProcessorList(
                [self.logits_processor_for(rows, width)])
        generated = self.model.generate(input_ids=input_ids.to(device),
                                        attention_mask=attention.to(device), **kwargs)
        return [self._cut(generated[row, width:].tolist()) for row in range(len(rows))]

    def _cut(self, generated: list[int]) -> tuple[list[int], str]:
        """The sampled ids up to the end of turn or the token that completes a closing tag
        (finished rows are padded after it), and their text without end-of-turn tokens."""
        stop = set(self.stop_ids)
        kept: list[int] = []
        for token in generated:
            kept.append(token)
            if token in stop:
                break
            if not self.STOP_STRINGS:
                continue
            piece = self.tokenizer.decode([token], skip_special_tokens=True)
            if any(tag[-1] in piece for tag in self.STOP_STRINGS):
                text = self.tokenizer.decode(kept, skip_special_tokens=True)
                if any(tag in text for tag in self.STOP_STRINGS):
                    break
        text = self.tokenizer.decode([t for t in kept if t not in stop], skip_special_tokens=True)
        return kept, text
