"""Checks of flag values that Typer's types do not make: counts of at least 1, integer lists."""

from __future__ import annotations

from ..errors import MdlmError


def check_positive(**values: int | None) -> None:
    """Counts given on the command line (None = not given) must be at least 1."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise MdlmError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")


def id_list(text: str | None, name: str) -> list[int] | None:
    """Comma-separated token ids (integers, at least 0) as given, e.g. 5,17,3; None for None."""
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MdlmError(f"{name} expects comma-separated token ids, e.g. 5,17,3 (got {text!r})"
                        ) from None
    if not values or min(values) < 0:
        raise MdlmError(f"{name} expects token ids of at least 0 (got {text!r})")
    return values


def int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MdlmError(
            f"{name} expects comma-separated integers, e.g. 100,1000 (got {text!r})"
        ) from None
    if not values or min(values) < 1:
        raise MdlmError(f"{name} expects positive integers (got {text!r})")
    return values
