"""Loaders from the public QA dataset files into :class:`~mmoa.data.records.QARecord`.

``load_qa(path, fmt)`` reads one file in one of these layouts (each as published upstream):

``hotpotqa``
    HotpotQA's JSON: a list of objects with ``_id``, ``question``, ``answer`` (a string),
    ``supporting_facts`` (``[[title, sentence_index], ...]``), ``context``, ``type``, ``level``.
``2wiki``
    2WikiMultihopQA's JSON: like HotpotQA plus ``evidences`` (``[[subject, relation, object]]``).
``ambigqa``
    AmbigQA / AmbigNQ JSON: a list of ``{id, question, annotations}`` (the "light" release) plus,
    in the full release, ``nq_answer`` (the NQ-open answers) and other metadata. An annotation
    is ``{"type": "singleAnswer", "answer": [...]}`` or ``{"type": "multipleQAs", "qaPairs":
    [{"question", "answer": [...]}]}``; ``type`` is ``"multipleQAs"`` when any annotator found
    several readings. Which strings become the gold answers is ``ambigqa_answers`` (one of
    :data:`AMBIGQA_ANSWER_SETS`):

    ``"nq_answer"`` (default)
        The ``nq_answer`` list, each string an alias: the answer set MMOA-RAG scores and trains
        AmbigQA with, so figures compare with the paper's. The light release has no
        ``nq_answer``; loading it this way fails with a message naming the other options.
    ``"nq_answer_joined"``
        The original code's literal rule: one gold string, ``", ".join(nq_answer)``.
    ``"union"``
        The answers of every annotation pooled, duplicates dropped, order kept (works on the
        light release; a more lenient target than the paper's).
``flashrag``
    FlashRAG's JSON Lines: ``{id, question, golden_answers, metadata?}``. From ``metadata`` the
    ``type``, the supporting titles and a ``question_decomposition`` are taken when they have a
    recognisable shape; anything else there is ignored (FlashRAG's metadata differs per dataset).
``nq_open``
    NQ-open JSON Lines: ``{question, answer: [...]}``, no id; the id is ``<file stem>-<line>``
    (``<file stem>-<index>`` in a JSON list), stable as long as the file is.
``popqa``
    PopQA (Mallen et al., the ``akariasai/PopQA`` release as JSON Lines): ``{id, question,
    possible_answers, s_pop, prop, ...}``; ``possible_answers`` is a list or a JSON-encoded list
    of aliases. The record's ``type`` is the relation (``prop``) and its ``group`` is
    ``popular`` or ``unpopular``: the subject's monthly page views ``s_pop`` against
    :data:`POPQA_POPULAR_MIN_VIEWS` (a fixed threshold, not Mallen et al.'s per-relation
    thresholds tuned on dev), so the decision agent's evaluation reports both groups.
``demo``
    The project's own schema, :meth:`QARecord.to_dict` per line (with an optional ``group``).

Every layout may come as a JSON list or as JSON Lines: the first non-blank character decides.
``fmt="auto"`` picks the layout from the first record's keys and refuses to guess when the keys
fit none or several layouts.

A malformed record stops the load with :class:`~mmoa.fileio.DataFormatError` naming the file, the
line (JSON Lines, 1-based) or record (JSON list, 0-based index), the field, and what was expected.
Answers are required and non-empty in every layout: these files train and evaluate the pipeline,
and a question without a gold answer would silently score 0.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from mmoa.data.records import QARecord, json_type_name
from mmoa.fileio import DataFormatError, PathLike, iter_jsonl, read_utf8_text

__all__ = [
    "AMBIGQA_ANSWER_SETS",
    "DEFAULT_AMBIGQA_ANSWERS",
    "FORMATS",
    "detect_format",
    "iter_raw_records",
    "load_qa",
    "supporting_titles_of",
]

#: The answer sets an AmbigQA record can be scored against (see the module docstring).
AMBIGQA_ANSWER_SETS: tuple[str, ...] = ("nq_answer", "nq_answer_joined", "union")
#: The paper's answer set.
DEFAULT_AMBIGQA_ANSWERS = "nq_answer"
#: PopQA: a subject with at least this many monthly Wikipedia page views (``s_pop``) is in the
#: ``popular`` group, else ``unpopular`` (the long tail where Mallen et al. found retrieval helps).
POPQA_POPULAR_MIN_VIEWS = 1000


# ---------------------------------------------------------------------------------------------
# Reading a file as (location, object) pairs
# ---------------------------------------------------------------------------------------------


def _first_char(path: Path) -> str:
    """The first non-blank character (only ``[`` matters: a JSON list). Read as bytes, so that
    a file that is not UTF-8 reaches the reader that reports the line and byte offset."""
    with path.open("rb") as handle:
        while True:
            chunk = handle.read(4096)
            if not chunk:
                return ""
            stripped = chunk.lstrip()
            if stripped:
                return chr(stripped[0])


def iter_raw_records(path: PathLike) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """Yield ``(where, position, object)`` for each record of a JSON list or JSON Lines file.

    ``where`` is the error-message prefix (``"file.jsonl:5"`` or ``"file.json: record 3"``),
    ``position`` the 1-based line number (JSON Lines) or the 0-based index (JSON list).
    """
    source = Path(path)
    if not source.is_file():
        raise FileNotFoundError(f"{source}: no such file")
    if _first_char(source) != "[":
        for line_number, obj in iter_jsonl(source):
            yield f"{source}:{line_number}", line_number, obj
        return
    try:
        data = json.loads(read_utf8_text(source))
    except json.JSONDecodeError as err:
        raise DataFormatError(
            f"{source}: invalid JSON at line {err.lineno} column {err.colno} ({err.msg})"
        ) from err
    if not isinstance(data, list):
        raise DataFormatError(f"{source}: expected a JSON list of records")
    for index, obj in enumerate(data):
        where = f"{source}: record {index}"
        if not isinstance(obj, dict):
            raise DataFormatError(f"{where}: expected a JSON object, got {json_type_name(obj)}")
        yield where, index, obj


# ---------------------------------------------------------------------------------------------
# Field helpers (all errors name the location and the field)
# ---------------------------------------------------------------------------------------------


def _get(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise DataFormatError(f"{where}: field {key!r} is missing")
    return obj[key]


def _get_nested(obj: Mapping[str, Any], key: str, parent: str, where: str) -> Any:
    if key not in obj:
        raise DataFormatError(f"{where}: field {parent}[{key!r}] is missing")
    return obj[key]


def _id(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = _get(obj, key, where)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, str) and value.strip():
        return value
    got = "an empty string" if isinstance(value, str) else json_type_name(value)
    raise DataFormatError(
        f"{where}: field {key!r} must be a non-empty string or an integer, got {got}"
    )


def _text(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = _get(obj, key, where)
    if not isinstance(value, str):
        raise DataFormatError(
            f"{where}: field {key!r} must be a string, got {json_type_name(value)}"
        )
    if not value.strip():
        raise DataFormatError(f"{where}: field {key!r} must be a non-empty string")
    return value.strip()


def _optional_text(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise DataFormatError(
            f"{where}: field {key!r} must be a string, got {json_type_name(value)}"
        )
    return value.strip() or None


def _answer_list(value: Any, field: str, where: str) -> list[str]:
    """A non-empty list of non-blank strings, stripped, duplicates dropped in order."""
    if not isinstance(value, list):
        raise DataFormatError(
            f"{where}: field {field} must be a list of strings, got {json_type_name(value)}"
        )
    answers: list[str] = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise DataFormatError(
                f"{where}: field {field} item {i} must be a string, got {json_type_name(item)}"
            )
        if not item.strip():
            raise DataFormatError(f"{where}: field {field} item {i} must be a non-empty string")
        if item.strip() not in answers:
            answers.append(item.strip())
    return answers


def _require_answers(answers: list[str], field: str, where: str) -> list[str]:
    if not answers:
        raise DataFormatError(f"{where}: field {field} must hold at least one answer, got none")
    return answers


def _supporting_titles(value: Any, where: str) -> list[str]:
    """Titles of HotpotQA/2Wiki ``supporting_facts`` ``[[title, sentence_index], ...]``, unique."""
    if not isinstance(value, list):
        raise DataFormatError(
            f"{where}: field 'supporting_facts' must be a list of [title, sentence_index] "
            f"pairs, got {json_type_name(value)}"
        )
    titles: list[str] = []
    for i, fact in enumerate(value):
        if (
            not isinstance(fact, list)
            or len(fact) != 2
            or not isinstance(fact[0], str)
            or not isinstance(fact[1], int)
            or isinstance(fact[1], bool)
        ):
            raise DataFormatError(
                f"{where}: field 'supporting_facts' item {i} must be a [title, sentence_index] "
                f"pair (string, integer), got {json.dumps(fact, ensure_ascii=False)[:80]}"
            )
        if fact[0] not in titles:
            titles.append(fact[0])
    return titles


# ---------------------------------------------------------------------------------------------
# Per-format parsers: (object, where, position, file) -> QARecord
# ---------------------------------------------------------------------------------------------


def supporting_titles_of(obj: Mapping[str, Any], fmt: str, where: str) -> list[str] | None:
    """The gold supporting titles a raw record names, as its loader reads them: HotpotQA /
    2Wiki ``supporting_facts`` (checked; errors name ``where``), FlashRAG ``metadata``
    (when recognisable); ``None`` when the record names none or ``fmt`` has no titles."""
    if fmt in ("hotpotqa", "2wiki"):
        facts = obj.get("supporting_facts")
        return None if facts is None else _supporting_titles(facts, where)
    if fmt == "flashrag":
        metadata = obj.get("metadata")
        return (_metadata_titles(metadata.get("supporting_facts"))
                if isinstance(metadata, Mapping) else None)
    return None


def _parse_multihop(obj: Mapping[str, Any], where: str, _pos: int, _src: Path) -> QARecord:
    """HotpotQA and 2WikiMultihopQA share the record layout that matters here."""
    answer = _text(obj, "answer", where)
    facts = obj.get("supporting_facts")
    return QARecord(
        id=_id(obj, "_id", where),
        question=_text(obj, "question", where),
        answers=[answer],
        supporting_titles=None if facts is None else _supporting_titles(facts, where),
        type=_optional_text(obj, "type", where),
    )


def _parse_ambigqa(
    obj: Mapping[str, Any], where: str, _pos: int, _src: Path,
    answer_set: str = DEFAULT_AMBIGQA_ANSWERS,
) -> QARecord:
    """The annotations are always read and checked (they give ``type``); ``answer_set`` picks
    the gold answers."""
    annotations = _get(obj, "annotations", where)
    if not isinstance(annotations, list) or not annotations:
        got = "an empty list" if annotations == [] else json_type_name(annotations)
        raise DataFormatError(f"{where}: field 'annotations' must be a non-empty list, got {got}")
    answers: list[str] = []
    multiple = False
    for i, ann in enumerate(annotations):
        field = f"'annotations'[{i}]"
        if not isinstance(ann, dict):
            raise DataFormatError(
                f"{where}: field {field} must be an object, got {json_type_name(ann)}"
            )
        kind = ann.get("type")
        if kind == "singleAnswer":
            groups = [(f"{field}['answer']", _get_nested(ann, "answer", field, where))]
        elif kind == "multipleQAs":
            multiple = True
            pairs = _get_nested(ann, "qaPairs", field, where)
            if not isinstance(pairs, list):
                raise DataFormatError(
                    f"{where}: field {field}['qaPairs'] must be a list, got {json_type_name(pairs)}"
                )
            groups = []
            for j, pair in enumerate(pairs):
                pair_field = f"{field}['qaPairs'][{j}]"
                if not isinstance(pair, dict):
                    raise DataFormatError(
                        f"{where}: field {pair_field} must be an object, got {json_type_name(pair)}"
                    )
                answer_field = f"{pair_field}['answer']"
                groups.append((answer_field, _get_nested(pair, "answer", pair_field, where)))
        else:
            raise DataFormatError(
                f"{where}: field {field}['type'] must be 'singleAnswer' or 'multipleQAs', "
                f"got {kind!r}"
            )
        for group_field, value in groups:
            for answer in _answer_list(value, group_field, where):
                if answer not in answers:
                    answers.append(answer)
    _require_answers(answers, "'annotations'", where)
    if answer_set != "union":
        if "nq_answer" not in obj:
            raise DataFormatError(
                f"{where}: field 'nq_answer' is missing; AmbigQA is scored against the NQ-open "
                "answers 'nq_answer' as MMOA-RAG does, which only the full AmbigNQ release has "
                "(ambignq/dev.json, not dev_light.json); use that file, or score against every "
                "annotation's answers with ambigqa_answers='union' (--ambigqa_answers union)"
            )
        nq = _require_answers(_answer_list(obj["nq_answer"], "'nq_answer'", where),
                              "'nq_answer'", where)
        answers = [", ".join(nq)] if answer_set == "nq_answer_joined" else nq
    return QARecord(
        id=_id(obj, "id", where),
        question=_text(obj, "question", where),
        answers=answers,
        type="multipleQAs" if multiple else "singleAnswer",
    )


def _metadata_titles(facts: Any) -> list[str] | None:
    """Supporting titles from FlashRAG metadata, either ``{"title": [...]}`` or pair lists."""
    raw: list[Any] | None = None
    if isinstance(facts, Mapping) and isinstance(facts.get("title"), list):
        raw = facts["title"]
    elif isinstance(facts, list) and all(
        isinstance(f, list) and len(f) == 2 and isinstance(f[0], str) for f in facts
    ):
        raw = [f[0] for f in facts]
    if raw is None or not all(isinstance(t, str) for t in raw):
        return None
    return list(dict.fromkeys(raw))


def _metadata_decomposition(steps: Any) -> list[str] | None:
    """Sub-questions from a ``question_decomposition`` list of strings or ``{"question"}`` dicts."""
    if not isinstance(steps, list) or not steps:
        return None
    questions = [s.get("question") if isinstance(s, Mapping) else s for s in steps]
    if not all(isinstance(q, str) and q.strip() for q in questions):
        return None
    return [q.strip() for q in questions]


def _parse_flashrag(obj: Mapping[str, Any], where: str, _pos: int, _src: Path) -> QARecord:
    answers = _answer_list(_get(obj, "golden_answers", where), "'golden_answers'", where)
    metadata = obj.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise DataFormatError(
            f"{where}: field 'metadata' must be an object, got {json_type_name(metadata)}"
        )
    metadata = metadata or {}
    record_type = metadata.get("type")
    return QARecord(
        id=_id(obj, "id", where),
        question=_text(obj, "question", where),
        answers=_require_answers(answers, "'golden_answers'", where),
        supporting_titles=_metadata_titles(metadata.get("supporting_facts")),
        decomposition=_metadata_decomposition(metadata.get("question_decomposition")),
        type=record_type.strip() if isinstance(record_type, str) and record_type.strip() else None,
    )


def _parse_nq_open(obj: Mapping[str, Any], where: str, pos: int, src: Path) -> QARecord:
    answers = _answer_list(_get(obj, "answer", where), "'answer'", where)
    return QARecord(
        id=f"{src.stem}-{pos}",
        question=_text(obj, "question", where),
        answers=_require_answers(answers, "'answer'", where),
    )


def _parse_popqa(obj: Mapping[str, Any], where: str, _pos: int, _src: Path) -> QARecord:
    raw = _get(obj, "possible_answers", where)
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as err:
            raise DataFormatError(f"{where}: field 'possible_answers' must be a list of strings "
                                  f"or a JSON-encoded one, got a string that is not JSON "
                                  f"({err.msg})") from err
    answers = _answer_list(raw, "'possible_answers'", where)
    views = _get(obj, "s_pop", where)
    if isinstance(views, bool) or not isinstance(views, int | float):
        raise DataFormatError(f"{where}: field 's_pop' must be a number (monthly page views), "
                              f"got {json_type_name(views)}")
    relation = obj.get("prop")
    return QARecord(
        id=_id(obj, "id", where),
        question=_text(obj, "question", where),
        answers=_require_answers(answers, "'possible_answers'", where),
        type=relation.strip() if isinstance(relation, str) and relation.strip() else None,
        group="popular" if views >= POPQA_POPULAR_MIN_VIEWS else "unpopular",
    )


def _parse_demo(obj: Mapping[str, Any], where: str, _pos: int, _src: Path) -> QARecord:
    record = QARecord.from_dict(obj, where)
    _require_answers(record.answers, "'answers'", where)
    return record


_Parser = Callable[[Mapping[str, Any], str, int, Path], QARecord]

_PARSERS: dict[str, _Parser] = {
    "hotpotqa": _parse_multihop,
    "2wiki": _parse_multihop,
    "ambigqa": _parse_ambigqa,
    "flashrag": _parse_flashrag,
    "nq_open": _parse_nq_open,
    "demo": _parse_demo,
    "popqa": _parse_popqa,
}

FORMATS: tuple[str, ...] = tuple(_PARSERS)

# Auto-detection: (keys that must be present, keys that must be absent) per layout. HotpotQA
# and 2Wiki are told apart by 2Wiki's "evidences"; NQ-open is the only layout without an id.
_SIGNATURES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "hotpotqa": (frozenset({"_id", "question", "answer"}), frozenset({"evidences"})),
    "2wiki": (frozenset({"_id", "question", "answer", "evidences"}), frozenset()),
    "ambigqa": (frozenset({"id", "question", "annotations"}), frozenset()),
    "flashrag": (frozenset({"id", "question", "golden_answers"}), frozenset()),
    "nq_open": (frozenset({"question", "answer"}), frozenset({"id", "_id"})),
    "demo": (frozenset({"id", "question", "answers"}), frozenset()),
    "popqa": (frozenset({"id", "question", "possible_answers", "s_pop"}), frozenset()),
}


def detect_format(obj: Mapping[str, Any], where: str = "record") -> str:
    """The layout whose signature the record's keys fit; an error when none or several fit."""
    keys = set(obj)
    matches = [
        name
        for name, (needed, forbidden) in _SIGNATURES.items()
        if needed <= keys and not (forbidden & keys)
    ]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise DataFormatError(
            f"{where}: cannot tell the dataset format: keys {sorted(keys)} fit {matches}; "
            "pass fmt explicitly"
        )
    expected = "; ".join(
        f"{name}: {sorted(needed)}" + (f" without {sorted(forbidden)}" if forbidden else "")
        for name, (needed, forbidden) in _SIGNATURES.items()
    )
    raise DataFormatError(
        f"{where}: unknown dataset format: keys {sorted(keys)} fit no known layout "
        f"(expected keys - {expected})"
    )


def load_qa(
    path: PathLike,
    fmt: str = "auto",
    *,
    max_samples: int | None = None,
    ambigqa_answers: str = DEFAULT_AMBIGQA_ANSWERS,
) -> list[QARecord]:
    """Load a QA file into records; ``fmt`` is one of :data:`FORMATS` or ``"auto"``.

    ``max_samples`` keeps the first N records (file order). Record ids must be unique in a file.
    ``ambigqa_answers`` (one of :data:`AMBIGQA_ANSWER_SETS`) is the gold answer set of an
    AmbigQA file and is ignored for the other layouts.
    """
    if fmt != "auto" and fmt not in _PARSERS:
        raise ValueError(f"unknown dataset format {fmt!r}; expected 'auto' or one of {FORMATS}")
    if max_samples is not None and max_samples < 1:
        raise ValueError(f"max_samples must be a positive integer or None, got {max_samples}")
    if ambigqa_answers not in AMBIGQA_ANSWER_SETS:
        raise ValueError(f"unknown AmbigQA answer set {ambigqa_answers!r}; expected one of "
                         f"{AMBIGQA_ANSWER_SETS}")
    parsers = {**_PARSERS,
               "ambigqa": functools.partial(_parse_ambigqa, answer_set=ambigqa_answers)}
    source = Path(path)
    parser: _Parser | None = None if fmt == "auto" else parsers[fmt]
    records: list[QARecord] = []
    seen: dict[str, str] = {}
    for where, position, obj in iter_raw_records(source):
        if parser is None:
            parser = parsers[detect_format(obj, where)]
        record = parser(obj, where, position, source)
        if record.id in seen:
            raise DataFormatError(
                f"{where}: duplicate id {record.id!r} (first seen at {seen[record.id]})"
            )
        seen[record.id] = where
        records.append(record)
        if max_samples is not None and len(records) >= max_samples:
            break
    if not records:
        raise DataFormatError(f"{source}: the file holds no records")
    return records
