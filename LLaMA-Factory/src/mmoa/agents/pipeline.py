"""The batched QR -> Retriever -> Selector -> Generator pipeline.

One pipeline serves evaluation (greedy) and MAPPO rollouts (sampling). For a batch of questions
each agent runs as ONE batched ``generate`` call, and all sub-questions of the batch go to the
retrieval server in ONE request, so the cost per question falls as the batch grows.

Every step is recorded in a :class:`Trace`: the sub-questions, the candidates with their ids and
titles, the selection, the answer, per-agent timings and, for each agent, the prompt and response
token ids that the PPO update needs.

``run(questions, group_size=G)`` samples ``G`` pipelines per question (GRPO rollouts). What a
group shares: the question's QR prompt is rendered and tokenised once and its input ids are
repeated ``G`` times in the batch (``generate`` still runs the prefill of every row: there is no
shared KV cache), and the sub-questions of all ``G`` pipelines of every question go to the
retriever in the one call of the batch, each distinct sub-question once. Selector and Generator
prompts differ between the pipelines of a group (other sub-questions, other documents) and are
encoded per pipeline. ``batch_size`` bounds the rows of one ``generate`` call, so a large batch
of questions (a whole MAPPO step) still makes one retrieval call.

Modes (for baselines and ablations): ``g`` (no retrieval), ``rag`` (question -> top-K ->
Generator), ``s_g`` (question -> top-K -> Selector -> Generator), ``qr_g`` (QR -> merged K ->
Generator) and ``qr_s_g`` (the full pipeline). The evaluation's oracle ``gold_g`` runs as
``rag`` over a retriever that returns the question's gold passages
(:class:`mmoa.retrieval.gold.GoldPassages`): the Generator reads every document it is given.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from mmoa.agent_adapters import use_agent
from mmoa.agents.candidates import Candidate, merge_candidates
from mmoa.agents.constrained import SelectorLogitsProcessor
from mmoa.agents.generation_cache import cache_kwargs
from mmoa.agents.modes import MODES, ORACLE_MODES, Mode, OracleMode
from mmoa.agents.parsers import (
    AnswerParse,
    SelectionParse,
    SubquestionParse,
    parse_answer,
    parse_selection,
    parse_subquestions,
)
from mmoa.agents.prompts import (
    AgentName,
    AgentPrompt,
    generator_prompt,
    qr_prompt,
    selector_prompt,
)
from mmoa.agents.render import PromptRenderer
from mmoa.defaults import (
    GENERATION_CACHE,
    MAX_NEW_TOKENS,
    QR_MAX_SUBQUESTIONS,
    ROLLOUT_TEMPERATURE,
    ROLLOUT_TOP_P,
)

if TYPE_CHECKING:
    from transformers import LogitsProcessor, PreTrainedModel, PreTrainedTokenizerBase



class DocumentRetriever(Protocol):
    """What the pipeline needs from a retriever: ranked documents for many queries at once.

    Each document is a dict with at least ``id`` and ``contents`` (``"title\\ntext"``).
    :class:`mmoa.retrieval.client.RetrievalClient` implements it over HTTP.
    """

    def search_documents(self, queries: Sequence[str], k: int) -> list[list[dict[str, Any]]]: ...


@dataclass
class GenerationSettings:
    """Decoding settings; ``do_sample=False`` is greedy (evaluation), True is rollout sampling."""

    do_sample: bool = False
    temperature: float = ROLLOUT_TEMPERATURE
    #: Sampling temperatures of some agents ({"selector": 0.5}); the others use ``temperature``.
    agent_temperatures: dict[str, float] = field(default_factory=dict)
    top_p: float = ROLLOUT_TOP_P
    top_k: int = 0
    max_new_tokens: dict[str, int] = field(default_factory=lambda: dict(MAX_NEW_TOKENS))
    constrained_selector: bool = True
    #: Sub-questions kept from the Query Rewriter's output (the MAPPO penalty's limit too).
    max_subquestions: int = QR_MAX_SUBQUESTIONS
    #: Keep the log-probability of each sampled token under the distribution it was drawn from
    #: (after temperature, top-p and the Selector's grammar mask): ``AgentCall.sampling_logprobs``.
    #: A diagnostic of how far the scored policy is from the sampling one; it asks ``generate``
    #: for every step's scores, a ``[batch, vocab]`` tensor per new token, so it is off by default.
    record_logprobs: bool = False
    #: Keep, for each token an agent wrote under a logits mask (the Selector's grammar), the
    #: ids the mask allowed there: ``AgentCall.support``. MAPPO's ``mappo_masked_scoring``
    #: scores those tokens over that support.
    record_support: bool = False
    #: The KV cache decoding uses: ``dynamic``, ``static`` (compiled decoding on CUDA) or
    #: ``auto`` (:mod:`mmoa.agents.generation_cache`).
    cache: str = GENERATION_CACHE

    def temperature_for(self, agent: str) -> float:
        """The temperature ``agent`` samples at."""
        return self.agent_temperatures.get(agent, self.temperature)


@dataclass
class AgentCall:
    """One agent's turn for one question: the prompt and what the model wrote."""

    agent: AgentName
    prompt: AgentPrompt
    prompt_ids: list[int]
    response_ids: list[int]
    response_text: str
    #: ``log p(token)`` of each response token under the sampling distribution, when
    #: ``GenerationSettings.record_logprobs`` is on; else ``None``.
    sampling_logprobs: list[float] | None = None
    #: The token ids the logits mask allowed at each response position, when
    #: ``GenerationSettings.record_support`` is on and the agent decodes under a mask; else
    #: ``None`` (the whole vocabulary).
    support: list[list[int]] | None = None
    #: Under the Selector's grammar: the probability, over the ids it allowed, that the
    #: response ends at its first token (an empty selection), and whether the greedy choice
    #: there is to stop (``SelectorLogitsProcessor.opening_stop_probability``); else ``None``.
    opening_stop_probability: float | None = None
    opening_greedy_stop: bool | None = None


