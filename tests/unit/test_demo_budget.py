"""`make demo` stays within its time budget on any CPU: its schedule is fitted to
`train.time_budget` minutes by the run's own clock (train/budget.py; the command in
tests/integration/test_time_budget.py), at most 9 of the 15 minutes `make demo` may take, so
set-up, data, sampling and the infill fit in the rest. Counted in tokens: the cap on steps must
not end the demo early on the fastest CPU measured (2 Xeon cores with AMX, bf16 and compiled:
20,703 tokens/s for the 4x192 DiT, BENCHMARKS.md table 13), or the budget would not be what
decides. Its AR twin (`make demo-ar`) trains for the same minutes; the table `demo` trains the
four objectives on the same fixed tokens.

The fit itself is driven here by a fake clock, through the loop's own order of events (a step,
the fit, the pause after it): a run ends at its budget, final validation included, when its
steps slow down after the probe and when a validation takes a large share of the budget, and a
resumed run goes on fitting to what is left."""

import random
from pathlib import Path

import pytest

from mdlm_cli import recipes
from mdlm_cli.build import resolve_config
from mdlm_cli.cli import app  # noqa: F401  (registers the commands whose flags recipes check)
from mdlm_cli.commands.app import command_flags
from mdlm_cli.train.budget import (
    PROBE_STEPS,
    REFIT_EVERY,
    WARM_STEPS,
    BudgetFit,
    Cadence,
    Pause,
    apply_fitted_steps,
)
from mdlm_cli.train.state import TrainState

FASTEST_CPU_TOKENS_PER_S = 21_000  # above the measured 20,703
TRAINING_BUDGET_MIN = 9  # of `make demo`'s 15 minutes


def tokens(cfg, steps: int | None = None) -> int:
    return (steps or cfg.train.max_steps) * cfg.train.global_batch_size * cfg.data.length


def test_make_demo_trains_for_its_budget_and_the_cap_does_not_cut_it_short():
    cfg = resolve_config("demo")
    assert 0 < cfg.train.time_budget <= TRAINING_BUDGET_MIN
    cap_minutes = tokens(cfg) / FASTEST_CPU_TOKENS_PER_S / 60
    assert cap_minutes > cfg.train.time_budget, (
        f"the demo's cap of {cfg.train.max_steps} steps ends it after {cap_minutes:.1f} min on "
        f"the fastest CPU measured, before its {cfg.train.time_budget:g}-minute budget")


def test_the_ar_twin_trains_as_long_and_the_table_on_the_same_tokens():
    demo = resolve_config("demo")
    twin = resolve_config("demo-ar")
    assert (twin.train.time_budget, tokens(twin)) == (demo.train.time_budget, tokens(demo))
    models = recipes.load_recipe("demo", command_flags).models
    table_tokens = {name: tokens(resolve_config(m.preset, m.overrides), m.max_steps)
                    for name, m in models.items()}
    assert len(set(table_tokens.values())) == 1, table_tokens
    for name, m in models.items():
        cfg = resolve_config(m.preset, m.overrides)
        assert cfg.train.time_budget == 0, name  # fixed tokens: the objectives compare
        assert (cfg.model.hidden_size, cfg.model.n_blocks) == (
            demo.model.hidden_size, demo.model.n_blocks), name


def test_the_makefile_runs_what_the_budget_counts():
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    demo = makefile.split("\ndemo: ")[1].split("\n\n")[0]
    assert "train --preset demo " in demo and "--infill" in demo
    assert "train --preset demo-ar" not in demo  # the twin is `make demo-ar`, outside the budget
    assert "train --preset demo-ar " in makefile.split("\ndemo-ar: ")[1].split("\n\n")[0]


# ---------------------------------------------------------------- the fit, on a fake clock

# the demo's pauses: a validation of 256 rows and a checkpoint every 500 steps, a final
# validation of the 1,158 valid rows, 16 rows a step
DEMO = Cadence(eval_every=500, save_every=500, eval_rows=256, final_rows=1158, batch_rows=16)


