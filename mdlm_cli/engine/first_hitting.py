"""The first-hitting sampler (Zheng et al. 2024): the reverse process simulated event by
event."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .context import SamplerContext, rows_active
from .options import option


@dataclass(frozen=True)
class FirstHittingOptions:
    tokens_per_step: int = option(1, "tokens revealed per network call (1 = exact).", low=1)


def first_hitting(z: Tensor, ctx: SamplerContext) -> Tensor:
    """With n positions masked at time tau, the next unmasking happens at
    tau' = alpha^-1(1 - u^(1/n) (1 - alpha(tau))); one uniformly chosen masked
    position is revealed with a token from p_theta(. | z, tau'). Exact, one network
    call per revealed token. `tokens_per_step` k > 1 reveals k positions per call
    (the model evaluated at the first of the k event times): faster, approximate.

    Neither the event times nor the positions depend on the model, so both are drawn
    up front: the times as a running product of u^(1/n) (in log space), the positions
    as a uniformly random order of the masked positions (choosing uniformly among the
    remaining ones at every event is the same law). The loop is then one network call
    and one draw per event.
    """
    B, L = z.shape
    k = ctx.options.tokens_per_step
    masked = z == ctx.mask_id
    n0 = masked.sum(1)  # (B,)
    n_host = n0.tolist()
    N = max(n_host)
    if N == 0:
        return z
    order = ctx.rand((B, L), z.device).masked_fill(~masked, 2.0).argsort(dim=1)[:, :N]  # (B, N)
    j = torch.arange(N, device=z.device)
    valid = j[None, :] < n0[:, None]  # (B, N): event j happens in sequence b
    # masked before event j
    remaining = (n0[:, None] - j[None, :]).clamp_min(1).to(torch.float64)
    log_u = ctx.rand((B, N), z.device).clamp_min(torch.finfo(torch.float64).tiny).log()
    start = ctx.schedule.mask_rate(torch.ones(B, 1, dtype=torch.float64, device=z.device)).log()
    tau = ctx.schedule.inverse(1.0 - (start + (log_u / remaining).cumsum(1)).exp())  # (B, N)
    for first in range(0, N, k):
        cols = slice(first, first + k)
        take = valid[:, cols]  # (B, <=k); order's positions are distinct within a row
        chosen = torch.zeros_like(masked).scatter_(1, order[:, cols], take)
        rows = rows_active(n0, n_host, first)  # sequences with an event left
        z.masked_scatter_(chosen, ctx.draw(ctx.logits(z, tau[:, first], chosen, rows), chosen))
    return z
