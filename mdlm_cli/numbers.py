"""Finite numbers in their ranges: the one check of every float that the config (`--set`, a
preset, a checkpoint's config) or a command-line flag gives. A nan compares false both ways
and an inf passes every lower bound, so a plain `value <= 0` check lets both through."""

from __future__ import annotations

import math

from .errors import MdlmError

# Config floats whose range nothing else checks (the others: config.validate and the
# backbones' validate_config): (low, high, low included, high included).
CONFIG_RANGES = {
    "diffusion.eps": (0.0, 1.0, True, False),  # the schedule's floor: alpha(1) = eps
    "model.norm_epsilon": (0.0, math.inf, False, False),
    "diffusion.clip_min": (0.0, 1.0, True, True),  # bd3lm's clipped schedule, in [0, 1]
    "diffusion.clip_max": (0.0, 1.0, False, True),
    "diffusion.clip_search_widths": (0.0, 1.0, False, True),  # each width
    "diffusion.clip_search_delta": (0.0, 1.0, False, True),
    "diffusion.cart_p": (0.0, 1.0, False, True),  # mdlm's CART: the geometric distribution's p
}


def check_float(
    where: str,
    value: float,
    low: float = -math.inf,
    high: float = math.inf,
    low_in: bool = True,
    high_in: bool = True,
) -> float:
    """`value` if it is finite and in the interval, else an MdlmError naming `where`."""
    inside = (low <= value if low_in else low < value) and (
        value <= high if high_in else value < high
    )
    if math.isfinite(value) and inside:
        return value
    if math.isinf(low) and math.isinf(high):
        interval = ""
    elif math.isinf(high):
        interval = f" {'at least' if low_in else 'above'} {low:g}"
    else:
        interval = f" in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"
    raise MdlmError(f"{where} must be a finite number{interval} (got {value})")


def check_config_float(where: str, value: float) -> float:
    """A config float (`section.key`): finite, and in its CONFIG_RANGES interval if it has
    one."""
    return check_float(where, value, *CONFIG_RANGES.get(where, ()))
