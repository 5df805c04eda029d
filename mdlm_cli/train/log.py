"""What training reports as it goes: the metrics.jsonl records, the progress line, the text
lines; tokens/s and model FLOP utilisation (perf.py) in each."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..models.anneal import anneal_ratio
from ..objectives.bound import BoundResult
from ..perf import Peak, mfu, mfu_text
from .state import TrainState

if TYPE_CHECKING:
    from ..config import Config
    from ..distributed import Dist


def nats_text(nats: float, char_level: bool) -> str:
    """'2.3250 nats/char (3.354 bits/char)' for characters, '3.1000 nats/token' otherwise."""
    if char_level:
        return f"{nats:.4f} nats/char ({nats / math.log(2):.3f} bits/char)"
    return f"{nats:.4f} nats/token"


@dataclass(frozen=True)
class Speed:
    """How tokens/s turn into MFU: model FLOPs per training token, the peak of the devices."""

    flops_per_token: float
    peak: Peak | None  # of one device
    devices: int = 1

    def mfu(self, tokens_per_s: float) -> float | None:
        total = None
        if self.peak is not None:
            total = Peak(self.peak.flops * self.devices, self.peak.source)
        return mfu(tokens_per_s * self.flops_per_token, total)

    def describe(self) -> str:
        if self.peak is None:
            return (f"{self.flops_per_token / 1e6:,.1f} MFLOP/token; "
                    "no known peak for this device")
        return (f"{self.flops_per_token / 1e6:,.1f} MFLOP/token, peak "
                f"{self.peak.flops / 1e12:,.2f} TFLOP/s per device ({self.peak.source})")


class Window:
    """Running sums between two log lines."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.loss, self.tokens, self.steps, self.t0 = 0.0, 0, 0, time.perf_counter()

    def add(self, loss: float, tokens: int) -> None:
        self.loss, self.tokens, self.steps = (self.loss + loss, self.tokens + tokens,
                                              self.steps + 1)


class Logged(Protocol):
    """What the log reads of a run (`setup.Run` is one): declared here so that this module does
    not import `setup`, which imports it."""

    cfg: Config
    state: TrainState
    speed: Speed
    console: Console
    dist: Dist


def log_window(run: Logged, window: Window, log, progress: Progress, task, *, lr: float,
               grad_norm: float | None, elapsed_s: float) -> None:
    """One JSONL record (means over the window), the progress line, and a text line every 10
    logs."""
    done = run.state.step
    mean_loss = window.loss / window.steps
    tokens_per_s = window.tokens / max(time.perf_counter() - window.t0, 1e-9)
    utilisation = run.speed.mfu(tokens_per_s)
    record = {"step": done, "loss": mean_loss, "ppl_bound": math.exp(min(mean_loss, 700)),
              "lr": lr, "tokens": run.state.tokens_seen, "tokens_per_s": tokens_per_s,
              "mfu": utilisation, "grad_norm": grad_norm, "elapsed_s": elapsed_s}
    if run.cfg.train.attention_anneal_steps:  # the last step's share of non-causal pairs
        record["attention_ratio"] = anneal_ratio(done - 1, run.cfg.train.attention_anneal_steps)
    log.write(json.dumps(record) + "\n")
    log.flush()
    speed = f"{tokens_per_s:.0f} tok/s" + (f", {mfu_text(utilisation)}" if utilisation else "")
    progress.update(task, info=f"loss {mean_loss:.3f}  ppl≤{record['ppl_bound']:.1f}  {speed}")
    if not run.console.is_terminal and done % (run.cfg.train.log_every * 10) == 0:
        bound = record["ppl_bound"]
        run.console.print(f"step {done}: loss {mean_loss:.4f} (ppl≤{bound:.1f}), {speed}")
    window.reset()


def progress_bar(run: Logged) -> Progress:
    shown = run.console.is_terminal and run.dist.is_main
    return Progress(
        TextColumn("[bold]train"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=run.console,
        transient=True,
        disable=not shown,
    )


def record_eval(state: TrainState, result: BoundResult, step: int, log, console: Console,
                final: bool = False, char_level: bool = False, ema: bool = True) -> bool:
    """The validation record (metrics.jsonl and a line saying which weights: the EMA's, or
    the trained ones where train.ema is 0); True when it is the best so far."""
    nats = result.nats_per_token
    best = state.record_validation(nats)
    record = {"step": step, "valid_nats": nats, "valid_ppl_bound": result.perplexity,
              "valid_tokens": result.tokens, "final": final}
    log.write(json.dumps(record) + "\n")
    log.flush()
    label = "final validation" if final else "validation"
    kind, rel = ("exact NLL", "=") if result.exact else (result.kind or "bound", result.relation)
    unit = "characters" if char_level else "tokens"
    console.print(f"step {step}: {label} {kind} {nats_text(nats, char_level)}, "
                  f"PPL {rel} {result.perplexity:.2f} ({result.tokens} {unit}, "
                  f"{'EMA' if ema else 'raw'} weights)")
    return best
