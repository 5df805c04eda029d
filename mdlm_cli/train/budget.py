"""A schedule fitted to a time budget (`train.time_budget`, minutes): the run measures its own
speed and sets max_steps to the steps the budget holds, so the cosine decay ends when the time
does. The same preset then trains about as long on any machine, and a faster machine (bf16
units, more cores, a GPU) trains on more tokens instead of finishing early; `make demo` relies
on it. `--time-limit` is different: it stops a run, its schedule unfinished.

The first fit comes after PROBE_STEPS steps of the process, at the speed of the steps after the
first WARM_STEPS (which hold the allocations and any compilation). That fit alone overran
(`make demo`'s 8 minutes took 9.3 on an EPYC): the steps after the probe ran slower than it
(the steady state, a loaded machine), and the validations and checkpoints were not counted.
So the fit is redone every REFIT_EVERY steps and after every pause, from what the run has
actually spent (pauses included) and a projection of the rest: the remaining steps at the
speed of the last WINDOW steps, the periodic validations and checkpoints that fall among them
at their measured cost, and the final validation and checkpoint. The run then ends at the
budget, the final validation included.

Before the first fit the learning rate must not depend on the total: a cosine schedule needs a
warm-up of at least PROBE_STEPS steps (`check_time_budget` refuses a shorter one). The latest
fit is kept in the run's state: a resumed process trains towards it until its own probe ends,
then re-fits to what is left of the budget (its time so far is in the state).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

WARM_STEPS = 10
PROBE_STEPS = 30
REFIT_EVERY = 25  # steps between two fits: the last one falls this close to the end
WINDOW = 50  # the speed is that of the last WINDOW steps: a slowing run is seen soon
# A validation row's seconds in a training row's, until a periodic validation is measured: a
# forward pass without the backward is a third of the FLOPs, but the EMA weights it runs on are
# eager where the trained trunk is compiled. Measured 0.45 on an AMD EPYC (the demo, bf16, one
# thread: the 1,158 valid rows in 10.3 s, 0.315 s a 16-row step); above it ends early, not late.
EVAL_ROW_PRIOR = 0.5


@dataclass(frozen=True)
class Cadence:
    """Where the loop pauses (loop._validate_or_save follows `pause_after`; the projection
    counts with `pauses`), and the rows each validation reads."""

    eval_every: int
    save_every: int
    eval_rows: int  # of a periodic validation
    final_rows: int  # of the final one (0: the split is empty, no final validation)
    batch_rows: int  # of a training step (the global batch)

    def pause_after(self, done: int, max_steps: int) -> str | None:
        """After step `done`: "valid" (a validation, then a checkpoint), "save" (a checkpoint
        alone) or None."""
        if done % self.eval_every == 0 and done < max_steps:
            return "valid"
        return "save" if done % self.save_every == 0 else None

    def pauses(self, step: int, end: int) -> tuple[int, int]:
        """(validations, checkpoints alone) after the steps step..end of a run ending at `end`
        (the pause after `step` is still to come when the fit runs)."""
        if end < step:
            return 0, 0
        valid = _multiples(self.eval_every, step, end - 1)
        both = _multiples(math.lcm(self.eval_every, self.save_every), step, end - 1)
        return valid, _multiples(self.save_every, step, end) - both


def _multiples(every: int, first: int, last: int) -> int:
    """Multiples of `every` in first..last."""
    return max(0, last // every - (first - 1) // every)


@dataclass
class Pause:
    """A validation or checkpoint the loop took after a step, as measured."""

    kind: str  # "valid" or "save" (Cadence.pause_after)
    seconds: float  # all of it
    eval_s: float = 0.0  # of it, the validation pass
    save_s: float = 0.0  # of it, the checkpoint


@dataclass
class BudgetFit:
    """Fits max_steps to the budget as the run goes: fed each step's end and each pause by the
    loop, `refit` gives the new max_steps when one is due (else None). Times are the run's
    seconds (`spent`: every resume included); only differences of `now` are used."""

    budget_s: float
    cap: int  # the configured max_steps: the budget never raises it
    start_step: int  # the step this process started at
    cadence: Cadence
    marks: deque = field(default_factory=lambda: deque(maxlen=WINDOW + 1))  # (step, step clock)
    paused_s: float = 0.0  # this process's pauses so far: the step clock leaves them out
    valid_s: float | None = None  # the last periodic validation, checkpoint included
    saves: tuple[int, float] = (0, 0.0)  # checkpoints measured, their seconds
    eval_row_s: float | None = None  # validation seconds per row, as last measured
    due: bool = False  # a pause since the last fit
    fits: int = 0

    def step_done(self, step: int, now: float) -> None:
        if step - self.start_step >= WARM_STEPS:
            self.marks.append((step, now - self.paused_s))

    def paused(self, pause: Pause) -> None:
        self.paused_s += pause.seconds
        self.saves = (self.saves[0] + 1, self.saves[1] + pause.save_s)
        if pause.kind == "valid":
            self.valid_s = pause.seconds
            self.eval_row_s = pause.eval_s / max(self.cadence.eval_rows, 1)
        self.due = True

    def refit(self, step: int, spent_s: float, max_steps: int) -> int | None:
        """The new max_steps if a fit is due at `step` (same on every rank: steps decide it),
        else None. Once the run is at its end it stays there."""
        in_process = step - self.start_step
        if self.budget_s <= 0 or step >= max_steps or in_process < PROBE_STEPS:
            return None
        if not (self.due or (in_process - PROBE_STEPS) % REFIT_EVERY == 0):
            return None
        self.due, self.fits = False, self.fits + 1
        return self.fitted(step, self.budget_s - spent_s)

    def fitted(self, step: int, left_s: float) -> int:
        """The last step at which the run, projected, ends within `left_s`: at most `cap`, and
        `step` (end now) when even the final validation does not fit."""
        if self.left_after(step, step) > left_s:
            return step
        lo, hi = step, max(step, self.cap)  # lo fits; bisect for the last that does
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.left_after(step, mid) <= left_s else (lo, mid - 1)
        return lo

    def left_after(self, step: int, end: int) -> float:
        """Projected seconds from `step` to the end of a run ending at `end`: its steps, its
        pauses, the final validation and checkpoint."""
        valid, saves = self.cadence.pauses(step, end)
        return ((end - step) * self.step_s() + valid * self.valid_cost()
                + saves * self.save_cost() + self.final_cost())

    def step_s(self) -> float:
        """Seconds per step of the last WINDOW steps (pauses left out)."""
        (first, t0), (last, t1) = self.marks[0], self.marks[-1]
        return max(t1 - t0, 0.0) / max(last - first, 1)

    def save_cost(self) -> float:
        """The mean of the checkpoints so far (one alone varies with the disk: a fit on it would
        jitter); 0 before the first, which is small."""
        count, seconds = self.saves
        return seconds / count if count else 0.0

    def row_cost(self) -> float:
        if self.eval_row_s is not None:
            return self.eval_row_s
        return EVAL_ROW_PRIOR * self.step_s() / self.cadence.batch_rows

    def valid_cost(self) -> float:
        if self.valid_s is not None:
            return self.valid_s
        return self.row_cost() * self.cadence.eval_rows + self.save_cost()

    def final_cost(self) -> float:
        return self.row_cost() * self.cadence.final_rows + self.save_cost()


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


def apply_fitted_steps(cfg, state) -> int:
    """A resumed budget run trains towards the max_steps last fitted (its learning rate goes
    on where it was) until its own fit; returns the configured max_steps, the fit's cap."""
    cap = cfg.train.max_steps
    if cfg.train.time_budget > 0 and state.budget_steps is not None:
        cfg.train.max_steps = min(cfg.train.max_steps, state.budget_steps)
    return cap
