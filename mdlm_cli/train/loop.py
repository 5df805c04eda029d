"""The training loop: one explicit loop, no framework.

Every random draw of a step (data order, diffusion times, masks, dropout) comes
from a stream seeded by (seed, step), so `--resume` reproduces the loss
trajectory of an uninterrupted run exactly on CPU. Under torchrun the same loop
runs data-parallel (`distributed.py`): each rank takes its share of the global
batch, and the draws of a micro-batch are seeded by its index in the global
batch, so the run does not depend on the number of ranks.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.markup import escape

from ..build import config_yaml
from ..checkpoints.folder import load_training_state, save_checkpoint
from ..config import Config
from ..data.dna import rc_augment
from ..data.order import DataOrder
from ..data.store import PreparedData, TokenSplit, prepare
from ..data.tokenizers import Tokenizer
from ..distributed import Dist, StopSignals, clip_grad_norm, session, set_gradient_sync, wait_for_file
from ..errors import MdlmError
from ..io.files import write_text_atomic
from ..models import build_model, check_data
from ..models.speed import compile_trunk, model_flops, model_width
from ..objectives import Objective, get_objective
from ..objectives.bound import BoundResult
from ..perf import device_peak
from ..runtime import Runtime, derive_seed, generator
from .log import Speed, Window, log_window, nats_text, progress_bar, record_eval
from .optim import EMA, lr_at
from .run_folder import ResumePoint, finished, locked, log_config_change, resume_point, truncate_metrics
from .state import TrainState


@dataclass
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
    already_done: bool = False  # --resume of a run already at max_steps: nothing was run or written
    char_level: bool = False  # tokens are characters: nats/char and bits/char
    mfu: float | None = None  # model FLOP utilisation of the steps (None: no known peak)


def _prepare_data(cfg: Config, console: Console, load_dataset=None, wait: bool = False) -> PreparedData:
    from ..data.store import prepared_folder

    folder, _, _ = prepared_folder(cfg.data)
    if wait:  # another process on this node (local rank 0) prepares it
        wait_for_file(folder / "meta.json")
    if (folder / "meta.json").is_file():
        return PreparedData(folder)
    console.print(f"[bold]Preparing data[/] {escape(cfg.data.dataset)} ({escape(cfg.data.tokenizer)}, "
                  f"{cfg.data.packing}, L={cfg.data.length}) ...")
    return prepare(cfg.data, load_dataset=load_dataset)


@dataclass
class Run:
    """What a training run holds while it runs (one per process)."""

    cfg: Config
    dist: Dist
    rt: Runtime
    console: Console
    data: PreparedData
    tokenizer: Tokenizer
    train_split: TokenSplit
    valid_split: TokenSplit
    objective: Objective
    model: torch.nn.Module  # the module whose weights are saved (FSDP2: sharded in place)
    net: torch.nn.Module  # what the loss calls: DDP / compiled wrappers around `model`
    ema: EMA | None
    optimizer: torch.optim.Optimizer
    state: TrainState
    accum: int  # micro-batches per rank per step
    mine: slice  # this rank's share of every global batch
    order: DataOrder
    denoiser: object  # the objective's callable around `net` (what the loss calls)
    speed: Speed  # what turns tokens/s into MFU
    losses: list[float] = field(default_factory=list)

    @property
    def run_dir(self) -> Path:
        return self.cfg.out_dir

    @property
    def eval_model(self) -> torch.nn.Module:
        return self.ema.model if self.ema is not None else self.model


def train(cfg: Config, *, resume: bool = False, console: Console | None = None,
          time_limit_s: float = 0.0, load_dataset=None, override_resume_config: bool = False) -> TrainResult:
    """Train as one process, or data-parallel over every rank when launched by torchrun.
    SIGTERM stops after the current step with a checkpoint (`TrainResult.stopped_by`).
    The run folder is locked for the duration (one trainer per run); `--resume` of a run
    trained with other data, model, objective, optimisation or batch settings is refused
    unless `override_resume_config`, and of a finished run changes nothing."""
    with session(cfg.train.device) as dist, locked(cfg.out_dir, dist), StopSignals(dist) as stop:
        console = console if console is not None and dist.is_main else Console(stderr=True, quiet=not dist.is_main)
        start = resume_point(cfg, dist, console, resume, override_resume_config)
        if finished(cfg, start):
            return _already_done(cfg, start)
        run = _set_up(cfg, dist, console, start, load_dataset=load_dataset)
        return _loop(run, stop, time_limit_s)


def _already_done(cfg: Config, start: ResumePoint) -> TrainResult:
    """A finished run's result, from its checkpoint alone: nothing is run or written."""
    from ..data.tokenizers import load_tokenizer

    state = start.state
    char_level = load_tokenizer(str(start.step_dir / "tokenizer")).is_character_level
    return TrainResult(cfg.out_dir, start.step_dir, state.step, state.tokens_seen,
                       state.train_seconds, 0.0, None, None, [], already_done=True,
                       char_level=char_level)


