"""Fast-dLLM's block caches for Dream (NVlabs/Fast-dLLM, dream/model/generation_utils_block.py,
`_sample`): `confidence` and `threshold` with `--cache prefix|dual` on a denoiser whose logits
at position i are read from the network's output at i - 1 (`shifted_logits`: Dream).

A sliced call on a block [s, e) cannot give position s's logits (they come from the output at
s - 1, outside the slice), so Fast-dLLM's loop decides s from the full pass. Per block of
`block_length` after the row's first masked position:
- one full pass refreshes the row's cache and reveals the token drawn at s, whatever its
  confidence (nothing if s is not masked);
- then cached calls on [s, L) (prefix) or [s, e) (dual), their logits shifted within the slice
  as Fast-dLLM shifts a call's logits (s reads its own output, never a candidate again), each
  revealing tokens of the block:
  - `threshold`: the most confident drawn token and every other whose probability is at least
    the threshold, until the block has no mask;
  - `confidence`: the block's per = steps / blocks steps on Dream's grid t_j = linspace(1,
    1e-3, per + 1), the full pass its step 0: cached call j (1 <= j < per - 1) keeps
    int(m (1 - t_{j+1} / t_j)) of the m still masked in the block, by `--order`, the call
    per - 1 all that are left. Fast-dLLM's loop ranks by negative entropy whatever its `alg`
    says: that is `--order entropy`.
- every call is one network evaluation, whatever it reveals (Fast-dLLM's loop makes it): a
  block the full pass filled still gets one cached call.
Rows are independent: Fast-dLLM's loop is written for one sequence (its threshold rule reads
row 0, its counts the batch's mean); each row here gets the tokens and calls it gets alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .block_decoding import BlockCall, at_least, block_draws, new_cache
from .confident_draws import most_confident, reveal
from .context import SamplerContext
from .errors import EngineError
from .transfer import DREAM_EPS, transfer_plan

# choose(rows, calls made in each row's block so far, candidates, confidence) -> kept (R, L)
Choose = Callable[[list[int], list[int], Tensor, Tensor], Tensor]


def dream_cached_confidence(z: Tensor, ctx: SamplerContext) -> Tensor:
    """`confidence --cache prefix|dual` on a shifted-logits model: Fast-dLLM's Dream loop."""
    opts, size = ctx.options, ctx.options.block_length
    cache = new_cache(z, ctx)  # refuses a cache without --block-length first
    if opts.k_schedule != "dream":
        raise EngineError(f"--cache {opts.cache} on Dream follows Fast-dLLM's Dream loop and "
                          "its timestep grid: use --k-schedule dream (got "
                          f"{opts.k_schedule})")
    masked = (z == ctx.mask_id).cpu()
    transfer_plan(masked, ctx.steps, "dream", size)  # refuses steps the blocks do not divide
    L = z.shape[1]
    per = [ctx.steps // -(-(L - _first(m, L)) // size) if m.any() else 0 for m in masked]
    if size > 1 and 1 in per:
        raise EngineError(f"--cache {opts.cache} on Dream needs at least 2 steps per block "
                          f"(got {ctx.steps} steps for {ctx.steps} blocks): Fast-dLLM's Dream "
                          "loop reveals one token in the full pass and would leave the rest "
                          "of the block masked")

    def counts(rows: list[int], calls: list[int], cand: Tensor, conf: Tensor) -> Tensor:
        m = cand.sum(1).tolist()
        k = [_grid_count(m[r], calls[r], per[b]) for r, b in enumerate(rows)]
        return most_confident(conf, torch.tensor(k, device=z.device), ctx)

    return _blocks(z, ctx, cache, counts, opts.order)


def dream_cached_threshold(z: Tensor, ctx: SamplerContext) -> Tensor:
    """`threshold --cache prefix|dual` on a shifted-logits model: Fast-dLLM's Dream loop with
    alg="confidence_threshold"."""
    cache = new_cache(z, ctx)

    def keep(rows: list[int], calls: list[int], cand: Tensor, conf: Tensor) -> Tensor:
        return at_least(cand, conf, ctx.options.threshold)

    return _blocks(z, ctx, cache, keep, "maskgit_plus")


def _first(masked: Tensor, L: int) -> int:
    return int(masked.nonzero()[0]) if masked.any() else L


def _grid_count(m: int, j: int, per: int) -> int:
    """Tokens cached call j of a block reveals out of its m masked: Dream's grid count
    int(m (1 - t_{j+1} / t_j)) in float32, as Fast-dLLM's loop; all at its last call."""
    if j >= per - 1:
        return m
    t = torch.linspace(1, DREAM_EPS, per + 1)  # float32, as Dream's grid
    return int(torch.tensor(float(m)) * (1 - t[j + 1] / t[j]))


def _blocks(z: Tensor, ctx: SamplerContext, cache, choose: Choose, order: str) -> Tensor:
    """Each row's blocks left to right: a full pass (rows entering a block, together), then
    cached calls (rows sharing a block start, together) until the block has no mask."""
    B, L = z.shape
    size = ctx.options.block_length
    masked = (z == ctx.mask_id).cpu()
    lo = [_first(m, L) for m in masked]
    calls = [0] * B  # calls made in the row's current block (0: its full pass is next)
    while True:
        for b in range(B):
            if calls[b] > 1 and not masked[b, lo[b]:lo[b] + size].any():
                lo[b], calls[b] = lo[b] + size, 0  # done after at least one cached call
            while calls[b] == 0 and lo[b] < L and not masked[b, lo[b]:lo[b] + size].any():
                lo[b] += size  # nothing to fill (an infilling template): no call
        active = [b for b in range(B) if lo[b] < L]
        if not active:
            return z
        fresh = [b for b in active if calls[b] == 0]
        groups = [(fresh, True)] if fresh else []
        for start in sorted({lo[b] for b in active if calls[b]}):
            groups.append(([b for b in active if calls[b] and lo[b] == start], False))
        for rows, refresh in groups:
            call = BlockCall(rows, [lo[b] for b in rows], refresh, 1 if refresh else None)
            cand, drawn, conf = block_draws(z, ctx, cache, call, order, False)
            if not refresh:
                cand = cand & choose(rows, [calls[b] for b in rows], cand, conf)
            reveal(z, torch.tensor(rows, device=z.device), cand, drawn)
            for b in rows:
                calls[b] += 1
        masked = (z == ctx.mask_id).cpu()
