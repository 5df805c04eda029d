"""What the confidence samplers share (confidence.py, block_decoding.py, dream_blocks.py): a
token drawn at every candidate position with its confidence by an order (Dream's `alg` names),
and the rules that keep some of the draws.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .categorical import drawn_probs
from .context import SamplerContext

# How confident a drawn token is, from its row of weights (N, V) (the distribution it was
# drawn from, or LLaDA's untempered one), the token and `uniform(n)` (n float64 uniforms of the
# run's generator, drawn only by the random orders): Dream's `alg` names and LLaDA's
# `remasking`. `random` (LLaDA's remasking="random") keeps k masked positions uniformly at
# random; `origin` (Dream's alg="origin") reveals each masked position with probability
# 1 - s/t on Dream's grid, whatever k (confidence.py), its positions as `random`'s.
ORDERS = {
    "maskgit_plus": lambda w, tokens, uniform: drawn_probs(w, tokens),  # the drawn token's
    "topk_margin": lambda w, tokens, uniform: _margin(w),  # top-1 minus top-2 probability
    "entropy": lambda w, tokens, uniform: _neg_entropy(w),  # sum p log p: the flattest last
    "random": lambda w, tokens, uniform: uniform(len(tokens)),
    "origin": lambda w, tokens, uniform: uniform(len(tokens)),
}


def _margin(weights: Tensor) -> Tensor:
    top2 = weights.topk(2, dim=-1).values.double()
    return (top2[:, 0] - top2[:, 1]) / weights.double().sum(-1)


def _neg_entropy(weights: Tensor) -> Tensor:
    p = weights / weights.sum(-1, keepdim=True)
    return (p * (p + 1e-10).log()).sum(-1).double()  # as Dream: + 1e-10, summed in float32



def times_of(z: Tensor, ctx: SamplerContext) -> Tensor:
    """One time per sequence, where the schedule's mask rate equals its masked fraction
    (what a model with time conditioning expects; a time-agnostic one ignores it)."""
    frac = (z == ctx.mask_id).double().mean(1)
    return ctx.schedule.inverse(1.0 - frac).clamp(ctx.eps, 1.0)


def draw_masked(z: Tensor, ctx: SamplerContext, rows: Tensor | None, order: str = "maskgit_plus",
                 untempered: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """A token drawn at every masked position of the sequences `rows` (all if None) from one
    network call. Returns, for those sequences, (masked (R, L), tokens (R, L), confidence (R, L):
    the drawn token's by `order` (ORDERS) at masked positions, -inf elsewhere)."""
    masked = z == ctx.mask_id
    logits = ctx.logits(z, times_of(z, ctx), masked, rows)
    tokens, weights = ctx.draw_with_weights(logits, untempered)
    if rows is not None:
        masked = masked[rows]
    drawn = torch.zeros(masked.shape, dtype=torch.long, device=z.device).masked_scatter_(
        masked, tokens
    )
    conf = torch.full(masked.shape, float("-inf"), dtype=torch.float64, device=z.device)
    ranks = ORDERS[order](weights, tokens, lambda n: ctx.rand((n,), z.device))
    return masked, drawn, conf.masked_scatter_(masked, ranks)


def reveal(z: Tensor, rows: Tensor | None, chosen: Tensor, drawn: Tensor) -> None:
    """Write the drawn tokens at the chosen positions of the sequences `rows`, in place."""
    if rows is None:
        z[chosen] = drawn[chosen]
    else:
        sub = z[rows]
        sub[chosen] = drawn[chosen]
        z[rows] = sub


def most_confident(conf: Tensor, k: Tensor, ctx: SamplerContext) -> Tensor:
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