class FakeRun:
    """The loop's order of events on a clock driven by hand: each step takes `step_s(step)`
    seconds, a validation `row_s` a row, a checkpoint `save_s`; the run starts at `step` with
    `spent` seconds of earlier sessions and trains towards `max_steps`."""

    def __init__(self, fit: BudgetFit, step_s, *, row_s=0.01, save_s=0.2, max_steps=None,
                 spent=0.0):
        self.fit, self.step_s, self.row_s, self.save_s = fit, step_s, row_s, save_s
        self.step, self.clock = fit.start_step, spent
        self.max_steps = fit.cap if max_steps is None else max_steps
        self.fitted: list[tuple[int, int]] = []  # (step, max_steps) of every fit

    def run(self) -> float:
        """Seconds of the whole run, the final validation and checkpoint included."""
        cadence = self.fit.cadence
        while self.step < self.max_steps:
            self.clock += self.step_s(self.step)
            self.step += 1
            self.fit.step_done(self.step, self.clock)
            steps = self.fit.refit(self.step, self.clock, self.max_steps)
            if steps is not None:
                self.max_steps = steps
                self.fitted.append((self.step, steps))
            kind = cadence.pause_after(self.step, self.max_steps)
            if kind is not None:
                eval_s = self.row_s * cadence.eval_rows if kind == "valid" else 0.0
                pause = Pause(kind, eval_s + self.save_s, eval_s=eval_s, save_s=self.save_s)
                self.clock += pause.seconds
                self.fit.paused(pause)
        return self.clock + self.row_s * cadence.final_rows + self.save_s


def steady(seconds: float, warm_s: float = 5.0):
    """A step time after a slow warm-up (allocations, compilation)."""
    return lambda step: warm_s if step < WARM_STEPS else seconds


def demo_fit(budget_min: float = 8, cadence: Cadence = DEMO, *, cap: int = 4000,
             start_step: int = 0) -> BudgetFit:
    return BudgetFit(budget_min * 60, cap, start_step, cadence)


def test_a_steady_run_ends_at_its_budget_with_its_final_validation():
    fake = FakeRun(demo_fit(), steady(0.3))
    seconds = fake.run()
    assert 0.98 * 480 <= seconds <= 480
    assert fake.fitted[0][0] == PROBE_STEPS
    # the final validation (1,158 rows) is in the budget: the steps stop short of 480 s
    assert fake.step < (480 - 5 * WARM_STEPS) / 0.3


def test_a_run_that_slows_after_the_probe_still_ends_at_its_budget():
    """The probe's steps 10-30 ran at about 0.2 s, the steady state at twice that: the fit of
    the probe alone would have run to 1.7x the budget."""
    def slowing(step):
        return 5.0 if step < WARM_STEPS else 0.2 + 0.2 * min(step / 300, 1.0)

    fake = FakeRun(demo_fit(), slowing)
    seconds = fake.run()
    assert 0.97 * 480 <= seconds <= 1.02 * 480
    probe_fit = fake.fitted[0][1]
    assert sum(slowing(s) for s in range(probe_fit)) > 1.6 * 480
    assert fake.step == fake.fitted[-1][1] < 0.6 * probe_fit


def test_a_validation_that_takes_a_quarter_of_the_budget_is_counted():
    """Validations of 30 s in a 2-minute budget, guessed at a fraction of that until one is
    measured: after the first (step 200), the fit leaves room for the final one, and ends the
    run at step 400, where a third would not fit (time is left, but not a validation's)."""
    cadence = Cadence(eval_every=200, save_every=200, eval_rows=256, final_rows=256, batch_rows=16)
    fake = FakeRun(demo_fit(2, cadence), steady(0.1, warm_s=0.5), row_s=30 / 256, save_s=0.1)
    seconds = fake.run()
    assert 120 - 30 < seconds <= 120
    assert fake.fitted[0][1] > 1000  # the probe's fit, with no validation measured yet
    assert fake.step == 400