@dataclass
class Trace:
    """Everything that happened for one question."""

    question: str
    subquestions: list[str] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    selected: list[int] = field(default_factory=list)
    answer: str = ""
    calls: dict[str, AgentCall] = field(default_factory=dict)
    qr_parse: SubquestionParse | None = None
    selection_parse: SelectionParse | None = None
    answer_parse: AnswerParse | None = None
    #: MAPPO's counterfactual credit only (``mappo_counterfactual_agents``): by agent, the same
    #: pipeline with that agent's output replaced by its default
    #: (:mod:`mmoa.pipelines.counterfactual`). Empty when the credit is off, and for an agent
    #: whose output already was its default (this trace is then its own counterfactual).
    counterfactuals: dict[str, Trace] = field(default_factory=dict)

    @property
    def selected_documents(self) -> list[str]:
        return [self.candidates[i].text for i in self.selected]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (predictions files, the playground)."""
        return {
            "question": self.question,
            "subquestions": self.subquestions,
            "candidates": [
                {"index": i, "id": c.id, "title": c.text.split("\n", 1)[0],
                 "subquestion": c.subquestion, "rank": c.rank}
                for i, c in enumerate(self.candidates)
            ],
            "selected_ids": self.selected,
            "prediction": self.answer,
            "raw_outputs": {name: call.response_text for name, call in self.calls.items()},
        }


@dataclass
class BatchTimings:
    """Seconds spent per stage for one batch (the playground and the trainer log them)."""

    qr: float = 0.0
    retrieve: float = 0.0
    selector: float = 0.0
    generator: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"qr": self.qr, "retrieve": self.retrieve, "selector": self.selector,
                "generator": self.generator}


def response_until_stop(generated: Sequence[int], stop_ids: Iterable[int]) -> list[int]:
    """A generated row's tokens up to and including its first stop token (the rows of one
    ``generate`` call that finished early are padded after it), or all of them without one."""
    stops = set(stop_ids)
    response: list[int] = []
    for token in generated:
        response.append(token)
        if token in stops:
            break
    return response


def response_text(tokenizer: PreTrainedTokenizerBase, response: Sequence[int],
                  stop_ids: Iterable[int]) -> str:
    """The text of a response cut by :func:`response_until_stop`: its stop tokens dropped (a
    chat template's end-of-turn token is not always a special token the tokenizer skips)."""
    stops = set(stop_ids)
    return tokenizer.decode([t for t in response if t not in stops],
                            skip_special_tokens=True).strip()


class ModelPipeline:
    """What every batched agent pipeline holds (the three-agent RAG pipeline and the multi-turn
    agents): one model, its tokenizer, the prompt renderer of the template, a retriever, the
    generation settings and the ``generate`` batch size, checked and bound in one place."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 template: str | PromptRenderer, retriever: DocumentRetriever | None,
                 settings: GenerationSettings | None, batch_size: int | None) -> None:
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be at least 1 (or None), got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.renderer = template if isinstance(template, PromptRenderer) \
            else PromptRenderer(tokenizer, template)
        self.retriever = retriever
        self.settings = settings or GenerationSettings()
        #: Most sequences per ``generate`` call (``None``: one call per agent for the batch).
        self.batch_size = batch_size

    def left_padded(self, sequences: Sequence[Sequence[int]]
                    ) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(input_ids, attention_mask, pad id)`` of one ``generate`` call: ``sequences``
        left-padded to the longest, so every row's next token is at the same position, with
        the tokenizer's pad token (its end-of-sequence token where it has none)."""
        pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        width = max(len(ids) for ids in sequences)
        input_ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, ids in enumerate(sequences):
            input_ids[row, width - len(ids):] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids):] = 1
        return input_ids, attention, pad_id


