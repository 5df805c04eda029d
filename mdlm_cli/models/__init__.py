"""Backbones (one registry of `Backbone`s, models/protocols.py) and the adapter that turns one
into an engine `Denoiser` (engine/protocols.py)."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from ..distributed import unwrap
from ..engine.schedules import Schedule
from ..errors import MdlmError
from .caduceus import Caduceus
from .dit import DiT, KVCache
from .dream import Dream
from .gpt2 import GPT2
from .hf_mlm import HFMaskedLM
from .llada import LLaDA
from .mamba import Mamba
from .protocols import Backbone
from .segments import is_segmented, segment_starts

if TYPE_CHECKING:
    from ..config import Config, ModelConfig

# model.backbone -> the module class, each a `Backbone` (models/protocols.py: the contract)
BACKBONES: dict[str, type[Backbone]] = {
    "dit": DiT, "hf-mlm": HFMaskedLM, "caduceus": Caduceus, "mamba": Mamba,
    "llada": LLaDA, "dream": Dream, "gpt2": GPT2,
}

__all__ = [
    "BACKBONES", "GPT2", "Backbone", "Caduceus", "DiT", "DiffusionDenoiser", "Dream",
    "HFMaskedLM", "KVCache", "LLaDA", "Mamba", "autocast_for", "build_model", "check_data",
    "is_segmented", "segment_starts", "unwrap",
]


def build_model(
    cfg: ModelConfig, vocab_size: int, *, causal: bool = False, folder: Path | None = None
) -> nn.Module:
    """The backbone `cfg.backbone` for a vocabulary (mask included); causal attention for
    objectives that predict left to right (`Objective.causal`). With `folder` (an mdlm
    checkpoint), from the files the backbone saved there, ready for the checkpoint's weights."""
    cls = BACKBONES[cfg.backbone]
    if folder is not None:
        return cls.from_checkpoint(cfg, vocab_size, Path(folder), causal=causal)
    return cls(cfg, vocab_size, causal=causal)


def check_data(cfg: Config) -> None:
    """The backbone's checks of the data a run trains on (its tokeniser, the row length)."""
    check = BACKBONES[cfg.model.backbone].check_data  # None: it checks nothing
    if check is not None:
        from ..data.store import cache_root
        from ..data.tokenizers import load_tokenizer

        check(cfg, load_tokenizer(cfg.data.tokenizer, cache_root(cfg.data)))


def autocast_for(device: torch.device, dtype: torch.dtype | None):
    """bf16 autocast where asked (CUDA), a no-op otherwise."""
    if dtype is None or dtype == torch.float32:
        return nullcontext()
    return torch.autocast(device.type, dtype=dtype)


class DiffusionDenoiser:
    """The engine's `Denoiser` over a backbone: maps t to the DiT's noise level sigma(t).

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
                 attention_mask: Tensor | None = None,
                 nll_of: tuple[Tensor, int] | None = None) -> Tensor:
        sigma = self.schedule.sigma(t) if self.time_conditioning else None
        extra = {} if nll_of is None else {"nll_of": nll_of}  # only a backbone that declares it
        with autocast_for(z_t.device, self.autocast_dtype):
            return self.model(z_t, sigma, attention_mask=attention_mask, output_mask=output_mask,
                              **extra)

    @property
    def computes_nll(self) -> bool:
        """The engine's declaration (engine/protocols.py): the backbone scores masked targets
        itself, its logits a chunk at a time (the folder backbones' `scores_in_chunks`)."""
        return bool(unwrap(self.model).scores_in_chunks)

    @property
    def shifted_logits(self) -> bool:
        """Whether the backbone reads position i's logits from its output at i - 1 (Dream)."""
        return bool(unwrap(self.model).shifted_logits)

    def new_block_cache(self, batch: int, length: int) -> Any:
        return self._cached_backbone().new_block_cache(batch, length)

    def block_cache(self, z_t: Tensor, cache: Any, rows: Tensor | None = None
                    ) -> tuple[Tensor, Any]:
        """The engine's `BlockCached` (engine/protocols.py): one full pass, logits (R, L, V),
        filling the backbone's block cache (models/block_cache.py) at `rows`."""
        with autocast_for(z_t.device, self.autocast_dtype):
            return self._cached_backbone().block_cache(z_t, cache, rows)

    def from_cache(self, z_t: Tensor, cache: Any, start: int, rows: Tensor | None = None
                   ) -> Tensor:
        """Logits (R, n, V) of positions [start, start + n), `z_t` (R, n) theirs, attending to
        the cache for the other positions."""
        with autocast_for(z_t.device, self.autocast_dtype):
            return self._cached_backbone().from_cache(z_t, cache, start, rows)

    def _cached_backbone(self) -> Any:
        model = unwrap(self.model)
        if self.time_conditioning:
            raise MdlmError("a block cache needs a model without time conditioning (its keys "
                            "depend on t): use --cache none")
        if not hasattr(model, "block_cache"):
            raise MdlmError(f"{model.describe()} has no block cache: use --cache none")
        return model
