"""Answer normalisation and the QA metrics Acc, EM and token F1: one definition for the project.

The MAPPO reward, the SFT data builder and the evaluation all import these functions, so the number
a policy is trained on is exactly the number it is evaluated with.

What a score means is fixed by three choices: the normaliser, answer extraction and the yes/no
rule. A :class:`ScoringProfile` bundles them under one name, so a table can say in one word how it
was scored, and each profile reproduces one published evaluation script:

``"mmoa"`` (default)
    MMOA-RAG's ``evaluate_qr_s_g.py``: the ``"mmoa"`` normaliser, answer extraction, the yes/no
    rule (and, unlike the original, the maximum over gold aliases).
``"squad"``
    The official SQuAD v1.1 ``evaluate-v1.1.py``: the ``"squad"`` normaliser, no extraction, no
    yes/no rule. "U.S." and "US" are one token each here (F1 1) and two tokens vs one under
    ``"mmoa"`` (F1 0).
``"hotpotqa"``
    The official HotpotQA ``hotpot_evaluate_v1.py`` answer EM and F1: the ``"squad"`` normaliser
    with the yes/no rule (which is HotpotQA's, not SQuAD's), no extraction.

The test suite checks ``"squad"`` and ``"hotpotqa"`` against re-implementations of those scripts.
The keyword arguments ``normalizer``, ``extract`` and ``yes_no_rule`` still override a profile's
choice one by one (``score_answer(p, g, normalizer="squad")`` keeps extraction and the yes/no rule,
as it always did).

Two normalisers are available, chosen by name:

``"mmoa"`` (default)
    The original MMOA-RAG system's normaliser (Atlas/Contriever style): lower-case; map unicode
    hyphens, dashes, minus signs, quotes, apostrophes, primes, slashes and the ellipsis to their
    ASCII forms and drop control characters; replace every ``string.punctuation`` character with a
    space; drop the articles a/an/the as whole words; collapse whitespace. Replacing punctuation by
    a space (instead of deleting it) keeps ``"Rock–Paper"`` two tokens, ``"rock paper"``.
``"squad"``
    The official SQuAD v1.1 evaluation script's normaliser: lower-case, delete punctuation
    characters, drop articles, collapse whitespace. With it (and ``extract=False``,
    ``yes_no_rule=False``: the ``"squad"`` profile), :func:`exact_match` and :func:`f1_score` give
    exactly the official script's values.

Scores are fractions in [0, 1] everywhere in code; multiply by 100 only for printing
(:meth:`QAScores.as_percent`).

Rules kept from the original system (all documented where they are implemented):

* Yes/no rule: when either normalised string is ``yes``, ``no`` or ``noanswer`` and the two differ,
  that (prediction, gold) pair scores 0 on every metric, Acc included: "yes it is" is not a
  correct answer to a yes/no question whose gold is "yes".
* Acc is a character-level substring test of the normalised gold in the normalised prediction.
* Answer extraction (:func:`extract_answer`) cuts a prediction to the text after the last
  ``"\\n\\n"``, ``"Answer: "`` and ``"The answer is: "``.

Changes from the original, on purpose:

* Every metric is the maximum over a list of gold aliases (the original scored one gold string and
  joined AmbigQA's several answers with ", ", which distorts EM and F1).
* Answer extraction applies to predictions only. Gold answers are dataset labels, not model output;
  cutting them at "Answer: " could only damage a legitimate label.
* An empty normalised gold counts as found only in an empty prediction: the plain substring test
  would otherwise credit every prediction with Acc 1 for a gold like "the".
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

__all__ = [
    "DEFAULT_PROFILE",
    "NORMALIZERS",
    "SCORING_PROFILES",
    "QAScores",
    "ScoringOptions",
    "ScoringProfile",
    "accuracy",
    "contains_answer_words",
    "exact_match",
    "extract_answer",
    "f1_score",
    "get_normalizer",
    "get_profile",
    "mean_scores",
    "normalize_answer",
    "normalize_answer_mmoa",
    "normalize_answer_squad",
    "normalize_unicode_punctuation",
    "score_answer",
]

# ---------------------------------------------------------------------------------------------
# Unicode punctuation normalisation (the original's normalize_text step)
# ---------------------------------------------------------------------------------------------

# Control characters that are deleted. Tab, newline, carriage return and the other white-space
# controls are not in this set: they are white space and disappear in the final whitespace collapse.
_CONTROLS = "".join(chr(c) for c in (*range(0x01, 0x09), 0x0E, 0x0F, *range(0x10, 0x1C)))
# Hyphens, dashes and minus signs -> "-".
_HYPHENS = "\u2010\u2011\u2012\u2013\u2014\u2015\u2043\u2212\uff0d\u207b"
# Double quotes -> '"'.
_DOUBLE_QUOTES = "\u201c\u201d\u201e\u201f"
# Single quotes, apostrophes and accents used as quotes -> "'".
_SINGLE_QUOTES = "\u2018\u2019\u201a\u201b\u055a\ua78b\ua78c\uff07\u0060\u00b4\u2032\u2035"
# Slashes -> "/".
_SLASHES = "\u2044\u2215"

_CHAR_MAP: dict[int, str] = {
    **{ord(c): "" for c in _CONTROLS},
    ord("\u000b"): " ",
    ord("\u000c"): " ",
    ord("\u0085"): " ",
    ord("\u00ad"): "",  # soft hyphen: invisible, deleted
    **{ord(c): "-" for c in _HYPHENS},
    **{ord(c): '"' for c in _DOUBLE_QUOTES},
    **{ord(c): "'" for c in _SINGLE_QUOTES},
    ord("\u2033"): "''",  # double prime
    ord("\u2036"): "''",  # reversed double prime
    ord("\u2034"): "'''",  # triple prime
    ord("\u2037"): "'''",  # reversed triple prime
    ord("\u2057"): "''''",  # quadruple prime
    ord("\u2026"): "...",  # horizontal ellipsis
    **{ord(c): "/" for c in _SLASHES},
}


def normalize_unicode_punctuation(text: str) -> str:
    """Map typographic quotes, dashes, primes, slashes and the ellipsis to ASCII; drop controls.

    This matters because the typographic forms are not in ``string.punctuation``: without this
    step "Rock–Paper" (en dash) would stay one token while "Rock-Paper" becomes two.
    """
    return text.translate(_CHAR_MAP)


# ---------------------------------------------------------------------------------------------
# Normalisers
# ---------------------------------------------------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_PUNCT_TO_SPACE = str.maketrans({c: " " for c in string.punctuation})
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer_mmoa(text: str) -> str:
    """The original MMOA-RAG normaliser (see the module docstring)."""
    text = normalize_unicode_punctuation(text.lower())
    text = text.translate(_PUNCT_TO_SPACE)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def normalize_answer_squad(text: str) -> str:
    """The official SQuAD v1.1 normaliser: punctuation is deleted, not replaced by a space."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


