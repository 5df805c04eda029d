"""`train.time_budget` / `--time-budget`: the schedule fitted to minutes of training
(train/budget.py), kept by --resume, and its bad values refused."""

import json

from mdlm_cli.train.budget import PROBE_STEPS, WARM_STEPS, BudgetFit, fitted_steps

from .conftest import invoke, one_line_error

WARMUP = ["--set", f"optim.warmup_steps={PROBE_STEPS}", "--set", "optim.schedule=cosine"]


def test_the_fit_waits_for_the_probe_then_fits_once():
    fit = BudgetFit(budget_s=60.0, cap=10_000, start_step=100)
    assert fit.steps(100 + WARM_STEPS - 1, 5.0, 5.0) is None
    assert fit.steps(100 + WARM_STEPS, 6.0, 6.0) is None  # the warm-up ends at 6 s
    assert fit.steps(100 + PROBE_STEPS - 1, 7.9, 8.0) is None
    # 20 steps in 2 s: 10 steps/s, and 60 - 10 s left: 500 steps more
    assert fit.steps(100 + PROBE_STEPS, 8.0, 10.0) == 100 + PROBE_STEPS + 500
    assert fit.steps(100 + PROBE_STEPS + 1, 8.1, 10.1) is None  # once


def test_the_fit_is_capped_and_never_ends_the_run_at_once():
    assert fitted_steps(30, 10.0, 1e6, cap=640) == 640
    assert fitted_steps(30, 10.0, -5.0, cap=640) == 31  # over budget already: one more step
    assert BudgetFit(budget_s=0.0, cap=9, start_step=0).steps(PROBE_STEPS, 1.0, 1.0) is None


def test_a_budget_run_ends_where_it_fitted_and_resumes_at_nothing(train_args, tmp_path):
    out = tmp_path / "run"
    output = invoke(*train_args, *WARMUP, "--out", out, "--max-steps", "500",
                    "--time-budget", "0.02")
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    fitted = [r for r in records if "budget_steps" in r]
    assert len(fitted) == 1 and fitted[0]["step"] == PROBE_STEPS
    steps = fitted[0]["budget_steps"]
    assert PROBE_STEPS < steps <= 500 and f"{steps} steps" in output
    last = sorted((out / "checkpoints").iterdir())[-1]
    state = json.loads((last / "state.json").read_text())
    assert state["step"] == steps and state["budget_steps"] == steps
    again = invoke(*train_args, *WARMUP, "--out", out, "--max-steps", "500",
                   "--time-budget", "0.02", "--resume")
    assert "Already trained" in again and "--time-budget 0 --max-steps N" in again


def test_a_large_budget_is_capped_by_max_steps(train_args, tmp_path):
    out = tmp_path / "run"
    invoke(*train_args, *WARMUP, "--out", out, "--max-steps", str(PROBE_STEPS + 4),
           "--time-budget", "60")
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["budget_steps"] for r in records if "budget_steps" in r] == [PROBE_STEPS + 4]
    assert max(r["step"] for r in records) == PROBE_STEPS + 4


def test_bad_budgets_are_one_line_errors(train_args, tmp_path):
    out = tmp_path / "run"
    assert "time-budget" in one_line_error(*train_args, "--out", out, "--time-budget", "-1")
    error = one_line_error(*train_args, "--out", out, "--time-budget", "1",
                           "--set", "optim.schedule=cosine", "--set", "optim.warmup_steps=5")
    assert "optim.warmup_steps" in error
    assert not out.exists()  # refused before anything was written
