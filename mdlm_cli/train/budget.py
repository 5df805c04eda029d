"""A schedule fitted to a time budget (`train.time_budget`, minutes): the run measures its own
speed, then sets max_steps to the steps the budget holds, so the cosine decay ends when the
time does. The same preset then trains about as long on any machine, and a faster machine
(bf16 units, more cores, a GPU) trains on more tokens instead of finishing early; `make demo`
relies on it. `--time-limit` is different: it stops a run, its schedule unfinished.

The decision is taken once, after PROBE_STEPS steps of the process: its speed is that of the
steps after the first WARM_STEPS (which hold the allocations and any compilation), the time
already spent counts against the budget, and the result is capped at the configured
max_steps. It is kept in the run's state, so a resumed run keeps the same schedule. Before the
decision the learning rate must not depend on the total: a cosine schedule needs a warm-up of
at least PROBE_STEPS steps (`check_time_budget` refuses a shorter one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WARM_STEPS = 10
PROBE_STEPS = 30


@dataclass
class BudgetFit:
    """Watches the first PROBE_STEPS steps of a process; `steps` then gives the run's new
    max_steps (once)."""

    budget_s: float
    cap: int  # the configured max_steps: the budget never raises it
    start_step: int  # the step this process started at
    warm_seconds: float | None = None  # step time spent when the warm-up ended
    done: bool = False

    def steps(self, step: int, step_seconds: float, spent_s: float) -> int | None:
        """The fitted max_steps once PROBE_STEPS steps of this process are done, else None.
        `step_seconds`: time in steps so far (this process); `spent_s`: the run's time so far,
        over every resume, validations and checkpoints included."""
        if self.done or self.budget_s <= 0:
            return None
        in_process = step - self.start_step
        if in_process == WARM_STEPS:
            self.warm_seconds = step_seconds
        if in_process < PROBE_STEPS or self.warm_seconds is None:
            return None
        self.done = True
        rate = (PROBE_STEPS - WARM_STEPS) / max(step_seconds - self.warm_seconds, 1e-9)
        return fitted_steps(step, rate, self.budget_s - spent_s, self.cap)


def fitted_steps(step: int, steps_per_s: float, remaining_s: float, cap: int) -> int:
    """The max_steps of a run at `step` going at `steps_per_s` with `remaining_s` of its budget
    left: at least one more step, at most `cap`."""
    return min(cap, step + max(1, math.floor(remaining_s * steps_per_s)))


def check_time_budget(cfg) -> None:
    """A budget is minutes >= 0; with a cosine decay, the warm-up covers the probe (the
    learning rate of the steps before the decision must not depend on the total)."""
    from ..errors import MdlmError

    budget, optim = cfg.train.time_budget, cfg.optim
    if budget < 0:
        raise MdlmError(f"train.time_budget must be minutes >= 0, 0 = off (got {budget})")
    if budget > 0 and optim.schedule == "cosine" and optim.warmup_steps < PROBE_STEPS:
        raise MdlmError(
            f"train.time_budget with a cosine schedule needs optim.warmup_steps >= "
            f"{PROBE_STEPS} (got {optim.warmup_steps}): the budget fixes the total after "
            f"{PROBE_STEPS} steps, and the warm-up must not depend on it")


def apply_fitted_steps(cfg, state) -> None:
    """A resumed budget run keeps the max_steps fitted when it started."""
    if cfg.train.time_budget > 0 and state.budget_steps is not None:
        cfg.train.max_steps = min(cfg.train.max_steps, state.budget_steps)
