"""Config values read as their dataclass field's type, for every stage's keys.

LLaMA-Factory hands a YAML config to ``HfArgumentParser`` as a dict, which passes values on
unconverted: ``mappo_top_k: ten`` failed with a bare ``TypeError`` and ``plot_loss: "false"`` (a
non-empty string) was true. One reading serves the ``mappo`` keys, the ``retriever_rl`` keys and
the pre-flight check, so it lives here, below all of them (it needs nothing but the standard
library).
"""

from __future__ import annotations

import types
import typing
from typing import Any

_TRUE = ("true", "yes", "y", "t", "1")
_FALSE = ("false", "no", "n", "f", "0")


def reads_as_true(value: Any) -> bool:
    """Whether a config value is a true boolean as LLaMA-Factory reads its own keys: ``True``, or
    a string or number among :data:`_TRUE` (``"true"``, ``"1"``, ``1``, ...). For a check that
    only reports (a warning), where :func:`typed_value` would refuse a bad value."""
    return value is True or (not isinstance(value, bool)
                             and str(value).strip().lower() in _TRUE)


def typed_value(name: str, value: Any, hint: Any, bool_strings: bool = True) -> Any:
    """``value`` as the field's type, read as LLaMA-Factory reads its own keys (numbers and
    true/false given as strings are accepted); anything else is a ``ValueError`` naming the key.
    ``bool_strings=False`` (the ``retriever_rl`` stage) refuses strings for a boolean too: only
    YAML's unquoted ``true`` / ``false`` are booleans there.

    Without this a wrong type passed the dataclass untouched: ``mappo_top_k: ten`` failed with
    a bare ``TypeError`` traceback, and ``mappo_adaptive_kl: maybe`` (a non-empty string) was
    silently true."""
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in args:
        return None
    kind = next(a for a in args if a is not type(None))
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            if bool_strings and isinstance(value, str) \
                    and value.strip().lower() in _TRUE + _FALSE:
                return value.strip().lower() in _TRUE
        elif kind is int and not isinstance(value, bool | float):
            return int(value)
        elif kind is float and not isinstance(value, bool):
            return float(value)
        elif kind is str and isinstance(value, str | int | float) \
                and not isinstance(value, bool):
            return str(value)
    except (ValueError, TypeError):  # TypeError: int(None) for a key given as null
        pass
    expected = {bool: "true or false", int: "an integer", float: "a number",
                str: "a string"}[kind]
    if kind is bool and not bool_strings and isinstance(value, str):
        expected += " (unquoted: a quoted string is not a boolean)"
    raise ValueError(f"{name} must be {expected}, got {value!r}")


def typed_fields(cls: Any, config: dict[str, Any], bool_strings: bool = True,
                 keep_none: bool = False,
                 kinds: tuple[type, ...] = (bool, int, float, str)) -> dict[str, Any]:
    """``config`` with the value of each of ``cls``'s dataclass fields of a plain type (one of
    ``kinds``, or one of them or None) read by :func:`typed_value`; other keys and fields of other
    types unchanged. ``keep_none``: a ``None`` stays ``None`` whatever the type (leaves it to
    the dataclass, as for LLaMA-Factory's keys)."""
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # a forward reference that does not resolve here: check nothing
        return dict(config)
    out = dict(config)
    for name, value in config.items():
        hint = hints.get(name)
        if hint is None or (keep_none and value is None):
            continue
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        args = typing.get_args(hint) if union else (hint,)
        plain = [a for a in args if a is not type(None)]
        if len(plain) == 1 and plain[0] in kinds:
            out[name] = typed_value(name, value, plain[0] | None if len(args) > 1 else plain[0],
                               bool_strings)
    return out
