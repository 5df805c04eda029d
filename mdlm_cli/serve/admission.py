"""What a served request may hold in memory beyond the weights, decided before it is queued:
its longest network call's rows and positions (`row_length`), their bytes by
`memory.ForwardCost`, refused with a 400 that says the need where even one row cannot fit,
queued behind the running requests where it fits only alone (the worker admits by bytes)."""

from __future__ import annotations

from ..memory import size_text
from .schema import ApiError, Plan
from .served import Served


class Memory:
    """What the requests' network calls may hold beyond the weights: `budget` bytes (a share
    of what the device had free once the model was loaded), each call's need from
    `memory.ForwardCost`. None budget: the device's memory cannot be read (nothing refused)."""

    def __init__(self, cost, budget: int | None):
        self.cost, self.budget = cost, budget

    def need(self, rows: int, length: int) -> int:
        return self.cost.bytes(rows, length)

    def fits(self, need: int) -> bool:
        return self.budget is None or need <= self.budget

    def rows_at(self, length: int, most: int) -> int:
        return self.cost.rows_within(self.budget, length, most)


def row_length(plan: Plan, served: Served) -> int:
    """The positions of the plan's longest network call: a semi-AR window, a bd3lm request's
    prompt and answer (its cache grows to them), else its longest row."""
    if plan.stride is not None:
        return served.loaded.length
    if plan.block_size:
        return max(len(r.prefix) for r in plan.rows) + plan.max_tokens
    return max(len(r.template) for r in plan.rows)


def memory_need(memory: Memory | None, rows: int, length: int, max_batch: int) -> int:
    """The bytes a job's network calls hold at most (its rows, at most a call's worth of
    `max_batch`); a job that cannot fit even one row alone is refused with a 400 naming what
    it needs."""
    if memory is None:
        return 0
    per_call = min(rows, max_batch)
    need = memory.need(per_call, length)
    if not memory.fits(memory.need(1, length)):
        raise ApiError(400, f"this request needs about {size_text(need)} of memory for its "
                       f"{per_call} row(s) of {length} positions, more than the "
                       f"{size_text(memory.budget)} this server has for requests: ask for fewer "
                       "tokens (max_tokens, a shorter prompt)", param="max_tokens",
                       code="insufficient_memory")
    if memory.budget is None:  # the device's memory cannot be read: nothing is refused
        return need
    return min(need, memory.budget)  # rows past what fits run in smaller calls (worker.py)
