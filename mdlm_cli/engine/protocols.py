"""The contracts of the models the engine calls: a denoiser (masked diffusion) and a causal
language model (left-to-right sampling). Structural types: any object with these members
serves, nothing is subclassed; `models.DiffusionDenoiser` and `objectives.ar.CausalLMAdapter`
are the package's own.

A `Denoiser` may declare four optional members, read through the helpers below (absent
means False / None) so that nothing guesses them:
- `time_agnostic = True`: its output does not depend on t (a model without time
  conditioning); caching samplers need this;
- `supports_output_mask = True`: it accepts `output_mask=` (B, L) bool and then returns
  logits (N, V) only at those positions (the DiT does: the loss needs only masked positions);
  without it the engine never passes `output_mask`;
- `log_score(z_t, t, *, output_mask) -> (N, V)`: log concrete scores of its own (a score
  model: SEDD); without it score-based samplers convert the logits (`subs_log_score`);
- `shifted_logits = True`: its logits at position i are read from the network's output at
  i - 1 (Dream's shift), in a block cache's sliced calls too (within the slice), so the block
  samplers decide a block's first position from the full pass (engine/dream_blocks.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor


class Denoiser(Protocol):
    """`denoiser(z_t (B, L) long, t (B,) float) -> logits (B, L, V)`, V including the mask
    token; the engine applies SUBS itself. `attention_mask` (B, L) is passed only when given."""

    def __call__(self, z_t: Tensor, t: Tensor, *,
                 output_mask: Tensor | None = None,
                 attention_mask: Tensor | None = None) -> Tensor: ...


class ScoreModel(Denoiser, Protocol):
    """A denoiser that also gives log concrete scores at the `output_mask` positions (N, V)."""

    def log_score(self, z_t: Tensor, t: Tensor, *, output_mask: Tensor) -> Tensor: ...


class BlockCached(Denoiser, Protocol):
    """A time-agnostic denoiser with a block cache (Fast-dLLM's prefix and dual cache):
    `new_block_cache(batch, length)`; `block_cache(z (R, L), cache, rows) -> (logits (R, L, V),
    cache)`, one full pass storing every position's keys and values at the cache's rows `rows`;
    `from_cache(z (R, n), cache, start, rows) -> logits (R, n, V)`, positions [start, start + n)
    attending to the cached keys and values of the others, theirs replacing their entries."""

    def new_block_cache(self, batch: int, length: int) -> Any: ...

    def block_cache(
        self, z_t: Tensor, cache: Any, rows: Tensor | None
    ) -> tuple[Tensor, Any]: ...

    def from_cache(self, z_t: Tensor, cache: Any, start: int, rows: Tensor | None) -> Tensor: ...


class CausalLM(Protocol):
    """Left-to-right model with a key/value (or state) cache: `bos_id` (the start token put
    before every row), `new_cache(batch, max_len, device)`, and `lm(tokens (B, n), cache) ->
    logits (B, n, V)` for n new tokens after the cached ones."""

    bos_id: int

    def new_cache(self, batch: int, max_len: int, device: torch.device) -> Any: ...

    def __call__(self, tokens: Tensor, cache: Any) -> Tensor: ...


def is_time_agnostic(denoiser: Denoiser) -> bool:
    """Whether the denoiser declared that its output ignores t (`time_agnostic`)."""
    return bool(getattr(denoiser, "time_agnostic", False))


def supports_output_mask(denoiser: Denoiser) -> bool:
    """Whether the denoiser declared that it takes `output_mask=` (`supports_output_mask`)."""
    return bool(getattr(denoiser, "supports_output_mask", False))


def computes_nll(denoiser: Denoiser) -> bool:
    """Whether the denoiser declared that it scores targets itself (`computes_nll`): called with
    `output_mask=` and `nll_of=(targets (N,), mask_id)` it returns -log p_theta (N,) under
    SUBS, its logits made a chunk of positions at a time (never (N, V) at once)."""
    return bool(getattr(denoiser, "computes_nll", False))


def has_block_cache(denoiser: Denoiser) -> bool:
    """Whether the denoiser offers a block cache (`BlockCached`) and ignores t."""
    return is_time_agnostic(denoiser) and hasattr(denoiser, "new_block_cache")


def has_shifted_logits(denoiser: Denoiser) -> bool:
    """Whether the denoiser declared that position i's logits come from i - 1
    (`shifted_logits`)."""
    return bool(getattr(denoiser, "shifted_logits", False))


def score_method(denoiser: Denoiser) -> Callable[..., Tensor] | None:
    """The denoiser's own `log_score` (a `ScoreModel`), or None."""
    return getattr(denoiser, "log_score", None)
