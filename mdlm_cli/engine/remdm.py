"""ReMDM (Wang et al. 2025, "Remasking Discrete Diffusion Models with Inference-Time
Scaling"): ancestral steps in which a revealed token may be masked again.

From t to s a revealed token is remasked with probability sigma_t, and a masked one
is revealed with probability (alpha_s - (1 - sigma_t) alpha_t) / (1 - alpha_t), with a
token from p_theta(. | z_t); the forward marginals q(z_t | x) stay MDLM's, so sigma_t = 0
is MDLM's ancestral sampler, and sigma_t <= sigma_max = min(1, (1 - alpha_s) / alpha_t)
keeps both probabilities in [0, 1]. Schedules of sigma_t (the paper's names): `cap`,
min(eta, sigma_max); `rescale`, eta * sigma_max. The paper's `conf` and `loop` variants
are not implemented. Positions fixed by a prompt are never remasked.

Inexact: at finite steps remasking changes the output distribution (the point is that
later, better-informed predictions can replace early tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .ancestral import ancestral_times, final_denoise_option, finish_masks
from .context import SamplerContext
from .options import option
from .schedules import Schedule

REMDM_SCHEDULES = {
    "cap": lambda eta, sigma_max: sigma_max.clamp(max=eta),
    "rescale": lambda eta, sigma_max: eta * sigma_max,
}


@dataclass(frozen=True)
class RemdmOptions:
    eta: float = option(0.008, "remasking strength eta (0 = ancestral).", low=0.0, high=1.0)
    remdm_schedule: str = option(
        "cap", "cap (sigma = min(eta, sigma_max)) or rescale (sigma = eta * sigma_max).",
        choices=REMDM_SCHEDULES)
    final_denoise: bool = final_denoise_option()


def remask_probs(times: Tensor, schedule: Schedule, eta: float, name: str) -> Tensor:
    """sigma_t of each step t_i -> t_i+1 (steps,) float64 (eta and the schedule's name
    checked with the options, RemdmOptions)."""
    alpha_t = 1.0 - schedule.mask_rate(times[:-1])
    rate_s = schedule.mask_rate(times[1:])
    sigma_max = torch.where(
        alpha_t > 0, rate_s / alpha_t.clamp_min(1e-300), torch.ones_like(rate_s)
    ).clamp(max=1.0)
    return REMDM_SCHEDULES[name](eta, sigma_max)


def remdm(z: Tensor, ctx: SamplerContext) -> Tensor:
    """ReMDM over the ancestral time grid; a network call only for the sequences that reveal
    a token in a step (remasking needs no network output), then the final step of ancestral.

    Whether a masked position is revealed is decided before its token, as in the ancestral
    sampler: each position holds a uniform u, drawn when it was (re)masked, and is revealed
    at the first step i where u >= S_i, S_i its probability of staying masked since then:
    rate(t_i+1) / rate(at (re)masking) times the product of (1 - sigma_j alpha(t_j) /
    rate(t_j+1)) over those steps (the product is 1 when sigma = 0, so eta = 0 draws, uniform
    for uniform, the tokens of `ancestral` in fp64).
    """
    times = ancestral_times(ctx.steps, ctx.eps, z.device)
    # computed as the ancestral sampler computes its survival, so that eta = 0 matches it bit
    # for bit
    rate_s, rate_t = (
        ctx.schedule.mask_rate(times[1:]),
        ctx.schedule.mask_rate(times[:-1]),
    )  # (steps,)
    sigma = remask_probs(times, ctx.schedule, ctx.options.eta, ctx.options.remdm_schedule)
    stay = (1.0 - sigma * (1.0 - rate_t) / rate_s).clamp(0.0, 1.0)  # the product's factors
    sigma_host = sigma.tolist()
    free = z == ctx.mask_id  # never remask a prompt's positions
    u = ctx.rand(z.shape, z.device)
    since = (
        ctx.schedule.mask_rate(times[:1]).expand(z.shape).clone()
    )  # rate when each was last masked
    product = torch.ones(z.shape, dtype=torch.float64, device=z.device)
    for i in range(ctx.steps):
        masked = z == ctx.mask_id
        if sigma_host[i] > 0:
            product.mul_(stay[i])
        reveal = masked & (u >= rate_s[i] / since * product)
        remask = (
            (free & ~masked & (ctx.rand(z.shape, z.device) < sigma_host[i]))
            if sigma_host[i] > 0
            else None
        )
        rows = reveal.any(1).nonzero()[:, 0]  # a network call only where a token is revealed
        if len(rows):
            z.masked_scatter_(reveal, ctx.draw(ctx.logits(z, times[i], reveal, rows)))
        if remask is not None:
            z.masked_fill_(remask, ctx.mask_id)
            u = torch.where(remask, ctx.rand(z.shape, z.device), u)
            since.masked_fill_(remask, float(rate_s[i]))
            product.masked_fill_(remask, 1.0)
    return finish_masks(z, ctx, times[-1], ctx.options.final_denoise)