def _set_up(cfg: Config, dist: Dist, console: Console, start: ResumePoint, *, load_dataset) -> Run:
    """Data, objective, model, EMA, optimizer; the checkpoint to resume; the run folder."""
    # a resumed run keeps the CPU threads it chose (gradients can round differently with another count)
    threads = cfg.train.threads or (0 if os.environ.get("OMP_NUM_THREADS") else start.state.threads or 0)
    rt = Runtime.create(str(dist.device), cfg.train.precision, threads)
    check_data(cfg)  # the backbone's checks of the data config, before any data is prepared
    data = _prepare_data(cfg, console, load_dataset, wait=dist.local_rank != 0)
    tokenizer = data.tokenizer()
    train_split, valid_split = data.split("train"), data.split("valid")
    if len(train_split) == 0:
        raise MdlmError(f"the training split of {data.folder.name} is empty")
    tc = cfg.train
    accum = dist.accumulation_steps(tc.global_batch_size, tc.micro_batch_size)
    objective = get_objective(cfg, tokenizer)
    torch.manual_seed(tc.seed)
    model = build_model(cfg.model, tokenizer.vocab_size, causal=objective.causal)
    rt = rt.for_model(tc.precision, model_width(model))
    if cfg.data.rc_augment and tokenizer.complement is None:
        raise MdlmError(f"data.rc_augment needs a DNA tokenizer (data.tokenizer=dna); {tokenizer.name} has none")
    if tc.init_from and start.step_dir is None:  # a fresh run only; a resumed one has its own weights
        from .init_from import initialise_from

        console.print(f"Initialised from {initialise_from(model, tc.init_from, tokenizer)}")
    ema = EMA(model, tc.ema) if tc.ema > 0 else None
    net = dist.wrap(model, ema.model if ema else None, tc.parallel, rt.dtype)  # to the device; DDP / FSDP2
    if tc.compile and not compile_trunk(model):  # the DiT's trunk; other backbones whole
        net = torch.compile(net)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas,
                                  eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay,
                                  fused=(rt.device.type == "cuda") or None)
    state = _restore(model, ema, optimizer, console, start.step_dir)
    state.threads = torch.get_num_threads()
    run = Run(cfg, dist, rt, console, data, tokenizer, train_split, valid_split, objective, model, net, ema,
              optimizer, state, accum, dist.batch_shard(tc.global_batch_size), DataOrder(len(train_split), tc.seed),
              objective.denoiser(net, rt.dtype), _speed(cfg, model, rt, dist))
    if dist.is_main:
        run.run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(run.run_dir / "config.yaml", config_yaml(cfg))
        truncate_metrics(run.run_dir / "metrics.jsonl", run.state.step)
        if start.changes:  # allowed by --override-resume-config: on the record
            log_config_change(run.run_dir, run.state.step, start.changes, console)
    _describe(run)
    return run


def _speed(cfg: Config, model: torch.nn.Module, rt: Runtime, dist: Dist) -> Speed:
    """Model FLOPs per training token at the run's row length, and the device's peak at its
    precision (a CPU's matmul probe is timed once and cached: perf.py)."""
    peak = device_peak(rt.device, rt.dtype)
    return Speed(model_flops(model).per_token(cfg.data.length), peak, dist.world_size)


def _restore(model, ema: EMA | None, optimizer, console: Console, step_dir: Path | None) -> TrainState:
    """The training state: fresh, or the checkpoint's (weights restored in place)."""
    state = TrainState()
    if step_dir is not None:
        ema_model = ema.model if ema else None
        state = TrainState.from_dict(load_training_state(step_dir, model, ema_model, optimizer))
        if ema is not None:
            ema.updates = state.step
        console.print(f"Resumed from {step_dir} at step {state.step}", markup=False, highlight=False)
    return state


