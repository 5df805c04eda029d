"""Confidence-ordered parallel decoding: MaskGIT / LLaDA's "low-confidence remasking"
(`confidence`) and Fast-dLLM's threshold rule (`threshold`).

At every network call a token is drawn (float64, exact per position) at every masked
position, and its confidence is read from the distribution it was drawn from; the most
confident drawn tokens are kept and the others stay masked (LLaDA's code calls this
remasking). Both are inexact: tokens revealed by the same call are drawn independently from
their marginals, and keeping likely draws favours likely tokens, an effect like a lower
temperature. What they buy is fewer network calls than tokens.

`confidence` reproduces two published generation loops, token for token at temperature 0:
- LLaDA's `generate(steps, gen_length, block_length, temperature)` (low_confidence
  remasking, no CFG) is `k_schedule="llada"`, `block_length`, order maskgit_plus. Its
  confidence is softmax(logits) at the drawn token, untempered, while the token is drawn at
  temperature T (Gumbel-max over exp(logits) / E^T: the softmax(logits / T) law); the llada
  schedule reads it so at any temperature, and ranks only within the current block.
- Dream's `diffusion_generate(steps, alg, alg_temp, temperature, top_p)` is
  `k_schedule="dream"`, `order=alg`, `order_temperature=alg_temp`; its confidence is read
  from the distribution drawn from (tempered, nucleus-filtered), as here for every k-schedule
  but llada. Rows are independent (Dream shares one count across the batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .categorical import drawn_probs
from .context import SamplerContext
from .errors import EngineError
from .options import option
from .protocols import has_block_cache
from .transfer import K_SCHEDULES, TransferPlan, transfer_plan

# Fast-dLLM's block caches (models/block_cache.py): per block one full pass stores every
# position's keys and values; the calls after it run the block and the suffix (prefix) or the
# block only (dual), the other positions read from the cache.
CACHES = ("none", "prefix", "dual")

# How confident a drawn token is, from its row of weights (N, V) (the distribution it was
# drawn from, or LLaDA's untempered one) and the token: Dream's `alg` names.
ORDERS = {
    "maskgit_plus": lambda w, tokens: drawn_probs(w, tokens),  # the drawn token's probability
    "topk_margin": lambda w, tokens: _margin(w),  # top-1 minus top-2 probability
    "entropy": lambda w, tokens: _neg_entropy(w),  # sum p log p: the flattest rows last
}


def _margin(weights: Tensor) -> Tensor:
    top2 = weights.topk(2, dim=-1).values.double()
    return (top2[:, 0] - top2[:, 1]) / weights.double().sum(-1)


def _neg_entropy(weights: Tensor) -> Tensor:
    p = weights / weights.sum(-1, keepdim=True)
    return (p * (p + 1e-10).log()).sum(-1).double()  # as Dream: + 1e-10, summed in float32


def _block_length() -> int:
    return option(0, "blocks of this many tokens after the prompt, filled left to right "
                  "(LLaDA's block_length; 0 = one block); confidence splits the steps evenly "
                  "over them.", low=0)


def _cache() -> str:
    return option("none", "with --block-length: none (exact), or Fast-dLLM's block cache, "
                  "refreshed by a full pass at each block: prefix (later calls run the block and "
                  "the suffix) or dual (the block only); inexact, see docs/sampling.md.",
                  choices=CACHES)


@dataclass(frozen=True)
class ConfidenceOptions:
    k_schedule: str = option(
        "linear", "tokens revealed per step: linear (equal shares), cosine (MaskGIT), llada "
        "(LLaDA's get_num_transfer_tokens, its confidence the untempered probability) or "
        "dream (Dream's timestep grid).", choices=K_SCHEDULES)
    block_length: int = _block_length()
    order: str = option(
        "maskgit_plus", "which draws a step keeps (Dream's alg): the likeliest (maskgit_plus), "
        "largest top-1 minus top-2 probability (topk_margin), lowest entropy (entropy).",
        choices=ORDERS)
    order_temperature: float = option(
        0.0, "0 keeps the k most confident; above 0 draws the k positions from "
        "softmax(confidence / this) (Dream's alg_temp).", low=0.0)
    cache: str = _cache()


@dataclass(frozen=True)
class ThresholdOptions:
    threshold: float = option(
        0.9, "reveal each drawn token whose probability exceeds this (0 = all in one call); in "
        "blocks, Fast-dLLM's: at least this.", low=0.0, high=1.0)
    block_length: int = _block_length()
    cache: str = _cache()


def _times(z: Tensor, ctx: SamplerContext) -> Tensor:
    """One time per sequence, where the schedule's mask rate equals its masked fraction
    (what a model with time conditioning expects; a time-agnostic one ignores it)."""
    frac = (z == ctx.mask_id).double().mean(1)
    return ctx.schedule.inverse(1.0 - frac).clamp(ctx.eps, 1.0)


def _draw_masked(z: Tensor, ctx: SamplerContext, rows: Tensor | None, order: str = "maskgit_plus",
                 untempered: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """A token drawn at every masked position of the sequences `rows` (all if None) from one
    network call. Returns, for those sequences, (masked (R, L), tokens (R, L), confidence (R, L):
    the drawn token's by `order` (ORDERS) at masked positions, -inf elsewhere)."""
    masked = z == ctx.mask_id
    logits = ctx.logits(z, _times(z, ctx), masked, rows)
    tokens, weights = ctx.draw_with_weights(logits, untempered)
    if rows is not None:
        masked = masked[rows]
    drawn = torch.zeros(masked.shape, dtype=torch.long, device=z.device).masked_scatter_(
        masked, tokens
    )
    conf = torch.full(masked.shape, float("-inf"), dtype=torch.float64, device=z.device)
    return masked, drawn, conf.masked_scatter_(masked, ORDERS[order](weights, tokens))


def _reveal(z: Tensor, rows: Tensor | None, chosen: Tensor, drawn: Tensor) -> None:
    """Write the drawn tokens at the chosen positions of the sequences `rows`, in place."""
    if rows is None:
        z[chosen] = drawn[chosen]
    else:
        sub = z[rows]
        sub[chosen] = drawn[chosen]
        z[rows] = sub


def _top_k(conf: Tensor, k: Tensor, ctx: SamplerContext) -> Tensor:
    """(R, L) bool: the k[r] positions of row r kept, the most confident, or at order
    temperature tau > 0 k positions drawn without replacement from softmax(conf / tau)
    (Dream's multinomial), by the Gumbel top-k trick: the same law, one uniform per position."""
    tau = ctx.options.order_temperature
    if tau > 0:
        u = ctx.rand(conf.shape, conf.device).clamp_(min=1e-300)  # u = 0 would rank last
        gumbel = -(-u.log()).log()
        conf = conf / tau + gumbel  # -inf (not a candidate) stays -inf
    order = conf.argsort(dim=1, descending=True, stable=True)  # candidates first
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(conf.shape[1], device=conf.device).expand_as(order)
    )
    return rank < k[:, None]


