"""Perplexity bound of a diffusion model on a prepared split."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from .data.store import TokenSplit
from .engine.diffusion import Denoiser, nelbo_terms, sample_times, times_from_uniform
from .engine.schedules import Schedule
from .runtime import generator


@dataclass
class BoundResult:
    nats: float  # summed NELBO over the rows (exact NLL for an autoregressive model)
    tokens: int  # real tokens in the rows
    sequences: int
    exact: bool = False  # True: an exact likelihood, not a bound

    @property
    def nats_per_token(self) -> float:
        return self.nats / max(self.tokens, 1)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.nats_per_token, 700.0))


@torch.no_grad()
def nelbo_bound(denoiser: Denoiser, split: TokenSplit, *, schedule: Schedule, mask_id: int,
                batch_size: int, device: torch.device, seed: int = 0, rows: int = 0, T: int = 0,
                antithetic: bool = True,
                on_batch: Callable[[int], None] | None = None) -> BoundResult:
    """NELBO over the first `rows` rows of `split` (0 = all, remainder batch included),
    one t per sequence, stratified over the whole evaluation set."""
    n = len(split) if rows <= 0 else min(rows, len(split))
    gen = generator(device, seed)
    t_all = times_from_uniform(sample_times(n, generator=gen, antithetic=antithetic, device=device),
                               schedule, T)
    total = torch.zeros((), device=device, dtype=torch.float64)
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(start + batch_size, n))
        x0, attention_mask = split.batch(idx, device)
        terms = nelbo_terms(denoiser, x0, t_all[idx[0]: idx[-1] + 1], mask_id=mask_id,
                            schedule=schedule, generator=gen, attention_mask=attention_mask, T=T)
        total += terms.sum().double()
        if on_batch is not None:
            on_batch(len(idx))
    return BoundResult(float(total), int(split.lengths[:n].sum()), n)
