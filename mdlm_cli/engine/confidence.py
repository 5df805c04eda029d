"""Confidence-ordered parallel decoding: MaskGIT / LLaDA's "low-confidence remasking"
(`confidence`) and Fast-dLLM's threshold rule (`threshold`).

At every network call a token is drawn (float64, exact per position) at every masked
position, and its confidence is its probability under the distribution it was drawn
from; the most confident drawn tokens are kept and the others stay masked (LLaDA's
code calls this remasking). Both are inexact: tokens revealed by the same call are drawn
independently from their marginals, and keeping likely draws favours likely tokens, an
effect like a lower temperature. What they buy is fewer network calls than tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .context import SamplerContext
from .options import option

# Fraction of a sequence's masked positions still masked after step i of N, s = i / N:
# `linear` reveals the same number at every step (LLaDA's get_num_transfer_tokens),
# `cosine` few at first and more later (MaskGIT's schedule).
K_SCHEDULES = {
    "linear": lambda s: 1.0 - s,
    "cosine": lambda s: math.cos(math.pi / 2 * s),
}


@dataclass(frozen=True)
class ConfidenceOptions:
    k_schedule: str = option(
        "linear", "tokens revealed per step, linear (equal shares, LLaDA) or cosine (MaskGIT).",
        choices=K_SCHEDULES)


@dataclass(frozen=True)
class ThresholdOptions:
    threshold: float = option(
        0.9, "reveal each drawn token whose probability exceeds this (0 = all in one call).",
        low=0.0, high=1.0)


def reveal_counts(n_masked: list[int], steps: int, k_schedule: str) -> Tensor:
    """Tokens each sequence reveals at each step, (B, steps) long on the host: the masked
    count left after step i is floor(n * f(i / steps)), f from K_SCHEDULES, 0 after the last.
    A step that reveals nothing for a sequence costs it no network call."""
    f = torch.tensor(
        [K_SCHEDULES[k_schedule](i / steps) for i in range(steps + 1)], dtype=torch.float64
    )
    n = torch.tensor(n_masked, dtype=torch.float64)[:, None]
    left = torch.floor(n * f + 1e-9).long().clamp(min=0)  # + 1e-9: 0.7 * 10 is 7, not 6.999...
    left[:, 0], left[:, -1] = n[:, 0].long(), 0
    left = torch.cummin(left, dim=1).values  # never more masked than before
    return left[:, :-1] - left[:, 1:]


def _times(z: Tensor, ctx: SamplerContext) -> Tensor:
    """One time per sequence, where the schedule's mask rate equals its masked fraction
    (what a model with time conditioning expects; a time-agnostic one ignores it)."""
    frac = (z == ctx.mask_id).double().mean(1)
    return ctx.schedule.inverse(1.0 - frac).clamp(ctx.eps, 1.0)


def _draw_masked(
    z: Tensor, ctx: SamplerContext, rows: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """A token drawn at every masked position of the sequences `rows` (all if None) from one
    network call. Returns, for those sequences, (masked (R, L), tokens (R, L), confidence (R, L):
    the drawn token's probability at masked positions, -inf elsewhere)."""
    masked = z == ctx.mask_id
    tokens, probs = ctx.draw_with_probs(ctx.logits(z, _times(z, ctx), masked, rows))
    if rows is not None:
        masked = masked[rows]
    drawn = torch.zeros(masked.shape, dtype=torch.long, device=z.device).masked_scatter_(
        masked, tokens
    )
    conf = torch.full(masked.shape, float("-inf"), dtype=torch.float64, device=z.device)
    return masked, drawn, conf.masked_scatter_(masked, probs)


def _reveal(z: Tensor, rows: Tensor | None, chosen: Tensor, drawn: Tensor) -> None:
    """Write the drawn tokens at the chosen positions of the sequences `rows`, in place."""
    if rows is None:
        z[chosen] = drawn[chosen]
    else:
        sub = z[rows]
        sub[chosen] = drawn[chosen]
        z[rows] = sub


def confidence(z: Tensor, ctx: SamplerContext) -> Tensor:
    """`steps` steps; at step i a sequence keeps the k_i most confident of its drawn tokens,
    k_i from `ctx.options.k_schedule` (reveal_counts). One network call per step that reveals
    something: NFE = min(steps, masked positions) with the linear schedule; NCS = the
    masked positions summed over the calls."""
    B = len(z)
    counts = reveal_counts((z == ctx.mask_id).sum(1).tolist(), ctx.steps, ctx.options.k_schedule)
    for i in range(ctx.steps):
        k = counts[:, i]
        active = k.nonzero()[:, 0]
        if not len(active):
            continue
        rows = None if len(active) == B else active.to(z.device)
        masked, drawn, conf = _draw_masked(z, ctx, rows)
        k = k[active].to(z.device)
        order = conf.argsort(dim=1, descending=True, stable=True)  # masked positions first
        rank = torch.empty_like(order).scatter_(
            1, order, torch.arange(z.shape[1], device=z.device).expand_as(order)
        )
        _reveal(z, rows, masked & (rank < k[:, None]), drawn)
    return z


def threshold(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Calls until nothing is masked; each keeps every drawn token whose probability exceeds
    `ctx.options.threshold`, and at least the most confident one. Threshold 0 reveals
    everything in one call, threshold 1 one token per call (a probability never exceeds 1)."""
    B = len(z)
    left = (
        (z == ctx.mask_id).sum(1).tolist()
    )  # read once per call: what a call reveals depends on the model
    while any(left):
        active = [b for b, n in enumerate(left) if n]
        rows = None if len(active) == B else torch.tensor(active, device=z.device)
        masked, drawn, conf = _draw_masked(z, ctx, rows)
        chosen = masked & (conf > ctx.options.threshold)
        chosen[torch.arange(len(chosen), device=z.device), conf.argmax(1)] = True
        _reveal(z, rows, chosen, drawn)
        left = (z == ctx.mask_id).sum(1).tolist()
    return z
