"""The bound arithmetic of a split: an objective's per-sequence terms summed over a prepared
split (rank-sharded under torchrun) and the diffusion times of a set. The objectives build
their `evaluate` on it; `mdlm eval-ppl`
(eval/ppl.py) reports it.

Diffusion objectives give the NELBO bound (continuous time, or the T-step discrete bound of
Table 11) over every token of the split; each pass draws one t per sequence, antithetic over
the whole split. Exact objectives (AR) give their exact likelihood on the same tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as tdist
from torch import Tensor

from ..data.store import TokenSplit
from ..engine.diffusion import sample_times, times_from_uniform
from ..engine.schedules import Schedule
from ..runtime import derive_seed, generator

# terms(x0 (B, L), t (B,) | None, generator, attention_mask) -> nats per sequence (B,); for a
# split of prompt/response rows (data.packing=sft) also targets= (B, L) bool, the responses
TermsFn = Callable[..., Tensor]


@dataclass
class BoundResult:
    nats: float  # summed NELBO over the rows (exact NLL for an exact objective)
    tokens: int  # real tokens in the rows
    sequences: int
    exact: bool = False  # True: an exact likelihood, not a bound
    T: int = 0  # 0 = continuous-time bound, else the T-step discrete bound
    per_sequence: np.ndarray | None = None  # each row's value (nats), when asked for
    # "masked-token": an MLM's masked-token cross-entropy, neither exact nor a bound
    kind: str = ""

    @property
    def nats_per_token(self) -> float:
        return self.nats / max(self.tokens, 1)

    @property
    def relation(self) -> str:
        return relation(self.exact, self.kind)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.nats_per_token, 700.0))


@dataclass(frozen=True)
class SplitSweep:
    """How a split is swept: batches of `batch_size` rows on `device`, over its first `rows`
    rows (0 = all, the remainder batch included), as rank `rank` of the `world_size` ranks
    of an initialised process group (torchrun; 1: one process), each row's value kept where
    `per_sequence`, and `on_batch(n)` told the rows finished by all ranks after each round."""

    batch_size: int
    device: torch.device
    rows: int = 0
    rank: int = 0
    world_size: int = 1
    per_sequence: bool = False
    on_batch: Callable[[int], None] | None = None

    def validate(self) -> SplitSweep:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not one of {self.world_size} ranks")
        return self


@torch.no_grad()
def sharded_sum(
    terms: TermsFn,
    split: TokenSplit,
    sweep: SplitSweep,
    *,
    seed: int = 0,
    draw_times: Callable[[int, torch.Generator], Tensor] | None = None,
    exact: bool = False,
    T: int = 0,
) -> BoundResult:
    """`terms` summed over the rows of `split` that `sweep` covers; with `sweep.per_sequence`,
    every row's value too (`BoundResult.per_sequence`, in row order). `exact` and `T` say
    what the sum is (the result's fields).

    `draw_times(n, generator)` gives one time per sequence for the whole set (stratified
    over it), None for objectives without time. Under torch.distributed (`sweep.rank`,
    `sweep.world_size`) rank r evaluates batches r, r + W, ... and the sums are
    all-reduced: every rank returns the value of the whole set, equal to the one-process
    value up to summation order (the draws of a batch are seeded by its index). Every rank
    makes the same number of model calls (a rank short of a batch evaluates one row and
    discards it), as FSDP2 needs. The per-row values are all-reduced too (each row is
    written by exactly one rank), so every rank holds all of them.
    """
    sweep.validate()
    batch_size, device, rows = sweep.batch_size, sweep.device, sweep.rows
    rank, world_size, on_batch = sweep.rank, sweep.world_size, sweep.on_batch
    n = len(split) if rows <= 0 else min(rows, len(split))
    t_all = draw_times(n, generator(device, seed)) if draw_times is not None else None
    total = torch.zeros((), device=device, dtype=torch.float64)
    each = torch.zeros(n, device=device, dtype=torch.float64) if sweep.per_sequence else None
    n_batches = -(-n // batch_size)
    for r in range(-(-n_batches // world_size)):
        b = r * world_size + rank  # this rank's batch in this round
        filler = (
            b >= n_batches
        )  # none left for this rank: one row through the model, result dropped
        start = 0 if filler else b * batch_size
        idx = np.arange(start, start + 1 if filler else min(start + batch_size, n))
        x0, attention_mask, targets = split.batch_with_targets(idx, device)  # sft: the responses
        t = None if t_all is None else t_all[idx[0]: idx[-1] + 1]
        extra = {} if targets is None else {"targets": targets}
        gen = generator(device, derive_seed(seed, "batch", b))
        values = terms(x0, t, gen, attention_mask, **extra)
        if not filler:
            total += values.sum().double()
            if each is not None:
                each[idx[0]: idx[-1] + 1] = values.detach().double()
        if on_batch is not None:
            on_batch(min((r + 1) * world_size * batch_size, n) - r * world_size * batch_size)
    if world_size > 1:
        tdist.all_reduce(total)
        if each is not None:
            tdist.all_reduce(each)
    return BoundResult(float(total), split.count(slice(0, n)), n, exact=exact, T=T,
                       per_sequence=None if each is None else each.cpu().numpy())


def diffusion_times(schedule: Schedule, T: int = 0, antithetic: bool = True):
    """`draw_times` for a diffusion bound: u antithetic over the set, mapped to t."""
    return lambda n, gen: times_from_uniform(
        sample_times(n, generator=gen, antithetic=antithetic, device=gen.device), schedule, T)


def relation(exact: bool, kind: str = "") -> str:
    """How a perplexity relates to the true one: = exact, ≤ a bound, ~ neither (an MLM's
    masked-token value)."""
    return "=" if exact else "~" if kind == "masked-token" else "≤"
