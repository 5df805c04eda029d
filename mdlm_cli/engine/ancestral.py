"""Ancestral sampling (§4.1): plain, and with per-sequence caching.

A masked position unmasks between t and s with probability (alpha_s - alpha_t) /
(1 - alpha_t) (from the schedule), taking a token from p_theta(. | z_t). In float64
(the default) "whether a position unmasks" is drawn before "which token", so the
model's distribution is needed, and a categorical draw made, only where a position
unmasks; `fp32` reproduces the reference's single float32 draw over V + 1 classes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .categorical import check_logits, reference_draw, token_weights
from .context import SamplerContext, rows_active
from .options import option


def final_denoise_option() -> Any:
    """The `final_denoise` field of the samplers that end with `finish_masks`."""
    return option(True, "argmax at the masks left after the last step (else one last draw).")


@dataclass(frozen=True)
class AncestralOptions:
    """The options of the ancestral samplers (and of D3PM's ancestral chain)."""

    final_denoise: bool = final_denoise_option()


def ancestral_times(
    steps: int, eps: float = 1e-5, device: torch.device | str | None = None
) -> Tensor:
    """The time grid 1 = t_0 > t_1 > ... > t_steps = eps (float64, steps + 1 values):
    step i goes from t_i to t_{i+1}; the final denoising step runs at eps."""
    return torch.linspace(1.0, eps, steps + 1, dtype=torch.float64, device=device)


def finish_masks(z: Tensor, ctx: SamplerContext, t_last: Tensor, final_denoise: bool) -> Tensor:
    """Remaining masks: argmax (`final_denoise`, the final denoising step) or one last draw."""
    masked = z == ctx.mask_id
    rows = masked.any(1).nonzero()[:, 0]
    if len(rows):
        logits = ctx.logits(z, t_last, masked, rows)
        if final_denoise:
            logits[:, ctx.mask_id] = float("-inf")
            check_logits(logits)
            z[masked] = logits.argmax(-1)
            ctx.record(masked, logits, z[masked])
        else:
            z[masked] = ctx.draw(logits, masked)
    return z


def _unmask_steps(masked: Tensor, times: Tensor, ctx: SamplerContext) -> Tensor:
    """The step at which each masked position unmasks, drawn up front (len(times) - 1 where
    it does not unmask before the last time, and at unmasked positions).

    Between t and s a masked position unmasks with probability (alpha_s - alpha_t) /
    (1 - alpha_t), independently of the network and of the other positions, so it is
    still masked after step i with probability S_i = (1 - alpha(t_i+1)) / (1 - alpha(t_0))
    (the product over steps telescopes). One uniform per position searched in S is the
    law of one Bernoulli per position per step, without the per-step draws.
    """
    steps = len(times) - 1
    # decreasing
    survival = ctx.schedule.mask_rate(times[1:]) / ctx.schedule.mask_rate(times[:1])
    u = ctx.rand(masked.shape, masked.device)
    # still masked after step i iff u < S_i, so it unmasks at step #{i : S_i > u}
    at = steps - torch.searchsorted(survival.flip(0).contiguous(), u, right=True)
    return at.masked_fill_(~masked, steps)


def _ancestral(z: Tensor, ctx: SamplerContext, *, cache: bool) -> Tensor:
    """Ancestral sampling from t = 1 to eps in `steps` steps. fp64: which step unmasks each
    position is drawn first (it does not depend on the network), then a token at the
    positions unmasking in each step. With `cache`, only sequences that need a fresh
    output are evaluated: a sequence whose tokens did not change keeps its previous output."""
    times = ancestral_times(ctx.steps, ctx.eps, z.device)
    if ctx.precision == "fp32":
        _ancestral_reference(z, ctx, times, cache=cache)
        return finish_masks(z, ctx, times[-1], ctx.options.final_denoise)
    masked = z == ctx.mask_id
    at = _unmask_steps(masked, times, ctx)
    # Which rows to evaluate at which step is known now, so it is read to the host once:
    # the loop then synchronises with the device only where the network's output size
    # (the number of positions unmasking) is data-dependent, once per call.
    span = (
        at.masked_fill(~masked, -1).amax(1) + 1
    )  # a row holds a mask at the start of step i iff i < span
    span_host = span.tolist()
    n_steps = min(max(span_host), ctx.steps)  # steps with a mask left: the loop's length
    if cache:  # a call only where a row changes
        B = len(z)
        pairs = torch.unique(
            (at * B + torch.arange(B, device=z.device)[:, None])[at < ctx.steps]
        )  # by step, row
        change_steps, counts = torch.unique_consecutive(pairs // B, return_counts=True)
        change_steps = change_steps.tolist()
        if ctx.on_changes is not None:
            ctx.on_changes(change_steps, n_steps)
        for i, rows in zip(change_steps, (pairs % B).split(counts.tolist()), strict=True):
            unmask = at == i
            z.masked_scatter_(unmask, ctx.draw(ctx.logits(z, times[i], unmask, rows), unmask))
    else:  # a call at every step for every row with a mask left, as the reference
        for i in range(n_steps):
            unmask = at == i
            logits = ctx.logits(z, times[i], unmask, rows_active(span, span_host, i))
            if logits.shape[0]:
                z.masked_scatter_(unmask, ctx.draw(logits, unmask))
    return finish_masks(z, ctx, times[-1], ctx.options.final_denoise)


def _ancestral_reference(z: Tensor, ctx: SamplerContext, times: Tensor, *, cache: bool) -> None:
    """fp32: the reference's joint float32 draw over V real tokens + "stay masked", in place."""
    B, L = z.shape
    unmask_probs = ctx.schedule.unmask_prob(
        times[:-1], times[1:]
    ).float()  # (steps,), once for the run
    cached = None  # last full logits per sequence
    valid = torch.zeros(B, dtype=torch.bool, device=z.device)  # cache still matches z
    # per step, whether any sequence changed (only when someone asks, `on_changes`)
    changed_at = []
    for i in range(ctx.steps):
        masked = z == ctx.mask_id
        if not masked.any():
            break
        need = masked.any(1)
        if cache:
            rows = (need & ~valid).nonzero()[:, 0]
            if len(rows):
                fresh = ctx.logits(z, times[i], None, rows)
                if cached is None:
                    cached = torch.empty(B, L, fresh.shape[-1], dtype=fresh.dtype,
                                         device=z.device)
                cached[rows] = fresh
                valid[rows] = True
            logits = cached[masked]
        else:
            logits = ctx.logits(z, times[i], masked, need.nonzero()[:, 0])
        q = token_weights(logits, ctx.mask_id, **ctx.filters)
        q.mul_(unmask_probs[i] / q.sum(-1, keepdim=True))
        q[:, ctx.mask_id] = 1.0 - unmask_probs[i]
        ctx.stats.draws += q.shape[0]
        new = reference_draw(q, generator=ctx.generator)
        changed_pos = torch.zeros_like(masked)
        changed_pos[masked] = new != ctx.mask_id
        z[masked] = new
        changed = changed_pos.any(1)
        valid &= ~changed
        if ctx.on_changes is not None:
            changed_at.append(changed.any())
    if cache and ctx.on_changes is not None:
        ctx.on_changes(
            torch.stack(changed_at).nonzero()[:, 0].tolist() if changed_at else [],
            len(changed_at)
        )


def ancestral(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Plain ancestral sampling: one network call for the batch at every step."""
    return _ancestral(z, ctx, cache=False)


def ancestral_cache(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Ancestral sampling with per-sequence caching (time-agnostic denoisers only)."""
    return _ancestral(z, ctx, cache=True)
