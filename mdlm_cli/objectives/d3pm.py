"""Discrete-time absorbing D3PM (Austin et al. 2021) as the MDLM reference trains it for the
paper's ablation (`parameterization=d3pm`, Table 8 "w/o ELBO simplification & SUBS"):
T steps, the model a plain softmax over all V (the mask may get mass unless
`diffusion.zero_masking`), the full KL of eq. 9 times T and, without carry-over, the
reconstruction term with its own forward pass (`engine.d3pm`). With both halves of SUBS
on it is MDLM's T-step loss (eq. 8). It samples with its own ancestral chain.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..engine.d3pm import d3pm_terms
from ..engine.sampling import SamplerSpec
from ..errors import MdlmError
from ..models import DiffusionDenoiser
from .base import Objective


class D3PMDenoiser(DiffusionDenoiser):
    """The DiT as eq. 9's x_theta: logits whose softmax over all V is the model's distribution,
    the mask's logit -inf under zero masking."""

    def __init__(self, model: nn.Module, schedule, *, mask_id: int, zero_masking: bool,
                 **kwargs):
        super().__init__(model, schedule, **kwargs)
        self.mask_id, self.zero_masking = mask_id, zero_masking

    def __call__(self, z_t: Tensor, t: Tensor, **kwargs) -> Tensor:
        logits = super().__call__(z_t, t, **kwargs)
        if not self.zero_masking:
            return logits
        return logits.index_fill(
            -1, torch.tensor([self.mask_id], device=logits.device), float("-inf")
        )


class D3PM(Objective):
    name = "d3pm"
    default_sampler = "d3pm-ancestral"
    sampler_names = ("d3pm-ancestral",)
    description = (
        "discrete-time absorbing D3PM (eq. 9): full posterior KL over T steps, a bound on "
        "the NLL"
    )

    @classmethod
    def validate(cls, cfg) -> None:
        if cfg.diffusion.T <= 0:
            raise MdlmError(
                "the d3pm objective is discrete-time (eq. 9): set diffusion.T to its number of "
                f"steps, e.g. 1000 (got {cfg.diffusion.T})"
            )

    @property
    def takes_time(self) -> bool:
        return self.cfg.model.time_conditioning

    def denoiser(
        self, model: nn.Module, autocast_dtype: torch.dtype | None = None
    ) -> D3PMDenoiser:
        return D3PMDenoiser(
            model,
            self.schedule,
            mask_id=self.mask_id,
            zero_masking=self.cfg.diffusion.zero_masking,
            time_conditioning=self.takes_time,
            autocast_dtype=autocast_dtype,
        )

    def loss_terms(
        self,
        denoiser: D3PMDenoiser,
        x0: Tensor,
        t: Tensor | None,
        *,
        generator,
        attention_mask,
        T: int | None = None,
        targets: Tensor | None = None,
    ) -> Tensor:
        return d3pm_terms(
            denoiser,
            x0,
            t,
            T=self.eval_T(T),
            carry_over=self.cfg.diffusion.carry_over,
            **self.diffusion_keywords(generator, attention_mask, targets),
        )

    def sampling_steps(self, spec: SamplerSpec) -> int:
        return self.cfg.diffusion.T  # its own chain

    def eval_T(self, T: int | None) -> int:
        T = self.cfg.diffusion.T if T is None else T
        if T <= 0:
            raise MdlmError(
                "--T must be a positive number of steps: D3PM's bound is discrete-time (got "
                f"{T})"
            )
        return T
