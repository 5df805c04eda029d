"""Optimisation helpers of the train loop: the learning-rate schedule and the EMA of the weights."""

from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from ..config import Config


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
