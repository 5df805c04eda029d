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

from .block_decoding import cached_confidence, threshold_blocks
from .confident_draws import ORDERS, draw_masked, most_confident, reveal
from .context import SamplerContext
from .dream_blocks import dream_cached_confidence, dream_cached_threshold
from .options import option
from .protocols import has_shifted_logits
from .transfer import DREAM_EPS, K_SCHEDULES, TransferPlan, transfer_plan

# Fast-dLLM's block caches (models/block_cache.py): per block one full pass stores every
# position's keys and values; the calls after it run the block and the suffix (prefix) or the
# block only (dual), the other positions read from the cache.
CACHES = ("none", "prefix", "dual")


def _block_length() -> int:
    return option(0, "blocks of this many tokens after the prompt, filled left to right "
                  "(LLaDA's block_length; 0 = one block); confidence splits the steps evenly "
                  "over them.", low=0)


def cache_rules(options) -> list[tuple[str, str]]:
    """The rule across fields of the options that take a cache: a block cache is refreshed at
    the start of each block, so it needs blocks. (field, what is wrong; `{}` marks where each
    caller spells a setting's name, `{cache}` / `{block_length}`)."""
    if options.cache != "none" and not options.block_length:
        return [("cache", f"{{cache}} {options.cache} needs {{block_length}} (its cache is "
                          "refreshed at the start of each block)")]
    return []


def _cache() -> str:
    return option("none", "with --block-length: none (exact), or Fast-dLLM's block cache, "
                  "refreshed by a full pass at each block: prefix (later calls run the block "
                  "and the suffix) or dual (the block only); inexact, see docs/sampling.md.",
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
        "largest top-1 minus top-2 probability (topk_margin), lowest entropy (entropy), k "
        "uniformly random ones (random: LLaDA's remasking=\"random\"), or each with probability "
        "1 - s/t on Dream's grid, whatever the k-schedule (origin: Dream's alg=\"origin\"; no "
        "blocks, no cache).", choices=ORDERS)
    order_temperature: float = option(
        0.0, "0 keeps the k most confident; above 0 draws the k positions from "
        "softmax(confidence / this) (Dream's alg_temp).", low=0.0)
    cache: str = _cache()

    def rules(self) -> list[tuple[str, str]]:
        wrong = cache_rules(self)
        if self.order == "origin" and (self.block_length or self.cache != "none"):
            wrong.append(("order", "{order} origin is Dream's one-window loop: give no "
                                   "{block_length} and {cache} none"))
        return wrong


@dataclass(frozen=True)
class ThresholdOptions:
    threshold: float = option(
        0.9, "reveal each drawn token whose probability exceeds this (0 = all in one call); in "
        "blocks, Fast-dLLM's: at least this.", low=0.0, high=1.0)
    block_length: int = _block_length()
    cache: str = _cache()

    rules = cache_rules


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
    if opts.order == "origin":
        return origin(z, ctx)
    plan = transfer_plan(z == ctx.mask_id, ctx.steps, opts.k_schedule, opts.block_length)
    if opts.cache != "none":
        if has_shifted_logits(ctx.denoiser):  # Dream: Fast-dLLM's Dream loop
            return dream_cached_confidence(z, ctx)
        return cached_confidence(z, ctx, plan)
    for i in range(ctx.steps):
        k = plan.counts[:, i]
        active = k.nonzero()[:, 0]
        if not len(active):
            continue
        rows = None if len(active) == B else active.to(z.device)
        masked, drawn, conf = draw_masked(z, ctx, rows, opts.order, opts.k_schedule == "llada")
        inside = _in_block(plan, active, i, L, z.device)
        if inside is not None:
            masked = masked & inside
            conf = conf.masked_fill(~inside, float("-inf"))
        reveal(z, rows, masked & most_confident(conf, k[active].to(z.device), ctx), drawn)
    return z


def origin(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Dream's alg="origin": at step i of its grid t = linspace(1, 1e-3, steps + 1) each masked
    position is revealed with probability 1 - t_{i+1} / t_i (all at the last step), its token
    drawn from the model; MDLM's ancestral step on the log-linear schedule at Dream's times.
    One network call per step that reveals something (Dream calls at every step)."""
    t = torch.linspace(1, DREAM_EPS, ctx.steps + 1, dtype=torch.float64)
    for i in range(ctx.steps):
        masked = z == ctx.mask_id
        p = 1.0 if i == ctx.steps - 1 else float(1 - t[i + 1] / t[i])
        chosen = masked & (ctx.rand(z.shape, z.device) < p)
        active = chosen.any(1).nonzero()[:, 0]
        if not len(active):
            continue
        rows = None if len(active) == len(z) else active
        candidates, drawn, _ = draw_masked(z, ctx, rows, "maskgit_plus")
        reveal(z, rows, candidates & (chosen if rows is None else chosen[rows]), drawn)
    return z


def threshold(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Calls until nothing is masked; each keeps every drawn token whose probability exceeds
    `ctx.options.threshold`, and at least the most confident one. Threshold 0 reveals
    everything in one call, threshold 1 one token per call (a probability never exceeds 1).
    With `block_length`, Fast-dLLM's rule in blocks instead (`threshold_blocks`)."""
    if ctx.options.cache != "none" and has_shifted_logits(ctx.denoiser):
        return dream_cached_threshold(z, ctx)  # Dream: Fast-dLLM's Dream loop
    if ctx.options.block_length or ctx.options.cache != "none":
        return threshold_blocks(z, ctx)
    B = len(z)
    left = (
        (z == ctx.mask_id).sum(1).tolist()
    )  # read once per call: what a call reveals depends on the model
    while any(left):
        active = [b for b, n in enumerate(left) if n]
        rows = None if len(active) == B else torch.tensor(active, device=z.device)
        masked, drawn, conf = draw_masked(z, ctx, rows)
        chosen = masked & (conf > ctx.options.threshold)
        chosen[torch.arange(len(chosen), device=z.device), conf.argmax(1)] = True
        reveal(z, rows, chosen, drawn)
        left = (z == ctx.mask_id).sum(1).tolist()
    return z

