"""Backbones (one registry) and the adapter that turns one into an engine denoiser."""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..engine.schedules import Schedule
from ..errors import MdlmError
from .caduceus import Caduceus, check_caduceus
from .dit import DiT, KVCache
from .mamba import Mamba, check_mamba

if TYPE_CHECKING:
    from ..config import ModelConfig

# model.backbone -> the module class; each is built as cls(model_cfg, vocab_size, causal=...).
# A class may set `requires_causal` (True/False) when it serves only one kind of objective.
BACKBONES: dict[str, type[nn.Module]] = {"dit": DiT, "caduceus": Caduceus, "mamba": Mamba}

# ModelConfig keys of the Mamba-based backbones only (the DiT's are hidden_size, n_blocks, n_heads,
# cond_dim, mlp_ratio, dropout, time_conditioning)
MAMBA_KEYS = ("mixer", "d_state", "d_conv", "expand", "rcps", "fused_add_norm", "bidirectional_strategy",
              "bidirectional_weight_tie", "rms_norm", "norm_epsilon")
CADUCEUS_ONLY = ("rcps", "fused_add_norm", "bidirectional_strategy", "bidirectional_weight_tie")

__all__ = ["BACKBONES", "Caduceus", "DiT", "DiffusionDenoiser", "KVCache", "Mamba", "autocast_for", "build_model",
           "check_backbone"]


def _unchanged(cfg: ModelConfig, keys: tuple[str, ...], backbone: str) -> None:
    """No key of another backbone is silently ignored."""
    from dataclasses import fields

    defaults = {f.name: f.default for f in fields(cfg)}
    for key in keys:
        if getattr(cfg, key) != defaults[key]:
            raise MdlmError(f"model.{key} does not apply to the {backbone} backbone; leave it at {defaults[key]!r}")


def check_dit(cfg: ModelConfig) -> None:
    """Config checks of the dit backbone."""
    if cfg.hidden_size % cfg.n_heads or (cfg.hidden_size // cfg.n_heads) % 2:
        raise MdlmError(
            f"model.hidden_size ({cfg.hidden_size}) must be divisible by model.n_heads "
            f"({cfg.n_heads}) with an even head size"
        )
    _unchanged(cfg, MAMBA_KEYS, "dit")


def _check_mamba(cfg: ModelConfig) -> None:
    check_mamba(cfg)
    _unchanged(cfg, CADUCEUS_ONLY, "mamba")


# model.backbone -> its config checks (each a one-line MdlmError naming the key)
BACKBONE_CHECKS = {"dit": check_dit, "caduceus": check_caduceus, "mamba": _check_mamba}


def check_backbone(cfg: ModelConfig) -> None:
    BACKBONE_CHECKS[cfg.backbone](cfg)


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
