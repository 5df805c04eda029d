"""Discrete-time absorbing D3PM (Austin et al. 2021) as MDLM's eq. 9 writes it: the full KL
between the true posterior and the model's over T steps, with the model's x_theta a
softmax over all V (the mask may get mass), and the reconstruction term.

A D3PM denoiser returns logits whose softmax over all V is x_theta(. | z_t) (its zero
masking, if any, already applied). With zero masking and carry-over (SUBS) the loss is
exactly MDLM's T-step term (eq. 9 -> eq. 8).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .ancestral import finish_masks
from .categorical import check_finite, reference_draw, token_weights
from .context import SamplerContext, rows_active
from .diffusion import (
    Masking,
    call_denoiser,
    mask_tokens,
    reconstruction_terms,
    sum_per_sequence,
)
from .protocols import Denoiser
from .schedules import Schedule


def posterior_kl(
    log_probs: Tensor, x0: Tensor, t: Tensor, s: Tensor, schedule: Schedule, mask_id: int
) -> Tensor:
    """KL(q(z_s | z_t = m, x0) || p_theta(z_s | z_t = m)) at N masked positions (eq. 9): nats
    (N,).

    The true posterior puts (alpha_s - alpha_t) / (1 - alpha_t) on x0 and the rest on the
    mask. The model's (D3PM's x0-parameterisation, sum over x0 of q(z_s, z_t | x0)
    x_theta(x0), where a mask "x0" stays masked) puts x_theta(y) (alpha_s - alpha_t) / N on
    y and (1 - alpha_s + alpha_s x_theta(m)) / N on the mask, N = 1 - alpha_t + alpha_t
    x_theta(m). `log_probs` (N, V) are log x_theta; t, s (N,) with s < t (s = 0 allowed).
    """
    t, s = t.double(), s.double()
    alpha_t, alpha_s = schedule.alpha(t), schedule.alpha(s)
    rate_t, rate_s = schedule.mask_rate(t), schedule.mask_rate(s)
    x_m = log_probs[:, mask_id].double().exp()
    log_x0 = log_probs.gather(-1, x0[:, None])[:, 0].double()
    log_norm = torch.log1p(alpha_t * x_m / rate_t)  # log(N / (1 - alpha_t))
    to_x0 = schedule.unmask_prob(t, s)
    stays = rate_s / rate_t
    safe_rate_s = torch.where(
        rate_s > 0, rate_s, torch.ones_like(rate_s)
    )  # at s = 0 nothing stays masked
    to_mask = torch.where(rate_s > 0,
                          stays * (log_norm - torch.log1p(alpha_s * x_m / safe_rate_s)),
                          torch.zeros_like(stays))
    return (to_x0 * (log_norm - log_x0) + to_mask).float()


def d3pm_terms(
    denoiser: Denoiser,
    x0: Tensor,
    t: Tensor,
    *,
    mask_id: int,
    schedule: Schedule,
    T: int,
    carry_over: bool = False,
    masking: Masking | None = None,
) -> Tensor:
    """One Monte-Carlo term of the T-step bound per sequence (eq. 9; the reference's
    `_d3pm_loss` + `_reconstruction_loss`), nats (B,): t (B,) on the grid {1/T, ..., 1},
    s = t - 1/T, T times the posterior KL summed over the masked positions, plus the
    t = 0 reconstruction term (a second forward pass on the clean input; none with
    carry-over where alpha(0) = 1)."""
    m = masking or Masking()
    z_t = mask_tokens(x0, schedule.mask_rate(t), mask_id, generator=m.generator,
                      attention_mask=m.noised)
    masked = z_t == mask_id
    logits = call_denoiser(
        denoiser, z_t, t, output_mask=masked, attention_mask=m.attention_mask
    )  # (N, V)
    per_position = lambda v: v[:, None].expand(masked.shape)[masked]  # noqa: E731 - (B,) -> (N,)
    kl = posterior_kl(logits.float().log_softmax(-1), x0[masked], per_position(t),
                      per_position((t - 1.0 / T).clamp_min(0.0)), schedule, mask_id)
    reconstruction = reconstruction_terms(
        denoiser,
        x0,
        mask_id=mask_id,
        schedule=schedule,
        carry_over=carry_over,
        zero_masking=False,
        masking=m,
    )
    return T * sum_per_sequence(kl, masked) + reconstruction


def d3pm_ancestral(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Ancestral sampling of eq. 9's model over `steps` steps from t = 1 to 0 (with steps = T its
    own chain): a masked position becomes y with weight x_theta(y) (alpha_s - alpha_t) and stays
    masked with weight 1 - alpha_s + alpha_s x_theta(m) (the reference's `_ddpm_update` drops the
    alpha_s x_theta(m) part, which its loss has). Masks left at t = 0 take the argmax over real
    tokens (final denoising) or one last draw. fp64: "whether" by a float64 Bernoulli, then
    the token; fp32: the reference's float32 draw over V + 1 classes."""
    times = torch.linspace(1.0, 0.0, ctx.steps + 1, dtype=torch.float64, device=z.device)
    alpha, rate = ctx.schedule.alpha(times), ctx.schedule.mask_rate(times)
    for i in range(ctx.steps):
        masked = z == ctx.mask_id
        span = masked.sum(1)
        span_host = span.tolist()
        if not max(span_host):
            break
        logits = ctx.logits(z, times[i], masked, rows_active(span, span_host, 0))  # (N, V)
        x_m = (logits[:, ctx.mask_id].float() - logits.float().logsumexp(-1)).double().exp()
        check_finite(x_m)
        to_tokens = (alpha[i + 1] - alpha[i]) * (1.0 - x_m)
        stays = rate[i + 1] + alpha[i + 1] * x_m
        if ctx.precision == "fp32":
            q = token_weights(logits, ctx.mask_id, **ctx.filters)
            q = q * (to_tokens / q.double().sum(-1)).float()[:, None]
            q[:, ctx.mask_id] = stays.float()
            ctx.stats.draws += q.shape[0]
            z[masked] = reference_draw(q, generator=ctx.generator)
            continue
        unmask = ctx.rand(x_m.shape, z.device) * (to_tokens + stays) < to_tokens
        if bool(unmask.any()):
            where = masked.clone()
            where[masked] = unmask
            z.masked_scatter_(where, ctx.draw(logits[unmask]))
    return finish_masks(z, ctx, times[-1], ctx.options.final_denoise)