def _describe(run: Run) -> None:
    tc, dist, model = run.cfg.train, run.dist, run.model
    data = f"{escape(run.data.folder.name)} ({len(run.train_split)} train rows, {len(run.valid_split)} valid rows)"
    batch = (f"global batch {tc.global_batch_size} = {tc.micro_batch_size} x {run.accum} accumulation "
             f"x {dist.world_size} rank(s)")
    run.console.print(f"Model: {model.describe()}, {model.num_parameters() / 1e6:.1f}M parameters, "
                      f"objective {run.objective.name}; data: {data}; device: {run.rt.describe()}; "
                      f"{dist.describe(tc.parallel)}, {batch}; {run.speed.describe()}")
    for note in getattr(run.model, "notes", []):
        run.console.print(f"[yellow]note:[/] {note}", highlight=False)
    unigram = run.data.meta.get("unigram_valid_nats")
    if unigram is not None:
        run.console.print(f"Unigram baseline on valid: {nats_text(unigram, run.tokenizer.is_character_level)} "
                          f"(PPL {math.exp(unigram):.1f})")


def _step(run: Run, step: int) -> tuple[float, int, float]:
    """One optimisation step over the global batch: (this rank's loss share, tokens, lr).
    Gradients are left in place; `_update` applies them after the ranks agree."""
    cfg, tc, dist, device = run.cfg, run.cfg.train, run.dist, run.rt.device
    lr = lr_at(step, cfg)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    rows = run.order.rows(run.state.samples_seen, tc.global_batch_size)
    n_tokens = run.train_split.count(rows)
    t = None
    if run.objective.uses_time:  # stratified over the global batch, then this rank's share
        draw = run.objective.draw_times(cfg.diffusion.T, cfg.diffusion.antithetic)
        t = draw(tc.global_batch_size, generator(device, derive_seed(tc.seed, "step", step)))[run.mine]
    rows = rows[run.mine]
    loss_sum = 0.0
    for i in range(run.accum):
        sl = slice(i * tc.micro_batch_size, (i + 1) * tc.micro_batch_size)
        micro = dist.rank * run.accum + i  # index in the global batch: draws independent of world size
        gen = generator(device, derive_seed(tc.seed, "step", step, "micro", micro))
        torch.manual_seed(derive_seed(tc.seed, "dropout", step, micro))
        set_gradient_sync(run.net, i == run.accum - 1)
        x0, attention_mask, targets = run.train_split.batch_with_targets(rows[sl], device)
        if cfg.data.rc_augment:  # its own stream: the other draws are those of a run without it
            x0, attention_mask = rc_augment(x0, attention_mask, run.tokenizer.complement,
                                            generator(device, derive_seed(tc.seed, "rc", step, micro)))
        terms = run.objective.loss_terms(run.denoiser, x0, None if t is None else t[sl], generator=gen,
                                         attention_mask=attention_mask, targets=targets)
        loss = terms.sum() / n_tokens
        loss.backward()
        loss_sum += loss.item()
    return loss_sum, n_tokens, lr


def _update(run: Run, step: int, loss: float) -> float | None:
    """Clip, apply and clear the gradients, update the EMA; returns the gradient norm."""
    grad_clip = run.cfg.optim.grad_clip
    grad_norm = clip_grad_norm(run.model.parameters(), grad_clip) if grad_clip > 0 else None
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    if run.ema is not None:
        run.ema.update(run.model)
    if not math.isfinite(loss):
        raise MdlmError(f"the loss became {loss} at step {step}; lower optim.lr or check the data")
    return None if grad_norm is None else float(grad_norm)


def _evaluate(run: Run, rows: int) -> BoundResult:
    """The validation bound (exact NLL for exact objectives) with the EMA weights, rank-sharded."""
    tc = run.cfg.train
    run.eval_model.eval()
    result = run.objective.evaluate(run.objective.denoiser(run.eval_model, run.rt.dtype), run.valid_split,
                                    seeds=[derive_seed(tc.seed, "valid")], batch_size=2 * tc.micro_batch_size,
                                    device=run.rt.device, rows=rows, antithetic=run.cfg.diffusion.antithetic,
                                    rank=run.dist.rank, world_size=run.dist.world_size)[0]
    run.model.train()
    return result


def _checkpoint(run: Run, best: bool = False) -> Path:
    return save_checkpoint(run.run_dir, run.state.step, model=run.model,
                           ema_model=run.ema.model if run.ema else None, optimizer=run.optimizer, cfg=run.cfg,
                           state=run.state.to_dict(), tokenizer=run.tokenizer, data_meta=run.data.meta,
                           keep_last=run.cfg.train.keep_last, best=best)


