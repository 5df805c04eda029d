"""SEDD (Lou et al. 2024), absorbing graph, as the MDLM reference trains it for the paper's
baselines (`parameterization=sedd`): the same DiT outputs log concrete scores, trained
with the denoising score entropy times dsigma/dt (`engine.sedd`); time conditioning is
required. Its bound is continuous-time, Monte-Carlo over t as MDLM's; it samples with
SEDD's analytic (default) and Euler samplers.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..engine.sedd import score_entropy_terms, sedd_log_score
from ..errors import MdlmError
from ..models import DiffusionDenoiser, autocast_for
from .base import Objective


class ScoreDenoiser(DiffusionDenoiser):
    """SEDD's network for the engine, a `ScoreModel` (engine/protocols.py): `log_score(z_t, t,
    output_mask=)` applies SEDD's parameterisation to the DiT's logits at the masked positions.

    Called as a plain denoiser it returns the DiT's logits: at a masked position their
    softmax over the real tokens is the normalised score, the denoiser SEDD's score implies.
    """

    def log_score(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor,
                  attention_mask: Tensor | None = None) -> Tensor:
        sigma = self.schedule.sigma(t)
        with autocast_for(z_t.device, self.autocast_dtype):
            logits = self.model(
                z_t, sigma, attention_mask=attention_mask, output_mask=output_mask
            )  # (N, V)
        log_k = (self.schedule.log_odds(t.double())[:, None]
                 .expand(output_mask.shape)[output_mask])
        return sedd_log_score(logits, z_t[output_mask], log_k)


class SEDD(Objective):
    name = "sedd"
    default_sampler = "analytic"
    sampler_names = ("analytic", "euler")
    description = (
        "score entropy discrete diffusion (Lou et al.), absorbing graph: a bound on the NLL"
    )

    @classmethod
    def validate(cls, cfg) -> None:
        if not cfg.model.time_conditioning:
            raise MdlmError(
                "the sedd objective needs model.time_conditioning=true: its log-score is "
                "divided by expm1(sigma(t)), which the network cannot do without the time "
                "input"
            )
        if cfg.diffusion.T:
            raise MdlmError(
                "diffusion.T does not apply to the sedd objective: its score-entropy bound is "
                "continuous-time; leave it at 0"
            )
        cls.refuse_unused(cfg, "zero_masking", "carry_over")

    @property
    def takes_time(self) -> bool:
        return True

    def denoiser(
        self, model: nn.Module, autocast_dtype: torch.dtype | None = None
    ) -> ScoreDenoiser:
        return ScoreDenoiser(
            model, self.schedule, time_conditioning=True, autocast_dtype=autocast_dtype
        )

    def loss_terms(
        self,
        denoiser: ScoreDenoiser,
        x0: Tensor,
        t: Tensor | None,
        *,
        generator,
        attention_mask,
        T: int | None = None,
        targets: Tensor | None = None,
    ) -> Tensor:
        batch = self.diffusion_keywords(generator, attention_mask, targets)
        return score_entropy_terms(denoiser, x0, t, **batch)

    def eval_T(self, T: int | None) -> int:
        if T:
            raise MdlmError(
                f"--T {T} does not apply: SEDD's score-entropy bound is continuous-time"
            )
        return 0
