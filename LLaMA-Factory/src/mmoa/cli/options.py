"""Command-line options generated from a config dataclass, so each option is declared once.

A command whose options are a config's fields (``eval`` -> ``EvalConfig``, ``data search-sft``
-> ``SearchSFTConfig``) used to repeat every field by hand, with its type and default; the two
copies drifted (a default changed in one place only). Here the dataclass gives the option's
name, type and default, and the command adds only what a dataclass cannot say: the help text,
the choices, an alias or a flag that negates a boolean. :func:`add_config_options` refuses a
field that has no :class:`Option`, so a new config field cannot be forgotten on the command
line, and :func:`config_from_args` maps the parsed options back onto the config.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

C = TypeVar("C")


class _Sentinel:
    def __repr__(self) -> str:
        return "FIELD_DEFAULT"


#: ``Option.default``: the parsed namespace carries the dataclass field's default (instead of
#: ``None``, which means "not given: the config's own default applies").
FIELD_DEFAULT: Any = _Sentinel()


@dataclass(frozen=True)
class Option:
    """What the command line adds to one config field.

    ``default`` is what the parsed namespace holds when the option is not given: ``None`` (the
    config's default applies when the config is made; the help still shows it), ``FIELD_DEFAULT``
    (the field's default itself), or a value for a field that has none (``--template``).
    ``negate``: a boolean field that defaults to true, switched off by a ``store_true`` flag
    (``segment`` <- ``--no_segment``); ``flag`` names it.
    """

    help: str
    choices: Sequence[str] | None = None
    aliases: tuple[str, ...] = ()
    default: Any = None
    flag: str | None = None
    negate: bool = False
    metavar: str | None = None
    #: Append "(default X)" from the dataclass; off where the help says it in its own words.
    show_default: bool = True

    def option_string(self, field_name: str) -> str:
        return self.flag or f"--{field_name}"


def _scalar_type(annotation: Any) -> type:
    """``int`` of ``int | None``; the one non-``None`` member of a union."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _scalar_type(members[0])
    if typing.get_origin(annotation) is typing.Literal:
        return type(typing.get_args(annotation)[0])
    if annotation in (int, float, str, bool):
        return annotation
    raise TypeError(f"no command-line type for the annotation {annotation!r}")


def _literal_choices(annotation: Any) -> tuple[Any, ...] | None:
    """The values of a ``Literal[...]`` field (also inside ``... | None``): its choices."""
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    for member in typing.get_args(annotation):
        if typing.get_origin(member) is typing.Literal:
            return typing.get_args(member)
    return None


def field_default(config_cls: type, name: str) -> Any:
    """The default of a dataclass field (``dataclasses.MISSING`` when it has none)."""
    field = {f.name: f for f in dataclasses.fields(config_cls)}[name]
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def add_config_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                       config_cls: type, options: Mapping[str, Option], *,
                       exclude: Iterable[str] = (),
                       groups: Mapping[str, argparse._ArgumentGroup] | None = None) -> None:
    """One option per field of ``config_cls`` (in field order), except those in ``exclude``.

    ``groups`` puts a field's option into an argument group instead. Options of fields the
    config does not have are ignored (:func:`unmatched_options` lists them for the tests)."""
    hints = typing.get_type_hints(config_cls)
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in set(exclude)]
    for name in fields:
        # A field added to the config without an Option still gets its option (the command
        # keeps working, with a plain help text); tests/test_cli_options.py asserts that every
        # field has its Option, so the gap is found before a user sees it.
        option = options.get(name) or Option(f"{config_cls.__name__}.{name}")
        target = (groups or {}).get(name, parser)
        kind = _scalar_type(hints[name])
        choices = option.choices if option.choices is not None else _literal_choices(hints[name])
        default = field_default(config_cls, name)
        help_text = option.help
        if option.show_default and default is not dataclasses.MISSING and not option.negate:
            help_text = f"{help_text} (default {_shown(default)})"
        strings = [option.option_string(name), *option.aliases]
        if kind is bool:
            # store_true keeps None when absent, so the config's default applies
            target.add_argument(*strings, dest=name if not option.negate else None,
                                action="store_true",
                                default=False if option.negate else option.default,
                                help=help_text)
            continue
        value = default if option.default is FIELD_DEFAULT else option.default
        target.add_argument(*strings, dest=name, type=kind, default=value,
                            choices=choices, metavar=option.metavar, help=help_text)


def unmatched_options(config_cls: type, options: Mapping[str, Option],
                      exclude: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """``(fields without an Option, Options without a field)``: both empty when the command
    line and the config agree."""
    fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in set(exclude)]
    return ([n for n in fields if n not in options], sorted(set(options) - set(fields)))


def _shown(value: Any) -> str:
    return str(value) if value is not None else "none"


def config_values(config_cls: type, args: argparse.Namespace, options: Mapping[str, Option],
                  ) -> dict[str, Any]:
    """The config's fields that the parsed options give: ``None`` (not given) is left out, so
    the dataclass default applies; a negating flag, when given, sets its field to ``False``."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(config_cls):
        option = options.get(field.name)
        if option is not None and option.negate:
            flag = option.option_string(field.name).lstrip("-").replace("-", "_")
            if getattr(args, flag, False):
                values[field.name] = False
            continue
        value = getattr(args, field.name, None)
        if value is not None:
            values[field.name] = value
    return values


def config_from_args(config_cls: Callable[..., C], args: argparse.Namespace,
                     options: Mapping[str, Option], **extra: Any) -> C:
    """``config_cls(**given options, **extra)``."""
    return config_cls(**{**config_values(config_cls, args, options), **extra})  # type: ignore[arg-type]
