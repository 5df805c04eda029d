"""Masked diffusion: forward masking, SUBS, the NELBO and its time sampler.

The model is a `Denoiser` (engine/protocols.py): `denoiser(z_t (B, L) long, t (B,) float)
-> logits (B, L, V)`, V including the mask token; the engine applies SUBS itself. Its
optional `supports_output_mask` lets the loss ask for the masked positions only, and an
`attention_mask` (when given) is passed on as a keyword argument. The losses take a batch's
generator, padding and likelihood targets together, as a `Masking`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .errors import EngineError
from .protocols import Denoiser, computes_nll, supports_output_mask
from .schedules import Schedule, get_schedule


def sample_times(n: int, *, generator: torch.Generator | None = None, antithetic: bool = True,
                 device: torch.device | str | None = None) -> Tensor:
    """n uniform draws u in [0, 1).

    Antithetic (low-discrepancy, app. D.3): u_i = (u_0 + i/n) mod 1, one draw in each
    of the n strata, then shuffled so that any slice of the result (a micro-batch,
    a rank's share) spreads over [0, 1). Draw once for the GLOBAL batch and slice:
    the reference stratifies each micro-batch separately instead.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    if not antithetic:
        return torch.rand(n, generator=generator, device=device)
    u0 = torch.rand(1, generator=generator, device=device)
    u = (u0 + torch.arange(n, device=device) / n) % 1.0
    return u[torch.randperm(n, generator=generator, device=device)]


def times_from_uniform(u: Tensor, schedule: Schedule, T: int = 0) -> Tensor:
    """Map u ~ U[0, 1) to diffusion time.

    Continuous (T = 0): t in [t_min, 1]. Discrete (T > 0): t = floor(u T)/T + 1/T,
    the grid {1/T, ..., 1} of the T-step bound.
    """
    if T > 0:
        return torch.floor(u * T) / T + 1.0 / T
    return schedule.t_min + (1.0 - schedule.t_min) * u


def loss_weight(t: Tensor, schedule: Schedule, T: int = 0) -> Tensor:
    """Per-token NELBO weight at time t: -alpha'/(1 - alpha), or its T-step version."""
    return schedule.discrete_loss_weight(t, T) if T > 0 else schedule.loss_weight(t)


def mask_tokens(x0: Tensor, mask_rate: Tensor, mask_id: int, *,
                generator: torch.Generator | None = None,
                attention_mask: Tensor | None = None, targets: Tensor | None = None) -> Tensor:
    """Forward process q(z_t | x) (eq. 4): mask each token independently with
    probability `mask_rate` (B,), or (B, L) one per position (block diffusion's per-block
    times). Padding (attention_mask == 0) is never masked; with `targets` (B, L) bool, only
    target positions are (the rest is clean context)."""
    u = torch.rand(x0.shape, generator=generator, device=x0.device)
    masked = u < (mask_rate if mask_rate.dim() == 2 else mask_rate[:, None])
    if attention_mask is not None:
        masked &= attention_mask.bool()
    if targets is not None:
        masked &= targets.bool()
    return torch.where(masked, torch.full_like(x0, mask_id), x0)


def noised_positions(attention_mask: Tensor | None, targets: Tensor | None) -> Tensor | None:
    """The positions the forward process may mask (B, L) bool: real tokens (attention_mask)
    that are likelihood targets; None = all. The others are clean context, never noised."""
    if targets is None:
        return attention_mask
    return targets.bool() if attention_mask is None else targets.bool() & attention_mask.bool()


@dataclass(frozen=True)
class Masking:
    """How the forward process masks a batch x0 (B, L): the `generator` of its draws (None:
    torch's global one), the real tokens (`attention_mask` (B, L), 1 = real: padding is never
    masked nor scored) and the likelihood targets (`targets` (B, L) bool: only they are masked
    and scored; the other real tokens are clean context, attended but never noised). None:
    every position."""

    generator: torch.Generator | None = None
    attention_mask: Tensor | None = None
    targets: Tensor | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        a, t = self.attention_mask, self.targets
        if a is not None and t is not None and a.shape != t.shape:
            raise EngineError(f"attention_mask {tuple(a.shape)} and targets {tuple(t.shape)} "
                              "must have one shape (B, L)")

    @property
    def noised(self) -> Tensor | None:
        """The positions the forward process may mask (`noised_positions`)."""
        return noised_positions(self.attention_mask, self.targets)


def subs_log_probs(logits: Tensor, z_t: Tensor, mask_id: int) -> Tensor:
    """SUBS parameterisation (§3.2.3, eq. 7), out of place.

    The mask token is never an output (its logit is -inf) and every unmasked
    position of z_t is a point mass on its observed token. Returns float32 log-probs
    (B, L, V), computed in one (B, L, V) buffer: a copy of the logits, normalised and
    edited in place.
    """
    log_probs = logits.to(torch.float32, copy=True)
    log_probs[..., mask_id] = float("-inf")
    torch.log_softmax(log_probs, dim=-1, out=log_probs)
    carried = (z_t != mask_id)[..., None]  # (B, L, 1)
    log_probs.masked_fill_(carried, float("-inf"))
    # point mass on the observed token; at masked positions z_t is the mask, whose entry is
    # -inf already
    return log_probs.scatter_(-1, z_t[..., None], torch.where(carried, 0.0, float("-inf")))


def without_mask(logits: Tensor, mask_id: int) -> Tensor:
    """Float32 logits (..., V) with the mask's logit -inf, out of place: the mask is never
    an output (SUBS's zero masking; never a real token for a causal model)."""
    mask = torch.tensor([mask_id], device=logits.device)
    return logits.float().index_fill(-1, mask, float("-inf"))


def masked_nll(logits: Tensor, targets: Tensor, mask_id: int) -> Tensor:
    """-log p_theta(target) under SUBS at masked positions: logits (N, V), targets (N,).

    Equal to gathering `subs_log_probs` at masked positions, without materialising
    the carried-over rows (they contribute exactly zero).
    """
    return F.cross_entropy(without_mask(logits, mask_id), targets, reduction="none")


def sum_per_sequence(values: Tensor, positions: Tensor) -> Tensor:
    """Values (N,) at the N True `positions` (B, L), row-major, summed per row: (B,), in
    their dtype; every other position counts zero."""
    per_token = torch.zeros(positions.shape, device=values.device, dtype=values.dtype)
    return per_token.masked_scatter_(positions, values).sum(dim=1)


def subs_log_score(logits: Tensor, log_k: Tensor, mask_id: int) -> Tensor:
    """A SUBS denoiser as a concrete score at masked positions (the reference's `get_score`):
    logits (N, V) and log k (N,) -> log-scores (N, V) in float32.

    For the absorbing process the score of a masked position is the ratio of the
    probabilities of z with that position set to y and of z itself:
    s(y) = k(t) p_theta(y | z_t), k = alpha / (1 - alpha) (`Schedule.log_odds`), and
    s(mask) = 1 (log 0): what score-based samplers (SEDD's analytic step) read.
    """
    mask = torch.tensor([mask_id], device=logits.device)
    log_p = logits.float().index_fill(-1, mask, float("-inf")).log_softmax(-1)
    return (log_p + log_k.float()[:, None]).index_fill_(-1, mask, 0.0)


def call_denoiser(denoiser: Denoiser, z_t: Tensor, t: Tensor, *,
                  output_mask: Tensor | None = None,
                  attention_mask: Tensor | None = None) -> Tensor:
    """Logits at `output_mask` positions (N, V) if given, else (B, L, V)."""
    kwargs = {} if attention_mask is None else {"attention_mask": attention_mask}
    if output_mask is not None and supports_output_mask(denoiser):
        return denoiser(z_t, t, output_mask=output_mask, **kwargs)
    logits = denoiser(z_t, t, **kwargs)
    return logits if output_mask is None else logits[output_mask]


def nelbo_terms(denoiser: Denoiser, x0: Tensor, t: Tensor, *, mask_id: int,
                schedule: Schedule, T: int = 0, masking: Masking | None = None) -> Tensor:
    """One Monte-Carlo term of the NELBO per sequence (eq. 10/11), nats (B,).

    Masks x0 at time t (B,), and sums w(t) * -log p_theta(x0_l | z_t) over the
    masked positions; unmasked and padded positions contribute exactly zero.

    `masking.targets` (B, L) bool: the conditional bound on -log p(x0[targets] | the rest).
    Only target positions are masked; the others are clean context, attended but never
    masked or scored. The argument of eq. 10/11 holds over the target positions alone
    (the forward process runs on them, the context is part of every z_t), so with an
    exact denoiser its expectation is the exact conditional NLL.
    """
    nll, masked = _masked_nll(denoiser, x0, t, mask_id, schedule, masking or Masking())
    return loss_weight(t, schedule, T).to(nll.dtype) * sum_per_sequence(nll, masked)


def cart_weights(masked: Tensor, context: Tensor, p: float) -> Tensor:
    """Dream's context-adaptive token-level weights (CART, Ye et al. 2025, "Dream 7B"): (B, L)
    float32, at each masked position n (masked (B, L) bool)

        w_n = 1/2 * sum_{i != n} context_i * p (1 - p)^(|n - i| - 1),

    a geometric distribution Geo(p) over the distance to each clean token i (context (B, L)
    bool: the unmasked real tokens), so a masked token with clean neighbours weighs up to 1 and
    one far from any weighs little; 0 at every other position. No time enters: the weights
    replace the bound's w(t) = -alpha'/(1 - alpha) (1/t under the linear schedule)."""
    idx = torch.arange(masked.shape[1], device=masked.device)
    distance = (idx[None, :] - idx[:, None]).abs()  # (L, L), symmetric
    geo = 0.5 * p * (1.0 - p) ** (distance - 1).clamp(min=0).float()
    geo = geo.masked_fill(distance == 0, 0.0)
    return (context.float() @ geo) * masked.float()


def cart_terms(denoiser: Denoiser, x0: Tensor, t: Tensor, *, mask_id: int, schedule: Schedule,
               p: float, masking: Masking | None = None) -> Tensor:
    """Dream's training loss per sequence (B,): x0 masked at time t as for the NELBO, each masked
    token's -log p_theta weighted by `cart_weights` (p: the geometric distribution's) instead of
    w(t). A training loss only, not a bound: evaluation keeps `nelbo_terms`."""
    m = masking or Masking()
    nll, masked = _masked_nll(denoiser, x0, t, mask_id, schedule, m)
    real = torch.ones_like(masked) if m.attention_mask is None else m.attention_mask.bool()
    weights = cart_weights(masked, real & ~masked, p)[masked]  # (N,)
    return sum_per_sequence(weights.to(nll.dtype) * nll, masked)


def _masked_nll(denoiser: Denoiser, x0: Tensor, t: Tensor, mask_id: int, schedule: Schedule,
                m: Masking) -> tuple[Tensor, Tensor]:
    """x0 masked at time t (eq. 4) and -log p_theta(x0) at its masked positions: (nll (N,),
    masked (B, L) bool)."""
    z_t = mask_tokens(x0, schedule.mask_rate(t), mask_id, generator=m.generator,
                      attention_mask=m.attention_mask, targets=m.targets)
    masked = z_t == mask_id
    if computes_nll(denoiser):  # the backbone scores the targets a chunk at a time
        kwargs = {} if m.attention_mask is None else {"attention_mask": m.attention_mask}
        return denoiser(z_t, t, output_mask=masked, nll_of=(x0[masked], mask_id),
                        **kwargs), masked
    logits = call_denoiser(denoiser, z_t, t, output_mask=masked, attention_mask=m.attention_mask)
    return masked_nll(logits, x0[masked], mask_id), masked


def nelbo(denoiser: Denoiser, x0: Tensor, *, mask_id: int,
          schedule: str | Schedule = "loglinear", num_samples: int = 1, T: int = 0,
          antithetic: bool = True,
          masking: Masking | None = None) -> Tensor:
    """Monte-Carlo estimate of the NELBO of each sequence, in nats: (B,).

    Each value is an unbiased estimate of its own sequence's bound (continuous
    time for T = 0, the T-step discrete bound otherwise). The `num_samples` draws
    of t of one sequence are stratified across [0, 1) (antithetic), never across rows;
    `masking.generator` draws them and the masks.
    Perplexity bound = exp(sum of nelbo / number of real tokens).
    """
    schedule = get_schedule(schedule)
    masking = masking or Masking()
    B, generator = x0.shape[0], masking.generator
    u0 = torch.rand(B, generator=generator, device=x0.device)
    total = torch.zeros(B, device=x0.device)
    for k in range(num_samples):
        u = (u0 + k / num_samples) % 1.0 if antithetic else (
            u0 if k == 0 else torch.rand(B, generator=generator, device=x0.device))
        t = times_from_uniform(u, schedule, T)
        total += nelbo_terms(denoiser, x0, t, mask_id=mask_id, schedule=schedule, T=T,
                             masking=masking)
    return total / num_samples


def reconstruction_terms(
    denoiser: Denoiser,
    x0: Tensor,
    *,
    mask_id: int,
    schedule: Schedule,
    carry_over: bool,
    zero_masking: bool,
    masking: Masking | None = None,
) -> Tensor:
    """The t = 0 term of the bound, E_{z_0 ~ q(.|x0)} [-log p_theta(x0 | z_0)] (D3PM's L_0, the
    reference's `_reconstruction_loss`), with its own forward pass: nats per sequence (B,).

    With carry-over (SUBS) every unmasked position of z_0 contributes exactly 0, so where
    alpha(0) = 1 (log-linear, cosine) the term vanishes and no network call is made (the
    paper's "zero reconstruction loss", §3.3); without it every target token is scored.
    `zero_masking` gives the mask's logit -inf first (a SUBS denoiser); False takes the
    logits as the model's distribution over all V (a D3PM denoiser's).
    """
    B = x0.shape[0]
    t0 = torch.zeros(B, device=x0.device)
    rate0 = schedule.mask_rate(t0)
    if carry_over and not bool((rate0 > 0).any()):
        return torch.zeros(B, device=x0.device)
    m = masking or Masking()
    noised = m.noised
    z0 = (
        mask_tokens(x0, rate0, mask_id, generator=m.generator, attention_mask=noised)
        if bool((rate0 > 0).any())
        else x0
    )
    if carry_over:
        scored = z0 == mask_id
    else:
        scored = torch.ones_like(x0, dtype=torch.bool) if noised is None else noised.bool()
    logits = call_denoiser(denoiser, z0, t0, output_mask=scored, attention_mask=m.attention_mask)
    nll = masked_nll(logits, x0[scored], mask_id) if zero_masking else F.cross_entropy(
        logits.float(), x0[scored], reduction="none")
    return sum_per_sequence(nll, scored)