class RagPipeline(ModelPipeline):
    """Runs the agents of a mode over batches of questions with one shared model."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        template: str | PromptRenderer,
        retriever: DocumentRetriever | None,
        *,
        mode: Mode | OracleMode = "qr_s_g",
        k: int = 10,
        settings: GenerationSettings | None = None,
        batch_size: int | None = None,
    ) -> None:
        if mode not in MODES + ORACLE_MODES:
            raise ValueError(f"unknown pipeline mode {mode!r}; choose one of "
                             f"{', '.join(MODES + ORACLE_MODES)}")
        if mode != "g" and retriever is None:
            raise ValueError(f"pipeline mode {mode!r} needs a retriever")
        super().__init__(model, tokenizer, template, retriever, settings, batch_size)
        self.mode = mode
        self.k = k
        self.last_timings = BatchTimings()

    # -- the pipeline ----------------------------------------------------------------------------

    def run(self, questions: Sequence[str], group_size: int = 1) -> list[Trace]:
        """Traces of the batch: ``group_size`` per question, a question's next to each other."""
        if group_size < 1:
            raise ValueError(f"group_size must be at least 1, got {group_size}")
        copies = group_size
        if self.mode not in ("qr_g", "qr_s_g") and group_size > 1:
            # no Query Rewriter: the first sampled agent's prompts differ per pipeline anyway
            questions = [q for q in questions for _ in range(group_size)]
            copies = 1
        traces = [Trace(question=q) for q in questions for _ in range(copies)]
        timings = BatchTimings()
        if self.mode == "g":
            self._generate_answers(traces, use_documents=False, timings=timings)
            self.last_timings = timings
            return traces

        if self.mode in ("qr_g", "qr_s_g"):
            start = time.perf_counter()
            calls = self.generate("qr", [qr_prompt(q) for q in questions],
                                  copies=copies)
            for trace, call in zip(traces, calls, strict=True):
                trace.calls["qr"] = call
                trace.qr_parse = parse_subquestions(
                    call.response_text, trace.question,
                    max_subquestions=self.settings.max_subquestions)
                trace.subquestions = trace.qr_parse.subquestions
            timings.qr = time.perf_counter() - start
        else:
            for trace in traces:
                trace.subquestions = [trace.question]

        start = time.perf_counter()
        self._retrieve(traces)
        timings.retrieve = time.perf_counter() - start

        if self.mode in ("s_g", "qr_s_g"):
            start = time.perf_counter()
            self._select(traces)
            timings.selector = time.perf_counter() - start
        else:
            for trace in traces:
                trace.selected = list(range(len(trace.candidates)))

        self._generate_answers(traces, use_documents=True, timings=timings)
        self.last_timings = timings
        return traces

    def retrieve_and_select(self, traces: list[Trace]) -> BatchTimings:
        """Retrieval (one call) and the Selector over traces whose sub-questions are already
        set, and their seconds: the pipeline after the Query Rewriter, for traces made outside
        :meth:`run` (MAPPO's counterfactual credit: the question as the only sub-question). The
        Generator is left to :meth:`answer`, so that traces of several origins share its
        batch."""
        timings = BatchTimings()
        start = time.perf_counter()
        self._retrieve(traces)
        timings.retrieve = time.perf_counter() - start
        start = time.perf_counter()
        self._select(traces)
        timings.selector = time.perf_counter() - start
        return timings

    def answer(self, traces: list[Trace]) -> float:
        """The Generator over traces whose candidates and selection are already set (their
        selected documents as context); returns its seconds. See :meth:`retrieve_and_select`."""
        timings = BatchTimings()
        self._generate_answers(traces, use_documents=True, timings=timings)
        return timings.generator

    def _retrieve(self, traces: list[Trace]) -> None:
        """One request for every sub-question of the batch, then per-question merging."""
        assert self.retriever is not None
        unique = list(dict.fromkeys(s for t in traces for s in t.subquestions))
        results = self.retriever.search_documents(unique, self.k)
        ranked = dict(zip(unique, results, strict=True))
        for trace in traces:
            trace.candidates = merge_candidates([ranked[s] for s in trace.subquestions], self.k)

    def _select(self, traces: list[Trace]) -> None:
        prompts = [selector_prompt(t.question, [c.text for c in t.candidates]) for t in traces]
        ks = {len(t.candidates) for t in traces}
        calls = self.generate("selector", prompts,
                              self.selector_processor(max(ks) if ks else self.k))
        for trace, call in zip(traces, calls, strict=True):
            trace.calls["selector"] = call
            trace.selection_parse = parse_selection(call.response_text, len(trace.candidates))
            trace.selected = trace.selection_parse.ids

    def selector_processor(self, k: int) -> Any:
        """The ``processor_for`` argument of :meth:`generate` for Selector prompts of at most
        ``k`` candidates: the grammar mask when constrained decoding is on, else ``None``."""
        if not self.settings.constrained_selector:
            return None
        stop_ids = self.renderer.stop_token_ids

        def processor_for(prompt_length: int) -> LogitsProcessor:
            return SelectorLogitsProcessor(self.tokenizer, k, prompt_length, stop_ids)

        return processor_for

    def _generate_answers(
        self, traces: list[Trace], *, use_documents: bool, timings: BatchTimings
    ) -> None:
        start = time.perf_counter()
        prompts = [
            generator_prompt(t.question, t.selected_documents if use_documents else [])
            for t in traces
        ]
        calls = self.generate("generator", prompts)
        for trace, call in zip(traces, calls, strict=True):
            trace.calls["generator"] = call
            trace.answer_parse = parse_answer(call.response_text)
            trace.answer = trace.answer_parse.answer
        timings.generator = time.perf_counter() - start

    # -- batched generation ----------------------------------------------------------------------

    def generate(
        self,
        agent: AgentName,
        prompts: Sequence[AgentPrompt],
        processor_for: Any = None,
        copies: int = 1,
    ) -> list[AgentCall]:
        """Left-padded ``generate`` calls for a batch of prompts of one agent: ``copies``
        samples per prompt (row ``i * copies + j`` is prompt ``i``'s ``j``-th), in calls of at
        most ``batch_size`` rows that hold whole prompts. Each prompt is tokenised once; its
        ids are repeated ``copies`` times."""
        if not prompts:
            return []
        prompt_ids = self.renderer.batch_prompt_ids(prompts)
        per_call = len(prompts) if self.batch_size is None \
            else max(1, self.batch_size // copies)
        calls: list[AgentCall] = []
        for start in range(0, len(prompts), per_call):
            calls.extend(self._generate_rows(
                agent, prompts[start: start + per_call], prompt_ids[start: start + per_call],
                processor_for, copies))
        return calls

    @torch.no_grad()
    def _generate_rows(
        self,
        agent: AgentName,
        prompts: Sequence[AgentPrompt],
        prompt_ids: list[list[int]],
        processor_for: Any,
        copies: int,
    ) -> list[AgentCall]:
        """One ``generate`` call: ``copies`` rows per prompt."""
        device = next(self.model.parameters()).device
        input_ids, attention, pad_id = self.left_padded(prompt_ids)
        width = input_ids.shape[1]
        if copies > 1:
            input_ids = input_ids.repeat_interleave(copies, dim=0)
            attention = attention.repeat_interleave(copies, dim=0)
        settings = self.settings
        stop_ids = self.renderer.stop_token_ids
        kwargs: dict[str, Any] = {
            "max_new_tokens": settings.max_new_tokens[agent],
            "eos_token_id": stop_ids,
            "pad_token_id": pad_id,
            "use_cache": True,
            **cache_kwargs(settings.cache, self.model),
        }
        if settings.do_sample:
            kwargs.update(do_sample=True, temperature=settings.temperature_for(agent),
                          top_p=settings.top_p, top_k=settings.top_k)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        processor = processor_for(width) if processor_for is not None else None
        if processor is not None:
            from transformers import LogitsProcessorList

            kwargs["logits_processor"] = LogitsProcessorList([processor])
        if settings.record_logprobs:
            kwargs.update(output_scores=True, return_dict_in_generate=True)
        with use_agent(self.model, agent):  # its own adapter, with one per agent
            output = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs
            )
        sequences = output.sequences if settings.record_logprobs else output
        sampled = None
        if settings.record_logprobs:
            # scores[t] is the processed distribution step t sampled from ([batch, vocab])
            new_tokens = sequences[:, width:]
            sampled = torch.stack([
                torch.log_softmax(step.float(), dim=-1).gather(1, new_tokens[:, t: t + 1])[:, 0]
                for t, step in enumerate(output.scores)], dim=1).tolist()
        stop_set = set(stop_ids)
        opening = processor if isinstance(processor, SelectorLogitsProcessor) \
            and processor.opening_stop_probability else None
        calls = []
        for row in range(len(prompts) * copies):
            prompt = prompts[row // copies]
            response = response_until_stop(sequences[row, width:].tolist(), stop_set)
            calls.append(AgentCall(
                agent=agent,
                prompt=prompt,
                prompt_ids=list(prompt_ids[row // copies]),
                response_ids=response,
                response_text=response_text(self.tokenizer, response, stop_set),
                sampling_logprobs=sampled[row][: len(response)] if sampled is not None else None,
                support=processor.support(response)
                if processor is not None and settings.record_support else None,
                opening_stop_probability=opening.opening_stop_probability[row]
                if opening is not None else None,
                opening_greedy_stop=opening.opening_greedy_stop[row]
                if opening is not None else None,
            ))
        return calls
