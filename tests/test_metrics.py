"""Tests of mmoa.metrics: hand-computed values, the original rules, SQuAD v1.1 parity."""

from __future__ import annotations

import random
import re
import string
from collections import Counter

import pytest

from mmoa.metrics import (
    DEFAULT_PROFILE,
    SCORING_PROFILES,
    QAScores,
    accuracy,
    exact_match,
    extract_answer,
    f1_score,
    get_profile,
    mean_scores,
    normalize_answer,
    normalize_unicode_punctuation,
    score_answer,
)

# ---------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("  An   apple\ta day\n", "apple day"),
        # punctuation becomes a space in the "mmoa" variant
        ("Rock-Paper", "rock paper"),
        ("U.S.A.", "u s"),  # "u s a" -> the lone "a" is an article and is dropped
        ("O'Neill", "o neill"),
        # unicode dash, curly quotes, ellipsis: first mapped to ASCII, then to spaces
        ("Rock–Paper “Scissors”…", "rock paper scissors"),
        ("Rock—Paper", "rock paper"),
        ("it’s", "it s"),
        ("5−3", "5 3"),  # U+2212 minus sign
        ("1⁄2", "1 2"),  # U+2044 fraction slash
        # articles only as whole words
        ("Theatre anatomy", "theatre anatomy"),
        ("the", ""),
        ("", ""),
        # soft hyphen and control characters vanish instead of splitting the word
        ("co\u00adoperate", "cooperate"),
        ("ab\x07cd", "abcd"),
    ],
)
def test_normalize_mmoa(text: str, expected: str) -> None:
    assert normalize_answer(text) == expected
    assert normalize_answer(text, "mmoa") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower", "eiffel tower"),
        ("Rock-Paper", "rockpaper"),  # SQuAD deletes punctuation
        ("U.S.A.", "usa"),
        ("O'Neill", "oneill"),
        ("Rock–Paper", "rock–paper"),  # no unicode mapping in SQuAD: U+2013 stays
        ("a (big) test!", "big test"),
        ("", ""),
    ],
)
def test_normalize_squad(text: str, expected: str) -> None:
    assert normalize_answer(text, "squad") == expected


def test_unknown_normalizer_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown answer normaliser 'nope'"):
        normalize_answer("x", "nope")
    with pytest.raises(ValueError, match="unknown answer normaliser"):
        score_answer("x", "x", normalizer="nope")


def test_unicode_punctuation_map() -> None:
    assert normalize_unicode_punctuation("‘a’ “b” c–d e—f g… h″") == "'a' \"b\" c-d e-f g... h''"


# ---------------------------------------------------------------------------------------------
# Answer extraction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Paris", "Paris"),
        ("Let me think.\n\nParis", "Paris"),
        ("Reasoning...\n\nAnswer: Paris", "Paris"),
        ("The answer is: 42", "42"),
        ("Answer: a\nAnswer: b", "b"),  # the last marker wins
        ("a\n\nb\n\nc", "c"),
        ("answer: Paris", "answer: Paris"),  # markers are case-sensitive, as in the original
        ("", ""),
    ],
)
def test_extract_answer(text: str, expected: str) -> None:
    assert extract_answer(text) == expected


def test_extraction_applies_to_prediction_only() -> None:
    # prediction "Reasoning\n\nAnswer: Paris" -> "Paris"; gold stays "paris" -> all 1
    assert score_answer("Reasoning\n\nAnswer: Paris", "paris") == QAScores(1.0, 1.0, 1.0, 1.0, 1.0)
    # Without extraction the prediction normalises to "reasoning answer paris" (3 tokens):
    # P = 1/3, R = 1/1, F1 = 2*(1/3)*1/(1/3+1) = (2/3)/(4/3) = 0.5; Acc 1 (substring), EM 0.
    s = score_answer("Reasoning\n\nAnswer: Paris", "paris", extract=False)
    assert (s.acc, s.em, s.f1) == (1.0, 0.0, pytest.approx(0.5))
    # A gold is never cut: gold "Answer: Paris" normalises to "answer paris", pred to "paris".
    # Acc 0 ("answer paris" not in "paris"); P = 1/1, R = 1/2, F1 = 2*1*0.5/1.5 = 2/3.
    s = score_answer("Paris", "Answer: Paris")
    assert (s.acc, s.em, s.f1) == (0.0, 0.0, pytest.approx(2 / 3))


