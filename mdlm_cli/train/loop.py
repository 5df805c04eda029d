"""The training loop: one explicit loop, no framework.

Every random draw of a step (data order, diffusion times, masks, dropout) comes
from a stream seeded by (seed, step), so `--resume` reproduces the loss
trajectory of an uninterrupted run exactly on CPU. Under torchrun the same loop
runs data-parallel (`distributed.py`): each rank takes its share of the global
batch, and the draws of a micro-batch are seeded by its index in the global
batch, so the run does not depend on the number of ranks.
"""

from __future__ import annotations

import gc
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from ..checkpoints.save import CheckpointContents, save_checkpoint
from ..config import Config
from ..distributed import StopSignals, barrier, session
from ..errors import MdlmError
from ..objectives.bound import BoundResult, SplitSweep
from ..runtime import derive_seed
from .budget import WARM_STEPS, BudgetFit, Cadence, Pause, apply_fitted_steps, check_time_budget
from .log import Window, log_window, progress_bar, record_eval
from .optim import EMA, AdapterEMA
from .run_folder import ResumePoint, finished, locked, resume_point
from .setup import Run, set_up
from .state import TrainState
from .step import apply_update, gradient_step


@dataclass(kw_only=True)  # built by keyword, in one place (_result)
class TrainResult:
    run_dir: Path
    checkpoint: Path
    step: int
    tokens_seen: int
    train_seconds: float
    tokens_per_second: float
    final_valid: BoundResult | None
    unigram_nats: float | None
    losses: list[float]
    stopped_by: str | None = None  # the signal that stopped the run early (checkpoint saved)
    # --resume of a run already at max_steps: nothing was run or written
    already_done: bool = False
    char_level: bool = False  # tokens are characters: nats/char and bits/char
    mfu: float | None = None  # model FLOP utilisation of the steps (None: no known peak)
    fitted: bool = False  # max_steps was fitted to train.time_budget


def train(cfg: Config, *, resume: bool = False, console: Console | None = None,
          time_limit_s: float = 0.0, load_dataset=None,
          override_resume_config: bool = False) -> TrainResult:
    """Train as one process, or data-parallel over every rank when launched by torchrun.
    SIGTERM stops after the current step with a checkpoint (`TrainResult.stopped_by`).
    The run folder is locked for the duration (one trainer per run); `--resume` of a run
    trained with other data, model, objective, optimisation or batch settings is refused
    unless `override_resume_config`, and of a finished run changes nothing."""
    check_time_budget(cfg)
    with session(cfg.train.device) as dist, locked(cfg.out_dir, dist), StopSignals(dist) as stop:
        if console is None or not dist.is_main:
            console = Console(stderr=True, quiet=not dist.is_main)
        start = resume_point(cfg, dist, console, resume, override_resume_config)
        cap = apply_fitted_steps(cfg, start.state)
        if finished(cfg, start):
            return _already_done(cfg, start)
        run = set_up(cfg, dist, console, start, load_dataset=load_dataset)
        result = _loop(run, stop, time_limit_s, cap)
        _release(run)
        return result


def _release(run: Run) -> None:
    """Free the data-parallel model before the process group goes. gloo's worker threads free
    each finished all-reduce (tensors of Python objects: they need the GIL) after it ran; a
    process group's destructor, run by a dealloc that holds the GIL, joins those threads, so a
    thread still freeing one deadlocks the exit (seen once in a 2-rank test). A barrier and a
    short sleep, neither holding the GIL, let them finish first."""
    if run.dist.world_size == 1:
        return
    barrier()
    run.net = run.model = run.ema = run.optimizer = None
    gc.collect()
    time.sleep(0.05)


def _already_done(cfg: Config, start: ResumePoint) -> TrainResult:
    """A finished run's result, from its checkpoint alone: nothing is run or written."""
    from ..data.tokenizers import load_tokenizer

    state = start.state
    char_level = load_tokenizer(str(start.step_dir / "tokenizer")).is_character_level
    return _result(state, cfg.out_dir, start.step_dir, train_seconds=state.train_seconds,
                   tokens_per_second=0.0, final_valid=None, unigram_nats=None, losses=[],
                   already_done=True, char_level=char_level,
                   fitted=cfg.train.time_budget > 0 and state.budget_steps is not None)


def _result(state: TrainState, run_dir: Path, checkpoint: Path, **fields) -> TrainResult:
    """The one place a `TrainResult` is built: the step and tokens from the state, the rest by
    name."""
    return TrainResult(run_dir=run_dir, checkpoint=checkpoint, step=state.step,
                       tokens_seen=state.tokens_seen, **fields)


def _evaluate(run: Run, rows: int) -> BoundResult:
    """The validation bound (exact NLL for exact objectives) with the EMA weights,
    rank-sharded."""
    tc = run.cfg.train
    with run.evaluation_weights() as model:
        return run.objective.evaluate(
            run.objective.denoiser(model, run.rt.dtype),
            run.valid_split,
            SplitSweep(2 * tc.micro_batch_size, run.rt.device, rows=rows, rank=run.dist.rank,
                       world_size=run.dist.world_size),
            seeds=[derive_seed(tc.seed, "valid")],
            antithetic=run.cfg.diffusion.antithetic,
        )[0]


