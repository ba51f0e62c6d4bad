"""The one definition of every agent prompt.

SFT data, MAPPO rollouts and evaluation all build their prompts here, so the model sees exactly
the same text in all three (the original system wrote them twice, differently, and lost accuracy).

A prompt is an Alpaca triple ``(system, instruction, input)``. LLaMA-Factory's Alpaca converter
turns an SFT record into the user message ``instruction + "\\n" + input``; :meth:`AgentPrompt.user`
joins the same way, and :mod:`mmoa.agents.render` feeds both through the same chat template, so
an SFT record and a rollout prompt give identical token ids by construction.

Documents are numbered ``Document0 .. Document{K-1}`` with no space, the same spelling the
Selector must output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from mmoa.defaults import QR_MAX_SUBQUESTIONS

AgentName = Literal["qr", "selector", "generator"]
AGENTS: tuple[AgentName, ...] = ("qr", "selector", "generator")
MAX_SUBQUESTIONS = QR_MAX_SUBQUESTIONS

QR_SYSTEM = "You turn a question into simple search queries."
QR_INSTRUCTION = (
    f"Split the question into at most {MAX_SUBQUESTIONS} simple sub-questions that together "
    "answer it. Write one sub-question per line and nothing else."
)

SELECTOR_SYSTEM = "You choose the documents that help answer a question."
SELECTOR_INSTRUCTION = (
    "Below are a question and {k} candidate documents, Document0 to Document{last}. Write the IDs "
    "of the documents that help answer the question, separated by commas, for example "
    "Document0,Document3. Write nothing else."
)

GENERATOR_SYSTEM = "You answer questions briefly and accurately."
GENERATOR_INSTRUCTION_DOCS = (
    "Answer the question using the documents below. Give only the short answer, written as "
    "**answer**."
)
GENERATOR_INSTRUCTION_NO_DOCS = (
    "Answer the question. Give only the short answer, written as **answer**."
)


class ChatMessages:
    """The user message and chat of an Alpaca-shaped prompt (a class with ``instruction`` and
    ``input``): one definition for the three agents' prompts and the search agent's, so that
    :class:`mmoa.agents.render.PromptRenderer` encodes every prompt the same way."""

    instruction: str
    input: str

    @property
    def user(self) -> str:
        """The user message, joined exactly as LLaMA-Factory's Alpaca converter joins it."""
        return "\n".join(part for part in (self.instruction, self.input) if part)

    def messages(self, response: str = "") -> list[dict[str, str]]:
        return [
            {"role": "user", "content": self.user},
            {"role": "assistant", "content": response},
        ]


@dataclass(frozen=True)
class AgentPrompt(ChatMessages):
    """One agent call: an Alpaca ``(system, instruction, input)`` triple."""

    agent: AgentName
    system: str
    instruction: str
    input: str

    def alpaca(self, output: str) -> dict[str, str]:
        """An SFT record for LLaMA-Factory's ``alpaca`` formatting."""
        return {
            "instruction": self.instruction,
            "input": self.input,
            "output": output,
            "system": self.system,
        }


def format_document(index: int, document: str) -> str:
    """``Document{index}: title\\ntext``; ``document`` is the server's ``"title\\ntext"`` string."""
    return f"Document{index}: {document.strip()}"


def _documents_block(documents: Sequence[str]) -> str:
    return "\n\n".join(format_document(i, d) for i, d in enumerate(documents))


def qr_prompt(question: str) -> AgentPrompt:
    return AgentPrompt("qr", QR_SYSTEM, QR_INSTRUCTION, f"Question: {question.strip()}")


def selector_prompt(question: str, candidates: Sequence[str]) -> AgentPrompt:
    """The Selector sees the original question and the K merged candidates."""
    k = len(candidates)
    instruction = SELECTOR_INSTRUCTION.format(k=k, last=max(k - 1, 0))
    body = f"Question: {question.strip()}\n\n{_documents_block(candidates)}"
    return AgentPrompt("selector", SELECTOR_SYSTEM, instruction, body)


def generator_prompt(question: str, documents: Sequence[str]) -> AgentPrompt:
    """The Generator sees the selected documents renumbered from 0, or none at all."""
    if not documents:
        return AgentPrompt(
            "generator", GENERATOR_SYSTEM, GENERATOR_INSTRUCTION_NO_DOCS,
            f"Question: {question.strip()}",
        )
    body = f"{_documents_block(documents)}\n\nQuestion: {question.strip()}"
    return AgentPrompt("generator", GENERATOR_SYSTEM, GENERATOR_INSTRUCTION_DOCS, body)


#: Appended to an agent's instruction when a model refines an earlier response (TOA's
#: refinement without feedback): the task stays the same, so the output format stays the same.
REFINEMENT_INSTRUCTION = (
    "A previous response to this task is shown at the end. Write a better response, in exactly "
    "the same output format."
)
REFINEMENT_HEADER = "Previous response:"

#: A prompt variant used as a model of its own during data synthesis: the same task with a
#: different system prompt, so one checkpoint gives two differently behaving samplers.
CAREFUL_SYSTEM_PREFIX = "Think carefully and be precise. "
PROMPT_VARIANTS = ("plain", "careful")


def refinement_prompt(prompt: AgentPrompt, previous: str) -> AgentPrompt:
    """The prompt that asks for a better version of ``previous``: the agent's own prompt with
    the refinement instruction and the earlier response appended, so the reply is parsed with
    the same parser and scored with the same reward."""
    return AgentPrompt(
        prompt.agent, prompt.system, f"{prompt.instruction} {REFINEMENT_INSTRUCTION}",
        f"{prompt.input}\n\n{REFINEMENT_HEADER}\n{previous.strip()}",
    )


def prompt_variant(prompt: AgentPrompt, variant: str) -> AgentPrompt:
    """``prompt`` as seen by a sampler of that variant (``plain``: unchanged)."""
    if variant == "plain":
        return prompt
    if variant == "careful":
        return AgentPrompt(prompt.agent, CAREFUL_SYSTEM_PREFIX + prompt.system,
                           prompt.instruction, prompt.input)
    raise ValueError(f"unknown prompt variant {variant!r}; expected one of {PROMPT_VARIANTS}")


def format_selection(ids: Sequence[int]) -> str:
    """The Selector's canonical output, e.g. ``Document0,Document3`` (empty for no document)."""
    return ",".join(f"Document{i}" for i in ids)


def format_answer(answer: str) -> str:
    """The Generator's canonical output, ``**answer**``."""
    return f"**{answer.strip()}**"


def format_subquestions(subquestions: Sequence[str]) -> str:
    """The Query Rewriter's canonical output: one sub-question per line."""
    return "\n".join(s.strip() for s in subquestions if s.strip())


def vocabulary_texts() -> list[str]:
    """Every fixed prompt string, for training the tiny model's tokenizer on them."""
    k = 10
    return [
        QR_SYSTEM, QR_INSTRUCTION, SELECTOR_SYSTEM,
        SELECTOR_INSTRUCTION.format(k=k, last=k - 1), GENERATOR_SYSTEM,
        GENERATOR_INSTRUCTION_DOCS, GENERATOR_INSTRUCTION_NO_DOCS,
        format_selection(range(k)), "Question: ", "Document",
    ]