# ---------------------------------------------------------------------------------------------
# Hand-computed metric values
# ---------------------------------------------------------------------------------------------


def test_token_f1_hand_computed() -> None:
    # pred -> "quick brown fox" (3 tokens), gold -> "quick red fox jumps" (4 tokens)
    # common = {quick, fox} = 2; P = 2/3, R = 2/4; F1 = 2*(2/3)*(1/2)/(2/3+1/2) = (2/3)/(7/6) = 4/7
    s = score_answer("The quick brown fox", "a quick red fox jumps")
    assert s.precision == pytest.approx(2 / 3)
    assert s.recall == pytest.approx(1 / 2)
    assert s.f1 == pytest.approx(4 / 7)
    assert s.em == 0.0
    assert s.acc == 0.0  # "quick red fox jumps" is not a substring of "quick brown fox"


def test_token_f1_counter_overlap_counts_repeats_once_per_gold_token() -> None:
    # pred "paris paris paris" vs gold "paris": overlap min(3, 1) = 1
    # P = 1/3, R = 1/1, F1 = 2*(1/3)*1/(1/3+1) = 0.5
    s = score_answer("Paris, Paris, Paris", "Paris")
    assert (s.precision, s.recall, s.f1) == (pytest.approx(1 / 3), 1.0, pytest.approx(0.5))
    assert s.acc == 1.0 and s.em == 0.0


def test_exact_match_after_normalisation() -> None:
    # "The  Beatles!" -> "beatles" == "beatles"
    assert exact_match("The  Beatles!", "beatles") == 1.0
    assert f1_score("The  Beatles!", "beatles") == 1.0
    assert accuracy("The  Beatles!", "beatles") == 1.0


def test_acc_is_a_character_level_substring_test() -> None:
    # "george" is inside "georgetown": Acc 1 although no token matches (F1 0) - the original's quirk
    s = score_answer("Georgetown", "George")
    assert (s.acc, s.em, s.f1) == (1.0, 0.0, 0.0)


def test_max_over_aliases_each_metric_independently() -> None:
    # pred -> "barack obama" (2 tokens)
    # alias "obama":                Acc 1 (substring), EM 0, common 1: P=1/2, R=1/1, F1=2/3
    # alias "barack hussein obama": Acc 0, EM 0, common 2: P=2/2, R=2/3, F1=2*1*(2/3)/(5/3)=4/5
    # alias "michelle":             all 0
    # max: Acc 1 (alias 1), EM 0, F1 0.8 with P=1, R=2/3 (alias 2, the best F1)
    s = score_answer("Barack Obama", ["Obama", "Barack Hussein Obama", "Michelle"])
    assert s.acc == 1.0
    assert s.em == 0.0
    assert s.f1 == pytest.approx(0.8)
    assert s.precision == pytest.approx(1.0)
    assert s.recall == pytest.approx(2 / 3)
    # adding an exact alias lifts EM and F1 to 1
    s = score_answer("Barack Obama", ["Obama", "Barack Obama"])
    assert (s.acc, s.em, s.f1) == (1.0, 1.0, 1.0)


def test_single_string_gold_equals_one_alias_list() -> None:
    assert score_answer("the cat sat", "cat") == score_answer("the cat sat", ["cat"])


# ---------------------------------------------------------------------------------------------
# The yes/no rule
# ---------------------------------------------------------------------------------------------