NORMALIZERS: dict[str, Callable[[str], str]] = {
    "mmoa": normalize_answer_mmoa,
    "squad": normalize_answer_squad,
}


def get_normalizer(name: str) -> Callable[[str], str]:
    try:
        return NORMALIZERS[name]
    except KeyError:
        raise ValueError(
            f"unknown answer normaliser {name!r}; expected one of {sorted(NORMALIZERS)}"
        ) from None


def normalize_answer(text: str, normalizer: str = "mmoa") -> str:
    return get_normalizer(normalizer)(text)


# ---------------------------------------------------------------------------------------------
# Answer extraction
# ---------------------------------------------------------------------------------------------

_EXTRACTION_MARKERS = ("\n\n", "Answer: ", "The answer is: ")


def extract_answer(prediction: str) -> str:
    """Cut a model output down to its answer, as the original system did before scoring.

    In turn: keep the text after the last ``"\\n\\n"``, then after the last ``"Answer: "``, then
    after the last ``"The answer is: "`` (each marker is case-sensitive, as in the original). A
    Generator that explains before answering is thus scored on its final answer. Applied to
    predictions only (see the module docstring).
    """
    for marker in _EXTRACTION_MARKERS:
        prediction = prediction.rsplit(marker, 1)[-1]
    return prediction


# ---------------------------------------------------------------------------------------------
# Scoring profiles
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScoringProfile:
    """A named bundle of the normaliser, answer extraction and the yes/no rule.

    Why a bundle: the normaliser alone does not fix the numbers (extraction and the yes/no rule
    move them too), so naming only the normaliser cannot make a table comparable with a paper's.
    ``reproduces`` names the evaluation script whose figures the profile gives.
    """

    name: str
    normalizer: str
    extract: bool
    yes_no_rule: bool
    reproduces: str

    def describe(self) -> str:
        """One line for a table's legend: the name, the three choices and the script."""
        choices = [
            f"{self.normalizer} normaliser",
            "answer extraction" if self.extract else "no answer extraction",
            "yes/no rule" if self.yes_no_rule else "no yes/no rule",
        ]
        return f"{self.name}: {', '.join(choices)}; max over gold aliases (= {self.reproduces})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready, for ``metrics.json``."""
        return {"profile": self.name, "normalizer": self.normalizer, "extract": self.extract,
                "yes_no_rule": self.yes_no_rule, "reproduces": self.reproduces}