def _in_block(plan: TransferPlan, active: Tensor, i: int, L: int, device) -> Tensor | None:
    """(R, L) bool: the positions of step i's block of each active sequence (None: all)."""
    if plan.lo is None:
        return None
    pos = torch.arange(L)[None]
    inside = (pos >= plan.lo[active, i, None]) & (pos < plan.hi[active, i, None])
    return inside.to(device)


def confidence(z: Tensor, ctx: SamplerContext) -> Tensor:
    """`steps` steps; at step i a sequence keeps k_i of its drawn tokens, the most confident
    by `order` (or drawn by confidence at `order_temperature` > 0), within step i's block;
    k_i and the blocks from `k_schedule` and `block_length` (transfer.py). One network call per
    step that reveals something (LLaDA's and Dream's code call the model at every step: the
    same tokens, the calls that change nothing saved): NFE = min(steps, masked positions)
    with the linear schedule; NCS = the masked positions summed over the calls."""
    B, L = z.shape
    opts = ctx.options
    plan = transfer_plan(z == ctx.mask_id, ctx.steps, opts.k_schedule, opts.block_length)
    if opts.cache != "none":
        return _cached_confidence(z, ctx, plan)
    for i in range(ctx.steps):
        k = plan.counts[:, i]
        active = k.nonzero()[:, 0]
        if not len(active):
            continue
        rows = None if len(active) == B else active.to(z.device)
        masked, drawn, conf = _draw_masked(z, ctx, rows, opts.order, opts.k_schedule == "llada")
        inside = _in_block(plan, active, i, L, z.device)
        if inside is not None:
            masked = masked & inside
            conf = conf.masked_fill(~inside, float("-inf"))
        _reveal(z, rows, masked & _top_k(conf, k[active].to(z.device), ctx), drawn)
    return z