def _checkpoint(run: Run, best: bool = False) -> Path:
    contents = CheckpointContents(
        model=run.model, cfg=run.cfg, state=run.state.to_dict(), tokenizer=run.tokenizer,
        data_meta=run.data.meta, ema_model=run.ema.model if isinstance(run.ema, EMA) else None,
        optimizer=run.optimizer,
        ema_adapter=run.ema.shadow if isinstance(run.ema, AdapterEMA) else None)
    return save_checkpoint(run.run_dir, run.state.step, contents,
                           keep_last=run.cfg.train.keep_last, best=best)


@dataclass
class _Clock:
    """The run's time: this session's since `start`, the part spent in steps, and the seconds
    of earlier sessions (every checkpoint holds the run's time so far: a kill loses none)."""

    base_seconds: float
    start: float = field(default_factory=time.perf_counter)
    in_steps: float = 0.0

    def elapsed(self) -> float:
        """Seconds of this session."""
        return time.perf_counter() - self.start

    def total(self) -> float:
        """Seconds of the whole run."""
        return self.base_seconds + self.elapsed()


def _loop(run: Run, stop: StopSignals, time_limit_s: float, cap: int) -> TrainResult:
    """Steps until max_steps (or a signal, or the time limit), with periodic logging,
    validation and checkpoints; then the final validation and checkpoint. `cap`: the
    configured max_steps, which a time budget's fits never exceed."""
    tc, state = run.cfg.train, run.state
    # files: rank 0 only
    metrics_path = run.run_dir / "metrics.jsonl" if run.dist.is_main else Path(os.devnull)
    window, progress = Window(), progress_bar(run)
    start_step, start_tokens = state.step, state.tokens_seen
    clock = _Clock(state.train_seconds)
    fit = BudgetFit(tc.time_budget * 60, cap, start_step, _cadence(run))
    preempted = 0.0  # > 0 once any rank has received SIGTERM
    try:
        with progress, open(metrics_path, "a") as log:
            task = progress.add_task("train", total=tc.max_steps, completed=start_step, info="")
            run.model.train()
            while state.step < tc.max_steps:
                out_of_time, preempted = _advance(run, stop, clock, time_limit_s,
                                                  window=window, log=log, progress=progress,
                                                  task=task)
                if preempted:
                    break
                state.train_seconds = clock.total()
                fit.step_done(state.step, clock.total())
                _fit_budget(run, fit, clock, log, lambda n: progress.update(task, total=n))
                pause = _validate_or_save(run, log, out_of_time, fit.cadence)
                if pause is not None:
                    fit.paused(pause)
                if out_of_time:
                    run.console.print(f"Time limit reached at step {state.step}")
                    break
    except KeyboardInterrupt:
        state.train_seconds = clock.total()
        path = _checkpoint(run)
        raise MdlmError(f"interrupted at step {state.step}; checkpoint saved to {path}; "
                        "continue with --resume") from None
    train_seconds = clock.elapsed()
    state.train_seconds = clock.base_seconds + train_seconds
    speed = (state.tokens_seen - start_tokens) / max(clock.in_steps, 1e-9)
    return _finish(run, stop, metrics_path, train_seconds, speed, preempted=bool(preempted))


def _advance(run: Run, stop: StopSignals, clock: _Clock, time_limit_s: float, *,
             window: Window, log, progress, task) -> tuple[bool, float]:
    """One step, applied once the ranks agree, and its log line: (out of time, preempted),
    the same on every rank."""
    tc, state = run.cfg.train, run.state
    step, step_t0 = state.step, time.perf_counter()
    loss, n_tokens, lr = gradient_step(run, step)
    out_of_time = time_limit_s > 0 and clock.elapsed() > time_limit_s
    # one reduction per step: the global loss, and whether any rank must stop
    loss, out_of_time, preempted = run.dist.all_sum(loss, out_of_time, stop.requested)
    grad_norm = apply_update(run, step, loss)
    run.losses.append(loss)
    clock.in_steps += time.perf_counter() - step_t0
    state.advance(tc.global_batch_size, n_tokens)
    window.add(loss, n_tokens)
    done = state.step
    if done % tc.log_every == 0 or done == tc.max_steps:
        log_window(run, window, log, progress, task, lr=lr, grad_norm=grad_norm,
                   elapsed_s=clock.total())
    progress.update(task, completed=done)
    return out_of_time, preempted


def _cadence(run: Run) -> Cadence:
    """The pauses of the run and the rows its validations read, for the budget's projection."""
    tc, valid_rows = run.cfg.train, len(run.valid_split)
    eval_rows = min(tc.eval_rows, valid_rows) if tc.eval_rows > 0 else valid_rows
    return Cadence(tc.eval_every, tc.save_every, eval_rows, valid_rows, tc.global_batch_size)