SCORING_PROFILES: dict[str, ScoringProfile] = {
    "mmoa": ScoringProfile("mmoa", "mmoa", extract=True, yes_no_rule=True,
                           reproduces="MMOA-RAG evaluate_qr_s_g.py, which had one gold"),
    "squad": ScoringProfile("squad", "squad", extract=False, yes_no_rule=False,
                            reproduces="official SQuAD v1.1 evaluate script"),
    "hotpotqa": ScoringProfile("hotpotqa", "squad", extract=False, yes_no_rule=True,
                               reproduces="official HotpotQA evaluate script, answer EM/F1"),
}
#: The profile every scoring function uses unless told otherwise (the MMOA-RAG rules).
DEFAULT_PROFILE = "mmoa"


def get_profile(profile: str | ScoringProfile) -> ScoringProfile:
    """The profile of that name (a :class:`ScoringProfile` is returned as it is)."""
    if isinstance(profile, ScoringProfile):
        return profile
    try:
        return SCORING_PROFILES[profile]
    except KeyError:
        raise ValueError(
            f"unknown scoring profile {profile!r}; expected one of {sorted(SCORING_PROFILES)}"
        ) from None


def _resolve(
    profile: str | ScoringProfile,
    normalizer: str | None,
    extract: bool | None,
    yes_no_rule: bool | None,
) -> tuple[str, bool, bool]:
    """The profile's three choices with any explicit keyword argument taking precedence."""
    base = get_profile(profile)
    return (
        base.normalizer if normalizer is None else normalizer,
        base.extract if extract is None else extract,
        base.yes_no_rule if yes_no_rule is None else yes_no_rule,
    )


# ---------------------------------------------------------------------------------------------
# Pairwise metrics on already-normalised strings
# ---------------------------------------------------------------------------------------------

_YES_NO = frozenset({"yes", "no", "noanswer"})


def _yes_no_mismatch(pred_norm: str, gold_norm: str) -> bool:
    return (pred_norm in _YES_NO or gold_norm in _YES_NO) and pred_norm != gold_norm


def _f1_parts(pred_norm: str, gold_norm: str) -> tuple[float, float, float]:
    """(f1, precision, recall) of whitespace tokens with Counter overlap, as in SQuAD."""
    pred_tokens = pred_norm.split()
    gold_tokens = gold_norm.split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0, 0.0, 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall), precision, recall


@dataclass(frozen=True)
class QAScores:
    """Acc / EM / F1 (with F1's precision and recall) as fractions in [0, 1].

    For one prediction each value is the maximum over the gold aliases, taken independently per
    metric (as SQuAD does); precision and recall are those of the alias with the best F1 (the first
    one on ties). For a batch (:func:`mean_scores`) they are means and ``count`` is the batch size.
    """

    acc: float
    em: float
    f1: float
    precision: float
    recall: float
    count: int = 1

    def as_dict(self) -> dict[str, float]:
        return {
            "acc": self.acc,
            "em": self.em,
            "f1": self.f1,
            "precision": self.precision,
            "recall": self.recall,
            "count": self.count,
        }

    def as_percent(self) -> dict[str, float]:
        """The three headline metrics x100, rounded to two decimals, for printing and tables."""
        return {
            "acc": round(100 * self.acc, 2),
            "em": round(100 * self.em, 2),
            "f1": round(100 * self.f1, 2),
        }