def test_yes_no_mismatch_zeroes_every_metric_including_acc() -> None:
    # pred -> "yes it is", gold -> "yes": gold is in {yes, no, noanswer} and they differ -> all 0
    assert score_answer("Yes, it is.", "yes") == QAScores(0.0, 0.0, 0.0, 0.0, 0.0)
    # without the rule: Acc 1 (substring); P = 1/3, R = 1, F1 = 2*(1/3)/(4/3) = 0.5
    s = score_answer("Yes, it is.", "yes", yes_no_rule=False)
    assert (s.acc, s.em, s.f1) == (1.0, 0.0, pytest.approx(0.5))


def test_yes_no_rule_applies_when_the_prediction_is_yes_no() -> None:
    # pred -> "no", gold -> "no way": differ and pred is "no" -> 0 (plain F1 would be 2/3)
    assert score_answer("No", "no way").f1 == 0.0
    assert score_answer("No", "no way", yes_no_rule=False).f1 == pytest.approx(2 / 3)
    # "noanswer" counts too
    assert score_answer("noanswer", "noanswer given").acc == 0.0


def test_yes_no_match_scores_one() -> None:
    assert score_answer("No.", "no") == QAScores(1.0, 1.0, 1.0, 1.0, 1.0)
    assert score_answer("YES", "yes").em == 1.0


def test_yes_no_rule_is_per_alias() -> None:
    # alias "yes" is zeroed by the rule, alias "yes it is" matches exactly -> max is 1
    assert score_answer("yes it is", ["yes", "yes it is"]).em == 1.0


# ---------------------------------------------------------------------------------------------
# Empty strings
# ---------------------------------------------------------------------------------------------


def test_empty_gold_is_not_found_in_every_prediction() -> None:
    # gold "the" normalises to "", a substring of anything; Acc is 1 only for an empty prediction
    assert score_answer("Paris", "the") == QAScores(0.0, 0.0, 0.0, 0.0, 0.0)
    # empty vs empty: EM 1 and Acc 1; F1 0 because there is no token overlap (SQuAD's convention)
    s = score_answer("", "the")
    assert (s.acc, s.em, s.f1) == (1.0, 1.0, 0.0)


def test_empty_prediction_scores_zero_against_a_real_gold() -> None:
    assert score_answer("", "Paris") == QAScores(0.0, 0.0, 0.0, 0.0, 0.0)


# ---------------------------------------------------------------------------------------------
# Batch helper and errors
# ---------------------------------------------------------------------------------------------


def test_mean_scores_hand_computed() -> None:
    # example 1: "Paris" vs "paris" -> Acc 1, EM 1, F1 1
    # example 2: "The quick brown fox" vs "a quick red fox jumps" -> Acc 0, EM 0, F1 4/7
    # means: Acc 1/2, EM 1/2, F1 (1 + 4/7)/2 = 11/14 ~ 0.785714
    batch = mean_scores(["Paris", "The quick brown fox"], [["paris"], "a quick red fox jumps"])
    assert batch.count == 2
    assert batch.acc == pytest.approx(0.5)
    assert batch.em == pytest.approx(0.5)
    assert batch.f1 == pytest.approx(11 / 14)
    # precision (1 + 2/3)/2 = 5/6; recall (1 + 1/2)/2 = 3/4
    assert batch.precision == pytest.approx(5 / 6)
    assert batch.recall == pytest.approx(3 / 4)
    assert batch.as_percent() == {"acc": 50.0, "em": 50.0, "f1": 78.57}
    assert batch.as_dict()["count"] == 2


def test_mean_scores_errors() -> None:
    with pytest.raises(ValueError, match="2 predictions but 1 gold"):
        mean_scores(["a", "b"], ["a"])
    with pytest.raises(ValueError, match="empty batch"):
        mean_scores([], [])


def test_score_answer_input_errors() -> None:
    with pytest.raises(ValueError, match="no gold answers"):
        score_answer("x", [])
    with pytest.raises(TypeError, match="gold answer 1 must be a string, got int"):
        score_answer("x", ["x", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="prediction must be a string"):
        score_answer(None, "x")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Parity with the official SQuAD v1.1 evaluation script
# ---------------------------------------------------------------------------------------------
# The functions below re-implement the official `evaluate-v1.1.py` definitions (normalize_answer,
# f1_score, exact_match_score, metric_max_over_ground_truths) independently of mmoa.metrics.


def _squad_normalize_answer(s: str) -> str:
    def remove_articles(text: str) -> str:
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text: str) -> str:
        return " ".join(text.split())

    def remove_punc(text: str) -> str:
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    def lower(text: str) -> str:
        return text.lower()

    return white_space_fix(remove_articles(remove_punc(lower(s))))


