"""Config values read as their dataclass field's type, for every stage's keys.

LLaMA-Factory hands a YAML config to ``HfArgumentParser`` as a dict, which passes values on
unconverted: ``mappo_top_k: ten`` failed with a bare ``TypeError`` and ``plot_loss: "false"`` (a
non-empty string) was true. One reading serves the ``mappo`` keys, the ``retriever_rl`` keys and
the pre-flight check, so it lives here, below all of them (it needs nothing but the standard
library).

The ranges of the numeric keys every stage shares (temperatures, top-p, learning rates, clip
ranges, the gradient clipping norm) are checked here too, by one small set of validators that
the ``mappo`` and ``retriever_rl`` keys, the LLaMA-Factory keys of a ``mappo`` config and
``mmoa-cli eval`` all call: a probe found 1e-320, ``.nan``, ``1e+400`` and 400-digit integers
accepted in some places (and tracebacks or an all-NaN model later) and refused in others.
The bounds and why they are where they are: :mod:`mmoa.defaults`.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from mmoa import defaults

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
    except OverflowError:  # float() of an integer of hundreds of digits
        raise ValueError(f"{name} must be a number a float can hold (below about 1.8e308), "
                         f"got {shown(value)}") from None
    expected = {bool: "true or false", int: "an integer", float: "a number",
                str: "a string"}[kind]
    if kind is bool and not bool_strings and isinstance(value, str):
        expected += " (unquoted: a quoted string is not a boolean)"
    raise ValueError(f"{name} must be {expected}, got {shown(value)}")


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for an error line: an integer of hundreds of digits as its digit count
    (its repr would fill the terminal, and past 4,300 digits Python refuses to make one)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value).bit_length() > 200:
        return f"an integer of about {int(abs(value).bit_length() * math.log10(2)) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- ranges ------------------------------------------------------------------------------------


def as_number(name: str, value: Any) -> float:
    """``value`` (an int, a float or a numeric string) as a float; a boolean, ``None``, a
    non-number or an integer too large for a float (a 400-digit YAML integer: ``OverflowError``
    in every later comparison with a float) is a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{name} must be a number, got {shown(value)}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a number a float can hold (below about 1.8e308), "
                         f"got {shown(value)}") from None
    except ValueError:
        raise ValueError(f"{name} must be a number, got {shown(value)}") from None


def check_range(name: str, value: Any, low: float = 0.0, high: float = math.inf, *,
                low_open: bool = False, high_open: bool = False, why: str = "") -> float:
    """``value`` as a finite float in the interval from ``low`` to ``high`` (each end open or
    closed), else one ``ValueError`` line naming ``name``, the interval and ``why`` it is
    bounded there. Every range check of a config key goes through here."""
    number = as_number(name, value)
    inside = math.isfinite(number) \
        and (number > low if low_open else number >= low) \
        and (number < high if high_open else number <= high)
    if inside:
        return number
    if low == 0 and low_open and high == math.inf:
        bound = "> 0"
    elif high == math.inf:
        bound = f"{'>' if low_open else '>='} {low:g}"
    else:
        bound = (f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}")
    raise ValueError(f"{name} must be a finite number {bound}{why}, got {shown(value)}")


def check_at_least(name: str, value: int | None, minimum: int = 1) -> int | None:
    """A count or size (turns, top-k, batch sizes, rounds) of at least ``minimum``, else one
    ``ValueError`` line naming ``name``; ``None`` (an unset key whose default is decided later)
    passes. One message for every integer lower bound of every stage's keys."""
    if value is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def check_positive(name: str, value: Any, why: str = "") -> float:
    """A finite number > 0 (timeouts, caps)."""
    return check_range(name, value, 0.0, low_open=True, why=why)


def check_temperature(name: str, value: Any) -> float:
    """A sampling temperature: logits are divided by it (bounds: ``defaults.MIN_TEMPERATURE``,
    ``MAX_TEMPERATURE``). Zero or a subnormal like 1e-320 (0 in float32) made every logit inf
    or NaN: a traceback at the first sampled token."""
    if as_number(name, value) <= 0:
        check_positive(name, value)  # the plain message for 0 and negatives
    return check_range(name, value, defaults.MIN_TEMPERATURE, defaults.MAX_TEMPERATURE,
                       why=" (lower is greedy sampling whose log-probabilities overflow, "
                           "higher uniform noise; to decode greedily, do not sample)")


def check_top_p(name: str, value: Any) -> float:
    """Nucleus top-p in (0, 1], at least ``defaults.MIN_PROBABILITY_RANGE`` (below it only the
    top token is ever kept: greedy decoding under another name)."""
    if not 0 < as_number(name, value) <= 1:
        check_range(name, value, 0.0, 1.0, low_open=True)
    return check_range(name, value, defaults.MIN_PROBABILITY_RANGE, 1.0,
                       why=" (below it only the top token is kept: greedy decoding)")


def check_learning_rate(name: str, value: Any) -> float:
    """A learning rate: finite and at least ``defaults.MIN_LEARNING_RATE`` (below it an AdamW
    step is under float32's resolution of the weights: nothing trains)."""
    if as_number(name, value) <= 0:
        check_positive(name, value)
    return check_range(name, value, defaults.MIN_LEARNING_RATE,
                       why=" (below it no float32 weight changes)")


def check_clip_range(name: str, value: Any, *, lower: bool = False) -> float:
    """A PPO clip range: a ratio is clipped to [1 - lower, 1 + upper]. At least
    ``defaults.MIN_PROBABILITY_RANGE`` (GSPO's 3e-4 stays well inside); a lower one below 1
    (ratios are positive, so 1 - e <= 0 clips nothing), an upper one (or the value clip) at
    most ``defaults.MAX_CLIPRANGE``."""
    if as_number(name, value) <= 0:
        check_positive(name, value)
    if lower:
        return check_range(name, value, defaults.MIN_PROBABILITY_RANGE, 1.0, high_open=True,
                           why=" (below 1e-06 every ratio is clipped; at 1 or more nothing is "
                               "clipped from below)")
    return check_range(name, value, defaults.MIN_PROBABILITY_RANGE, defaults.MAX_CLIPRANGE,
                       why=" (below 1e-06 every ratio is clipped; above 10 none is)")


def check_max_grad_norm(name: str, value: Any) -> float:
    """The gradient clipping norm: finite and > 0. Hugging Face's ``TrainingArguments`` default
    is 1.0 and its Trainer skips clipping for 0 or ``None``, but LLaMA-Factory passes the key
    through unchecked and our loops hand it to ``clip_grad_norm_``, where NaN multiplied every
    gradient by NaN (an all-NaN model saved with exit 0), 0 zeroes them and a negative value
    flips their sign: refused, as is a norm below ``defaults.MIN_MAX_GRAD_NORM`` (nothing
    would train); a large value (1e9) clips nothing."""
    if as_number(name, value) <= 0:
        check_positive(name, value, why=" (a large value such as 1e9 clips nothing)")
    return check_range(name, value, defaults.MIN_MAX_GRAD_NORM,
                       why=" (below it the clipped gradient trains nothing; a large value "
                           "such as 1e9 clips nothing)")


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
