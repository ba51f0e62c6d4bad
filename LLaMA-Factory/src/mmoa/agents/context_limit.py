"""Whether a question fits the model that has to read it.

A model attends to at most ``max_position_embeddings`` positions, and the prompt of every agent
that reads the question plus the tokens it may write must fit in them. Past that a model with
rotary positions writes on, silently, with positions it never saw (``mmoa-cli eval --mode g``
with a 100,000-character question: 100,028 tokens against 2,048 positions, still generating
after 300 s), and one with learned positions fails with an index error.

Questions are refused, not truncated: a cut question is another question, scored against the
gold answer of the whole one. The check is exact where it matters and cheap where it does not:
each agent's prompt with an empty question is rendered once (the template and the instruction
around the question), a question's own tokens are added to it, and only a question that comes
within a few tokens of the limit is rendered whole (far past it, the figure named is that sum,
exact to a token or two).

Documents are not checked here: they come from the corpus, not from the user, and only after
retrieval.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mmoa.agents.modes import MODE_AGENTS
from mmoa.agents.prompts import generator_prompt, qr_prompt, selector_prompt

#: Context sizes a tokenizer reports when it does not know (transformers' "very large" value).
_UNKNOWN_MAX_LENGTH = 10**7
#: A question whose estimate comes this close to the limit is rendered whole to decide.
_MARGIN = 16
#: Agent names as messages show them.
AGENT_NAMES = {"qr": "Query Rewriter", "selector": "Selector", "generator": "Generator",
               "search": "search agent", "decision": "decision agent"}


@dataclass(frozen=True)
class ModelContext:
    """The positions a model can attend to and where that figure comes from."""

    tokens: int
    source: str


def model_context(model: Any, tokenizer: Any) -> ModelContext | None:
    """The smaller of the model config's position limit (``max_position_embeddings`` and its
    other names) and the tokenizer's ``model_max_length`` (when it states a real one);
    ``None`` when neither says."""
    config = getattr(model, "config", None)
    found: list[ModelContext] = []
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            found.append(ModelContext(value, key))
            break
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < _UNKNOWN_MAX_LENGTH:
        found.append(ModelContext(value, "tokenizer.model_max_length"))
    return min(found, key=lambda c: c.tokens) if found else None


PromptBuilder = Callable[[str], Any]


@dataclass(frozen=True)
class QuestionPrompt:
    """One prompt that holds the question, and the tokens its agent may write after it."""

    agent: str
    build: PromptBuilder
    budget: int


def question_prompts(mode: str, max_new_tokens: Mapping[str, int], *,
                     search_max_queries: int | None = None) -> list[QuestionPrompt]:
    """The prompts of ``mode`` that contain the question (before any document is added):
    the Query Rewriter's, the Selector's, the Generator's of the three-agent modes (and of
    ``gold_g``), the first turn of the search and decision agents."""
    if mode == "search_agent":
        from mmoa.agents.search_tags import search_prompt

        return [QuestionPrompt("search", lambda q: search_prompt(q, search_max_queries)
                               if search_max_queries else search_prompt(q),
                               max_new_tokens["search"])]
    if mode == "decision_agent":
        from mmoa.agents.decision_tags import decision_prompt

        return [QuestionPrompt("decision", decision_prompt, max_new_tokens["decision"])]
    builders: dict[str, PromptBuilder] = {
        "qr": qr_prompt, "selector": lambda q: selector_prompt(q, []),
        "generator": lambda q: generator_prompt(q, [])}
    return [QuestionPrompt(agent, builders[agent], max_new_tokens[agent])
            for agent in MODE_AGENTS[mode]]


@dataclass(frozen=True)
class Overflow:
    """A question that does not fit: the agent whose prompt overflows and the figures."""

    index: int
    agent: str
    prompt_tokens: int
    budget: int
    context: ModelContext

    def describe(self, question_id: str | None, question: str) -> str:
        who = f"question {question_id!r}" if question_id is not None else "the question"
        return (f"{who} ({len(question):,} characters) makes the "
                f"{AGENT_NAMES.get(self.agent, self.agent)}'s prompt {self.prompt_tokens:,} "
                f"tokens; with the {self.budget:,} it may write that is more than the model's "
                f"context of {self.context.tokens:,} ({self.context.source})")


def find_overflows(renderer: Any, questions: Sequence[str], prompts: Sequence[QuestionPrompt],
                   context: ModelContext) -> list[Overflow]:
    """Every question whose prompt for some agent plus that agent's budget exceeds
    ``context`` (the first such agent per question), in order. ``renderer``:
    :class:`mmoa.agents.render.PromptRenderer` of the model's tokenizer and template."""
    tokenizer = renderer.tokenizer
    base = {p.agent: len(renderer.prompt_ids(p.build(""))) for p in prompts}
    found: list[Overflow] = []
    for i, question in enumerate(questions):
        # verbose=False: transformers' "longer than the specified maximum sequence length"
        # warning is what this check turns into a clear refusal
        own = len(tokenizer(question.strip(), add_special_tokens=False,
                            verbose=False)["input_ids"])
        for p in prompts:
            estimate = base[p.agent] + own
            if estimate + p.budget <= context.tokens - _MARGIN:
                continue
            # near the boundary the joins of template and question decide: render it whole
            length = estimate if estimate + p.budget > context.tokens + _MARGIN \
                else len(renderer.prompt_ids(p.build(question)))
            if length + p.budget > context.tokens:
                found.append(Overflow(i, p.agent, length, p.budget, context))
                break
    return found


def check_questions_fit(renderer: Any, context: ModelContext | None,
                        questions: Sequence[str], prompts: Sequence[QuestionPrompt],
                        ids: Sequence[str] | None = None) -> None:
    """Raise a one-line ``ValueError`` naming the first question (by id when given) that
    does not fit, its length against the model's context and how many others do not."""
    if context is None:
        return
    overflows = find_overflows(renderer, questions, prompts, context)
    if not overflows:
        return
    first = overflows[0]
    more = (f"; {len(overflows) - 1} more question(s) do not fit either"
            if len(overflows) > 1 else "")
    raise ValueError(f"{first.describe(ids[first.index] if ids else None, questions[first.index])}"
                     f"{more}: shorten or drop them (refused, not truncated: a cut question is "
                     f"another question)")
