"""Tests of mmoa.data.records and mmoa.data.loaders on small files in the exact upstream layouts."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import pytest

from mmoa.data.loaders import FORMATS, detect_format, load_qa
from mmoa.data.records import QARecord
from mmoa.fileio import DataFormatError

# ---------------------------------------------------------------------------------------------
# Upstream-format samples
# ---------------------------------------------------------------------------------------------

HOTPOT = [
    {
        "_id": "5a8b57f25542995d1e6f1371",
        "answer": "yes",
        "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
        "context": [
            [
                "Ed Wood (film)",
                [
                    "Ed Wood is a 1994 American biographical period comedy-drama film directed "
                    "and produced by Tim Burton, and starring Johnny Depp as cult "
                    "filmmaker Ed Wood."
                ],
            ],
            [
                "Scott Derrickson",
                [
                    "Scott Derrickson (born July 16, 1966) is an American director, screenwriter "
                    "and producer.",
                    " He lives in Los Angeles, California.",
                ],
            ],
            [
                "Ed Wood",
                [
                    "Edward Davis Wood Jr. (October 10, 1924 – December 10, 1978) was an American "
                    "filmmaker, actor, writer, producer, and director."
                ],
            ],
        ],
        "type": "comparison",
        "level": "hard",
    },
    {
        "_id": "5a8c7595554299585d9e36b6",
        "answer": "Chief of Protocol",
        "question": "What government position was held by the woman who portrayed Corliss Archer "
        "in the film Kiss and Tell?",
        "supporting_facts": [
            ["Kiss and Tell (1945 film)", 0],
            ["Shirley Temple", 0],
            ["Shirley Temple", 1],
        ],
        "context": [
            ["Kiss and Tell (1945 film)", ["Kiss and Tell is a 1945 American comedy film."]],
            ["Shirley Temple", ["Shirley Temple Black was an actress.", " She was a diplomat."]],
        ],
        "type": "bridge",
        "level": "hard",
    },
]

TWOWIKI = [
    {
        "_id": "8813f87c0bdd11eba7f7acde48001122",
        "type": "compositional",
        "question": "Who is the mother of the director of film Polish-Russian War (Film)?",
        "context": [
            ["Polish-Russian War (film)", ["Polish-Russian War is a 2009 Polish film.",
                                           " It was directed by Xawery Żuławski."]],
            ["Xawery Żuławski", ["Xawery Żuławski is a Polish film director.",
                                 " He is the son of Andrzej Żuławski.",
                                 " His mother is Małgorzata Braunek."]],
        ],
        "supporting_facts": [["Polish-Russian War (film)", 1], ["Xawery Żuławski", 2]],
        "evidences": [
            ["Polish-Russian War", "director", "Xawery Żuławski"],
            ["Xawery Żuławski", "mother", "Małgorzata Braunek"],
        ],
        "answer": "Małgorzata Braunek",
    },
    {
        "_id": "028eaef60bdb11eba7f7acde48001122",
        "type": "comparison",
        "question": "Which film came out first, Blind Shaft or The Mask Of Fu Manchu?",
        "context": [
            ["Blind Shaft", ["Blind Shaft is a 2003 film."]],
            ["The Mask of Fu Manchu", ["The Mask of Fu Manchu is a 1932 film."]],
        ],
        "supporting_facts": [["Blind Shaft", 0], ["The Mask of Fu Manchu", 0]],
        "evidences": [
            ["Blind Shaft", "publication date", "2003"],
            ["The Mask of Fu Manchu", "publication date", "1932"],
        ],
        "answer": "The Mask Of Fu Manchu",
    },
]  # fmt: skip

AMBIG = [
    {
        "id": "-4469503464110108318",
        "question": "When did the simpsons first air on television?",
        "annotations": [
            {
                "type": "multipleQAs",
                "qaPairs": [
                    {
                        "question": "When did the Simpsons first air on television as an "
                        "animated short on the Tracey Ullman Show?",
                        "answer": ["April 19, 1987"],
                    },
                    {
                        "question": "When did the Simpsons first air as a half-hour prime time "
                        "show?",
                        "answer": ["December 17, 1989", "17 December 1989"],
                    },
                ],
            },
            {"type": "singleAnswer", "answer": ["December 17, 1989"]},
        ],
    },
    {
        "id": "5963458406226283010",
        "question": "who sings does he love me with reba",
        "annotations": [{"type": "singleAnswer", "answer": ["Linda Davis"]}],
    },
]

FLASHRAG = [
    {
        "id": "dev_0",
        "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
        "golden_answers": ["yes"],
        "metadata": {
            "type": "comparison",
            "level": "hard",
            "supporting_facts": {"title": ["Scott Derrickson", "Ed Wood"], "sent_id": [0, 0]},
            "context": {
                "title": ["Ed Wood (film)", "Scott Derrickson"],
                "sentences": [["Ed Wood is a 1994 film."], ["Scott Derrickson is a director."]],
            },
        },
    },
    {
        "id": "test_0",
        "question": "who got the first nobel prize in physics",
        "golden_answers": ["Wilhelm Conrad Röntgen", "Wilhelm Röntgen"],
    },
    {
        "id": "2hop__13548_13529",
        "question": "When was the person who Messi's goals in Copa del Rey compared to get signed "
        "by Barcelona?",
        "golden_answers": ["June 1982"],
        "metadata": {
            "question_decomposition": [
                {"id": 13548, "question": "To whom was Messi's goalscoring compared?",
                 "answer": "Diego Maradona", "paragraph_support_idx": 16},
                {"id": 13529, "question": "When did Barcelona sign #1?",
                 "answer": "June 1982", "paragraph_support_idx": 12},
            ]
        },
    },
]  # fmt: skip

NQ_OPEN = [
    {"question": "when was the last time anyone was on the moon",
     "answer": ["14 December 1972 UTC", "December 1972"]},
    {"question": "who wrote he ain't heavy he's my brother lyrics",
     "answer": ["Bobby Scott", "Bob Russell"]},
]  # fmt: skip

DEMO = [
    {
        "id": "demo-0001",
        "question": "Which river flows through the capital of Veldoria?",
        "answers": ["the Amsel", "Amsel River"],
        "supporting_ids": ["p0012", "p0040"],
        "decomposition": ["What is the capital of Veldoria?", "Which river flows through it?"],
        "type": "bridge",
    },
    {
        "id": "demo-0002",
        "question": "Is Kessa older than Brun?",
        "answers": ["no"],
        "supporting_ids": None,
        "decomposition": None,
        "type": None,
    },
]


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    return path


# ---------------------------------------------------------------------------------------------
# QARecord
# ---------------------------------------------------------------------------------------------


def test_record_round_trip_and_frozen() -> None:
    record = QARecord(
        id="q1",
        question="Who?",
        answers=["A", "B"],
        supporting_ids=["p1"],
        supporting_titles=["T"],
        decomposition=["Who is A?"],
        type="bridge",
    )
    data = record.to_dict()
    assert data == {
        "id": "q1",
        "question": "Who?",
        "answers": ["A", "B"],
        "supporting_ids": ["p1"],
        "supporting_titles": ["T"],
        "decomposition": ["Who is A?"],
        "type": "bridge",
    }
    assert QARecord.from_dict(json.loads(json.dumps(data))) == record
    data["answers"].append("C")  # to_dict hands out copies
    assert record.answers == ["A", "B"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.question = "changed"  # type: ignore[misc]


def test_record_defaults_and_validation() -> None:
    bare = QARecord(id="q", question="What?")
    assert bare.answers == [] and bare.supporting_ids is None and bare.type is None
    with pytest.raises(DataFormatError, match="field 'question' must be a non-empty string"):
        QARecord(id="q", question="  ")
    with pytest.raises(
        DataFormatError, match="field 'answers' item 1 must be a string, got integer"
    ):
        QARecord(id="q", question="What?", answers=["a", 1])  # type: ignore[list-item]
    with pytest.raises(DataFormatError, match="field 'id' must be a string, got integer"):
        QARecord(id=3, question="What?")  # type: ignore[arg-type]


def test_record_resolved_decomposition_round_trips_and_needs_one_hop_each() -> None:
    record = QARecord(id="q", question="Where was the director of Nox born?", answers=["Tal"],
                      decomposition=["Who directed Nox?", "Where was the director of Nox born?"],
                      resolved_decomposition=["Who directed Nox?", "Where was Ada Brel born?"],
                      type="bridge")
    data = record.to_dict()
    assert data["resolved_decomposition"] == ["Who directed Nox?", "Where was Ada Brel born?"]
    assert QARecord.from_dict(json.loads(json.dumps(data))) == record
    assert "resolved_decomposition" not in QARecord(id="q", question="W?").to_dict()
    with pytest.raises(DataFormatError, match=r"one hop per 'decomposition' hop \(1\), got 2"):
        QARecord(id="q", question="W?", decomposition=["A?"], resolved_decomposition=["A?", "B?"])
    with pytest.raises(DataFormatError, match=r"one hop per 'decomposition' hop \(0\), got 1"):
        QARecord(id="q", question="W?", resolved_decomposition=["A?"])


def test_record_from_dict_errors() -> None:
    with pytest.raises(DataFormatError, match=r"^x\.jsonl:4: field 'answers' is missing$"):
        QARecord.from_dict({"id": "a", "question": "b"}, "x.jsonl:4")
    with pytest.raises(
        DataFormatError,
        match=r"^here: field 'supporting_ids' must be a list of strings, got string$",
    ):
        QARecord.from_dict(
            {"id": "a", "question": "b", "answers": ["c"], "supporting_ids": "p1"}, "here"
        )
    assert QARecord.from_dict({"id": 7, "question": "b", "answers": ["c"]}).id == "7"


# ---------------------------------------------------------------------------------------------
# One test per upstream layout
# ---------------------------------------------------------------------------------------------


def test_load_hotpotqa(tmp_path: Path) -> None:
    path = write_json(tmp_path / "hotpot_dev_distractor_v1.json", HOTPOT)
    records = load_qa(path, "hotpotqa")
    assert records == [
        QARecord(
            id="5a8b57f25542995d1e6f1371",
            question="Were Scott Derrickson and Ed Wood of the same nationality?",
            answers=["yes"],
            supporting_titles=["Scott Derrickson", "Ed Wood"],
            type="comparison",
        ),
        QARecord(
            id="5a8c7595554299585d9e36b6",
            question="What government position was held by the woman who portrayed Corliss "
            "Archer in the film Kiss and Tell?",
            answers=["Chief of Protocol"],
            supporting_titles=["Kiss and Tell (1945 film)", "Shirley Temple"],  # unique, in order
            type="bridge",
        ),
    ]
    assert records[0].supporting_ids is None and records[0].decomposition is None
    assert load_qa(path) == records  # auto-detected


def test_load_2wiki(tmp_path: Path) -> None:
    path = write_json(tmp_path / "dev.json", TWOWIKI)
    records = load_qa(path, "2wiki")
    assert [r.to_dict() for r in records] == [
        {
            "id": "8813f87c0bdd11eba7f7acde48001122",
            "question": "Who is the mother of the director of film Polish-Russian War (Film)?",
            "answers": ["Małgorzata Braunek"],
            "supporting_ids": None,
            "supporting_titles": ["Polish-Russian War (film)", "Xawery Żuławski"],
            "decomposition": None,
            "type": "compositional",
        },
        {
            "id": "028eaef60bdb11eba7f7acde48001122",
            "question": "Which film came out first, Blind Shaft or The Mask Of Fu Manchu?",
            "answers": ["The Mask Of Fu Manchu"],
            "supporting_ids": None,
            "supporting_titles": ["Blind Shaft", "The Mask of Fu Manchu"],
            "decomposition": None,
            "type": "comparison",
        },
    ]
    assert load_qa(path) == records  # auto-detected through "evidences"
    # the same records as JSON Lines (how 2Wiki is sometimes redistributed) load the same way
    assert load_qa(write_jsonl(tmp_path / "dev.jsonl", TWOWIKI), "2wiki") == records


def test_load_ambigqa_union(tmp_path: Path) -> None:
    path = write_json(tmp_path / "dev_light.json", AMBIG)
    records = load_qa(path, "ambigqa", ambigqa_answers="union")
    assert records[0] == QARecord(
        id="-4469503464110108318",
        question="When did the simpsons first air on television?",
        # every annotation's answers pooled, the repeated "December 17, 1989" kept once
        answers=["April 19, 1987", "December 17, 1989", "17 December 1989"],
        type="multipleQAs",
    )
    assert records[1] == QARecord(
        id="5963458406226283010",
        question="who sings does he love me with reba",
        answers=["Linda Davis"],
        type="singleAnswer",
    )
    assert load_qa(path, ambigqa_answers="union") == records


# The full AmbigNQ release (ambignq/dev.json): the light fields plus the NQ-open answers
# "nq_answer" (tokenised as NQ gives them) and other metadata.
AMBIG_FULL = [
    AMBIG[0] | {"nq_answer": ["December 17 , 1989"], "nq_doc_title": "The Simpsons",
                "viewed_doc_titles": ["The Simpsons"],
                "used_queries": [{"query": "simpsons first air", "results": []}]},
    AMBIG[1] | {"nq_answer": ["Linda Davis", "Linda Kaye Davis"],
                "nq_doc_title": "Does He Love You", "viewed_doc_titles": [], "used_queries": []},
]  # fmt: skip


def test_load_ambigqa_scores_the_papers_answer_set_by_default(tmp_path: Path) -> None:
    # MMOA-RAG scores AmbigQA against nq_answer, not against the annotations' pooled answers.
    path = write_json(tmp_path / "dev.json", AMBIG_FULL)
    records = load_qa(path)
    assert [r.answers for r in records] == [["December 17 , 1989"],
                                            ["Linda Davis", "Linda Kaye Davis"]]
    assert [r.type for r in records] == ["multipleQAs", "singleAnswer"]
    assert load_qa(path, "ambigqa", ambigqa_answers="nq_answer") == records
    # the original code's literal rule: one ", "-joined gold string
    joined = load_qa(path, ambigqa_answers="nq_answer_joined")
    assert [r.answers for r in joined] == [["December 17 , 1989"],
                                           ["Linda Davis, Linda Kaye Davis"]]
    # the union is still one option away
    union = load_qa(path, ambigqa_answers="union")
    assert union[0].answers == ["April 19, 1987", "December 17, 1989", "17 December 1989"]


def test_ambigqa_light_release_needs_the_union_option(tmp_path: Path) -> None:
    path = write_json(tmp_path / "dev_light.json", AMBIG)
    with pytest.raises(DataFormatError, match=re.escape(
            f"{path}: record 0: field 'nq_answer' is missing; AmbigQA is scored against the "
            "NQ-open answers")) as info:
        load_qa(path)
    assert "--ambigqa_answers union" in str(info.value)
    with pytest.raises(ValueError, match="unknown AmbigQA answer set 'all'"):
        load_qa(path, ambigqa_answers="all")


def test_ambigqa_answer_set_through_the_registry(tmp_path: Path) -> None:
    from mmoa.data.registry import load_dataset_records, register_datasets

    write_json(tmp_path / "dev_light.json", AMBIG)
    register_datasets(tmp_path, {"ambig_dev": {"file_name": "dev_light.json",
                                               "mmoa_format": "ambigqa"}})
    records = load_dataset_records("ambig_dev", tmp_path, None, ambigqa_answers="union")
    assert records[1].answers == ["Linda Davis"]
    with pytest.raises(DataFormatError, match="'nq_answer' is missing"):
        load_dataset_records("ambig_dev", tmp_path, None)


def test_load_flashrag(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "dev.jsonl", FLASHRAG)
    records = load_qa(path, "flashrag")
    assert records[0] == QARecord(
        id="dev_0",
        question="Were Scott Derrickson and Ed Wood of the same nationality?",
        answers=["yes"],
        supporting_titles=["Scott Derrickson", "Ed Wood"],
        type="comparison",
    )
    assert records[1] == QARecord(
        id="test_0",
        question="who got the first nobel prize in physics",
        answers=["Wilhelm Conrad Röntgen", "Wilhelm Röntgen"],
    )
    assert records[2].decomposition == [
        "To whom was Messi's goalscoring compared?",
        "When did Barcelona sign #1?",
    ]
    assert records[2].answers == ["June 1982"] and records[2].type is None
    assert load_qa(path) == records


def test_load_flashrag_ignores_unrecognised_metadata(tmp_path: Path) -> None:
    row = {"id": 17, "question": "q?", "golden_answers": ["a"],
           "metadata": {"type": 3, "supporting_facts": "odd",
                        "question_decomposition": [{}]}}  # fmt: skip
    (record,) = load_qa(write_jsonl(tmp_path / "x.jsonl", [row]), "flashrag")
    assert record == QARecord(id="17", question="q?", answers=["a"])


def test_load_nq_open(tmp_path: Path) -> None:
    path = tmp_path / "NQ-open.dev.jsonl"
    # a blank line in the middle: ids follow the physical line numbers
    path.write_text(
        json.dumps(NQ_OPEN[0]) + "\n\n" + json.dumps(NQ_OPEN[1]) + "\n", encoding="utf-8"
    )
    records = load_qa(path, "nq_open")
    assert records == [
        QARecord(
            id="NQ-open.dev-1",
            question="when was the last time anyone was on the moon",
            answers=["14 December 1972 UTC", "December 1972"],
        ),
        QARecord(
            id="NQ-open.dev-3",
            question="who wrote he ain't heavy he's my brother lyrics",
            answers=["Bobby Scott", "Bob Russell"],
        ),
    ]
    assert load_qa(path) == records


def test_load_demo(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "demo_train.jsonl", DEMO)
    records = load_qa(path, "demo")
    assert records[0] == QARecord(
        id="demo-0001",
        question="Which river flows through the capital of Veldoria?",
        answers=["the Amsel", "Amsel River"],
        supporting_ids=["p0012", "p0040"],
        decomposition=["What is the capital of Veldoria?", "Which river flows through it?"],
        type="bridge",
    )
    assert records[1] == QARecord(
        id="demo-0002", question="Is Kessa older than Brun?", answers=["no"]
    )
    assert load_qa(path) == records
    # to_dict output is a valid demo file
    again = write_jsonl(tmp_path / "again.jsonl", [r.to_dict() for r in records])
    assert load_qa(again, "demo") == records


def test_max_samples(tmp_path: Path) -> None:
    path = write_json(tmp_path / "h.json", HOTPOT)
    assert [r.id for r in load_qa(path, max_samples=1)] == ["5a8b57f25542995d1e6f1371"]
    assert len(load_qa(path, max_samples=10)) == 2
    with pytest.raises(ValueError, match="max_samples must be a positive integer"):
        load_qa(path, max_samples=0)


def test_formats_registry() -> None:
    assert set(FORMATS) == {"hotpotqa", "2wiki", "ambigqa", "flashrag", "nq_open", "demo",
                            "popqa"}
    with pytest.raises(ValueError, match="unknown dataset format 'squad'"):
        load_qa("whatever.json", "squad")


# ---------------------------------------------------------------------------------------------
# Auto-detection
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("record", "fmt"),
    [
        (HOTPOT[0], "hotpotqa"),
        (TWOWIKI[0], "2wiki"),
        (AMBIG[0], "ambigqa"),
        (FLASHRAG[0], "flashrag"),
        (NQ_OPEN[0], "nq_open"),
        (DEMO[0], "demo"),
    ],
)
def test_detect_format(record: dict[str, Any], fmt: str) -> None:
    assert detect_format(record) == fmt


def test_detect_format_ambiguous(tmp_path: Path) -> None:
    row = {"id": "1", "question": "q", "answers": ["a"], "golden_answers": ["a"]}
    path = write_jsonl(tmp_path / "mixed.jsonl", [row])
    with pytest.raises(DataFormatError, match=r"mixed\.jsonl:1: cannot tell the dataset format: "
                       r"keys .* fit \['flashrag', 'demo'\]; pass fmt explicitly"):  # fmt: skip
        load_qa(path)
    assert load_qa(path, "demo")[0].answers == ["a"]


def test_detect_format_unknown(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "squad.jsonl", [{"qid": "1", "query": "q", "label": "a"}])
    with pytest.raises(
        DataFormatError,
        match=r"squad\.jsonl:1: unknown dataset format: keys \['label', 'qid', 'query'\] fit no "
        r"known layout \(expected keys - hotpotqa: \['_id', 'answer', 'question'\] without",
    ):
        load_qa(path)


# ---------------------------------------------------------------------------------------------
# Malformed input: every error names the file, the line or record, and the field
# ---------------------------------------------------------------------------------------------


def _bad(record: dict[str, Any], **changes: Any) -> dict[str, Any]:
    bad = json.loads(json.dumps(record))
    for key, value in changes.items():
        if value is _DROP:
            del bad[key]
        else:
            bad[key] = value
    return bad


_DROP = object()
_SINGLE_STR = {"type": "singleAnswer", "answer": "Linda Davis"}
_PAIR_NO_ANSWER = {"type": "multipleQAs", "qaPairs": [{"question": "q"}]}


def test_hotpot_answer_wrong_type(tmp_path: Path) -> None:
    data = [HOTPOT[0], HOTPOT[1], HOTPOT[0] | {"_id": "x2"}, _bad(HOTPOT[1], answer=["Chief"])]
    path = write_json(tmp_path / "hotpot.json", data)
    with pytest.raises(
        DataFormatError,
        match=r"^"
        + re.escape(f"{path}: record 3: field 'answer' must be a string, got list")
        + "$",
    ):
        load_qa(path, "hotpotqa")


@pytest.mark.parametrize(
    ("fmt", "rows", "message"),
    [
        # missing fields
        ("hotpotqa", [_bad(HOTPOT[0], question=_DROP)], "record 0: field 'question' is missing"),
        ("2wiki", [TWOWIKI[0], _bad(TWOWIKI[1], _id=_DROP)], "record 1: field '_id' is missing"),
        ("ambigqa", [_bad(AMBIG[1], annotations=_DROP)],
         "record 0: field 'annotations' is missing"),
        # wrong types
        ("hotpotqa", [_bad(HOTPOT[0], _id=None)],
         "record 0: field '_id' must be a non-empty string or an integer, got null"),
        ("hotpotqa", [_bad(HOTPOT[0], supporting_facts=[["Ed Wood", "0"]])],
         "record 0: field 'supporting_facts' item 0 must be a [title, sentence_index] pair "
         "(string, integer), got [\"Ed Wood\", \"0\"]"),
        ("hotpotqa", [_bad(HOTPOT[0], supporting_facts="Ed Wood")],
         "record 0: field 'supporting_facts' must be a list of [title, sentence_index] pairs, "
         "got string"),
        ("hotpotqa", [_bad(HOTPOT[0], type=1)],
         "record 0: field 'type' must be a string, got integer"),
        ("ambigqa", [_bad(AMBIG[1], annotations=[{"type": "single", "answer": ["x"]}])],
         "record 0: field 'annotations'[0]['type'] must be 'singleAnswer' or 'multipleQAs', "
         "got 'single'"),
        ("ambigqa", [_bad(AMBIG[1], annotations=[_SINGLE_STR])],
         "record 0: field 'annotations'[0]['answer'] must be a list of strings, got string"),
        ("ambigqa", [_bad(AMBIG[1], annotations=[_PAIR_NO_ANSWER])],
         "record 0: field 'annotations'[0]['qaPairs'][0]['answer'] is missing"),
        ("ambigqa", [_bad(AMBIG[1], annotations=[])],
         "record 0: field 'annotations' must be a non-empty list, got an empty list"),
        ("ambigqa", ["not an object"], "record 0: expected a JSON object, got string"),
        # empty answers
        ("hotpotqa", [_bad(HOTPOT[0], answer="  ")],
         "record 0: field 'answer' must be a non-empty string"),
        ("ambigqa", [_bad(AMBIG[1], annotations=[{"type": "multipleQAs", "qaPairs": []}])],
         "record 0: field 'annotations' must hold at least one answer, got none"),
    ],
)  # fmt: skip
def test_malformed_json_list(tmp_path: Path, fmt: str, rows: list[Any], message: str) -> None:
    path = write_json(tmp_path / "data.json", rows)
    with pytest.raises(DataFormatError, match="^" + re.escape(f"{path}: {message}") + "$"):
        load_qa(path, fmt)


@pytest.mark.parametrize(
    ("fmt", "rows", "message"),
    [
        ("flashrag", [FLASHRAG[1], _bad(FLASHRAG[1], id="x", golden_answers=[])],
         "2: field 'golden_answers' must hold at least one answer, got none"),
        ("flashrag", [_bad(FLASHRAG[1], golden_answers="Röntgen")],
         "1: field 'golden_answers' must be a list of strings, got string"),
        ("flashrag", [_bad(FLASHRAG[1], metadata=[1])],
         "1: field 'metadata' must be an object, got list"),
        ("flashrag", [_bad(FLASHRAG[1], question=_DROP)], "1: field 'question' is missing"),
        ("nq_open", [_bad(NQ_OPEN[0], answer=[""])],
         "1: field 'answer' item 0 must be a non-empty string"),
        ("nq_open", [_bad(NQ_OPEN[0], answer=["x", 5])],
         "1: field 'answer' item 1 must be a string, got integer"),
        ("nq_open", [_bad(NQ_OPEN[0], question=42)],
         "1: field 'question' must be a string, got integer"),
        ("demo", [_bad(DEMO[0], answers=[])],
         "1: field 'answers' must hold at least one answer, got none"),
        ("demo", [_bad(DEMO[0], decomposition="a; b")],
         "1: field 'decomposition' must be a list of strings, got string"),
        ("demo", [DEMO[0], DEMO[0]], "2: duplicate id 'demo-0001' (first seen at {path}:1)"),
    ],
)  # fmt: skip
def test_malformed_jsonl(tmp_path: Path, fmt: str, rows: list[Any], message: str) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", rows)
    expected = f"{path}:{message}".replace("{path}", str(path))
    with pytest.raises(DataFormatError, match="^" + re.escape(expected) + "$"):
        load_qa(path, fmt)


def test_invalid_json_line(tmp_path: Path) -> None:
    path = tmp_path / "nq.jsonl"
    path.write_text(
        json.dumps(NQ_OPEN[0]) + '\n{"question": "who", "answer": [\n', encoding="utf-8"
    )
    with pytest.raises(DataFormatError, match=re.escape(f"{path}:2: invalid JSON")):
        load_qa(path, "nq_open")


def test_jsonl_line_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "nq.jsonl"
    path.write_text(json.dumps(NQ_OPEN[0]) + "\n[1, 2]\n", encoding="utf-8")
    # a JSON Lines file whose first record is an object; line 2 is a list
    with pytest.raises(
        DataFormatError, match=re.escape(f"{path}:2: expected a JSON object, got list")
    ):
        load_qa(path, "nq_open")


def test_a_byte_that_is_not_utf8_names_file_line_and_offset(tmp_path: Path) -> None:
    """A Latin-1 byte (0xe9) on line 3 of a JSON Lines file, and in a JSON list: the error
    names the file, the line and the byte offset (it was a bare UnicodeDecodeError)."""
    lines = [json.dumps(NQ_OPEN[0]).encode(), json.dumps(NQ_OPEN[1]).encode(),
             b'{"question": "caf\xe9?", "answer": ["x"]}']
    path = tmp_path / "nq.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    offset = len(lines[0]) + len(lines[1]) + 2 + lines[2].index(b"\xe9")
    with pytest.raises(DataFormatError, match="^" + re.escape(
            f"{path}:3: byte 0xe9 at byte offset {offset} is not UTF-8")):
        load_qa(path, "nq_open")
    listed = tmp_path / "hotpot.json"
    data = json.dumps(HOTPOT, indent=1).encode().replace(b"Ed Wood (film)", b"Ed W\xf6od")
    listed.write_bytes(data)
    at = data.index(b"\xf6")
    line = data[:at].count(b"\n") + 1
    with pytest.raises(DataFormatError, match="^" + re.escape(
            f"{listed}:{line}: byte 0xf6 at byte offset {at} is not UTF-8")):
        load_qa(listed, "hotpotqa")


def test_a_registry_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    from mmoa.data.registry import read_dataset_info

    (tmp_path / "dataset_info.json").write_bytes(b'{\n "x": {"file_name": "\xff"}}')
    with pytest.raises(DataFormatError, match=re.escape(
            f"{tmp_path / 'dataset_info.json'}:2: byte 0xff at byte offset 23 is not UTF-8")):
        read_dataset_info(tmp_path)


def test_truncated_json_list(tmp_path: Path) -> None:
    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(HOTPOT)[:-10], encoding="utf-8")
    with pytest.raises(DataFormatError, match=re.escape(f"{path}: invalid JSON at line 1")):
        load_qa(path, "hotpotqa")


def test_empty_file(tmp_path: Path) -> None:
    for name, text in [("empty.jsonl", "\n\n"), ("empty.json", "[]")]:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        with pytest.raises(DataFormatError, match=re.escape(f"{path}: the file holds no records")):
            load_qa(path)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "train.json"
    with pytest.raises(FileNotFoundError, match=re.escape(f"{path}: no such file")):
        load_qa(path, "hotpotqa")