def threshold(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Calls until nothing is masked; each keeps every drawn token whose probability exceeds
    `ctx.options.threshold`, and at least the most confident one. Threshold 0 reveals
    everything in one call, threshold 1 one token per call (a probability never exceeds 1).
    With `block_length`, Fast-dLLM's rule in blocks instead (`_threshold_blocks`)."""
    if ctx.options.block_length or ctx.options.cache != "none":
        return _threshold_blocks(z, ctx)
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


# ------------------------------------------------------------------ block decoding with a cache

def _new_cache(z: Tensor, ctx: SamplerContext):
    """The denoiser's empty block cache for the batch; refused (one line) where there is none."""
    cache = ctx.options.cache
    if not ctx.options.block_length:
        raise EngineError(f"--cache {cache} needs --block-length (its cache is refreshed at "
                          "the start of each block)")
    if not has_block_cache(ctx.denoiser):
        raise EngineError(f"--cache {cache} needs a time-agnostic model with a block cache (the "
                          "DiT without time conditioning); use --cache none")
    return ctx.denoiser.new_block_cache(*z.shape)


def _cached_confidence(z: Tensor, ctx: SamplerContext, plan: TransferPlan) -> Tensor:
    """`confidence` in blocks with a block cache (Fast-dLLM's generate_with_prefix_cache and
    generate_with_dual_cache): a row's first revealing step in a block is a full pass that
    refreshes its cache, the later ones cached calls; the same plan of counts and blocks. A
    block that its full pass filled still gets one cached call (revealing nothing), as
    Fast-dLLM's loop makes: its NFE."""
    cache, blocks = _new_cache(z, ctx), _Blocks(len(z))
    lo, untempered = plan.lo.tolist(), ctx.options.k_schedule == "llada"
    for i in range(ctx.steps):
        k = plan.counts[:, i]

        def top_k(rows: list[int], cand: Tensor, conf: Tensor, k=k) -> Tensor:
            return _top_k(conf, k[rows].to(z.device), ctx)

        active = {b: lo[b][i] for b in k.nonzero()[:, 0].tolist()}
        active |= {b: lo[b][i] for b in blocks.pending if blocks.cached_at[b] == lo[b][i]}
        _block_step(z, ctx, cache, active, blocks, top_k, ctx.options.order, untempered)
    return z


class _Blocks:
    """Per row: the block start its cache was last refreshed at, and whether that block has
    had a cached call since (Fast-dLLM's block loop makes at least one after the full pass)."""

    def __init__(self, batch: int):
        self.cached_at, self.pending = [-1] * batch, set()


def _threshold_blocks(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Fast-dLLM's threshold decoding (generate and its cached versions with `threshold`): each
    row fills its blocks of `block_length` after its first masked position left to right, with
    calls until its block has no mask; a call keeps the most confident drawn token of the block
    and every other whose probability is at least the threshold. With a cache, a block that
    its full pass filled still gets one cached call (revealing nothing): Fast-dLLM's NFE."""
    B, L = z.shape
    size, blocks = ctx.options.block_length, _Blocks(B)
    cache = None if ctx.options.cache == "none" else _new_cache(z, ctx)
    masked = (z == ctx.mask_id).cpu()
    lo = [int(m.nonzero()[0]) if m.any() else L for m in masked]

    def at_least(rows: list[int], cand: Tensor, conf: Tensor) -> Tensor:
        keep = cand & (conf >= ctx.options.threshold)
        keep[torch.arange(len(keep)), conf.argmax(1)] = True  # not a candidate: dropped after
        return keep

    while True:
        for b in range(B):
            while (lo[b] < L and b not in blocks.pending
                   and not masked[b, lo[b]:lo[b] + size].any()):
                lo[b] += size  # a block done: the next
        active = {b: lo[b] for b in range(B) if lo[b] < L}
        if not active:
            return z
        _block_step(z, ctx, cache, active, blocks, at_least, "maskgit_plus", False)
        masked = (z == ctx.mask_id).cpu()


def _block_step(z: Tensor, ctx: SamplerContext, cache, lo: dict[int, int], blocks: _Blocks,
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
        cand, drawn, conf = _block_draws(z, ctx, cache, rows, [lo[b] for b in rows], refresh,
                                         order, untempered)
        _reveal(z, torch.tensor(rows, device=z.device), cand & choose(rows, cand, conf), drawn)


def _block_draws(z: Tensor, ctx: SamplerContext, cache, rows: list[int], lo: list[int],
                 refresh: bool, order: str, untempered: bool) -> tuple[Tensor, Tensor, Tensor]:
    """A token drawn at every masked position of each row's block [lo, lo + block_length)
    from one call: a full pass (refreshing the rows' cache, if any), or a cached call on the
    rows' shared block (dual) or block and suffix (prefix). Returns, for the rows, (candidates,
    tokens, confidence), each (R, L), as `_draw_masked`."""
    size, idx = ctx.options.block_length, torch.tensor(rows, device=z.device)
    everyone = rows == list(range(len(z)))
    sub = z[idx]
    pos = torch.arange(z.shape[1], device=z.device)[None]
    start = torch.tensor(lo, device=z.device)[:, None]
    cand = (sub == ctx.mask_id) & (pos >= start) & (pos < start + size)
    if cache is None:
        where = torch.zeros_like(z, dtype=torch.bool).index_copy_(0, idx, cand)
        logits = ctx.logits(z, _times(z, ctx), where, idx)
    elif refresh:  # all rows in order: no copies of the cache
        logits = ctx.refresh_cache(z, cache, None if everyone else idx)[cand]
    else:
        s = lo[0]
        e = z.shape[1] if ctx.options.cache == "prefix" else min(s + size, z.shape[1])
        logits = ctx.cached_logits(z, cache, None if everyone else idx, s, e)[cand[:, s:e]]
    tokens, weights = ctx.draw_with_weights(logits, untempered)
    drawn = torch.zeros_like(sub).masked_scatter_(cand, tokens)
    conf = torch.full(cand.shape, float("-inf"), dtype=torch.float64, device=z.device)
    return cand, drawn, conf.masked_scatter_(cand, ORDERS[order](weights, tokens))