def _squad_f1_score(prediction: str, ground_truth: str) -> float:
    prediction_tokens = _squad_normalize_answer(prediction).split()
    ground_truth_tokens = _squad_normalize_answer(ground_truth).split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1


def _squad_exact_match_score(prediction: str, ground_truth: str) -> bool:
    return _squad_normalize_answer(prediction) == _squad_normalize_answer(ground_truth)


def _squad_metric_max_over_ground_truths(metric_fn, prediction: str, ground_truths: list[str]):
    scores_for_ground_truths = []
    for ground_truth in ground_truths:
        score = metric_fn(prediction, ground_truth)
        scores_for_ground_truths.append(score)
    return max(scores_for_ground_truths)


_HANDPICKED = [
    "",
    " ",
    "the",
    "a an the",
    "The Eiffel Tower",
    "eiffel tower",
    "Eiffel-Tower!",
    "U.S.A.",
    "usa",
    "u s a",
    "O'Neill",
    "oneill",
    "Rock–Paper",
    "rock–paper",
    "“Scissors”",
    "scissors",
    "Café au lait",
    "CAFÉ AU LAIT",
    "İstanbul",
    "東京 タワー",
    "1,000,000",
    "1000000",
    "$5.00",
    "500",
    "yes",
    "no",
    "Yes, it is.",
    "an apple a day",
    "apple day",
    "Paris, Paris, Paris",
    "paris",
    "the the the",
    "New York City",
    "new york",
    "... ",
    "(!)",
    "tab\tseparated\nlines",
    "tab separated lines",
]

_VOCAB = [
    "the", "a", "an", "The", "A", "AN", "paris", "Paris", "france", "tower", "new", "york",
    "yes", "no", "noanswer", "1999", "3.5", "U.S.", "it's", "rock-paper", "café", "naïve",
    "東京", "“quoted”", "–", "—", "…", "!", "?", ",", ".", "'", '"', "(", ")", "", " ", "\t",
]  # fmt: skip


def _random_string(rng: random.Random) -> str:
    words = [rng.choice(_VOCAB) for _ in range(rng.randint(0, 6))]
    return rng.choice([" ", "", "  "]).join(words) if rng.random() < 0.2 else " ".join(words)


def _parity_pairs() -> list[tuple[str, list[str]]]:
    rng = random.Random(1234)
    pairs: list[tuple[str, list[str]]] = [(p, [g]) for p in _HANDPICKED for g in _HANDPICKED]
    for _ in range(3000):
        pred = _random_string(rng)
        golds = [_random_string(rng) for _ in range(rng.randint(1, 3))]
        pairs.append((pred, golds))
    return pairs


def test_squad_variant_matches_official_script() -> None:
    pairs = _parity_pairs()
    assert len(pairs) > 4000
    for pred, golds in pairs:
        ours = score_answer(pred, golds, normalizer="squad", extract=False, yes_no_rule=False)
        official_em = _squad_metric_max_over_ground_truths(_squad_exact_match_score, pred, golds)
        official_f1 = _squad_metric_max_over_ground_truths(_squad_f1_score, pred, golds)
        assert ours.em == float(official_em), (pred, golds)
        assert ours.f1 == float(official_f1), (pred, golds)  # bit-identical, same arithmetic
        assert normalize_answer(pred, "squad") == _squad_normalize_answer(pred)


