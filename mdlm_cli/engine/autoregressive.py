"""Left-to-right sampling of a causal language model, with a key/value cache or without.

The model is a `CausalLM` (engine/protocols.py): `lm.bos_id` (the start token put before
every row), `lm.new_cache(batch, max_len, device)` and `lm(tokens (B, n), cache) -> logits
(B, n, V)` for n new tokens after the cached ones. One network call per new token, each
processing only that token (the reference AR sampler recomputes the whole prefix at every step
and pre-allocates a B x L x V noise buffer). `autoregressive_recompute` is that reference
algorithm's cost without its buffer: every new token re-reads the whole prefix, so the timing
claims made against the reference's AR can be reproduced beside the cached sampler's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .context import SamplerContext
from .errors import EngineError
from .protocols import CausalLM


def prefix_length(z: Tensor, mask_id: int) -> int:
    """Length of the fixed prefix shared by every row of z (B, L); the rest must be free.
    A left-to-right model can only continue a prefix: a fixed token after a free one is an
    infill."""
    free = z == mask_id
    n = int(free[0].long().argmax()) if bool(free[0].any()) else z.shape[1]
    if bool(free[:, :n].any()) or not bool(free[:, n:].all()):
        raise EngineError(
            "an autoregressive model can only continue a prefix (the same length in every row); "
            "use --prompt, not --infill"
        )
    return n


@torch.no_grad()
def autoregressive(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Exact ancestral sampling token by token: one cached call and one draw per new token
    (the first call also reads BOS and the prompt)."""
    lm: CausalLM = ctx.denoiser
    B, L = z.shape
    n = prefix_length(z, ctx.mask_id)
    if n == L:
        return z
    cache = lm.new_cache(B, L, z.device)
    step_in = torch.cat(
        [torch.full((B, 1), lm.bos_id, dtype=torch.long, device=z.device), z[:, :n]], 1
    )
    for pos in range(n, L):
        ctx.count_call(z, B)
        logits = lm(step_in, cache)[:, -1]  # (B, V)
        z[:, pos] = ctx.draw(logits, (slice(None), pos))
        step_in = z[:, pos:pos + 1]
    return z


@torch.no_grad()
def autoregressive_recompute(z: Tensor, ctx: SamplerContext) -> Tensor:
    """The same law and draws as `autoregressive`, without a cache: the call for position
    `pos` reads BOS and all `pos` tokens before it afresh (the reference's `_ar_sampler`)."""
    lm: CausalLM = ctx.denoiser
    B, L = z.shape
    n = prefix_length(z, ctx.mask_id)
    bos = torch.full((B, 1), lm.bos_id, dtype=torch.long, device=z.device)
    for pos in range(n, L):
        # a fresh cache per call: nothing of the previous call is kept
        ctx.count_call(z, B)
        logits = lm(torch.cat([bos, z[:, :pos]], 1), lm.new_cache(B, pos + 1, z.device))[:, -1]
        z[:, pos] = ctx.draw(logits, (slice(None), pos))
    return z
