"""`train.time_budget` / `--time-budget`: the schedule fitted to minutes of training
(train/budget.py; the fit itself on a fake clock in tests/unit/test_demo_budget.py), re-fitted
as the run goes, kept by --resume, the same on every rank, and its bad values refused."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mdlm_cli.train.budget import PROBE_STEPS

from .conftest import invoke, one_line_error

WARMUP = ["--set", f"optim.warmup_steps={PROBE_STEPS}", "--set", "optim.schedule=cosine"]


def fits(out) -> list[dict]:
    return [r for r in map(json.loads, open(out / "metrics.jsonl")) if "budget_steps" in r]


def last_state(out) -> dict:
    return json.loads((sorted((out / "checkpoints").iterdir())[-1] / "state.json").read_text())


def test_a_budget_run_ends_where_it_last_fitted_and_resumes_at_nothing(train_args, tmp_path):
    out = tmp_path / "run"
    output = invoke(*train_args, *WARMUP, "--out", out, "--max-steps", "500",
                    "--time-budget", "0.02")
    fitted = fits(out)
    assert fitted[0]["step"] == PROBE_STEPS and f"{fitted[0]['budget_steps']} steps" in output
    assert len(fitted) > 1  # a checkpoint every 2 steps: a fit after each
    assert all(r["spent_s"] > 0 and r["step_s"] > 0 and r["final_s"] > 0 for r in fitted)
    steps = fitted[-1]["budget_steps"]
    state = last_state(out)
    assert PROBE_STEPS <= steps <= 500 and state["step"] == state["budget_steps"] == steps
    again = invoke(*train_args, *WARMUP, "--out", out, "--max-steps", "500",
                   "--time-budget", "0.02", "--resume")
    assert "Already trained" in again and "--time-budget 0 --max-steps N" in again


def test_a_resumed_budget_run_goes_on_fitting_to_what_is_left(train_args, tmp_path):
    """Stopped by --time-limit, then resumed: the schedule of the last fit until the resumed
    process's own probe, then fits to the rest of the budget; both sessions' time counts."""
    out = tmp_path / "run"
    args = [*train_args, *WARMUP, "--out", out, "--max-steps", "5000", "--time-budget", "0.1"]
    invoke(*args, "--time-limit", "0.01")
    stopped = last_state(out)
    invoke(*args, "--resume")
    fitted, state = fits(out), last_state(out)
    later = [r for r in fitted if r["step"] > stopped["step"]]
    assert state["step"] == state["budget_steps"] == fitted[-1]["budget_steps"] > stopped["step"]
    assert state["train_seconds"] > stopped["train_seconds"]
    if later:  # (none if the first session left fewer steps than a probe)
        assert later[0]["step"] == stopped["step"] + PROBE_STEPS
        assert later[0]["spent_s"] > stopped["train_seconds"]


def test_a_large_budget_is_capped_by_max_steps(train_args, tmp_path):
    out = tmp_path / "run"
    invoke(*train_args, *WARMUP, "--out", out, "--max-steps", str(PROBE_STEPS + 4),
           "--time-budget", "60")
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert {r["budget_steps"] for r in records if "budget_steps" in r} == {PROBE_STEPS + 4}
    assert max(r["step"] for r in records) == PROBE_STEPS + 4


def test_bad_budgets_are_one_line_errors(train_args, tmp_path):
    out = tmp_path / "run"
    assert "time-budget" in one_line_error(*train_args, "--out", out, "--time-budget", "-1")
    error = one_line_error(*train_args, "--out", out, "--time-budget", "1",
                           "--set", "optim.schedule=cosine", "--set", "optim.warmup_steps=5")
    assert "optim.warmup_steps" in error
    assert not out.exists()  # refused before anything was written


@pytest.mark.slow
def test_two_ranks_fit_the_same_steps_and_stop_together(train_args, tmp_path):
    """torchrun, 2 CPU processes (gloo): each rank fits from its own clock and they take the
    mean, so both stop at the same step (else one would wait in a collective for ever)."""
    import torch.distributed as tdist

    if not tdist.is_available() or not tdist.is_gloo_available():
        pytest.skip("this torch build has no torch.distributed / gloo")
    out = tmp_path / "run"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           "-m", "mdlm_cli", *train_args, *WARMUP, "--out", str(out), "--max-steps", "2000",
           "--time-budget", "0.1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fitted, state = fits(out), last_state(out)
    assert len(fitted) > 1 and state["step"] == state["budget_steps"] == fitted[-1]["budget_steps"]