def _fit_budget(run: Run, fit: BudgetFit, clock: _Clock, log, set_total) -> None:
    """When a fit is due (after the probe, then every few steps and after each pause):
    max_steps becomes what the rest of train.time_budget holds (the ranks agree on their mean,
    so all stop at the same step), on the record in metrics.jsonl and the run's state."""
    tc, step, old = run.cfg.train, run.state.step, run.cfg.train.max_steps
    steps = fit.refit(step, clock.total(), old)
    if steps is None:
        return
    steps = math.floor(run.dist.all_sum(steps)[0] / run.dist.world_size)
    tc.max_steps = run.state.budget_steps = steps
    set_total(steps)
    log.write(json.dumps({"step": step, "time_budget_min": tc.time_budget, "budget_steps": steps,
                          "spent_s": clock.total(), "step_s": fit.step_s(),
                          "final_s": fit.final_cost()}) + "\n")
    if fit.fits == 1:
        probe = f"{fit.start_step + WARM_STEPS}-{step}"
        run.console.print(f"Time budget {tc.time_budget:g} min: {steps} steps at the speed of "
                          f"steps {probe} (cap {fit.cap}; re-fitted as the run goes)",
                          highlight=False)
    elif abs(steps - old) > 0.05 * old:  # the small moves are in metrics.jsonl only
        run.console.print(f"Time budget: {steps} steps, re-fitted at step {step} "
                          f"({fit.step_s():.3f} s/step, {clock.total() / 60:.1f} min spent)",
                          highlight=False)


def _validate_or_save(run: Run, log, out_of_time: bool, cadence: Cadence) -> Pause | None:
    """The periodic validation (with a checkpoint that records whether it is the best so far),
    else the periodic checkpoint, after the step just done: what it took (the budget counts
    it)."""
    tc, done, t0 = run.cfg.train, run.state.step, time.perf_counter()
    kind = cadence.pause_after(done, tc.max_steps)
    if kind == "valid" and out_of_time:  # the run stops here: the final validation follows
        kind = "save" if done % tc.save_every == 0 else None
    if kind == "valid":
        result = _evaluate(run, tc.eval_rows)
        eval_s = time.perf_counter() - t0
        best = record_eval(run.state, result, done, log, run.console,
                           char_level=run.tokenizer.is_character_level, ema=run.ema is not None)
        _after_validation(run, log)
        t1 = time.perf_counter()
        _checkpoint(run, best=best)
        end = time.perf_counter()
        return Pause("valid", end - t0, eval_s=eval_s, save_s=end - t1)
    if kind == "save":
        _checkpoint(run)
        seconds = time.perf_counter() - t0
        return Pause("save", seconds, save_s=seconds)
    return None


def _after_validation(run: Run, log) -> None:
    """The objective's own use of the validation split (bd3lm's clipped-schedule search), with
    the evaluation weights, the same on every rank: its record in metrics.jsonl, its state in
    the checkpoint's state.json."""
    tc = run.cfg.train
    with run.evaluation_weights() as model:
        record = run.objective.after_validation(
            run.objective.denoiser(model, run.rt.dtype), run.valid_split,
            batch_size=2 * tc.micro_batch_size, device=run.rt.device,
            seed=derive_seed(tc.seed, "after-validation", run.state.step), rows=tc.eval_rows)
    if record is None:
        return
    run.state.objective_state = run.objective.training_state()
    log.write(json.dumps({"step": run.state.step, **record}) + "\n")
    run.console.print(f"{run.objective.name}: {json.dumps(run.state.objective_state)}",
                      markup=False, highlight=False)


def _finish(run: Run, stop: StopSignals, metrics_path: Path, train_seconds: float,
            speed: float, *, preempted: bool) -> TrainResult:
    """Preempted: save now, no final validation. Otherwise the final validation, then the last
    checkpoint."""
    state, unigram = run.state, run.data.meta.get("unigram_valid_nats")
    char_level = run.tokenizer.is_character_level
    if preempted:
        path = _checkpoint(run)
        signal_name = stop.received or "SIGTERM"
        run.console.print(f"{signal_name} at step {state.step}: checkpoint saved to {path}",
                          markup=False, highlight=False)
        return _result(state, run.run_dir, path, train_seconds=train_seconds,
                       tokens_per_second=speed, final_valid=None, unigram_nats=unigram,
                       losses=run.losses, stopped_by=signal_name, char_level=char_level,
                       mfu=run.speed.mfu(speed))
    final = _evaluate(run, 0) if len(run.valid_split) else None
    best = False
    if final is not None:
        with open(metrics_path, "a") as log:
            best = record_eval(state, final, state.step, log, run.console, final=True,
                               char_level=char_level, ema=run.ema is not None)
    state.final_step = state.step  # a --resume at max_steps finds nothing left to do
    checkpoint = _checkpoint(run, best=best)
    return _result(state, run.run_dir, checkpoint, train_seconds=train_seconds,
                   tokens_per_second=speed, final_valid=final, unigram_nats=unigram,
                   losses=run.losses, char_level=char_level, mfu=run.speed.mfu(speed))
