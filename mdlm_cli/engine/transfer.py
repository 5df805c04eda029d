"""How many tokens each step of the `confidence` sampler reveals, and where: the k-schedules
(`K_SCHEDULES`) and the blocks of LLaDA's semi-autoregressive generation (`transfer_plan`).

A k-schedule maps the masked counts of the sequences and a number of steps to the tokens each
sequence reveals at each step, (B, steps), each row summing to its count:
- `linear`: the masked count left after step i of N is floor(n (1 - i/N));
- `cosine`: floor(n cos(pi/2 i/N)), few first and more later (MaskGIT's schedule);
- `llada`: LLaDA's `get_num_transfer_tokens`: n // N at every step, one more at the first
  n % N steps;
- `dream`: Dream's `diffusion_generate` grid t_i = linspace(1, 1e-3, N + 1) (float32, as its
  code): step i reveals int(m (1 - t_{i+1} / t_i)) of the m still masked, the last step all
  that are left. Dream averages m over the batch (its rows share one count); here each row
  has its own, which is Dream's count exactly for one sequence (or rows of equal counts).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import EngineError

DREAM_EPS = 1e-3  # the last time of Dream's grid (its generation config's `eps`)


def _fraction_counts(n_masked: list[int], steps: int, left: Callable[[float], float]) -> Tensor:
    """Counts from the fraction still masked after step i, `left(i / steps)`, floored."""
    f = torch.tensor([left(i / steps) for i in range(steps + 1)], dtype=torch.float64)
    n = torch.tensor(n_masked, dtype=torch.float64)[:, None]
    kept = torch.floor(n * f + 1e-9).long().clamp(min=0)  # + 1e-9: 0.7 * 10 is 7, not 6.999...
    kept[:, 0], kept[:, -1] = n[:, 0].long(), 0
    kept = torch.cummin(kept, dim=1).values  # never more masked than before
    return kept[:, :-1] - kept[:, 1:]


def _linear(n_masked: list[int], steps: int) -> Tensor:
    return _fraction_counts(n_masked, steps, lambda s: 1.0 - s)


def _cosine(n_masked: list[int], steps: int) -> Tensor:
    return _fraction_counts(n_masked, steps, lambda s: math.cos(math.pi / 2 * s))


def _llada(n_masked: list[int], steps: int) -> Tensor:
    n = torch.tensor(n_masked, dtype=torch.long)[:, None]
    first = torch.arange(steps)[None] < (n % steps)  # the remainder goes to the first steps
    return n // steps + first.long()


def _dream(n_masked: list[int], steps: int) -> Tensor:
    t = torch.linspace(1, DREAM_EPS, steps + 1)  # float32, as Dream's (its ratios are float32)
    left = torch.tensor(n_masked, dtype=torch.long)
    out = torch.zeros(len(n_masked), steps, dtype=torch.long)
    for i in range(steps - 1):
        # Dream: int(mask_index.sum() / batch * (1 - s / t)), float32, truncated
        out[:, i] = (left.float() * (1 - t[i + 1] / t[i])).long()
        left = left - out[:, i]
    out[:, -1] = left  # the last step reveals all that are left
    return out


K_SCHEDULES = {"linear": _linear, "cosine": _cosine, "llada": _llada, "dream": _dream}


def reveal_counts(n_masked: list[int], steps: int, k_schedule: str) -> Tensor:
    """Tokens each sequence reveals at each step, (B, steps) long on the host, by the
    k-schedule named. A step that reveals nothing for a sequence costs it no network call."""
    return K_SCHEDULES[k_schedule](n_masked, steps)


@dataclass
class TransferPlan:
    """Per sequence and step: the tokens to reveal, and the block [lo, hi) they are chosen
    in (None: anywhere, one block over the whole sequence)."""

    counts: Tensor  # (B, steps) long, host
    lo: Tensor | None = None  # (B, steps) long, host
    hi: Tensor | None = None


def transfer_plan(masked: Tensor, steps: int, k_schedule: str,
                  block_length: int) -> TransferPlan:
    """The plan for masked positions `masked` (B, L) bool. `block_length` 0: one block. Else
    LLaDA's blocks: each sequence's span, from its first masked position to the end, is cut
    into blocks of `block_length` (the last one shorter where it does not divide), filled left
    to right, `steps` split evenly over them (refused unless the blocks divide the steps, as
    LLaDA's `generate` asserts), each block's counts by the k-schedule over its steps."""
    masked = masked.cpu()
    if not block_length:
        return TransferPlan(reveal_counts(masked.sum(1).tolist(), steps, k_schedule))
    B, L = masked.shape
    counts, lo = torch.zeros(B, steps, dtype=torch.long), torch.zeros(B, steps, dtype=torch.long)
    for b in range(B):
        where = masked[b].nonzero()[:, 0]
        if not len(where):
            continue
        start = int(where[0])
        blocks = -(-(L - start) // block_length)
        if steps % blocks:
            raise EngineError(
                f"steps ({steps}) must be a multiple of the number of blocks ({blocks}: "
                f"{L - start} tokens after the prompt in blocks of {block_length}), as LLaDA's "
                "generate asserts")
        per = steps // blocks
        edges = [start + j * block_length for j in range(blocks)]
        n = [int(masked[b, e:e + block_length].sum()) for e in edges]
        counts[b] = reveal_counts(n, per, k_schedule).reshape(-1)
        lo[b] = torch.tensor(edges).repeat_interleave(per)
    return TransferPlan(counts, lo, (lo + block_length).clamp(max=L))
