"""Sampler options as data.

A sampler's options are a frozen dataclass next to its function (`AncestralOptions` in
ancestral.py, ...); each field is declared with `option()`, whose metadata holds the help
text and the valid values (choices, or an inclusive range). `check_options` is the one
place where a value is checked; `build_options` turns keyword values into an instance.
The CLI generates its flags from the same fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import Field, field, fields, replace
from typing import Any

from .errors import EngineError

OPTION_TYPES = (bool, int, float, str)  # the types an option's default may have
KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def option(
    default: Any,
    help: str,
    *,
    choices: Iterable[str] | None = None,
    low: float | None = None,
    high: float | None = None,
) -> Any:
    """A sampler option field: its default, one line of help, and its valid values
    (`choices`, or `low` <= value <= `high`, either bound optional)."""
    return field(
        default=default,
        metadata={
            "help": help,
            "choices": None if choices is None else tuple(choices),
            "low": low,
            "high": high,
        },
    )


def value_type(f: Field) -> type:
    """The type of an option's values: that of its default."""
    return type(f.default)


def describe(f: Field) -> str:
    """The valid values of an option, as a sentence fragment: `one of: a, b`, `in [0, 1]`."""
    choices, low, high = f.metadata["choices"], f.metadata["low"], f.metadata["high"]
    if choices is not None:
        return f"one of: {', '.join(choices)}"
    if low is not None and high is not None:
        return f"in [{low:g}, {high:g}]"
    if low is not None:
        return f"at least {low:g}"
    if high is not None:
        return f"at most {high:g}"
    return KINDS[value_type(f)]


def problem(f: Field, value: Any) -> str | None:
    """What is wrong with `value` for the option `f`, e.g. `must be in [0, 1] (got 2.0)`;
    None when it is valid."""
    kind = value_type(f)
    if kind is float:
        fits = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind is int:
        fits = isinstance(value, int) and not isinstance(value, bool)
    else:
        fits = isinstance(value, kind)
    if not fits:
        return f"must be {KINDS[kind]} (got {value!r})"
    if kind is float and not math.isfinite(value):  # NaN compares false with any bound
        return f"must be a finite number {describe(f)} (got {value!r})"
    choices, low, high = f.metadata["choices"], f.metadata["low"], f.metadata["high"]
    if choices is not None and value not in choices:
        return f"must be {describe(f)} (got {value!r})"
    if (low is not None and value < low) or (high is not None and value > high):
        return f"must be {describe(f)} (got {value!r})"
    return None


def check_options(options: Any) -> None:
    """Every field of an options instance valid, else an EngineError naming the option."""
    for f in fields(options):
        wrong = problem(f, getattr(options, f.name))
        if wrong is not None:
            raise EngineError(f"{f.name} {wrong}")


def build_options(
    cls: type | None, instance: Any, values: Mapping[str, Any], known: Iterable[str],
    sampler: str,
) -> Any:
    """The checked options of a sampler whose options dataclass is `cls` (None: it has none):
    `instance` (an instance of `cls`, or None for the defaults) with the keyword `values`
    that `cls` declares. Other keywords named in `known` (options of other samplers) are
    not read; any other is an EngineError listing the valid names."""
    known = sorted(set(known))
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise EngineError(
            f"unknown sampler option {unknown[0]!r}; the options are: {', '.join(known)}"
        )
    if instance is not None and (cls is None or not isinstance(instance, cls)):
        expected = "none" if cls is None else cls.__name__
        raise EngineError(
            f"sampler {sampler} takes options={expected} (got {type(instance).__name__})"
        )
    if cls is None:
        return None
    names = {f.name for f in fields(cls)}
    out = replace(
        instance if instance is not None else cls(),
        **{k: v for k, v in values.items() if k in names},
    )
    check_options(out)
    return out


def convert_options(options: Any, cls: type | None) -> Any:
    """`options` as an instance of `cls` (the fields they share carried over): what a sampler
    that falls back to another runs with."""
    if cls is None or isinstance(options, cls):
        return options if cls is not None else None
    shared = {f.name for f in fields(cls)} & (
        {f.name for f in fields(options)} if options else set()
    )
    return cls(**{name: getattr(options, name) for name in shared})
