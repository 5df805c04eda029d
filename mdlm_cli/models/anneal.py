"""Attention-mask annealing (DiffuLLaMA, Gong et al. 2025, "Scaling Diffusion Language Models
via Adaptation from Autoregressive Models"): while a converted causal LM is fine-tuned into a
diffusion model, each training pass attends through the causal mask OR a random mask that lets
a query see any key with probability `ratio`, the ratio rising with the step until attention is
full. The model moves from the attention it was trained with to diffusion's by degrees.

As DiffuLLaMA's trainer (LLaMA-Factory's ddm trainer, `get_anneal_attn_mask`): one Bernoulli
draw per (query, key) pair, shared by every row of the batch, a new one at each pass; the ratio
at step s (counted from 0) is min(1, (s + 1) / steps). Here the draws come from the step's own
stream (train/step.py), so a resumed run draws the same masks.

Training only: a backbone that anneals (`anneals_attention`, models/protocols.py) reads
`attention_anneal` in training mode alone; evaluation and sampling use its own attention (full
once annealed). At ratio 1 the annealed mask is the model's own: `keys` gives None.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def anneal_ratio(step: int, steps: int) -> float:
    """The share of the non-causal (query, key) pairs attended at training step `step`
    (0-based) of a `steps`-step anneal: min(1, (step + 1) / steps), DiffuLLaMA's schedule."""
    return min(1.0, (step + 1) / steps)


@dataclass(frozen=True)
class AttentionAnneal:
    """One training pass's anneal: the ratio and the generator of its Bernoulli draws."""

    ratio: float
    generator: torch.Generator | None = None

    def allowed(self, length: int, device) -> Tensor | None:
        """(L, L) bool, True = attend: causal (keys <= the query, its own included, so no row is
        empty) OR Bernoulli(ratio), one draw for the whole batch; None at ratio >= 1 (full)."""
        if self.ratio >= 1.0:
            return None
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        if self.ratio <= 0.0:
            return causal
        drawn = torch.rand(length, length, generator=self.generator, device=device)
        return causal | (drawn < self.ratio)


def set_attention_anneal(model: torch.nn.Module, anneal: AttentionAnneal | None) -> None:
    """Give a backbone that anneals (`anneals_attention`) the next training passes' anneal
    (None: its own attention). A ratio of 1 is stored as None: nothing left to anneal."""
    model.attention_anneal = None if anneal is None or anneal.ratio >= 1.0 else anneal
