"""Block diffusion (BD3-LM, Arriola et al. 2025): an autoregressive model over blocks of L'
tokens with masked diffusion inside each block.

The NELBO is a sum over blocks b of the masked-diffusion bound of block b given the clean
blocks before it (the paper's block NELBO). All blocks are trained in one pass of the network
over the concatenation [x_t, x_0] (length 2L) under `block_attention_mask`: a noisy block
sees itself and the clean blocks before it, a clean block the clean blocks up to itself.
Each block draws its own time t_b (`block_times`).

The block denoiser is a callable `denoiser(z_t (B, L), x0 (B, L), *, output_mask=,
attention_mask=) -> logits` ((N, V) at the N True `output_mask` positions of z_t); the
objective (objectives/bd3lm.py) builds it over a backbone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .diffusion import Masking, mask_tokens, masked_nll, sample_times
from .schedules import Schedule

BlockDenoiser = Callable[..., Tensor]


def block_attention_mask(length: int, block_size: int,
                         device: torch.device | str | None = None) -> Tensor:
    """Which key each query attends over [x_t, x_0] (2L, 2L) bool, True = attend.

    Positions 0..L-1 are x_t, L..2L-1 are x_0, block index (position mod L) // L':
    block diagonal (x_t block b -> x_t block b; x_0 block b -> x_0 block b), offset
    block-causal (x_t block b -> x_0 blocks < b) and block-causal (x_0 block b -> x_0 blocks
    < b). Clean tokens never attend noisy ones, so x_0's states are those of a block-causal
    pass over x_0 alone: what a key/value cache of finished blocks holds at sampling time.
    """
    index = torch.arange(2 * length, device=device)
    clean = index >= length
    block = (index % length) // block_size
    q_clean, k_clean = clean[:, None], clean[None, :]
    q_block, k_block = block[:, None], block[None, :]
    diagonal = (q_block == k_block) & (q_clean == k_clean)
    offset_causal = (q_block > k_block) & k_clean & ~q_clean
    causal = (q_block > k_block) & k_clean & q_clean
    return diagonal | offset_causal | causal


def block_times(n: int, num_blocks: int, generator: torch.Generator, *, low: float,
                high: float = 1.0, antithetic: bool = True) -> Tensor:
    """One time per block (n, num_blocks), uniform on [low, high]: u antithetic over all the
    n x num_blocks blocks of the set (the reference stratifies over batch and blocks too)."""
    u = sample_times(n * num_blocks, generator=generator, antithetic=antithetic,
                     device=generator.device).view(n, num_blocks)
    return low + (high - low) * u


def block_rates(t: Tensor, schedule: Schedule, block_size: int,
                length: int | None = None) -> tuple[Tensor, Tensor]:
    """Per-position mask rate and NELBO weight (B, L) of per-block times t (B, K): rows of
    `length` tokens (default K L'; a shorter row, its last block partial, reads the first
    blocks' times).

    With L' = 1, a block at t = 1 is the exact NLL term: the token is always masked and its
    weight is 1 (the reference's full masking for its L' = 1 likelihood), where the schedule's
    floor alpha(1) = eps would leave it clean with probability eps.
    """
    length = t.shape[1] * block_size if length is None else length
    t = t[:, torch.arange(length, device=t.device) // block_size]  # (B, L)
    rate, weight = schedule.mask_rate(t), schedule.loss_weight(t)
    if block_size == 1:
        full = t >= 1.0
        rate = torch.where(full, torch.ones_like(rate), rate)
        weight = torch.where(full, torch.ones_like(weight), weight)
    return rate, weight


def block_nelbo_tokens(denoiser: BlockDenoiser, x0: Tensor, t: Tensor, *, mask_id: int,
                       schedule: Schedule, block_size: int,
                       masking: Masking | None = None) -> Tensor:
    """The block NELBO's Monte-Carlo term at each position (B, L), nats: w(t_b) * -log
    p_theta(x0_l | z_t of block b, x0 of the blocks before b) where position l (in block b) is
    masked, 0 elsewhere. Summed over a row it is one estimate of the row's bound.

    t (B, K): one time per block (K = L / L'). `masking` as in `nelbo_terms`: its targets
    only are masked and scored, the rest is clean context.
    """
    m = masking or Masking()
    rate, weight = block_rates(t, schedule, block_size, x0.shape[1])
    z_t = mask_tokens(x0, rate, mask_id, generator=m.generator, attention_mask=m.attention_mask,
                      targets=m.targets)
    masked = z_t == mask_id
    logits = denoiser(z_t, x0, output_mask=masked, attention_mask=m.attention_mask)  # (N, V)
    nll = masked_nll(logits, x0[masked], mask_id)  # (N,)
    per_token = torch.zeros(x0.shape, device=x0.device, dtype=nll.dtype)
    return per_token.masked_scatter_(masked, weight[masked].to(nll.dtype) * nll)
