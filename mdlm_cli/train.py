"""The training loop: one explicit loop, no framework.

Every random draw of a step (data order, diffusion times, masks, dropout) comes
from a stream seeded by (seed, step), so `--resume` reproduces the loss
trajectory of an uninterrupted run exactly on CPU. Under torchrun the same loop
runs data-parallel (`distributed.py`): each rank takes its share of the global
batch, and the draws of a micro-batch are seeded by its index in the global
batch, so the run does not depend on the number of ranks.
"""

from __future__ import annotations

import copy
import json
import math
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from . import ar
from .checkpoint import load_training_state, resolve_checkpoint, save_checkpoint
from .config import Config
from .data.store import PreparedData, prepare
from .distributed import Dist, StopSignals, clip_grad_norm, session, set_gradient_sync, wait_for_file
from .engine.diffusion import nelbo_terms, sample_times, times_from_uniform
from .engine.schedules import get_schedule
from .errors import MdlmError
from .evaluation import BoundResult, nelbo_bound
from .models import DiffusionDenoiser, DiT, DiTConfig
from .runtime import Runtime, derive_seed, generator


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


def lr_at(step: int, cfg: Config) -> float:
    """Linear warmup, then constant or cosine decay to min_lr_ratio * lr."""
    o = cfg.optim
    if o.warmup_steps and step < o.warmup_steps:
        return o.lr * (step + 1) / o.warmup_steps
    if o.schedule == "cosine":
        span = max(cfg.train.max_steps - o.warmup_steps, 1)
        progress = min((step - o.warmup_steps) / span, 1.0)
        return o.lr * (o.min_lr_ratio + (1 - o.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
    return o.lr


class DataOrder:
    """Stateless epoch-shuffled order: global sample i is row perm_{i // N}[i % N].

    The position in the stream is just the number of samples consumed, so a run
    resumed from a checkpoint (with any number of ranks) neither repeats nor skips data.
    """

    def __init__(self, num_rows: int, seed: int):
        self.num_rows, self.seed = num_rows, seed
        self._perm = lru_cache(maxsize=2)(self._permutation)

    def _permutation(self, epoch: int) -> np.ndarray:
        g = torch.Generator().manual_seed(derive_seed(self.seed, "epoch", epoch))
        return torch.randperm(self.num_rows, generator=g).numpy()

    def rows(self, start: int, count: int) -> np.ndarray:
        idx = np.arange(start, start + count)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(idx // self.num_rows):
            sel = idx // self.num_rows == epoch
            out[sel] = self._perm(int(epoch))[idx[sel] % self.num_rows]
        return out


class EMA:
    """Exponential moving average of the weights, with the reference's warmup
    decay min(decay, (1 + n) / (10 + n))."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.updates = 0

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        ema_params = list(self.model.parameters())
        params = [p.detach() for p in model.parameters()]
        torch._foreach_lerp_(ema_params, params, 1.0 - decay)


def build_model(cfg: Config, vocab_size: int) -> DiT:
    m = cfg.model
    return DiT(DiTConfig(vocab_size=vocab_size, hidden_size=m.hidden_size, n_blocks=m.n_blocks,
                         n_heads=m.n_heads, cond_dim=m.cond_dim, dropout=m.dropout,
                         causal=cfg.diffusion.objective == "ar"))


def _prepare_data(cfg: Config, console: Console, load_dataset=None, wait: bool = False) -> PreparedData:
    from .data.store import prepared_folder

    folder, _, _ = prepared_folder(cfg.data)
    if wait:  # another process on this node (local rank 0) prepares it
        wait_for_file(folder / "meta.json")
    if (folder / "meta.json").is_file():
        return PreparedData(folder)
    console.print(f"[bold]Preparing data[/] {cfg.data.dataset} ({cfg.data.tokenizer}, "
                  f"{cfg.data.packing}, L={cfg.data.length}) ...")
    return prepare(cfg.data, load_dataset=load_dataset)


def train(cfg: Config, *, resume: bool = False, console: Console | None = None,
          time_limit_s: float = 0.0, load_dataset=None) -> TrainResult:
    """Train as one process, or data-parallel over every rank when launched by torchrun.
    SIGTERM stops after the current step with a checkpoint (`TrainResult.stopped_by`)."""
    with session(cfg.train.device) as dist, StopSignals(dist) as stop:
        return _train(cfg, dist, stop, resume=resume, console=console, time_limit_s=time_limit_s,
                      load_dataset=load_dataset)


def _train(cfg: Config, dist: Dist, stop: StopSignals, *, resume: bool,
           console: Console | None, time_limit_s: float, load_dataset) -> TrainResult:
    console = console if console is not None and dist.is_main else Console(stderr=True, quiet=not dist.is_main)
    rt = Runtime.create(str(dist.device), cfg.train.precision, cfg.train.threads)
    data = _prepare_data(cfg, console, load_dataset, wait=dist.local_rank != 0)
    tokenizer = data.tokenizer()
    train_split, valid_split = data.split("train"), data.split("valid")
    if len(train_split) == 0:
        raise MdlmError(f"the training split of {data.folder.name} is empty")
    tc = cfg.train
    accum = dist.accumulation_steps(tc.global_batch_size, tc.micro_batch_size)
    mine = dist.batch_shard(tc.global_batch_size)  # this rank's share of every global batch
    schedule = get_schedule(cfg.diffusion.schedule, cfg.diffusion.eps)
    mask_id = tokenizer.mask_id

    run_dir = cfg.out_dir
    torch.manual_seed(tc.seed)
    model = build_model(cfg, tokenizer.vocab_size)
    ema = EMA(model, tc.ema) if tc.ema > 0 else None
    net = dist.wrap(model, ema.model if ema else None, tc.parallel, rt.dtype)  # to the device; DDP / FSDP2
    net = torch.compile(net) if tc.compile else net
    fused = rt.device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas,
                                  eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay,
                                  fused=fused or None)
    state = {"step": 0, "samples_seen": 0, "tokens_seen": 0, "best_valid_nats": None,
             "train_seconds": 0.0}
    has_checkpoint = (run_dir / "latest").is_file()
    if resume and has_checkpoint:
        step_dir = resolve_checkpoint(run_dir)
        state = load_training_state(step_dir, model, ema.model if ema else None, optimizer)
        if ema is not None:
            ema.updates = state["step"]
        console.print(f"Resumed from {step_dir} at step {state['step']}")
    elif not resume and (run_dir / "checkpoints").exists() and any((run_dir / "checkpoints").glob("step-*")):
        raise MdlmError(f"{run_dir} already holds checkpoints; continue it with --resume, or "
                        "choose another --out")
    metrics_path = run_dir / "metrics.jsonl" if dist.is_main else Path(os.devnull)  # files: rank 0 only
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(cfg.to_yaml())
        _truncate_metrics(metrics_path, state["step"])

    denoiser = DiffusionDenoiser(net, schedule, time_conditioning=cfg.model.time_conditioning,
                                 autocast_dtype=rt.dtype)
    eval_denoiser = DiffusionDenoiser(ema.model if ema else model, schedule,
                                      time_conditioning=cfg.model.time_conditioning,
                                      autocast_dtype=rt.dtype)
    order = DataOrder(len(train_split), tc.seed)
    unigram = data.meta.get("unigram_valid_nats")
    n_params = model.num_parameters()
    console.print(f"Model: DiT {cfg.model.n_blocks}x{cfg.model.hidden_size}, {n_params / 1e6:.1f}M "
                  f"parameters; data: {data.folder.name} ({len(train_split)} train rows, "
                  f"{len(valid_split)} valid rows); device: {rt.describe()}; {dist.describe(tc.parallel)}, "
                  f"global batch {tc.global_batch_size} = {tc.micro_batch_size} x {accum} accumulation x "
                  f"{dist.world_size} rank(s)")
    if unigram is not None:
        console.print(f"Unigram baseline on valid: {unigram:.3f} nats/token (PPL {math.exp(unigram):.1f})")

    def evaluate(rows: int) -> BoundResult:
        (ema.model if ema else model).eval()
        if cfg.diffusion.objective == "ar":  # exact likelihood, not a bound
            return ar.exact_nll(ema.model if ema else model, valid_split, bos_id=tokenizer.bos_id,
                                mask_id=mask_id, batch_size=tc.micro_batch_size, device=rt.device,
                                rows=rows, autocast_dtype=rt.dtype)
        return nelbo_bound(eval_denoiser, valid_split, schedule=schedule, mask_id=mask_id,
                           batch_size=2 * tc.micro_batch_size, device=rt.device,
                           seed=derive_seed(tc.seed, "valid"), rows=rows, T=cfg.diffusion.T,
                           antithetic=cfg.diffusion.antithetic, rank=dist.rank, world_size=dist.world_size)

    def checkpoint(best: bool = False) -> Path:
        return save_checkpoint(run_dir, state["step"], model=model, ema_model=ema.model if ema else None,
                               optimizer=optimizer, cfg=cfg, state=state, tokenizer=tokenizer,
                               data_meta=data.meta, keep_last=tc.keep_last, best=best)

    losses: list[float] = []
    window = {"loss": 0.0, "tokens": 0, "t0": time.perf_counter(), "steps": 0}
    start_step, start_tokens, start_time = state["step"], state["tokens_seen"], time.perf_counter()
    step_seconds = 0.0  # time in training steps only (no evaluation, no checkpointing)
    preempted = 0.0  # > 0 once any rank has received SIGTERM (agreed on by all ranks each step)
    progress = Progress(TextColumn("[bold]train"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                        console=console, transient=True, disable=not (console.is_terminal and dist.is_main))
    try:
        with progress, open(metrics_path, "a") as log:
            task = progress.add_task("train", total=tc.max_steps, completed=start_step, info="")
            model.train()
            while state["step"] < tc.max_steps:
                step = state["step"]
                step_t0 = time.perf_counter()
                lr = lr_at(step, cfg)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                rows = order.rows(state["samples_seen"], tc.global_batch_size)
                n_tokens = int(train_split.lengths[rows].sum())
                gen = generator(rt.device, derive_seed(tc.seed, "step", step))
                u = sample_times(tc.global_batch_size, generator=gen,
                                 antithetic=cfg.diffusion.antithetic, device=rt.device)
                t = times_from_uniform(u, schedule, cfg.diffusion.T)  # stratified over the global batch
                rows, t = rows[mine], t[mine]
                loss_sum = 0.0
                for i in range(accum):
                    sl = slice(i * tc.micro_batch_size, (i + 1) * tc.micro_batch_size)
                    micro = dist.rank * accum + i  # index in the global batch: draws independent of world size
                    gen = generator(rt.device, derive_seed(tc.seed, "step", step, "micro", micro))
                    torch.manual_seed(derive_seed(tc.seed, "dropout", step, micro))
                    set_gradient_sync(net, i == accum - 1)
                    x0, attention_mask = train_split.batch(rows[sl], rt.device)
                    if cfg.diffusion.objective == "ar":
                        terms = ar.sequence_nll(net, x0, bos_id=tokenizer.bos_id, mask_id=mask_id,
                                                attention_mask=attention_mask, autocast_dtype=rt.dtype)
                    else:
                        terms = nelbo_terms(denoiser, x0, t[sl], mask_id=mask_id, schedule=schedule,
                                            generator=gen, attention_mask=attention_mask,
                                            T=cfg.diffusion.T)
                    loss = terms.sum() / n_tokens
                    loss.backward()
                    loss_sum += loss.item()
                out_of_time = time_limit_s > 0 and time.perf_counter() - start_time > time_limit_s
                # one reduction per step: the global loss, and whether any rank must stop
                loss_sum, out_of_time, preempted = dist.all_sum(loss_sum, out_of_time, stop.requested)
                grad_norm = (clip_grad_norm(model.parameters(), cfg.optim.grad_clip)
                             if cfg.optim.grad_clip > 0 else None)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if ema is not None:
                    ema.update(model)
                if not math.isfinite(loss_sum):
                    raise MdlmError(f"the loss became {loss_sum} at step {step}; lower optim.lr or "
                                    "check the data")
                losses.append(loss_sum)
                step_seconds += time.perf_counter() - step_t0
                state["step"] += 1
                state["samples_seen"] += tc.global_batch_size
                state["tokens_seen"] += n_tokens
                window["loss"] += loss_sum
                window["tokens"] += n_tokens
                window["steps"] += 1

                done = state["step"]
                if done % tc.log_every == 0 or done == tc.max_steps:
                    elapsed = time.perf_counter() - window["t0"]
                    mean_loss = window["loss"] / window["steps"]
                    record = {"step": done, "loss": mean_loss, "ppl_bound": math.exp(min(mean_loss, 700)),
                              "lr": lr, "tokens": state["tokens_seen"],
                              "tokens_per_s": window["tokens"] / max(elapsed, 1e-9),
                              "grad_norm": None if grad_norm is None else float(grad_norm),
                              "elapsed_s": state["train_seconds"] + time.perf_counter() - start_time}
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                    progress.update(task, info=f"loss {mean_loss:.3f}  ppl≤{record['ppl_bound']:.1f}  "
                                               f"{record['tokens_per_s']:.0f} tok/s")
                    if not console.is_terminal and done % (tc.log_every * 10) == 0:
                        console.print(f"step {done}: loss {mean_loss:.4f} (ppl≤{record['ppl_bound']:.1f}), "
                                      f"{record['tokens_per_s']:.0f} tok/s")
                    window.update(loss=0.0, tokens=0, steps=0, t0=time.perf_counter())
                progress.update(task, completed=done)

                if preempted:
                    break
                if done % tc.eval_every == 0 and done < tc.max_steps and not out_of_time:
                    result = evaluate(tc.eval_rows)
                    model.train()
                    checkpoint(best=_record_eval(state, result, done, log, console))
                elif done % tc.save_every == 0:
                    checkpoint()
                if out_of_time:
                    console.print(f"Time limit reached at step {done}")
                    break
    except KeyboardInterrupt:
        state["train_seconds"] += time.perf_counter() - start_time
        path = checkpoint()
        raise MdlmError(f"interrupted at step {state['step']}; checkpoint saved to {path}; "
                        "continue with --resume") from None

    train_seconds = time.perf_counter() - start_time
    state["train_seconds"] += train_seconds
    tokens_this_run = state["tokens_seen"] - start_tokens
    if preempted:
        path = checkpoint()  # preemption: save now, no final validation
        console.print(f"{stop.received or 'SIGTERM'} at step {state['step']}: checkpoint saved to {path}")
        return TrainResult(run_dir, path, state["step"], state["tokens_seen"], train_seconds,
                           tokens_this_run / max(step_seconds, 1e-9), None, unigram, losses,
                           stopped_by=stop.received or "SIGTERM")
    final = evaluate(0) if len(valid_split) else None
    best = False
    if final is not None:
        with open(metrics_path, "a") as log:
            best = _record_eval(state, final, state["step"], log, console, final=True)
    last_ckpt = checkpoint(best=best)
    return TrainResult(run_dir, last_ckpt, state["step"], state["tokens_seen"], train_seconds,
                       tokens_this_run / max(step_seconds, 1e-9), final, unigram, losses)


def _record_eval(state: dict, result: BoundResult, step: int, log, console: Console,
                 final: bool = False) -> bool:
    nats = result.nats_per_token
    best = state["best_valid_nats"] is None or nats < state["best_valid_nats"]
    if best:
        state["best_valid_nats"] = nats
    state["valid_nats"] = nats
    record = {"step": step, "valid_nats": nats, "valid_ppl_bound": result.perplexity,
              "valid_tokens": result.tokens, "final": final}
    log.write(json.dumps(record) + "\n")
    log.flush()
    label = "final validation" if final else "validation"
    kind, rel = ("exact NLL", "=") if result.exact else ("bound", "≤")
    console.print(f"step {step}: {label} {kind} {nats:.4f} nats/token, PPL {rel} {result.perplexity:.2f} "
                  f"({result.tokens} tokens, EMA weights)")
    return best


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop log lines past `step` (written by a run that was later resumed from `step`)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in kept))
