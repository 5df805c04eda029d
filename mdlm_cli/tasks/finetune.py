"""The fine-tuning loop the downstream tasks share: `mdlm glue` (tasks/glue.py) and
`mdlm classify` (tasks/genomic.py) differ in their data, loss, schedule and evaluation,
which they pass in; the loop is the same.

AdamW over epochs of mini-batches, the learning rate set before every step from the task's
schedule (`train.optim.warmup_cosine` for Genomic Benchmarks, a linear decay for GLUE),
gradient clipping, a stop after `total_steps` (GLUE's fractional epochs end mid-epoch), and
with an evaluation the weights of the best epoch (the first of equals) kept at the end.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn


@dataclass
class FitResult:
    last_epoch_loss: float  # mean training loss over the steps of the last epoch
    best_score: float | None = None  # the best evaluation (None without one)
    best_epoch: int | None = None  # its epoch, from 1


def epochs_for(total_steps: int, steps_per_epoch: int) -> int:
    """Epochs that hold `total_steps` steps (the last one possibly cut short)."""
    return math.ceil(total_steps / max(steps_per_epoch, 1))


@dataclass(frozen=True)
class FitPlan:
    """A task's optimisation: `epochs` over its batches, stopped after `total_steps` steps
    (GLUE's fractional epochs end mid-epoch), `lr_at(step)` the learning rate of step 0, 1,
    ..., AdamW's `weight_decay`, and the gradient norm clipped to `grad_clip` (0: not
    clipped)."""

    epochs: int
    total_steps: int
    lr_at: Callable[[int], float]
    weight_decay: float
    grad_clip: float


def fit(model: nn.Module,
        batches: Callable[[], Iterable[Any]],
        loss_of: Callable[[nn.Module, Any], Tensor],
        plan: FitPlan, *,
        evaluate: Callable[[nn.Module], float] | None = None,
        on_step: Callable[[int, int, float], None] | None = None) -> FitResult:
    """Train `model` in place as `plan` says: `batches()` is called once per epoch (an iterable
    of batches, drawn lazily, so a task's random draws keep their order), `loss_of(model,
    batch)` is the loss of one. With `evaluate(model)` (higher is better) after every epoch,
    the model ends with the best epoch's weights. `on_step(step, total_steps, loss)` reports
    progress."""
    epochs, total_steps, lr_at = plan.epochs, plan.total_steps, plan.lr_at
    grad_clip = plan.grad_clip
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr_at(0),
                                  weight_decay=plan.weight_decay)
    step, losses = 0, []
    best_score, best_epoch, best_weights = None, None, None
    for epoch in range(1, epochs + 1):
        model.train()
        losses = []
        for batch in batches():
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            loss = loss_of(model, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
            optimizer.step()
            step += 1
            losses.append(loss.detach())
            if on_step is not None:
                on_step(step, total_steps, loss.item())
            if step == total_steps:
                break
        if evaluate is not None:
            score = evaluate(model)
            if best_score is None or score > best_score:
                best_score, best_epoch = score, epoch
                best_weights = copy.deepcopy(model.state_dict())
        if step >= total_steps:
            break
    if best_weights is not None:
        model.load_state_dict(best_weights)
    mean = float(np.mean([loss.item() for loss in losses])) if losses else math.nan
    return FitResult(mean, best_score, best_epoch)
