"""Fast-dLLM's block decoding (NVlabs/Fast-dLLM, llada/generate.py) for the models that predict
each token in place (the DiT, LLaDA): `threshold` in blocks, and `confidence` and `threshold`
with a block cache (`--cache prefix|dual`, models/block_cache.py). Dream's loop, whose logits
are read one position to the left, is dream_blocks.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .confident_draws import ORDERS, most_confident, reveal, times_of
from .context import SamplerContext
from .errors import EngineError
from .protocols import has_block_cache
from .transfer import TransferPlan


def new_cache(z: Tensor, ctx: SamplerContext):
    """The denoiser's empty block cache for the batch; refused (one line) where there is none
    (that a cache needs a block length is checked with the settings: `cache_rules`)."""
    cache = ctx.options.cache
    if not has_block_cache(ctx.denoiser):
        raise EngineError(f"--cache {cache} needs a time-agnostic model with a block cache "
                          "(the DiT without time conditioning, LLaDA, Dream); use --cache none")
    return ctx.denoiser.new_block_cache(*z.shape)


def cached_confidence(z: Tensor, ctx: SamplerContext, plan: TransferPlan) -> Tensor:
    """`confidence` in blocks with a block cache (Fast-dLLM's generate_with_prefix_cache and
    generate_with_dual_cache): a row's first revealing step in a block is a full pass that
    refreshes its cache, the later ones cached calls; the same plan of counts and blocks. A
    block that its full pass filled still gets one cached call (revealing nothing), as
    Fast-dLLM's loop makes: its NFE."""
    cache, blocks = new_cache(z, ctx), Blocks(len(z))
    lo, untempered = plan.lo.tolist(), ctx.options.k_schedule == "llada"
    for i in range(ctx.steps):
        k = plan.counts[:, i]

        def keep_k(rows: list[int], cand: Tensor, conf: Tensor, k=k) -> Tensor:
            return most_confident(conf, k[rows].to(z.device), ctx)

        active = {b: lo[b][i] for b in k.nonzero()[:, 0].tolist()}
        active |= {b: lo[b][i] for b in blocks.pending if blocks.cached_at[b] == lo[b][i]}
        _block_step(z, ctx, cache, active, blocks, keep_k, ctx.options.order, untempered)
    return z


class Blocks:
    """Per row: the block start its cache was last refreshed at, and whether that block has
    had a cached call since (Fast-dLLM's block loop makes at least one after the full pass)."""

    def __init__(self, batch: int):
        self.cached_at, self.pending = [-1] * batch, set()


def threshold_blocks(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Fast-dLLM's threshold decoding (generate and its cached versions with `threshold`): each
    row fills its blocks of `block_length` after its first masked position left to right, with
    calls until its block has no mask; a call keeps the most confident drawn token of the block
    and every other whose probability is at least the threshold. With a cache, a block that
    its full pass filled still gets one cached call (revealing nothing): Fast-dLLM's NFE."""
    B, L = z.shape
    size, blocks = ctx.options.block_length, Blocks(B)
    cache = None if ctx.options.cache == "none" else new_cache(z, ctx)
    masked = (z == ctx.mask_id).cpu()
    lo = [int(m.nonzero()[0]) if m.any() else L for m in masked]

    def keep(rows: list[int], cand: Tensor, conf: Tensor) -> Tensor:
        return at_least(cand, conf, ctx.options.threshold)

    while True:
        for b in range(B):
            while (lo[b] < L and b not in blocks.pending
                   and not masked[b, lo[b]:lo[b] + size].any()):
                lo[b] += size  # a block done: the next
        active = {b: lo[b] for b in range(B) if lo[b] < L}
        if not active:
            return z
        _block_step(z, ctx, cache, active, blocks, keep, "maskgit_plus", False)
        masked = (z == ctx.mask_id).cpu()


def at_least(cand: Tensor, conf: Tensor, threshold: float) -> Tensor:
    """Fast-dLLM's threshold rule in a block: the most confident candidate of each row and
    every other whose confidence is at least `threshold`."""
    keep = cand & (conf >= threshold)
    keep[torch.arange(len(keep)), conf.argmax(1)] = True  # not a candidate: dropped after
    return keep


def _block_step(z: Tensor, ctx: SamplerContext, cache, lo: dict[int, int], blocks: Blocks,
                choose, order: str, untempered: bool) -> None:
    """One step of the rows in `lo` (row -> its block's start): a full pass for the rows entering
    a block, refreshing their cache (all rows, without a cache), one cached call per block start
    for the others; `choose(rows, candidates, confidence)` picks the drawn tokens revealed."""
    fresh = [b for b in lo if cache is None or blocks.cached_at[b] != lo[b]]
    groups = [(fresh, True)] if fresh else []
    cached = [b for b in lo if b not in fresh]
    for start in sorted({lo[b] for b in cached}):
        groups.append(([b for b in cached if lo[b] == start], False))
    blocks.pending = (blocks.pending - set(lo)) | (set(fresh) if cache is not None else set())
    for b in fresh:
        blocks.cached_at[b] = lo[b]
    for rows, refresh in groups:
        call = BlockCall(rows, [lo[b] for b in rows], refresh)
        cand, drawn, conf = block_draws(z, ctx, cache, call, order, untempered)
        reveal(z, torch.tensor(rows, device=z.device), cand & choose(rows, cand, conf), drawn)


@dataclass(frozen=True)
class BlockCall:
    """What one network call of block decoding covers: the `rows`, each one's block starting
    at `lo` (one per row), a full pass that refreshes their cache or a cached call, and only
    the first `width` positions of each block where given."""

    rows: list[int]
    lo: list[int]
    refresh: bool
    width: int | None = None


def block_draws(z: Tensor, ctx: SamplerContext, cache, call: BlockCall, order: str,
                untempered: bool) -> tuple[Tensor, Tensor, Tensor]:
    """A token drawn at every masked position of each row's block [lo, lo + block_length)
    (the first `width` positions of it, if given) from one call: a full pass (refreshing the
    rows' cache, if any), or a cached call on the rows' shared block (dual) or block and suffix
    (prefix). Returns, for the rows, (candidates, tokens, confidence), each (R, L), as
    `draw_masked`."""
    rows, lo, refresh, width = call.rows, call.lo, call.refresh, call.width
    size, idx = ctx.options.block_length, torch.tensor(rows, device=z.device)
    everyone = rows == list(range(len(z)))
    sub = z[idx]
    pos = torch.arange(z.shape[1], device=z.device)[None]
    start = torch.tensor(lo, device=z.device)[:, None]
    cand = (sub == ctx.mask_id) & (pos >= start) & (pos < start + (width or size))
    if cache is None:
        where = torch.zeros_like(z, dtype=torch.bool).index_copy_(0, idx, cand)
        logits = ctx.logits(z, times_of(z, ctx), where, idx)
    elif refresh:  # all rows in order: no copies of the cache
        logits = ctx.refresh_cache(z, cache, None if everyone else idx)[cand]
    else:
        s = lo[0]
        e = z.shape[1] if ctx.options.cache == "prefix" else min(s + size, z.shape[1])
        logits = ctx.cached_logits(z, cache, None if everyone else idx, s, e)[cand[:, s:e]]
    tokens, weights = ctx.draw_with_weights(logits, untempered)
    drawn = torch.zeros_like(sub).masked_scatter_(cand, tokens)
    conf = torch.full(cand.shape, float("-inf"), dtype=torch.float64, device=z.device)
    ranks = ORDERS[order](weights, tokens, lambda n: ctx.rand((n,), z.device))
    return cand, drawn, conf.masked_scatter_(cand, ranks)
