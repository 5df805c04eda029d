"""MDLM (Sahoo et al. 2024): masked diffusion with SUBS and the continuous-time NELBO.

The loss and the bound are `engine.diffusion.nelbo_terms` (eq. 10/11, or the T-step
discrete bound of Table 8 "w/o continuous time"; with `diffusion.carry_over=false` the
t = 0 reconstruction term that SUBS' carry-over makes 0 is added); the samplers that serve it
are its `sampler_names` (SEDD's analytic one through the SUBS -> score conversion).
Training may weight the masked tokens otherwise (`diffusion.loss_weighting`: Dream's CART,
`engine.diffusion.cart_terms`); the bound that evaluation reports is always the NELBO.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import check_choice
from ..engine.diffusion import cart_terms, nelbo_terms, reconstruction_terms
from ..errors import MdlmError
from ..models import DiffusionDenoiser
from .base import Objective

# diffusion.loss_weighting: the bound's w(t) (nelbo) or Dream's token-level weights (cart)
LOSS_WEIGHTINGS = ("nelbo", "cart")


class MDLM(Objective):
    name = "mdlm"
    default_sampler = "first-hitting"
    sampler_names = ("ancestral", "ancestral-cache", "first-hitting", "analytic", "confidence",
                     "threshold", "remdm")
    description = "masked diffusion, SUBS, continuous-time NELBO (a bound on the NLL)"
    counts_masks = True
    loss_in_chunks = True
    own_keys = ("loss_weighting", "cart_p")

    @classmethod
    def validate(cls, cfg) -> None:
        if cfg.diffusion.T < 0:
            raise MdlmError(
                "diffusion.T must be 0 (continuous) or a positive number of steps "
                f"(got {cfg.diffusion.T})"
            )
        if not cfg.diffusion.zero_masking:
            raise MdlmError(
                "diffusion.zero_masking=false leaves MDLM's loss (eq. 8/10) no valid bound: it "
                "assumes the mask gets no probability; D3PM's eq. 9 keeps that mass: use "
                "diffusion.objective=d3pm with diffusion.T > 0"
            )
        check_choice(cfg.diffusion.loss_weighting, LOSS_WEIGHTINGS, "diffusion.loss_weighting")
        default_p = type(cfg.diffusion).cart_p
        if cfg.diffusion.loss_weighting != "cart" and cfg.diffusion.cart_p != default_p:
            raise MdlmError("diffusion.cart_p is read by diffusion.loss_weighting=cart only; "
                            f"set that, or leave diffusion.cart_p at {default_p}")

    @property
    def takes_time(self) -> bool:
        return self.cfg.model.time_conditioning

    def denoiser(
        self, model: nn.Module, autocast_dtype: torch.dtype | None = None
    ) -> DiffusionDenoiser:
        return DiffusionDenoiser(model, self.schedule, time_conditioning=self.takes_time,
                                 autocast_dtype=autocast_dtype)

    def loss_terms(self, denoiser, x0: Tensor, t: Tensor | None, *, generator, attention_mask,
                   T: int | None = None, targets: Tensor | None = None) -> Tensor:
        batch = self.diffusion_keywords(generator, attention_mask, targets)
        T = self.cfg.diffusion.T if T is None else T
        terms = nelbo_terms(denoiser, x0, t, T=T, **batch)
        if self.cfg.diffusion.carry_over:  # SUBS: the reconstruction term is exactly 0 (§3.3)
            return terms
        reconstruction = reconstruction_terms(
            denoiser, x0, carry_over=False, zero_masking=True, **batch
        )
        return terms + reconstruction

    def training_terms(self, denoiser, x0: Tensor, t: Tensor | None, *, generator,
                       attention_mask, targets: Tensor | None = None) -> Tensor:
        """`loss_terms` (the NELBO), or with diffusion.loss_weighting=cart each masked token
        weighted by Dream's CART instead of w(t) (plus the reconstruction term without
        carry-over, as the bound has it)."""
        d = self.cfg.diffusion
        if d.loss_weighting == "nelbo":
            return self.loss_terms(denoiser, x0, t, generator=generator,
                                   attention_mask=attention_mask, targets=targets)
        batch = self.diffusion_keywords(generator, attention_mask, targets)
        terms = cart_terms(denoiser, x0, t, p=d.cart_p, **batch)
        if d.carry_over:
            return terms
        return terms + reconstruction_terms(denoiser, x0, carry_over=False, zero_masking=True,
                                            **batch)

    def eval_T(self, T: int | None) -> int:
        T = self.cfg.diffusion.T if T is None else T
        if T < 0:
            raise MdlmError(f"--T must be 0 (continuous time) or a number of steps (got {T})")
        return T