def test_yes_no_rule_only_changes_yes_no_pairs() -> None:
    # With the rule on, the squad variant still equals the official script unless a yes/no pair
    # disagrees, in which case the score is 0.
    for pred, golds in _parity_pairs():
        ours = score_answer(pred, golds, normalizer="squad", extract=False)
        expected = 0.0
        for gold in golds:
            p, g = _squad_normalize_answer(pred), _squad_normalize_answer(gold)
            if (p in {"yes", "no", "noanswer"} or g in {"yes", "no", "noanswer"}) and p != g:
                continue
            expected = max(expected, float(_squad_f1_score(pred, gold)))
        assert ours.f1 == expected, (pred, golds)


# ---------------------------------------------------------------------------------------------
# Scoring profiles: one name for normaliser + extraction + yes/no rule
# ---------------------------------------------------------------------------------------------

# Predictions that carry extraction markers or yes/no: where the profiles differ most.
_MARKED = ["Reasoning\n\nAnswer: Paris", "The answer is: yes", "Answer: U.S.", "yes\n\nno",
           "Let me think.\n\nThe answer is: Barack Obama", "noanswer"]


def _profile_pairs() -> list[tuple[str, list[str]]]:
    golds = ["Paris", "yes", "no", "US", "U.S.", "Barack Obama", "noanswer"]
    return _parity_pairs() + [(p, [g]) for p in _MARKED for g in golds]


def test_profiles_bundle_the_three_choices() -> None:
    assert sorted(SCORING_PROFILES) == ["hotpotqa", "mmoa", "squad"]
    assert DEFAULT_PROFILE == "mmoa"
    mmoa, squad, hotpot = (get_profile(n) for n in ("mmoa", "squad", "hotpotqa"))
    assert (mmoa.normalizer, mmoa.extract, mmoa.yes_no_rule) == ("mmoa", True, True)
    assert (squad.normalizer, squad.extract, squad.yes_no_rule) == ("squad", False, False)
    assert (hotpot.normalizer, hotpot.extract, hotpot.yes_no_rule) == ("squad", False, True)
    assert get_profile(squad) is squad
    assert squad.as_dict()["profile"] == "squad"
    assert squad.describe().startswith(
        "squad: squad normaliser, no answer extraction, no yes/no rule")
    with pytest.raises(ValueError, match="unknown scoring profile 'nope'"):
        score_answer("x", "x", profile="nope")


def test_us_abbreviation_under_each_profile() -> None:
    # mmoa: "U.S." -> "u s" (2 tokens) vs "US" -> "us": no common token, F1 0, EM 0, Acc 0
    # squad: "U.S." -> "us" == "us": F1 1, EM 1, Acc 1 (what the official script reports)
    assert score_answer("U.S.", "US") == QAScores(0.0, 0.0, 0.0, 0.0, 0.0)
    assert score_answer("U.S.", "US", profile="squad") == QAScores(1.0, 1.0, 1.0, 1.0, 1.0)
    assert score_answer("U.S.", "US", profile="hotpotqa").f1 == 1.0


def test_squad_profile_neither_extracts_nor_applies_the_yes_no_rule() -> None:
    # "The answer is: Paris" -> squad "answer is paris" (3 tokens) vs "paris":
    # P = 1/3, R = 1, F1 = 2*(1/3)/(4/3) = 0.5; Acc 1 (substring); EM 0.
    s = score_answer("The answer is: Paris", "Paris", profile="squad")
    assert (s.acc, s.em, s.f1) == (1.0, 0.0, pytest.approx(0.5))
    # the default profile cuts the prediction to "Paris": all 1
    assert score_answer("The answer is: Paris", "Paris").f1 == 1.0
    # "yes it is" vs "yes": squad P = 1/3, R = 1, F1 0.5; mmoa and hotpotqa: 0 (yes/no rule)
    assert score_answer("Yes, it is.", "yes", profile="squad").f1 == pytest.approx(0.5)
    assert score_answer("Yes, it is.", "yes", profile="hotpotqa").f1 == 0.0
    assert score_answer("Yes, it is.", "yes").f1 == 0.0


