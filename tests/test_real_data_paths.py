"""Real-data paths, tried as a new user would: small files written in the exact published layouts
(HotpotQA, 2WikiMultihopQA, a FlashRAG wiki corpus and QA file, NQ-open) through the loaders,
the gold-passage statistics, the SFT builder's ``supporting`` labels, the scoring profiles and the
evaluation's report."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from json_files import write_json, write_jsonl

from mmoa.agents.candidates import Candidate
from mmoa.agents.parsers import parse_selection
from mmoa.agents.pipeline import BatchTimings, Trace
from mmoa.data.loaders import load_qa
from mmoa.data.records import QARecord
from mmoa.data.sft_builder import SFTBuildConfig, build_sft_records
from mmoa.data.support import GoldSupport, normalize_title, passage_title
from mmoa.evaluation import (
    EvalConfig,
    _support_precision,
    _support_recall,
    format_table,
    score_trace,
    scoring_legend,
)
from mmoa.retrieval.corpus import iter_corpus

# ---------------------------------------------------------------------------------------------
# Files in the published layouts
# ---------------------------------------------------------------------------------------------

# FlashRAG's wiki corpus (wiki18_100w.jsonl): "contents" is the title in literal double quotes,
# a newline, then the passage text.
FLASHRAG_CORPUS = [
    {"id": "1001", "contents": '"Scott Derrickson"\nScott Derrickson (born July 16, 1966) is an '
                               "American director, screenwriter and producer."},
    {"id": "1002", "contents": '"Ed Wood"\nEdward Davis Wood Jr. (October 10, 1924 – December '
                               "10, 1978) was an American filmmaker."},
    {"id": "1003", "contents": '"Ed Wood"\nWood spent his later years making pornographic films.'},
    {"id": "1004", "contents": '"Ed Wood (film)"\nEd Wood is a 1994 American biographical film '
                               "directed by Tim Burton."},
    {"id": "1005", "contents": '"Evan Morris"\nEvan L. Morris was a lobbyist for Genentech.'},
    {"id": "1006", "contents": '""Heroes" (David Bowie album)"\n"Heroes" is the twelfth studio '
                               "album by David Bowie."},
]  # fmt: skip

HOTPOT = [
    {"_id": "5a8b57f25542995d1e6f1371",
     "answer": "yes",
     "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
     "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
     "context": [["Scott Derrickson", ["Scott Derrickson is an American director."]],
                 ["Ed Wood", ["Edward Davis Wood Jr. was an American filmmaker."]]],
     "type": "comparison", "level": "hard"},
    {"_id": "5a7a06935542990198eaf050",
     "answer": "Genentech",
     "question": "Which company did the lobbyist Evan Morris work for?",
     "supporting_facts": [["Evan Morris", 0], ["Genentech", 0]],
     "context": [["Evan Morris", ["Evan L. Morris was a lobbyist for Genentech."]],
                 ["Genentech", ["Genentech is a biotechnology corporation."]]],
     "type": "bridge", "level": "medium"},
]  # fmt: skip

TWOWIKI = [
    {"_id": "028eaef60bdb11eba7f7acde48001122", "type": "comparison",
     "question": "Which album came out first, Heroes or Low?",
     "context": [['"Heroes" (David Bowie album)', ["It was released in 1977."]]],
     "supporting_facts": [['"Heroes" (David Bowie album)', 0]],
     "evidences": [['"Heroes"', "publication date", "1977"]],
     "answer": "Low"},
]  # fmt: skip

# FlashRAG's hotpotqa dev.jsonl: supporting facts in the metadata, titles without quotes.
FLASHRAG_QA = [
    {"id": "dev_0", "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
     "golden_answers": ["yes"],
     "metadata": {"type": "comparison", "level": "hard",
                  "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood"],
                                       "sent_id": [0, 0]}}},
]  # fmt: skip

NQ_OPEN = [
    {"question": "when was the last time anyone was on the moon",
     "answer": ["14 December 1972 UTC", "December 1972"]},
    {"question": "where did the Apollo program take place", "answer": ["U.S.", "United States"]},
]  # fmt: skip


_write_json, _write_jsonl = write_json, write_jsonl


def _corpus_documents(tmp_path: Path) -> list[dict[str, str]]:
    """The corpus as the retrieval server returns it: ``{"id", "contents"}`` per passage."""
    path = _write_jsonl(tmp_path / "wiki18_100w.jsonl", FLASHRAG_CORPUS)
    return [{"id": p.id, "contents": p.contents} for p in iter_corpus(path)]


def _trace(documents: list[dict[str, str]], selected: list[int]) -> Trace:
    candidates = [Candidate(doc, 0, rank) for rank, doc in enumerate(documents)]
    selection = ",".join(f"Document{i}" for i in selected)
    return Trace(question="q", candidates=candidates, selected=selected, answer="yes",
                 selection_parse=parse_selection(selection, len(candidates)))


# ---------------------------------------------------------------------------------------------
# Title normalisation
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("title", "expected"),
    [
        ('"Evan Morris"', "evan morris"),  # FlashRAG's quotes
        ("Evan Morris", "evan morris"),  # HotpotQA's title
        ("  Evan   Morris ", "evan morris"),
        ("Evan_Morris", "evan morris"),  # URL form
        ("Cafe\u0301 Society", "café society"),  # decomposed é -> NFC
        ('""Heroes" (David Bowie album)"', 'heroes" (david bowie album)'),
        ('"Heroes" (David Bowie album)', 'heroes" (david bowie album)'),
        ('""', ""),
    ],
)
def test_normalize_title(title: str, expected: str) -> None:
    assert normalize_title(title) == expected


def test_passage_title_is_the_first_line() -> None:
    assert passage_title('"Ed Wood"\nEdward Davis Wood Jr.') == '"Ed Wood"'
    assert passage_title("no title line") == "no title line"


def test_gold_support_prefers_ids_then_titles() -> None:
    both = QARecord("1", "q", ["a"], supporting_ids=["p1"], supporting_titles=["T"])
    assert GoldSupport.of(both) == GoldSupport("id", frozenset({"p1"}))
    titles = QARecord("2", "q", ["a"], supporting_titles=['"Ed Wood"', "Ed Wood", "X"])
    assert GoldSupport.of(titles) == GoldSupport("title", frozenset({"ed wood", "x"}))
    assert GoldSupport.of(QARecord("3", "q", ["a"])) is None
    assert GoldSupport.of(QARecord("4", "q", ["a"], supporting_titles=['""'])) is None


def test_gold_support_f1_of_a_selection() -> None:
    def cand(pid: str) -> Candidate:
        return Candidate({"id": pid, "contents": f"{pid}\ntext"}, 0, 0)

    gold = GoldSupport("id", frozenset({"p1", "p2"}))
    # P 1/4, R 1/2 -> 2 * 1/8 / (3/4) = 1/3
    assert gold.f1([cand("p1"), cand("x"), cand("y"), cand("z")]) == pytest.approx(1 / 3)
    assert gold.f1([cand("p1"), cand("p2")]) == 1.0
    assert gold.f1([cand("x")]) == 0.0 and gold.f1([]) == 0.0


# ---------------------------------------------------------------------------------------------
# Gold-passage recall and precision on a FlashRAG corpus
# ---------------------------------------------------------------------------------------------


def test_gold_passage_recall_on_a_flashrag_corpus(tmp_path: Path) -> None:
    documents = _corpus_documents(tmp_path)
    assert documents[0]["contents"].startswith('"Scott Derrickson"\n')  # quotes kept verbatim
    hotpot = load_qa(_write_json(tmp_path / "hotpot_dev_distractor_v1.json", HOTPOT))
    record = hotpot[0]  # gold titles: Scott Derrickson, Ed Wood
    # candidates: 0 Scott Derrickson, 1 Ed Wood, 2 Ed Wood, 3 Ed Wood (film), 4 Evan Morris,
    # 5 "Heroes" (David Bowie album)
    trace = _trace(documents, selected=[3, 1, 4])
    # both gold titles are among the candidates: recall 2/2 (it read 0 with the quotes kept)
    assert _support_recall(record, trace, selected_only=False) == 1.0
    # selected: Ed Wood (film) (not gold: a different title), Ed Wood (gold), Evan Morris (not)
    # -> recall 1/2 of the gold titles, precision 1/3 of the selected passages
    assert _support_recall(record, trace, selected_only=True) == pytest.approx(1 / 2)
    assert _support_precision(record, trace) == pytest.approx(1 / 3)
    # the second question: Evan Morris found, Genentech not -> 1/2
    assert _support_recall(hotpot[1], trace, selected_only=False) == pytest.approx(1 / 2)

    # FlashRAG's own QA file names the same titles in its metadata
    (flashrag,) = load_qa(_write_jsonl(tmp_path / "dev.jsonl", FLASHRAG_QA))
    assert _support_recall(flashrag, trace, selected_only=False) == 1.0
    # 2Wiki, with a title that itself starts with a quote
    (twowiki,) = load_qa(_write_json(tmp_path / "dev.json", TWOWIKI))
    assert _support_recall(twowiki, _trace(documents, [5]), selected_only=True) == 1.0

    # score_trace reports the same figures in predictions.jsonl
    row = score_trace(record, trace, "s_g")
    assert row["agent_stats"]["retrieval"]["support_recall"] == 1.0
    assert row["agent_stats"]["selector"]["support_recall"] == pytest.approx(1 / 2)
    assert row["agent_stats"]["selector"]["support_precision"] == pytest.approx(1 / 3)


# ---------------------------------------------------------------------------------------------
# SFT data: --label_source supporting on HotpotQA / 2Wiki (supporting titles, no passage ids)
# ---------------------------------------------------------------------------------------------


class _FakeSearcher:
    """Returns the whole corpus, in corpus order, for every query (what is retrieved does not
    matter here, only how the candidates are labelled)."""

    def __init__(self, documents: list[dict[str, str]]) -> None:
        self.documents = documents

    def search_documents(self, queries: Sequence[str], k: int) -> list[list[dict[str, Any]]]:
        return [self.documents[:k] for _ in queries]


def _selector_positives(sft_records: list[dict[str, str]]) -> list[str]:
    """The titles of the documents the Selector record labels helpful."""
    selector = sft_records[1]
    ids = [int(d.removeprefix("Document")) for d in selector["output"].split(",") if d]
    prompt = selector["instruction"] + selector["input"]
    titles = []
    for i in ids:
        start = prompt.index(f"Document{i}:") if f"Document{i}:" in prompt \
            else prompt.index(f"Document {i}:")
        titles.append(prompt[start:].split("\n", 1)[0].split(":", 1)[1].strip())
    return titles


def test_supporting_labels_match_hotpotqa_titles(tmp_path: Path) -> None:
    documents = _corpus_documents(tmp_path)
    records = load_qa(_write_json(tmp_path / "hotpot.json", HOTPOT), max_samples=1)
    config = SFTBuildConfig(dataset_dir=str(tmp_path), k=5, label_source="supporting")
    sft_records, report = build_sft_records(records, _FakeSearcher(documents), config)
    # candidates: the first 5 passages; gold titles Scott Derrickson and Ed Wood match 3 of
    # them (one Scott Derrickson chunk, two Ed Wood chunks); "Ed Wood (film)" and Evan Morris
    # do not.
    assert report.mean_positives == 3.0
    assert sorted(_selector_positives(sft_records)) == ['"Ed Wood"', '"Ed Wood"',
                                                        '"Scott Derrickson"']
    # precision 3/3 labelled passages gold; recall 2/2 gold titles labelled
    assert (report.supporting_precision, report.supporting_recall) == (1.0, 1.0)
    assert report.supporting_matched_by == {"title": 1}
    assert "(matched by title 1)" in report.lines()[-1]


def test_supporting_labels_match_2wiki_titles(tmp_path: Path) -> None:
    documents = _corpus_documents(tmp_path)
    records = load_qa(_write_json(tmp_path / "dev.json", TWOWIKI))
    config = SFTBuildConfig(dataset_dir=str(tmp_path), k=6, label_source="supporting")
    _, report = build_sft_records(records, _FakeSearcher(documents), config)
    assert report.mean_positives == 1.0  # only the "Heroes" album passage
    assert (report.supporting_precision, report.supporting_recall) == (1.0, 1.0)


def test_supporting_labels_refuse_records_without_any_gold_passage(tmp_path: Path) -> None:
    records = load_qa(_write_jsonl(tmp_path / "nq.jsonl", NQ_OPEN))
    config = SFTBuildConfig(dataset_dir=str(tmp_path), label_source="supporting")
    with pytest.raises(ValueError, match=r"needs gold supporting passages \(supporting_ids, or "
                       r"supporting_titles as HotpotQA and 2Wiki give\) on every record; "
                       r"2 of 2 have none \(first: 'nq-1'\)"):  # fmt: skip
        build_sft_records(records, _FakeSearcher([]), config)


# ---------------------------------------------------------------------------------------------
# NQ-open: the scoring profile decides "U.S." vs "US"; the report names the profile
# ---------------------------------------------------------------------------------------------


def test_nq_open_scored_under_each_profile(tmp_path: Path) -> None:
    records = load_qa(_write_jsonl(tmp_path / "NQ-open.dev.jsonl", NQ_OPEN))
    trace = Trace(question=records[1].question, answer="US")
    # mmoa: "us" vs "u s" / "united states": no exact match; "us" is not in "u s" -> Acc 0, F1 0
    assert score_trace(records[1], trace, "g")["scores"]["f1"] == 0.0
    # squad (the official script): "us" == "us" -> EM 1, F1 1
    scores = score_trace(records[1], trace, "g", "squad")["scores"]
    assert (scores["em"], scores["f1"]) == (1.0, 1.0)
    # the SQuAD script does not cut "Answer: ": "answer december 1972" vs "december 1972":
    # P 2/3, R 1 -> F1 = 2*(2/3)/(5/3) = 0.8
    trace = Trace(question=records[0].question, answer="Answer: December 1972")
    assert score_trace(records[0], trace, "g", "squad")["scores"]["f1"] == pytest.approx(0.8)
    assert score_trace(records[0], trace, "g")["scores"]["f1"] == 1.0


class _FakePipeline:
    """Stands in for the model: answers every question with the same string."""

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        self.last_timings = BatchTimings()

    def run(self, questions: list[str]) -> list[Trace]:
        return [Trace(question=q, answer="US") for q in questions]


def test_evaluation_records_and_prints_the_scoring_profile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mmoa.agents.pipeline
    import mmoa.evaluation as evaluation
    import mmoa.modeling

    monkeypatch.setattr(mmoa.modeling, "load_for_inference",
                        lambda *_a, **_k: (torch.nn.Linear(1, 1), None))
    # evaluate() imports the pipeline when it runs (the CLI's parser must not load torch)
    monkeypatch.setattr(mmoa.agents.pipeline, "RagPipeline", _FakePipeline)
    # no tokenizer to measure prompts with: the context check has its own tests
    # (tests/test_context_limit.py); this one is about the scoring profile
    monkeypatch.setattr(evaluation, "check_context", lambda *_a, **_k: None)
    data = _write_jsonl(tmp_path / "NQ-open.dev.jsonl", NQ_OPEN)
    runs = []
    for scoring in ("mmoa", "squad"):
        config = EvalConfig(model_name_or_path="m", template="llama3", mode="g",
                            output_dir=str(tmp_path / scoring), data_file=str(data),
                            scoring=scoring, precision="fp32")
        metrics = evaluation.evaluate(config, progress=False)
        assert metrics["scoring"]["profile"] == scoring
        runs.append((scoring, evaluation.load_metrics(tmp_path / scoring)))
    # question 2 ("US" vs "U.S."): F1 0 under mmoa, 1 under squad; question 1 scores 0 in both
    assert (runs[0][1]["f1"], runs[1][1]["f1"]) == (0.0, 0.5)
    table = format_table(runs).splitlines()
    assert table[0].split()[:4] == ["run", "mode", "scoring", "n"]
    assert table[2].split()[:3] == ["mmoa", "g", "mmoa"]
    assert table[3].split()[:3] == ["squad", "g", "squad"]
    legend = scoring_legend(runs)
    assert legend == [
        "scoring mmoa: mmoa normaliser, answer extraction, yes/no rule; max over gold aliases "
        "(= MMOA-RAG evaluate_qr_s_g.py, which had one gold)",
        "scoring squad: squad normaliser, no answer extraction, no yes/no rule; max over gold "
        "aliases (= official SQuAD v1.1 evaluate script)",
    ]
    # a metrics.json written before profiles existed still gets a label
    old_squad = {"mode": "g", "config": {"normalizer": "squad"}}
    assert format_table([("old", old_squad)]).splitlines()[2].split()[2] == "squad*"
    assert "before scoring profiles" in scoring_legend([("old", old_squad)])[0]
    assert format_table([("x", {"config": {"normalizer": "mmoa"}})]).splitlines()[2].split()[1:3] \
        == ["?", "mmoa"]


def test_eval_cli_scoring_flag_and_its_old_name() -> None:
    from mmoa.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["eval"]).scoring == "mmoa"
    assert parser.parse_args(["eval", "--normalizer", "squad"]).scoring == "squad"
    assert parser.parse_args(["eval", "--scoring", "hotpotqa"]).scoring == "hotpotqa"
    args = parser.parse_args(["eval", "--ambigqa_answers", "union"])
    assert args.ambigqa_answers == "union"
    assert parser.parse_args(["data", "mappo"]).ambigqa_answers == "nq_answer"
    assert parser.parse_args(["data", "sft", "--label_source", "supporting"]).label_source \
        == "supporting"
    with pytest.raises(ValueError, match="unknown scoring profile 'nope'"):
        EvalConfig(model_name_or_path="m", template="t", output_dir="o", data_file="f",
                   scoring="nope").validate()
    with pytest.raises(ValueError, match="ambigqa_answers must be one of"):
        EvalConfig(model_name_or_path="m", template="t", output_dir="o", data_file="f",
                   ambigqa_answers="all").validate()
