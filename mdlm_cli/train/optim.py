"""Optimisation helpers: the learning-rate schedule (the fine-tuning loop's too) and the EMA
of the weights (of a LoRA run's trainable tensors only: `AdapterEMA`)."""

from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..config import Config


def warmup_cosine(step: int, *, lr: float, warmup: int, total: int,
                  min_lr_ratio: float) -> float:
    """The learning rate at `step` (from 0): linear warmup over `warmup` steps, then cosine
    decay to min_lr_ratio * lr at step `total` (min_lr_ratio = 1: constant after warmup)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min((step - warmup) / max(total - warmup, 1), 1.0)
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def lr_at(step: int, cfg: Config) -> float:
    """The training run's schedule: linear warmup, then constant or cosine decay to
    min_lr_ratio * lr."""
    o = cfg.optim
    floor = o.min_lr_ratio if o.schedule == "cosine" else 1.0
    return warmup_cosine(step, lr=o.lr, warmup=o.warmup_steps, total=cfg.train.max_steps,
                         min_lr_ratio=floor)


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

    @contextmanager
    def swapped(self, model: torch.nn.Module):
        """The module holding the averages: its own copy (`model` is left as it is)."""
        yield self.model


class AdapterEMA:
    """The EMA of a LoRA run: of its trainable tensors only (the adapters, and the layers
    trained whole), by parameter name, with the same warmup decay as `EMA`. The frozen base
    is shared, never copied; evaluation swaps the averages in (`swapped`)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters()
                       if p.requires_grad}
        self.updates = 0

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        params = dict(model.named_parameters())
        torch._foreach_lerp_(list(self.shadow.values()),
                             [params[n].detach() for n in self.shadow], 1.0 - decay)

    @contextmanager
    def swapped(self, model: torch.nn.Module):
        """`model` with the averages in place of its trainable tensors, restored after."""
        params = dict(model.named_parameters())
        saved = {n: params[n].detach().clone() for n in self.shadow}
        with torch.no_grad():
            for n, value in self.shadow.items():
                params[n].copy_(value)
        try:
            yield model
        finally:
            with torch.no_grad():
                for n, value in saved.items():
                    params[n].copy_(value)

    def take(self, model: torch.nn.Module) -> None:
        """The averages become `model`'s current trainable tensors (a resumed run's)."""
        params = dict(model.named_parameters())
        self.shadow = {n: params[n].detach().clone() for n in self.shadow}
