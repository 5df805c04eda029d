"""LLaDA's unsupervised classifier-free guidance (its `generate.py` and
`get_log_likelihood.py`'s `cfg_scale`): the model is run on z and on z with the prompt
masked, in one call of twice the rows, and the two are combined as

    logits = un + (scale + 1) * (cond - un)

so scale 0 is the model's own logits. Its NFE counts that call once, its rows twice
(`SampleStats.sequence_evals`). The sampler context applies it to every network call of
the samplers that call the model through it (engine/context.py); `GuidedDenoiser` wraps a
denoiser for scoring, where each batch's prompt positions are known.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .diffusion import call_denoiser
from .protocols import Denoiser, is_time_agnostic


def guided_logits(denoiser: Denoiser, z: Tensor, t: Tensor, *, prompt: Tensor, scale: float,
                  mask_id: int, output_mask: Tensor | None = None,
                  attention_mask: Tensor | None = None) -> Tensor:
    """Logits (B, L, V), or (N, V) at `output_mask`, under guidance: `prompt` (B, L) bool marks
    the positions masked in the unconditional half."""
    uncond = z.masked_fill(prompt, mask_id)
    both = call_denoiser(denoiser, torch.cat([z, uncond]), torch.cat([t, t]),
                         output_mask=_twice(output_mask), attention_mask=_twice(attention_mask))
    cond, un = both.chunk(2)  # (N, V) halves too: the output mask's rows come in row order
    return un + (scale + 1.0) * (cond - un)


def _twice(x: Tensor | None) -> Tensor | None:
    return None if x is None else torch.cat([x, x])


class GuidedDenoiser:
    """A denoiser whose every call is guided, the prompt of a batch `prompt` (B, L): what a
    scorer's rows hold (their context and row start), set before each batch."""

    supports_output_mask = True

    def __init__(self, denoiser: Denoiser, scale: float, mask_id: int):
        self.denoiser, self.scale, self.mask_id = denoiser, scale, mask_id
        self.time_agnostic = is_time_agnostic(denoiser)
        self.prompt: Tensor | None = None

    def __call__(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor | None = None,
                 attention_mask: Tensor | None = None) -> Tensor:
        return guided_logits(self.denoiser, z_t, t, prompt=self.prompt, scale=self.scale,
                             mask_id=self.mask_id, output_mask=output_mask,
                             attention_mask=attention_mask)
