"""Categorical sampling, in float64 by default.

Zheng et al. (2024): Gumbel-max in float32 draws uniforms on a 2^-24 grid, so the
exponential noise E = -log u is never below ~6e-8 and a class whose probability
is below ~6e-8 of the leading class can never win. In an ancestral step the
leading class is "stay masked", so rare tokens vanish: a lower effective
temperature, a flattering generative perplexity. `fp32` reproduces exactly the
reference draw (probabilities / (-log(u + 1e-10)) in float32) for comparison.
"""

from __future__ import annotations

import torch
from torch import Tensor

PRECISIONS = ("fp64", "fp32")


def filter_logits(logits: Tensor, *, temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """Temperature, then nucleus filtering: keep the smallest set of classes whose
    probability reaches top_p (the most likely class is always kept)."""
    if temperature != 1.0:
        logits = logits / temperature
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_logits.softmax(-1) >= top_p  # mass before this class already enough
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def gumbel_argmax(log_weights: Tensor, *, generator: torch.Generator | None, precision: str = "fp64") -> Tensor:
    """One draw per row from unnormalised log-weights (..., V): argmax of w / E, E ~ Exp(1).

    fp64: the race in log space in float64 (no truncation worth the name).
    fp32: the reference's float32 recipe, truncation included.
    """
    if precision == "fp64":
        lw = log_weights.double()
        u = torch.rand(lw.shape, generator=generator, device=lw.device, dtype=torch.float64)
        e = -torch.log(u.clamp_min(torch.finfo(torch.float64).tiny))
        return (lw - torch.log(e)).argmax(dim=-1)
    if precision == "fp32":
        lw = log_weights.float()
        return reference_draw(torch.exp(lw - lw.amax(-1, keepdim=True)), generator=generator)
    raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")


def reference_draw(probs: Tensor, *, generator: torch.Generator | None) -> Tensor:
    """The reference implementation's float32 draw: argmax(p / (1e-10 - log(u + 1e-10)))."""
    probs = probs.float()
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=torch.float32)
    return (probs / (1e-10 - (u + 1e-10).log_())).argmax(dim=-1)


def inverse_cdf_draw(log_weights: Tensor, *, generator: torch.Generator | None) -> Tensor:
    """One draw per row from unnormalised float64 log-weights (N, V), overwritten in place:
    exp(lw - max), its running sum (the CDF, unnormalised), and a search for u times the row
    total with u ~ U(0, 1) in float64. One uniform per row, no division pass, and no fresh
    (N, V) temporaries: at V = 50k those cost more in page faults than the arithmetic."""
    w = log_weights
    w -= w.amax(-1, keepdim=True)
    w.exp_()
    w.cumsum_(-1)
    u = torch.rand((w.shape[0], 1), generator=generator, device=w.device, dtype=torch.float64)
    idx = torch.searchsorted(w, u.mul_(w[:, -1:]), right=True)[:, 0]
    return idx.clamp_max_(w.shape[-1] - 1)


def sample_tokens(logits: Tensor, mask_id: int, *, generator: torch.Generator | None,
                  precision: str = "fp64", temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """Tokens from p_theta (SUBS: the mask is never drawn) at N positions: logits (N, V) -> (N,).

    fp64: inverse CDF in float64 on a float64 copy of the logits (exact to float64 rounding,
    and cheap at large V: one uniform per row). fp32: the reference's float32 race,
    truncation included.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    filtered = temperature != 1.0 or top_p < 1.0
    if precision == "fp64":
        lw = logits.to(torch.float64, copy=True)
        lw[:, mask_id] = float("-inf")
        if filtered:
            lw = filter_logits(lw, temperature=temperature, top_p=top_p)
        return inverse_cdf_draw(lw, generator=generator)
    if filtered:
        logits = logits.float().index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf"))
        probs = filter_logits(logits, temperature=temperature, top_p=top_p).softmax(-1)
    else:  # softmax straight into float32, then zero the mask (the race is scale-free)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        probs[:, mask_id] = 0.0
    return reference_draw(probs, generator=generator)