def test_squad_profile_alone_matches_the_official_script() -> None:
    # The old `normalizer="squad"` kept extraction and the yes/no rule; the profile needs no
    # further flags to give the official figures.
    for pred, golds in _profile_pairs():
        ours = score_answer(pred, golds, profile="squad")
        assert ours.em == float(
            _squad_metric_max_over_ground_truths(_squad_exact_match_score, pred, golds)
        ), (pred, golds)
        assert ours.f1 == float(
            _squad_metric_max_over_ground_truths(_squad_f1_score, pred, golds)
        ), (pred, golds)
        assert f1_score(pred, golds, profile="squad") == ours.f1
        assert exact_match(pred, golds, profile="squad") == ours.em


# The official HotpotQA `hotpot_evaluate_v1.py` answer metrics, re-implemented independently of
# mmoa.metrics: SQuAD's normaliser, the yes/no/noanswer rule in f1_score, one gold per question.


def _hotpot_f1_score(prediction: str, ground_truth: str) -> tuple[float, float, float]:
    normalized_prediction = _squad_normalize_answer(prediction)
    normalized_ground_truth = _squad_normalize_answer(ground_truth)
    zero_metric = (0, 0, 0)
    if (normalized_prediction in ["yes", "no", "noanswer"]
            and normalized_prediction != normalized_ground_truth):
        return zero_metric
    if (normalized_ground_truth in ["yes", "no", "noanswer"]
            and normalized_prediction != normalized_ground_truth):
        return zero_metric
    prediction_tokens = normalized_prediction.split()
    ground_truth_tokens = normalized_ground_truth.split()
    common = Counter(prediction_tokens) & Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return zero_metric
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    f1 = (2 * precision * recall) / (precision + recall)
    return f1, precision, recall


def _hotpot_exact_match_score(prediction: str, ground_truth: str) -> bool:
    return _squad_normalize_answer(prediction) == _squad_normalize_answer(ground_truth)


def test_hotpotqa_profile_matches_the_official_script() -> None:
    checked = 0
    for pred, golds in _profile_pairs():
        for gold in golds:  # the HotpotQA script scores one gold per question
            ours = score_answer(pred, gold, profile="hotpotqa")
            f1, precision, recall = _hotpot_f1_score(pred, gold)
            assert ours.em == float(_hotpot_exact_match_score(pred, gold)), (pred, gold)
            assert (ours.f1, ours.precision, ours.recall) == (f1, precision, recall), (pred, gold)
            checked += 1
    assert checked > 7000


def test_default_profile_is_the_original_behaviour() -> None:
    # The default scores exactly as the explicit old keyword defaults, and the keyword arguments
    # still override a profile one by one.
    for pred, golds in _profile_pairs()[::7]:
        default = score_answer(pred, golds)
        assert default == score_answer(pred, golds, profile="mmoa")
        assert default == score_answer(pred, golds, normalizer="mmoa", extract=True,
                                       yes_no_rule=True)
        assert score_answer(pred, golds, profile="squad", extract=True, yes_no_rule=True) == \
            score_answer(pred, golds, normalizer="squad")
    # mean_scores and accuracy take the profile too
    batch = mean_scores(["U.S.", "The answer is: Paris"], ["US", "Paris"], profile="squad")
    # example 1: all 1; example 2: Acc 1, EM 0, F1 0.5 -> means Acc 1, EM 0.5, F1 0.75
    assert (batch.acc, batch.em, batch.f1) == (1.0, 0.5, 0.75)
    assert accuracy("U.S.", "US", profile="squad") == 1.0


def test_contains_answer_words_needs_whole_words_in_order() -> None:
    from mmoa.metrics import contains_answer_words

    assert contains_answer_words("The capital of Iran is Tehran.", ["Tehran"])
    assert contains_answer_words("the Pacific Ocean", ["Atlantic", "Pacific Ocean"])
    assert contains_answer_words("I do not know", "I")  # "i" stands as a whole word
    assert not contains_answer_words("Iodine", ["I"])  # not inside a word
    assert not contains_answer_words("Ocean Pacific", ["Pacific Ocean"])  # order counts
    assert not contains_answer_words("anything", ["", "  "])  # empty aliases never match
