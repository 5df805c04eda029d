"""Perplexity bound of a diffusion model on a prepared split."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as tdist

from .data.store import TokenSplit
from .engine.diffusion import Denoiser, nelbo_terms, sample_times, times_from_uniform
from .engine.schedules import Schedule
from .runtime import derive_seed, generator


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
                on_batch: Callable[[int], None] | None = None,
                rank: int = 0, world_size: int = 1) -> BoundResult:
    """NELBO over the first `rows` rows of `split` (0 = all, remainder batch included),
    one t per sequence, stratified over the whole evaluation set.

    Under torch.distributed (`rank`, `world_size` of the initialised process group) rank r
    evaluates batches r, r + W, ... and the sums are all-reduced: every rank returns the
    bound of the whole set, equal to the one-process value up to summation order (the
    draws of a batch are seeded by its index). Every rank makes the same number of model
    calls (a rank short of a batch evaluates one row and discards it), as FSDP2 needs.
    `on_batch` gets the number of rows finished by all ranks together.
    """
    n = len(split) if rows <= 0 else min(rows, len(split))
    gen = generator(device, seed)
    t_all = times_from_uniform(sample_times(n, generator=gen, antithetic=antithetic, device=device),
                               schedule, T)
    total = torch.zeros((), device=device, dtype=torch.float64)
    n_batches = -(-n // batch_size)
    rounds = -(-n_batches // world_size)
    for r in range(rounds):
        b = r * world_size + rank  # this rank's batch in this round
        filler = b >= n_batches  # none left for this rank: one row through the model, result dropped
        start = 0 if filler else b * batch_size
        idx = np.arange(start, start + 1 if filler else min(start + batch_size, n))
        x0, attention_mask = split.batch(idx, device)
        terms = nelbo_terms(denoiser, x0, t_all[idx[0]: idx[-1] + 1], mask_id=mask_id, schedule=schedule,
                            generator=generator(device, derive_seed(seed, "batch", b)),
                            attention_mask=attention_mask, T=T)
        if not filler:
            total += terms.sum().double()
        if on_batch is not None:
            on_batch(min((r + 1) * world_size * batch_size, n) - r * world_size * batch_size)
    if world_size > 1:
        tdist.all_reduce(total)
    return BoundResult(float(total), int(split.lengths[:n].sum()), n)
