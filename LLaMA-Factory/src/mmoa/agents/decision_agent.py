"""The retrieve-or-answer decision agent (SmartRAG): one policy, ``[Answer]`` or ``[Search]``.

At every step the model writes ``[Answer] ...`` (the trajectory ends) or ``[Search] query``
(the pipeline appends the query's top-k documents as a ``[Documents]`` observation turn and the
model decides again). After ``max_searches`` searches the last observation says no more searches
are allowed and the next turn is started with ``[Answer]``, so an answer is forced.

Everything but the text is the search agent's loop (:class:`SearchAgentPipeline`): batched
``generate`` calls per round, ONE retrieval request per round for every trajectory that searched,
observations as the chat template's observation turns, and the ``loss_mask`` that keeps the
documents, the template tails and the forced prefix out of the RL loss. This class replaces only
the prompt, the parser, the observation text and the forced prefix, so a fix to the loop is a
fix to both agents.

``policy`` gives the two baselines a decision agent is compared with, run through the same loop
and scoring: ``never`` forces the answer at once (closed book, ``max_searches`` 0); ``always``
writes ``[Search] <the question>`` for the model (masked, not sampled), retrieves, and forces
the answer after it (retrieve once with the original question, then answer: plain RAG).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from mmoa.agents.decision_tags import (
    FORCED_ANSWER_PREFIX,
    DecisionStop,
    decision_prompt,
    format_decision,
    format_documents,
    parse_decision,
)
from mmoa.agents.prompts import ChatMessages
from mmoa.agents.search_agent import (
    ProcessorFactory,
    SearchAgentPipeline,
    SearchTrajectory,
    SearchTurn,
)
from mmoa.agents.search_tags import TurnParse
from mmoa.config_values import check_at_least
from mmoa.defaults import DECISION_MAX_NEW_TOKENS, DECISION_MAX_SEARCHES, DECISION_TOP_K

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from mmoa.agents.pipeline import DocumentRetriever, GenerationSettings
    from mmoa.agents.render import PromptRenderer

#: ``model``: the policy decides; ``always`` / ``never``: the baselines (module docstring).
DECISION_POLICIES: tuple[str, ...] = ("model", "always", "never")


class DecisionAgentPipeline(SearchAgentPipeline):
    """Runs the decision agent over batches of questions with one model and one retriever."""

    STOP_STRINGS: tuple[str, ...] = ()  # a turn is one action: it ends with the end of turn
    FORCED_PREFIX = FORCED_ANSWER_PREFIX
    ANSWERED = DecisionStop.ANSWERED
    FORCED = DecisionStop.FORCED_ANSWER
    MIN_TURNS = 0

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        template: str | PromptRenderer,
        retriever: DocumentRetriever | None,
        *,
        max_searches: int = DECISION_MAX_SEARCHES,
        top_k: int = DECISION_TOP_K,
        max_new_tokens: int = DECISION_MAX_NEW_TOKENS,
        policy: str = "model",
        settings: GenerationSettings | None = None,
        batch_size: int | None = None,
        logits_processor_for: ProcessorFactory | None = None,
    ) -> None:
        if policy not in DECISION_POLICIES:
            raise ValueError(f"policy must be one of {', '.join(DECISION_POLICIES)}, got "
                             f"{policy!r}")
        check_at_least("max_searches", max_searches, 0)
        if retriever is None and policy != "never" and max_searches > 0:
            raise ValueError("a retriever is needed unless policy is never or max_searches 0")
        # the baselines' quota: never searches 0 times, always exactly once (the question)
        turns = {"model": max_searches, "never": 0, "always": 1}[policy]
        super().__init__(model, tokenizer, template, retriever,  # type: ignore[arg-type]
                         max_turns=turns, max_queries=1, top_k=top_k,
                         max_new_tokens=max_new_tokens, settings=settings,
                         batch_size=batch_size, logits_processor_for=logits_processor_for)
        self.policy = policy

    def _prompt(self, question: str) -> ChatMessages:
        return decision_prompt(question)

    def _parse(self, text: str, forced: bool, finished: bool) -> TurnParse:
        return parse_decision(text, forced_answer=forced, finished=finished)

    def _information(self, queries: Sequence[str], documents: Sequence[Sequence[str]],
                     last: bool) -> str:
        return format_documents(queries, documents, force_answer=last)

    def _open(self, trajectories: list[SearchTrajectory], timings: dict[str, float]) -> int:
        """``always``: the pipeline writes the search with the question as its query (mask 0:
        the policy did not choose it), retrieves, and the model starts at the forced answer."""
        if self.policy != "always" or not trajectories:
            return 0
        for t in trajectories:
            text = format_decision(query=t.question)
            t._append(self.tokenizer.encode(text, add_special_tokens=False), sampled=False)
            t.turns.append(SearchTurn(text=text, parse=self._parse(text, False, True),
                                      forced=True))
        t0 = time.perf_counter()
        self._inform(trajectories, last=True)
        timings["retrieve"] += time.perf_counter() - t0
        return 1


def retrieval_rate(trajectories: Sequence[SearchTrajectory]) -> float:
    """Share of the trajectories that searched at least once (SmartRAG's retrieval rate)."""
    if not trajectories:
        return 0.0
    return sum(t.num_searches > 0 for t in trajectories) / len(trajectories)


def trajectory_summary(trajectory: SearchTrajectory) -> dict[str, Any]:
    """The decision statistics of one trajectory (predictions and training logs)."""
    return {"searches": trajectory.num_searches, "retrieved": trajectory.num_searches > 0,
            "well_formed": trajectory.well_formed,
            "forced": trajectory.stop_reason == DecisionStop.FORCED_ANSWER,
            "retrieved_tokens": trajectory.retrieved_tokens}
