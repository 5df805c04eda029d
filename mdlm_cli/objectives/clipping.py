"""bd3lm's data-driven noise schedule (the paper's clipped schedules; the reference's
`clip_search_widths` and `_clipped_schedule_search`): training draws t ~ U[beta, omega],
and at each validation the interval whose loss has the least variance over the validation
batches is chosen.

The variance of a batch is that of its per-block losses (each block's loss averaged over its
L' tokens, padding counted 0, as the reference reshapes them), summed over the batches; the
intervals are compared on the same batches, masks and uniform draws. The chosen interval is
used for training only: evaluation reports the bound of the whole interval U[eps, 1], as the
paper's likelihood tables do (the reference's validation reports [1e-3, 1], and the exact NLL
at L' = 1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from torch import Tensor

Interval = tuple[float, float]


def candidate_intervals(widths: Sequence[float], delta: float, t_min: float,
                        block_size: int) -> list[Interval]:
    """The intervals a search compares, the whole one (t_min, 1) first. At L' = 1 it and
    (1, 1), the exact NLL (the reference's pair); else, for each width w, every [s, s + w] with
    s = 0, delta, 2 delta, ... up to 1 - w, floored at t_min."""
    if block_size == 1:
        return [(t_min, 1.0), (1.0, 1.0)]
    out = [(t_min, 1.0)]
    for width in widths:
        for k in range(math.floor((1.0 - width) / delta + 1e-6) + 1):
            start = round(k * delta, 10)
            interval = (max(start, t_min), min(max(round(start + width, 10), t_min), 1.0))
            if interval not in out:
                out.append(interval)
    return out


def variance_table(block_losses: Callable[[Interval, int], Tensor],
                   intervals: Sequence[Interval], batches: int) -> dict[Interval, float]:
    """{interval: the variance of its per-block losses, summed over `batches` batches}, where
    `block_losses(interval, b)` is batch b's (B, K) per-block losses under t ~ U[interval]."""
    return {interval: sum(float(block_losses(interval, b).float().var()) for b in range(batches))
            for interval in intervals}


def select_interval(variances: dict[Interval, float]) -> Interval:
    """The interval of least variance (the first of equals, so the whole interval wins a tie)."""
    return min(variances, key=lambda interval: variances[interval])


def interval_name(interval: Interval) -> str:
    """'0.001-1', '0.25-0.75': the interval as a metrics.jsonl key."""
    return f"{interval[0]:g}-{interval[1]:g}"
