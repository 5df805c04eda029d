"""The counted estimator of a masked diffusion model's bound (LLaDA's `get_log_likelihood`,
its paper's eq. 14 and Appendix B.5), beside the time estimator of diffusion.py.

For a sequence whose n noised positions are drawn together, the NELBO is also
E_{l ~ U{1..n}} [ n / l * sum over l positions masked uniformly at random of
-log p_theta(x0_i | z) ]: the number of masked positions is drawn instead of the time, and a
term masks exactly that many. It needs a denoiser that ignores t (LLaDA, Dream, a DiT
without time conditioning): no time is drawn. Its spread is smaller where n is small; for
n = 1 every term is the exact -log p_theta(x0 | the rest), one pass exact, where the time
estimator's terms spread as widely as the answer's own NLL.

The K terms of a sequence are stratified as LLaDA's `forward_process` draws them: l_0
uniform in 1..n, then K counts evenly spaced n / K apart from it, wrapped into 1..n.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .diffusion import Masking, call_denoiser, masked_nll, sum_per_sequence
from .errors import EngineError
from .protocols import Denoiser, is_time_agnostic


def stratified_counts(n: Tensor, passes: int, generator: torch.Generator | None) -> Tensor:
    """(passes, B) long: each row's masked counts, in 1..n[b], stratified over the passes."""
    n = n.long().clamp_min(1)
    u = torch.rand(n.shape, generator=generator, device=n.device, dtype=torch.float64)
    first = (u * n).long() + 1  # uniform in 1..n
    steps = torch.arange(passes, device=n.device, dtype=torch.float64)[:, None]
    counts = torch.round(first[None] + steps * n[None] / passes).long()
    return (counts - 1) % n[None] + 1


def counted_terms(denoiser: Denoiser, x0: Tensor, counts: Tensor, *, mask_id: int,
                  masking: Masking) -> Tensor:
    """One term per sequence (B,) in nats: exactly `counts[b]` of row b's noised positions
    (`masking.noised`: its targets among its real tokens) masked, chosen uniformly at random,
    their -log p_theta summed and weighted by n_b / counts[b]."""
    if not is_time_agnostic(denoiser):
        raise EngineError("the counted (l) estimator draws no time: it needs a denoiser that "
                          "ignores t (time_agnostic); use the time (t) estimator")
    noised = masking.noised
    noised = torch.ones_like(x0, dtype=torch.bool) if noised is None else noised.bool()
    n = noised.sum(1)
    u = torch.rand(x0.shape, generator=masking.generator, device=x0.device)
    order = u.masked_fill(~noised, 2.0).argsort(dim=1)  # the noised positions, shuffled, first
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(x0.shape[1], device=x0.device).expand_as(order))
    masked = noised & (rank < counts[:, None])
    z = torch.where(masked, torch.full_like(x0, mask_id), x0)
    t = torch.ones(len(x0), device=x0.device)  # ignored by a time-agnostic denoiser
    logits = call_denoiser(denoiser, z, t, output_mask=masked,
                           attention_mask=masking.attention_mask)
    nll = sum_per_sequence(masked_nll(logits, x0[masked], mask_id), masked)
    return nll * (n.to(nll.dtype) / counts.clamp_min(1).to(nll.dtype))
