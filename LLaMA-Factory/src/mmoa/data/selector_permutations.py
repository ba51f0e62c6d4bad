"""Selector-only SFT records with the candidates in new orders: a test of position-free reading.

A Selector trained on candidates in retrieval order learns that the first candidates are the
gold ones (on HotpotQA's distractor set the first is gold for 80 of 100 dev questions), which a
model can learn without reading a document (docs/real_workflow.md, "Does the Selector read its
candidates at all?"). Shown the same question's candidates in a random order with the label
renumbered to match, a model can only fit the label by reading the documents. This module turns
the Selector records of an SFT file (any builder's: the prompt is :func:`selector_prompt`'s)
into ``copies`` such permutations each, for continued training of the Selector alone.

Built from records with more candidates than the pipeline shows (``data sft --k 10`` for a
K = 5 Selector), each copy can also be a random ``subset_size`` of them: many distinct records
per training question (C(10, 5) = 252 subsets), in which the first candidate shown is gold far
less often than in the top five, so the label is predicted by the documents more than by the
rank. ``subset_order="ranked"`` keeps the drawn candidates in their retrieval order (the rollouts'
order, a weaker rank cue); ``"shuffled"`` shuffles them as well.

The records are parsed back into question, candidates and label and rebuilt with the same
prompt functions, and a record that does not rebuild to its own text is refused: a permuted
record is then exactly what the pipeline would show for that order.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from mmoa.agents.parsers import parse_selection
from mmoa.agents.prompts import SELECTOR_SYSTEM, format_selection, selector_prompt
from mmoa.fileio import DataFormatError

_QUESTION = "Question: "
_DOCUMENT = re.compile(r"\n\nDocument(\d+): ")


@dataclass(frozen=True)
class SelectorExample:
    """One Selector record: the question, its candidates in order, the gold ones' indices."""

    question: str
    candidates: list[str]
    label: list[int]


def is_selector_record(record: dict[str, str]) -> bool:
    return record.get("system") == SELECTOR_SYSTEM


def parse_selector_record(record: dict[str, str], where: str = "record") -> SelectorExample:
    """The question, candidates and label of a Selector record; :class:`DataFormatError` where
    the record is not one :func:`selector_prompt` wrote (it must rebuild to the same text)."""
    body = record.get("input", "")
    if not body.startswith(_QUESTION):
        raise DataFormatError(f"{where}: a Selector input starts with {_QUESTION!r}")
    parts = _DOCUMENT.split(body)
    # parts = [question block, "0", doc0, "1", doc1, ...]
    numbers = [int(n) for n in parts[1::2]]
    if not numbers or numbers != list(range(len(numbers))):
        raise DataFormatError(f"{where}: the documents are not numbered Document0, Document1, ...")
    question = parts[0][len(_QUESTION):]
    candidates = parts[2::2]
    label_text = record.get("output", "").strip()
    selection = parse_selection(label_text, len(candidates))
    label = selection.ids
    if selection.malformed or selection.out_of_range or selection.duplicate \
            or label != sorted(label):
        raise DataFormatError(f"{where}: the output {label_text!r} is not a canonical selection "
                              f"of its {len(candidates)} candidates (ascending, no repeat)")
    rebuilt = selector_prompt(question, candidates)
    if (rebuilt.input, rebuilt.instruction) != (body, record.get("instruction")):
        raise DataFormatError(f"{where}: the record does not rebuild to its own text (not "
                              "written by selector_prompt, or edited)")
    return SelectorExample(question, candidates, label)


def permuted(example: SelectorExample, order: Sequence[int]) -> dict[str, str]:
    """The Alpaca record of ``example`` with candidate ``order[j]`` shown as Document j and the
    label renumbered to match (ascending, the canonical form)."""
    if sorted(order) != list(range(len(example.candidates))):
        raise ValueError(f"order {list(order)} is not a permutation of "
                         f"{len(example.candidates)} candidates")
    return shown(example, order)


SUBSET_ORDERS = ("ranked", "shuffled")


def drawn_subset(n_candidates: int, size: int, order: str, rng: random.Random) -> list[int]:
    """A random ``size`` of ``n_candidates`` candidates (all of them where there are no more),
    as the order to show them in: ascending (``"ranked"``: their retrieval order) or shuffled."""
    chosen = rng.sample(range(n_candidates), min(size, n_candidates))
    if order == "ranked":
        return sorted(chosen)
    rng.shuffle(chosen)
    return chosen


def shown(example: SelectorExample, order: Sequence[int]) -> dict[str, str]:
    """The Alpaca record of ``example`` showing only the candidates ``order`` names, in that
    order (``order[j]`` as Document j), the label renumbered and restricted to them."""
    if len(set(order)) != len(order) or not all(0 <= i < len(example.candidates) for i in order):
        raise ValueError(f"order {list(order)} does not name distinct candidates of "
                         f"{len(example.candidates)}")
    gold = set(example.label)
    label = [j for j, i in enumerate(order) if i in gold]  # ascending: the canonical form
    return selector_prompt(example.question, [example.candidates[i] for i in order]).alpaca(
        format_selection(label))


def permuted_selector_records(records: Sequence[dict[str, str]], copies: int, seed: int,
                              keep_given_order: bool = False, subset_size: int | None = None,
                              subset_order: str = "shuffled"
                              ) -> tuple[list[dict[str, str]], int]:
    """``copies`` random permutations of every Selector record among ``records`` (the other
    agents' records are left out), and how many Selector records there were.

    ``keep_given_order`` also writes each record in its own order first (rebuilt, so checked like
    the others): mixed with the permutations, the model keeps the rank prior the rollouts show
    (retrieval order) while the shuffled copies reward reading the documents.

    ``subset_size`` makes each copy a random ``subset_size`` of the record's candidates, in
    ``subset_order`` order (``"ranked"`` or ``"shuffled"``), drawn uniformly among the subsets
    that hold at least one of its gold candidates where it has any (random subsets of five of
    the top ten of HotpotQA's distractor set hold none for 28 % of the records, where the
    rollouts' top five hold none for 3 %: the empty label would be taught far more often than
    it is right); the given order is then its first ``subset_size`` candidates, the top of the
    retrieval."""
    if copies < 1:
        raise ValueError(f"copies must be at least 1, got {copies}")
    if subset_size is not None and subset_size < 1:
        raise ValueError(f"subset_size must be at least 1, got {subset_size}")
    if subset_order not in SUBSET_ORDERS:
        raise ValueError(f"subset order must be one of {SUBSET_ORDERS}, got "
                         f"{subset_order!r}")
    rng = random.Random(seed)
    out: list[dict[str, str]] = []
    found = 0
    for n, record in enumerate(records):
        if not is_selector_record(record):
            continue
        found += 1
        example = parse_selector_record(record, where=f"record {n}")
        size, gold = len(example.candidates), set(example.label)
        if keep_given_order:
            out.append(shown(example, range(min(size, subset_size or size))))
        for _ in range(copies):
            if subset_size is None:
                order = list(range(size))
                rng.shuffle(order)
            else:  # redrawn until it holds a gold candidate, where the record has one
                order = drawn_subset(size, subset_size, subset_order, rng)
                while gold and not gold & set(order):
                    order = drawn_subset(size, subset_size, subset_order, rng)
            out.append(shown(example, order))
    return out, found