def _loop(run: Run, stop: StopSignals, time_limit_s: float) -> TrainResult:
    """Steps until max_steps (or a signal, or the time limit), with periodic logging,
    validation and checkpoints; then the final validation and checkpoint."""
    tc, state = run.cfg.train, run.state
    metrics_path = run.run_dir / "metrics.jsonl" if run.dist.is_main else Path(os.devnull)  # files: rank 0 only
    window, progress = Window(), progress_bar(run)
    start_step, start_tokens, start_time = state.step, state.tokens_seen, time.perf_counter()
    base_seconds = state.train_seconds  # every checkpoint holds the run's time so far: a kill loses none
    step_seconds, preempted = 0.0, 0.0  # time in steps only; > 0 once any rank has received SIGTERM
    try:
        with progress, open(metrics_path, "a") as log:
            task = progress.add_task("train", total=tc.max_steps, completed=start_step, info="")
            run.model.train()
            while state.step < tc.max_steps:
                step, step_t0 = state.step, time.perf_counter()
                loss, n_tokens, lr = _step(run, step)
                out_of_time = time_limit_s > 0 and time.perf_counter() - start_time > time_limit_s
                # one reduction per step: the global loss, and whether any rank must stop
                loss, out_of_time, preempted = run.dist.all_sum(loss, out_of_time, stop.requested)
                grad_norm = _update(run, step, loss)
                run.losses.append(loss)
                step_seconds += time.perf_counter() - step_t0
                state.advance(tc.global_batch_size, n_tokens)
                window.add(loss, n_tokens)
                done = state.step
                if done % tc.log_every == 0 or done == tc.max_steps:
                    log_window(run, window, log, progress, task, lr=lr, grad_norm=grad_norm,
                         elapsed_s=base_seconds + time.perf_counter() - start_time)
                progress.update(task, completed=done)
                if preempted:
                    break
                state.train_seconds = base_seconds + time.perf_counter() - start_time
                if done % tc.eval_every == 0 and done < tc.max_steps and not out_of_time:
                    _checkpoint(run, best=record_eval(state, _evaluate(run, tc.eval_rows), done, log, run.console,
                                                       char_level=run.tokenizer.is_character_level))
                elif done % tc.save_every == 0:
                    _checkpoint(run)
                if out_of_time:
                    run.console.print(f"Time limit reached at step {done}")
                    break
    except KeyboardInterrupt:
        state.train_seconds = base_seconds + time.perf_counter() - start_time
        path = _checkpoint(run)
        raise MdlmError(f"interrupted at step {state.step}; checkpoint saved to {path}; "
                        "continue with --resume") from None
    train_seconds = time.perf_counter() - start_time
    state.train_seconds = base_seconds + train_seconds
    speed = (state.tokens_seen - start_tokens) / max(step_seconds, 1e-9)
    return _finish(run, stop, metrics_path, train_seconds, speed, preempted=bool(preempted))


def _finish(run: Run, stop: StopSignals, metrics_path: Path, train_seconds: float, speed: float, *,
            preempted: bool) -> TrainResult:
    """Preempted: save now, no final validation. Otherwise the final validation, then the last checkpoint."""
    state, unigram = run.state, run.data.meta.get("unigram_valid_nats")
    if preempted:
        path = _checkpoint(run)
        run.console.print(f"{stop.received or 'SIGTERM'} at step {state.step}: checkpoint saved to {path}",
                          markup=False, highlight=False)
        return TrainResult(run.run_dir, path, state.step, state.tokens_seen, train_seconds, speed, None,
                           unigram, run.losses, stopped_by=stop.received or "SIGTERM",
                           char_level=run.tokenizer.is_character_level, mfu=run.speed.mfu(speed))
    final = _evaluate(run, 0) if len(run.valid_split) else None
    best = False
    if final is not None:
        with open(metrics_path, "a") as log:
            best = record_eval(state, final, state.step, log, run.console, final=True,
                                char_level=run.tokenizer.is_character_level)
    state.final_step = state.step  # a --resume at max_steps finds nothing left to do
    return TrainResult(run.run_dir, _checkpoint(run, best=best), state.step, state.tokens_seen, train_seconds,
                       speed, final, unigram, run.losses, char_level=run.tokenizer.is_character_level,
                       mfu=run.speed.mfu(speed))