def _as_gold_list(golds: str | Sequence[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    gold_list = list(golds)
    if not gold_list:
        raise ValueError("no gold answers given: at least one alias is needed to score")
    for i, gold in enumerate(gold_list):
        if not isinstance(gold, str):
            raise TypeError(f"gold answer {i} must be a string, got {type(gold).__name__}")
    return gold_list


class ScoringOptions(TypedDict, total=False):
    """The keyword options of :func:`score_answer`, which the one-number metrics pass through.

    Typed once here so :func:`accuracy`, :func:`exact_match`, :func:`f1_score` and
    :func:`mean_scores` do not each repeat (and risk drifting from) ``score_answer``'s signature;
    the defaults live on ``score_answer`` alone.
    """

    profile: str | ScoringProfile
    normalizer: str | None
    extract: bool | None
    yes_no_rule: bool | None


def score_answer(
    prediction: str,
    golds: str | Sequence[str],
    *,
    profile: str | ScoringProfile = DEFAULT_PROFILE,
    normalizer: str | None = None,
    extract: bool | None = None,
    yes_no_rule: bool | None = None,
) -> QAScores:
    """Score one prediction against one gold string or a list of gold aliases.

    ``profile`` (see :data:`SCORING_PROFILES`) sets the three choices; ``normalizer``,
    ``extract`` and ``yes_no_rule``, when given, override it one by one. ``extract`` applies
    :func:`extract_answer` to the prediction first; ``yes_no_rule`` zeroes a pair where either
    side is yes/no/noanswer and they differ. The default is the original system's behaviour;
    ``profile="squad"`` gives the official SQuAD v1.1 figures.
    """
    if not isinstance(prediction, str):
        raise TypeError(f"prediction must be a string, got {type(prediction).__name__}")
    normalizer, extract, yes_no_rule = _resolve(profile, normalizer, extract, yes_no_rule)
    norm = get_normalizer(normalizer)
    pred_norm = norm(extract_answer(prediction) if extract else prediction)

    best_acc = best_em = 0.0
    best_f1, best_p, best_r = -1.0, 0.0, 0.0
    for gold in _as_gold_list(golds):
        gold_norm = norm(gold)
        if yes_no_rule and _yes_no_mismatch(pred_norm, gold_norm):
            acc = em = f1 = p = r = 0.0
        else:
            em = float(pred_norm == gold_norm)
            # An empty gold would be a substring of everything; it is found only in an empty
            # prediction (then Acc equals EM).
            acc = float(gold_norm in pred_norm) if gold_norm else em
            f1, p, r = _f1_parts(pred_norm, gold_norm)
        best_acc = max(best_acc, acc)
        best_em = max(best_em, em)
        if f1 > best_f1:
            best_f1, best_p, best_r = f1, p, r
    return QAScores(acc=best_acc, em=best_em, f1=best_f1, precision=best_p, recall=best_r)


def accuracy(
    prediction: str,
    golds: str | Sequence[str],
    **options: Unpack[ScoringOptions],
) -> float:
    """Acc of one prediction (max over aliases); options as in :func:`score_answer`."""
    return score_answer(prediction, golds, **options).acc


def exact_match(
    prediction: str,
    golds: str | Sequence[str],
    **options: Unpack[ScoringOptions],
) -> float:
    """EM of one prediction (max over aliases); options as in :func:`score_answer`."""
    return score_answer(prediction, golds, **options).em


def f1_score(
    prediction: str,
    golds: str | Sequence[str],
    **options: Unpack[ScoringOptions],
) -> float:
    """Token F1 of one prediction (max over aliases); options as in :func:`score_answer`.

    This is the shared MAPPO reward.
    """
    return score_answer(prediction, golds, **options).f1


def mean_scores(
    predictions: Sequence[str],
    golds: Sequence[str | Sequence[str]],
    **options: Unpack[ScoringOptions],
) -> QAScores:
    """Mean Acc / EM / F1 / precision / recall over a batch, as fractions; ``count`` = batch size.

    ``golds[i]`` is the gold string or alias list of ``predictions[i]``; options as in
    :func:`score_answer`.
    """
    if len(predictions) != len(golds):
        raise ValueError(
            f"{len(predictions)} predictions but {len(golds)} gold entries: they must pair up"
        )
    if not predictions:
        raise ValueError("cannot average the scores of an empty batch")
    scores = [score_answer(p, g, **options) for p, g in zip(predictions, golds, strict=True)]
    n = len(scores)
    return QAScores(
        acc=sum(s.acc for s in scores) / n,
        em=sum(s.em for s in scores) / n,
        f1=sum(s.f1 for s in scores) / n,
        precision=sum(s.precision for s in scores) / n,
        recall=sum(s.recall for s in scores) / n,
        count=n,
    )


def contains_answer_words(text: str, golds: str | Sequence[str],
                          profile: str | ScoringProfile = DEFAULT_PROFILE) -> bool:
    """Whether a gold alias's normalised words occur, whole and in order, in ``text``.

    Stricter than Acc's substring test, which counts iodine's "i" inside "I do not know": the
    check of the decision agent's known questions and of the TOA QR reward's fallback."""
    normalizer = get_profile(profile).normalizer
    padded = f" {normalize_answer(text, normalizer)} "
    aliases = [golds] if isinstance(golds, str) else golds
    return any(f" {gold} " in padded
               for gold in (normalize_answer(a, normalizer) for a in aliases) if gold)
