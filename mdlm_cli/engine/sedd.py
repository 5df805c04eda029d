"""SEDD (Lou et al. 2024, "Discrete Diffusion Modeling by Estimating the Ratios of the Data
Distribution"), absorbing graph: its score parameterisation, the denoising score entropy
and its two samplers, as the MDLM reference implements them (`_sedd_parameterization`,
`_score_entropy`, `_analytic_update`, `_denoiser_update`; SEDD's own `sampling.py`).

The network gives log concrete scores: at a masked position, log s(y) estimates
log p_t(z with y there) - log p_t(z), which for the absorbing process is
log k(t) + log p(x_l = y | unmasked rest), k = alpha / (1 - alpha) = 1 / expm1(sigma).
A *score model* is a denoiser with a method `log_score(z_t, t, output_mask=) -> (N, V)`
giving those at the N masked positions of `output_mask`; any plain (SUBS) denoiser is
converted by `SamplerContext.log_score`, so the samplers here serve MDLM models too.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .ancestral import ancestral_times
from .categorical import check_finite, reference_draw, token_weights
from .context import SamplerContext, rows_active
from .diffusion import Masking, mask_tokens, sum_per_sequence
from .schedules import Schedule


def sedd_log_score(logits: Tensor, z: Tensor, log_k: Tensor) -> Tensor:
    """SEDD's parameterisation (`scale_by_sigma`): logits (N, V) at N positions whose tokens
    are z (N,), log k(t) (N,) -> log-scores (N, V), float32.

    log s = logits + log k - log(V - 1): a network output of 0 is the score of a uniform
    denoiser; the entry of the observed token is 0 (a ratio of a state to itself).
    """
    log_score = logits.float() + (log_k.float() - math.log(logits.shape[-1] - 1))[:, None]
    return log_score.scatter(-1, z[:, None], 0.0)


def score_entropy(log_score: Tensor, x0: Tensor, log_k: Tensor, mask_id: int) -> Tensor:
    """Denoising score entropy at N masked positions (Lou et al. eq. (5), absorbing graph):
    sum_{y != mask} s(y) - k log s(x0) + k (log k - 1), with k = alpha / (1 - alpha) the true
    ratio for the clean token x0 (N,). Non-negative, 0 iff s(x0) = k and s(y) = 0 elsewhere.

    Written as sum_y s(y) - k (1 + log s(x0) - log k), in float64 where the terms of size k
    (1000 near t = 0) cancel.
    """
    mask = torch.tensor([mask_id], device=log_score.device)
    positive = log_score.index_fill(-1, mask, float("-inf")).logsumexp(-1).double().exp()
    at_x0 = log_score.gather(-1, x0[:, None])[:, 0].double()
    log_k = log_k.double()
    return positive - log_k.exp() * (1.0 + at_x0 - log_k)


def score_entropy_terms(
    scorer,
    x0: Tensor,
    t: Tensor,
    *,
    mask_id: int,
    schedule: Schedule,
    masking: Masking | None = None,
) -> Tensor:
    """One Monte-Carlo term of SEDD's bound per sequence, nats (B,): x0 masked at time t (B,)
    (eq. 4), score entropy summed over the masked positions, times dsigma/dt (the
    reference's `dsigma * _score_entropy`). With the exact score it equals MDLM's term:
    dsigma k = -alpha' / (1 - alpha)."""
    m = masking or Masking()
    z_t = mask_tokens(x0, schedule.mask_rate(t), mask_id, generator=m.generator,
                      attention_mask=m.noised)
    masked = z_t == mask_id
    log_score = scorer.log_score(
        z_t, t, output_mask=masked, attention_mask=m.attention_mask
    )  # (N, V)
    log_k = schedule.log_odds(t.double())[:, None].expand(masked.shape)[masked]
    entropy = score_entropy(log_score, x0[masked], log_k, mask_id).float()  # (N,)
    return schedule.dsigma(t).to(entropy.dtype) * sum_per_sequence(entropy, masked)


# ----------------------------------------------------------------------------- samplers

def _leap(z: Tensor, ctx: SamplerContext, t: Tensor, rate: Tensor, rows: Tensor | None) -> None:
    """One reverse step at the masked positions of z, in place: each unmasks with probability
    min(rate * sum_{y != mask} s(y), 1) and then takes y with probability proportional to s(y).

    That is the analytic step's law (the staggered score times the transposed transition,
    rate = expm1(dsigma)) or the Euler step's (rate = dt dsigma/dt); where the reference's
    "stay masked" weight 1 - rate S would be negative, it never wins its draw, as here.
    """
    masked = z == ctx.mask_id
    log_score = ctx.log_score(z, t, masked, rows)  # (N, V)
    if not log_score.shape[0]:
        return
    mask = torch.tensor([ctx.mask_id], device=z.device)
    if (
        ctx.precision == "fp32"
    ):  # the reference's single float32 draw over V real tokens + "stay masked"
        probs = token_weights(log_score, ctx.mask_id, **ctx.filters)
        total = rate * log_score.index_fill(-1, mask, float("-inf")).logsumexp(-1).double().exp()
        probs = probs * (total / probs.double().sum(-1)).float()[:, None]
        probs[:, ctx.mask_id] = (1.0 - total).float()
        ctx.stats.draws += probs.shape[0]
        z[masked] = reference_draw(probs, generator=ctx.generator)
        return
    total = (
        rate * log_score.index_fill(-1, mask, float("-inf")).logsumexp(-1).double().exp()
    )  # (N,)
    check_finite(total)
    unmask = ctx.rand(total.shape, z.device) < total  # "whether" first, in float64
    if bool(unmask.any()):
        where = masked.clone()
        where[masked] = unmask
        z.masked_scatter_(where, ctx.draw(log_score[unmask]))


def _denoise(z: Tensor, ctx: SamplerContext, t: Tensor) -> None:
    """The final denoising step at t = eps (Lou et al.'s `Denoiser`, the reference's
    `_denoiser_update`): every mask left takes y with probability proportional to s(y)."""
    masked = z == ctx.mask_id
    rows = masked.any(1).nonzero()[:, 0]
    if not len(rows):
        return
    log_score = ctx.log_score(z, t, masked, rows)
    if ctx.precision == "fp32":
        ctx.stats.draws += log_score.shape[0]
        weights = token_weights(log_score, ctx.mask_id, **ctx.filters)
        z[masked] = reference_draw(weights, generator=ctx.generator)
    else:
        z[masked] = ctx.draw(log_score)


def _score_sampler(z: Tensor, ctx: SamplerContext, euler: bool) -> Tensor:
    times = ancestral_times(ctx.steps, ctx.eps, z.device)  # 1 -> eps, as SEDD and the reference
    sigma = ctx.schedule.sigma(times)
    for i in range(ctx.steps):
        span = (z == ctx.mask_id).sum(1)  # a row needs the network while it holds a mask
        span_host = span.tolist()
        if not max(span_host):
            break
        if euler:
            rate = (times[i] - times[i + 1]) * ctx.schedule.dsigma(times[i])
        else:
            rate = torch.expm1(sigma[i] - sigma[i + 1])
        _leap(z, ctx, times[i], rate, rows_active(span, span_host, 0))
    _denoise(z, ctx, times[-1])
    return z


def analytic(z: Tensor, ctx: SamplerContext) -> Tensor:
    """SEDD's analytic sampler (Tweedie tau-leaping) with its final denoising step: one network
    call per step for every sequence with a mask left. For a SUBS model the unmasking
    probability is exactly the ancestral sampler's, (alpha_s - alpha_t) / (1 - alpha_t)."""
    return _score_sampler(z, ctx, euler=False)


def euler(z: Tensor, ctx: SamplerContext) -> Tensor:
    """SEDD's Euler sampler: the reverse rate dsigma/dt s(y) integrated over one step, then the
    same final denoising step."""
    return _score_sampler(z, ctx, euler=True)
