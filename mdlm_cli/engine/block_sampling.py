"""Block-by-block sampling of a block diffusion model (BD3-LM, Arriola et al.):
each block of L' tokens starts fully masked and is denoised by MDLM's ancestral step given
the finished blocks, then joins them; generation stops once every row has drawn EOS.

The model side is a `BlockModel`: `start` a batch, `logits` of a noisy block given the
finished blocks (nothing kept), `commit` a finished block. Attention is block-causal, so a
finished block's keys and values never change: a key/value cache of them is exact, and the
cached and the recomputing models give the same tokens under one generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from .categorical import sample_tokens
from .schedules import Schedule


class BlockModel(Protocol):
    def start(self, batch: int, max_len: int, device: torch.device) -> None: ...

    def logits(self, block: Tensor) -> Tensor:
        """(B, L', V) of the noisy block (B, L') after the finished blocks."""
        ...

    def commit(self, block: Tensor) -> None:
        """The finished block (B, L') becomes context of the next ones."""
        ...


@dataclass
class BlockSamples:
    tokens: Tensor  # (B, n): the blocks drawn (n a multiple of L')
    lengths: Tensor  # (B,) tokens up to and including the first EOS; n where none was drawn
    ended: Tensor  # (B,) bool: the row drew EOS


def denoise_block(model: BlockModel, batch: int, block_size: int, *, steps: int, mask_id: int,
                  schedule: Schedule, generator: torch.Generator | None,
                  device: torch.device) -> Tensor:
    """One block (B, L') by `steps` ancestral steps t = k / steps -> (k - 1) / steps: a masked
    position is revealed with probability (alpha_s - alpha_t) / (1 - alpha_t) (all at the
    last step), its token drawn from p_theta (float64 draw)."""
    z = torch.full((batch, block_size), mask_id, dtype=torch.long, device=device)
    for k in range(steps, 0, -1):
        masked = z == mask_id
        if not bool(masked.any()):
            break
        t, s = torch.tensor(k / steps), torch.tensor((k - 1) / steps)
        u = torch.rand(z.shape, generator=generator, device=device)
        reveal = masked if k == 1 else masked & (u < float(schedule.unmask_prob(t, s)))
        logits = model.logits(z)  # (B, L', V)
        if bool(reveal.any()):
            drawn = sample_tokens(logits[reveal], mask_id, generator=generator)
            z = z.masked_scatter(reveal, drawn)
    return z


def sample_blocks(model: BlockModel, *, num_samples: int, length: int, block_size: int,
                  steps: int, mask_id: int, schedule: Schedule,
                  generator: torch.Generator | None, device: torch.device,
                  eos_id: int | None = None) -> BlockSamples:
    """Up to `length` tokens per row (any length, a multiple of L': the positions go on past
    the training length), block after block; with `eos_id`, stops after the block in which
    the last row drew EOS (the rows that ended earlier are cut at their EOS by `lengths`)."""
    model.start(num_samples, length, device)
    blocks, ended = [], torch.zeros(num_samples, dtype=torch.bool, device=device)
    for _ in range(length // block_size):
        block = denoise_block(model, num_samples, block_size, steps=steps, mask_id=mask_id,
                              schedule=schedule, generator=generator, device=device)
        model.commit(block)
        blocks.append(block)
        if eos_id is not None:
            ended |= (block == eos_id).any(dim=1)
            if bool(ended.all()):
                break
    tokens = torch.cat(blocks, dim=1)
    n = tokens.shape[1]
    is_eos = tokens == eos_id if eos_id is not None else torch.zeros_like(tokens, dtype=torch.bool)
    first = torch.where(is_eos, torch.arange(n, device=device), n).min(dim=1).values
    return BlockSamples(tokens, torch.where(ended, first + 1, n), ended)
