"""The autoregressive baseline: the DiT's blocks with causal attention and no time input
(or a causal backbone such as Mamba, on DNA).

Every token of a row is predicted from the tokens before it, the first from a start
token (BOS) put in front: inputs [BOS, x_0, ..., x_{L-2}], targets [x_0, ..., x_{L-1}].
The AR model is therefore scored on exactly the tokens the diffusion bound covers
(the reference predicts x[1:] from x[:-1] and never scores the first token), so its
exact perplexity and a diffusion model's bound are comparable row for row.

It samples with the engine's `autoregressive` sampler: one network call per new token
through the DiT's key/value cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..engine.diffusion import without_mask
from ..errors import MdlmError
from ..models import KVCache, autocast_for, is_segmented, segment_starts, unwrap
from .base import Objective


def shift_right(x0: Tensor, bos_id: int) -> Tensor:
    """Inputs of the AR model: [BOS, x_0, ..., x_{L-2}] (B, L)."""
    return torch.cat([torch.full_like(x0[:, :1], bos_id), x0[:, :-1]], dim=1)


def next_token_logits(logits: Tensor, mask_id: int) -> Tensor:
    """The mask token exists in the vocabulary (shared with the diffusion models) but is
    never a real token: it gets probability zero, as under SUBS."""
    return without_mask(logits, mask_id)


def sequence_nll(model: nn.Module, x0: Tensor, *, bos_id: int, mask_id: int,
                 attention_mask: Tensor | None = None, autocast_dtype: torch.dtype | None = None,
                 targets: Tensor | None = None) -> Tensor:
    """Exact negative log-likelihood of each row, summed over its real tokens: nats (B,).

    -log p(x) = sum_l -log p_theta(x_l | x_<l). Padding sits at the end of a row, so with
    causal attention no real position ever sees it; it is only excluded from the sum.
    With `targets` (B, L) bool only target positions are summed: the tokens before them
    condition them, so for targets after a context this is -log p(targets | context).
    With segment ids as `attention_mask` (packed examples) each example starts from its own
    BOS and attends only within itself: the sum of its examples' NLLs taken one by one.
    """
    inputs, kwargs = shift_right(x0, bos_id), {}
    if is_segmented(attention_mask):  # else padding sits at the end: causal attention suffices
        inputs = inputs.masked_fill(segment_starts(attention_mask), bos_id)
        kwargs = {"attention_mask": attention_mask}
    with autocast_for(x0.device, autocast_dtype):
        logits = model(inputs, **kwargs)  # (B, L, V)
    next_logits = next_token_logits(logits, mask_id).transpose(1, 2)  # (B, V, L): classes second
    nll = F.cross_entropy(next_logits, x0, reduction="none")  # (B, L)
    if attention_mask is not None:
        nll = nll * attention_mask.bool().to(nll.dtype)
    if targets is not None:
        nll = nll * targets.to(nll.dtype)
    return nll.sum(dim=1)


class CausalLMAdapter:
    """The engine's `CausalLM` (engine/protocols.py) over a causal backbone: BOS, a key/value
    cache (or the backbone's own), and logits of the new tokens after the cached ones."""

    def __init__(self, model: nn.Module, *, bos_id: int, mask_id: int,
                 autocast_dtype: torch.dtype | None = None):
        self.model, self.bos_id, self.mask_id = model, bos_id, mask_id
        self.autocast_dtype = autocast_dtype

    def new_cache(self, batch: int, max_len: int, device: torch.device):
        """The DiT's key/value cache, or the backbone's own (`model.new_cache`, e.g. Mamba's
        recurrent state)."""
        dtype = self.autocast_dtype or torch.float32
        make = unwrap(self.model).new_cache  # a trait (models/traits.py): None on most
        if make is not None:
            return make(batch, max_len, device, dtype)
        return KVCache.empty(self.model, batch, max_len, device, dtype)

    def __call__(self, tokens: Tensor, cache: KVCache) -> Tensor:
        with autocast_for(tokens.device, self.autocast_dtype):
            return self.model(tokens, kv_cache=cache)

    def nll(self, x0: Tensor, attention_mask: Tensor | None = None,
            targets: Tensor | None = None) -> Tensor:
        return sequence_nll(
            self.model,
            x0,
            bos_id=self.bos_id,
            mask_id=self.mask_id,
            attention_mask=attention_mask,
            autocast_dtype=self.autocast_dtype,
            targets=targets,
        )

    def next_token_argmax(self, x0: Tensor) -> Tensor:
        """argmax_v p_theta(x_l = v | x_<l) at every position l of x0 (B, L), teacher-forced."""
        with autocast_for(x0.device, self.autocast_dtype):
            logits = self.model(shift_right(x0, self.bos_id))  # (B, L, V)
        return next_token_logits(logits, self.mask_id).argmax(-1)


class Autoregressive(Objective):
    name = "ar"
    causal = True
    exact = True
    uses_time = False
    default_sampler = "autoregressive-kv-cache"
    sampler_names = ("autoregressive-kv-cache", "autoregressive-recompute")
    description = "left-to-right baseline: causal blocks, no time input, exact likelihood"

    @classmethod
    def validate(cls, cfg) -> None:
        cls.refuse_time(cfg, "autoregressive")
        if cfg.model.shift:  # the AR loss reads each position's own output
            raise MdlmError("model.shift belongs to a diffusion model converted from an AR run; "
                            "the ar objective predicts the next token without it")

    def denoiser(self,
                 model: nn.Module,
                 autocast_dtype: torch.dtype | None = None) -> CausalLMAdapter:
        return CausalLMAdapter(model, bos_id=self.bos_id, mask_id=self.mask_id,
                               autocast_dtype=autocast_dtype)

    def loss_terms(self,
                   denoiser: CausalLMAdapter,
                   x0: Tensor,
                   t: Tensor | None, *,
                   generator,
                   attention_mask,
                   T: int | None = None,
                   targets: Tensor | None = None) -> Tensor:
        return denoiser.nll(x0, attention_mask, targets)

    def greedy_tokens(self, denoiser: CausalLMAdapter, x0: Tensor, targets: Tensor,
                      attention_mask: Tensor | None = None) -> Tensor:
        """Greedy decoding's token at each target position given the true tokens before it."""
        return torch.where(targets.bool(), denoiser.next_token_argmax(x0), x0)

    def greedy_by_confidence(self, denoiser: CausalLMAdapter, x0: Tensor, targets: Tensor,
                             attention_mask: Tensor | None = None) -> Tensor:
        """Left to right, one token at a time: greedy decoding is already that."""
        return self.greedy_tokens(denoiser, x0, targets, attention_mask)
