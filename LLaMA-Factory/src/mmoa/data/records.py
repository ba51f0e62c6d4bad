"""The one record type every QA dataset is loaded into.

HotpotQA, 2WikiMultihopQA, AmbigQA, FlashRAG files, NQ-open and the generated demo world all become
:class:`QARecord`, so the SFT data builder, the MAPPO rollout and the evaluation never look at a
dataset's own layout. The demo schema (JSON Lines) is exactly :meth:`QARecord.to_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mmoa.fileio import DataFormatError

__all__ = ["QARecord", "json_type_name"]


def json_type_name(value: Any) -> str:
    """The JSON name of a value's type, for error messages about data files."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def _check_str(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str):
        raise DataFormatError(
            f"{where}: field {name!r} must be a string, got {json_type_name(value)}"
        )
    if not value.strip():
        raise DataFormatError(f"{where}: field {name!r} must be a non-empty string, got {value!r}")
    return value


def _check_str_list(value: Any, name: str, where: str, *, optional: bool) -> list[str] | None:
    if value is None and optional:
        return None
    if not isinstance(value, list):
        raise DataFormatError(
            f"{where}: field {name!r} must be a list of strings, got {json_type_name(value)}"
        )
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise DataFormatError(
                f"{where}: field {name!r} item {i} must be a string, got {json_type_name(item)}"
            )
        if not item.strip():
            raise DataFormatError(f"{where}: field {name!r} item {i} must be a non-empty string")
    return list(value)


@dataclass(frozen=True)
class QARecord:
    """One question with its gold answers and whatever supervision the dataset has.

    ``answers`` holds every accepted alias (metrics take the maximum over them); it is non-empty
    for anything loaded from a dataset file, and may be empty only for a record built at run time
    for an unlabelled question. ``supporting_ids`` are corpus passage ids (known for the demo
    world); ``supporting_titles`` are Wikipedia titles (HotpotQA and 2Wiki know titles, not
    passage ids). ``decomposition`` is a reference list of sub-questions when the dataset has one;
    ``resolved_decomposition`` the same hops as asked after reading the earlier ones (a bridge
    question's second hop names the entity the first found: what a multi-turn search agent
    queries), where the dataset knows it (the demo world's bridge questions).
    ``group`` names the question's group for per-group scores (the decision agent's mixed sets:
    ``known``, answerable without retrieval, and ``world``, only by retrieval). ``group`` and
    ``resolved_decomposition`` are written only when set, so files without them are unchanged.
    """

    id: str
    question: str
    answers: list[str] = field(default_factory=list)
    supporting_ids: list[str] | None = None
    supporting_titles: list[str] | None = None
    decomposition: list[str] | None = None
    type: str | None = None
    group: str | None = None
    resolved_decomposition: list[str] | None = None

    def __post_init__(self) -> None:
        where = f"QARecord {self.id!r}" if isinstance(self.id, str) else "QARecord"
        _check_str(self.id, "id", where)
        _check_str(self.question, "question", where)
        _check_str_list(self.answers, "answers", where, optional=False)
        _check_str_list(self.supporting_ids, "supporting_ids", where, optional=True)
        _check_str_list(self.supporting_titles, "supporting_titles", where, optional=True)
        _check_str_list(self.decomposition, "decomposition", where, optional=True)
        _check_str_list(self.resolved_decomposition, "resolved_decomposition", where,
                        optional=True)
        hops = 0 if self.decomposition is None else len(self.decomposition)
        if self.resolved_decomposition is not None and len(self.resolved_decomposition) != hops:
            raise DataFormatError(
                f"{where}: field 'resolved_decomposition' must have one hop per "
                f"'decomposition' hop ({hops}), got {len(self.resolved_decomposition)}")
        if self.type is not None:
            _check_str(self.type, "type", where)
        if self.group is not None:
            _check_str(self.group, "group", where)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the demo schema); lists are copies."""
        out: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "answers": list(self.answers),
            "supporting_ids": None if self.supporting_ids is None else list(self.supporting_ids),
            "supporting_titles": (
                None if self.supporting_titles is None else list(self.supporting_titles)
            ),
            "decomposition": None if self.decomposition is None else list(self.decomposition),
            "type": self.type,
        }
        if self.group is not None:
            out["group"] = self.group
        if self.resolved_decomposition is not None:
            out["resolved_decomposition"] = list(self.resolved_decomposition)
        return out

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any], where: str = "record") -> QARecord:
        """Build a record from :meth:`to_dict`'s layout; ``where`` prefixes every error message.

        ``id``, ``question`` and ``answers`` are required; the other fields may be missing or null.
        An integer ``id`` is accepted and turned into a string.
        """
        if not isinstance(obj, Mapping):
            raise DataFormatError(f"{where}: expected a JSON object, got {json_type_name(obj)}")
        for key in ("id", "question", "answers"):
            if key not in obj:
                raise DataFormatError(f"{where}: field {key!r} is missing")
        record_id = obj["id"]
        if isinstance(record_id, int) and not isinstance(record_id, bool):
            record_id = str(record_id)
        record_type = obj.get("type")
        group = obj.get("group")
        return cls(
            id=_check_str(record_id, "id", where),
            question=_check_str(obj["question"], "question", where),
            answers=_check_str_list(obj["answers"], "answers", where, optional=False) or [],
            supporting_ids=_check_str_list(
                obj.get("supporting_ids"), "supporting_ids", where, optional=True
            ),
            supporting_titles=_check_str_list(
                obj.get("supporting_titles"), "supporting_titles", where, optional=True
            ),
            decomposition=_check_str_list(
                obj.get("decomposition"), "decomposition", where, optional=True
            ),
            type=None if record_type is None else _check_str(record_type, "type", where),
            group=None if group is None else _check_str(group, "group", where),
            resolved_decomposition=_check_str_list(
                obj.get("resolved_decomposition"), "resolved_decomposition", where, optional=True
            ),
        )