@pytest.mark.parametrize("budget_min, step_s", [(2, 0.02), (3, 0.5), (8, 0.12), (8, 1.1)])
def test_the_demo_ends_within_its_budget_on_noisy_machines(budget_min, step_s):
    """Step times that wander by +-30% (a shared machine) and a 20% slow-down halfway."""
    rng = random.Random(budget_min * 1000 + int(step_s * 100))
    halfway = budget_min * 30 / step_s

    def noisy(step):
        slow = 1.2 if step > halfway else 1.0
        return 5.0 if step < WARM_STEPS else step_s * slow * rng.uniform(0.7, 1.3)

    seconds = FakeRun(demo_fit(budget_min), noisy, row_s=step_s / 16 / 3).run()
    assert 0.93 * budget_min * 60 <= seconds <= 1.02 * budget_min * 60


def test_fits_come_after_the_probe_then_every_few_steps_and_after_each_pause():
    cadence = Cadence(eval_every=10**6, save_every=70, eval_rows=64, final_rows=64, batch_rows=16)
    fake = FakeRun(demo_fit(60, cadence, start_step=100), steady(0.01))
    fake.run()
    saved = set(range(140, fake.step + 1, 70))
    due = {n for n in range(100 + PROBE_STEPS, fake.step)
           if (n - 100 - PROBE_STEPS) % REFIT_EVERY == 0 or n - 1 in saved}
    assert [s for s, _ in fake.fitted] == sorted(due)


def test_the_fit_is_capped_and_ends_a_spent_run_now():
    fake = FakeRun(demo_fit(60, cap=200), steady(0.01))
    fake.run()
    assert {n for _, n in fake.fitted} == {200} and fake.step == 200
    fit = demo_fit(1)
    for step in range(1, PROBE_STEPS + 1):
        fit.step_done(step, 30.0 + step)
    assert fit.refit(PROBE_STEPS, 61.0, 4000) == PROBE_STEPS  # over budget: end at this step
    assert fit.refit(PROBE_STEPS, 61.0, PROBE_STEPS) is None  # at its end: stays there
    assert BudgetFit(0.0, 9, 0, DEMO).refit(PROBE_STEPS, 1.0, 9) is None  # no budget


def test_a_resumed_run_keeps_its_schedule_until_its_probe_then_fits_what_is_left():
    cfg = resolve_config("demo")
    state = TrainState(step=300, train_seconds=200.0, budget_steps=1100)
    cap = apply_fitted_steps(cfg, state)
    assert (cap, cfg.train.max_steps) == (4000, 1100)  # the old schedule; the preset's cap
    fake = FakeRun(BudgetFit(480, cap, 300, DEMO), steady(0.3, warm_s=3.0),
                   max_steps=cfg.train.max_steps, spent=200.0)
    seconds = fake.run()
    assert fake.fitted[0][0] == 300 + PROBE_STEPS
    assert 0.98 * 480 <= seconds <= 480  # the earlier session's 200 s counted
    # a resumed run already past its budget ends at its probe's fit; one with fewer steps
    # left than the probe ends where it was fitted to
    spent = FakeRun(BudgetFit(480, cap, 300, DEMO), steady(0.3), max_steps=1100, spent=500.0)
    spent.run()
    assert spent.step == 300 + PROBE_STEPS
    short = FakeRun(BudgetFit(480, cap, 1090, DEMO), steady(0.3), max_steps=1100, spent=470.0)
    short.run()
    assert short.step == 1100 and short.fitted == []


def test_a_run_without_a_budget_keeps_its_max_steps_on_resume():
    cfg = resolve_config("demo", ["train.time_budget=0"])
    assert apply_fitted_steps(cfg, TrainState(step=10, budget_steps=50)) == 4000
    assert cfg.train.max_steps == 4000


def test_the_projection_counts_the_pauses_the_loop_takes():
    rng = random.Random(0)
    for _ in range(300):
        cadence = Cadence(rng.randint(1, 40), rng.randint(1, 40), 8, 8, 16)
        step = rng.randint(1, 200)
        end = step + rng.randint(0, 200)
        kinds = [cadence.pause_after(done, end) for done in range(step, end + 1)]
        assert cadence.pauses(step, end) == (kinds.count("valid"), kinds.count("save"))
