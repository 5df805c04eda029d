"""Backbones (one registry) and the adapter that turns one into an engine denoiser."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..engine.schedules import Schedule
from .dit import DiT, KVCache

if TYPE_CHECKING:
    from ..config import ModelConfig

# model.backbone -> the module class; each is built as cls(model_cfg, vocab_size, causal=...)
BACKBONES: dict[str, type[nn.Module]] = {"dit": DiT}

__all__ = ["BACKBONES", "DiT", "DiffusionDenoiser", "KVCache", "autocast_for", "build_model"]


def build_model(cfg: ModelConfig, vocab_size: int, *, causal: bool = False) -> nn.Module:
    """The backbone `cfg.backbone` for a vocabulary (mask included); causal attention for
    objectives that predict left to right (`Objective.causal`)."""
    return BACKBONES[cfg.backbone](cfg, vocab_size, causal=causal)


def autocast_for(device: torch.device, dtype: torch.dtype | None):
    """bf16 autocast where asked (CUDA), a no-op otherwise."""
    if dtype is None or dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class DiffusionDenoiser:
    """`denoiser(z_t, t)` for the engine: maps t to the DiT's noise level sigma(t).

    Without time conditioning (the reference default) the DiT gets no time at all
    and uses its constant sigma = 0 embedding; the engine's t is ignored, and the
    denoiser declares itself `time_agnostic` (what per-sequence caching needs).
    """

    supports_output_mask = True

    def __init__(self, model: nn.Module, schedule: Schedule, *, time_conditioning: bool = False,
                 autocast_dtype: torch.dtype | None = None):
        self.model = model
        self.schedule = schedule
        self.time_conditioning = time_conditioning
        self.time_agnostic = not time_conditioning
        self.autocast_dtype = autocast_dtype

    def __call__(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor | None = None,
                 attention_mask: Tensor | None = None) -> Tensor:
        sigma = self.schedule.sigma(t) if self.time_conditioning else None
        with autocast_for(z_t.device, self.autocast_dtype):
            return self.model(z_t, sigma, attention_mask=attention_mask, output_mask=output_mask)
