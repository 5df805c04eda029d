"""A causal Mamba language model: Table 6's autoregressive baseline on DNA.

mamba-ssm's `MambaLMHeadModel` layout (`backbone.embedding`, `backbone.layers.i.{mixer,
norm}`, `backbone.norm_f`, `lm_head` tied to the embedding), pre-norm RMSNorm blocks
without an MLP, as the Caduceus authors' Mamba baseline (configs/model/mamba.yaml).

Left-to-right decoding keeps each layer's recurrent state instead of keys and values:
`model(tokens, kv_cache=cache)` with a `MambaCache` from `model.new_cache(...)` processes
only the new tokens (the first call runs the parallel scan over BOS and the prompt and
keeps the final states; later calls advance the recurrence one token each), which is the
contract of the AR objective's `CausalLMAdapter` (the engine's `CausalLM`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import MdlmError
from .caduceus import MambaBackbone, MambaConfig, RMSNorm, rescale_out_proj
from .mamba_mixer import MambaMixer, MixerState
from .section import keys_of, read_section
from .tied import count_parameters, store_tied_once

if TYPE_CHECKING:
    from ..config import Config, ModelConfig


@dataclass
class MambaCache:
    """Every layer's recurrent state after `length` positions (of at most `max_len`)."""

    states: list[MixerState]
    max_len: int
    length: int = 0


def _logits(hidden: Tensor, weight: Tensor) -> Tensor:
    logits = F.linear(hidden, weight)
    # bf16 autocast -> float32
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


class Layer(nn.Module):
    def __init__(self, cfg: MambaConfig):
        super().__init__()
        self.mixer = MambaMixer(
            cfg.hidden_size,
            d_state=cfg.d_state,
            d_conv=cfg.d_conv,
            expand=cfg.expand,
            impl=cfg.mixer,
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_epsilon, cfg.rms_norm)


class Backbone(nn.Module):
    def __init__(self, cfg: MambaConfig, vocab_size: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, cfg.hidden_size)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_blocks))
        self.norm_f = RMSNorm(cfg.hidden_size, cfg.norm_epsilon, cfg.rms_norm)


class Mamba(MambaBackbone, nn.Module):
    """`Mamba(cfg, vocab_size, causal=True)(tokens (B, L)) -> logits (B, L, V)`, position l
    seeing positions <= l only."""

    requires_causal = True
    config_keys = keys_of(MambaConfig)

    @classmethod
    def validate_config(cls, cfg: Config) -> None:
        super().validate_config(cfg)
        if cfg.model.time_conditioning:
            raise MdlmError("the mamba backbone is the autoregressive baseline and takes no "
                            "time; set model.time_conditioning=false")

    def describe(self) -> str:
        return f"Mamba {self.config.n_blocks}x{self.config.hidden_size}"

    def __init__(self, cfg: ModelConfig | MambaConfig, vocab_size: int, causal: bool = True):
        super().__init__()
        if not causal:
            raise MdlmError(
                "the mamba backbone is causal (the autoregressive baseline); a bidirectional "
                "DNA model uses model.backbone=caduceus"
            )
        cfg = read_section(MambaConfig, cfg)
        self.config, self.vocab_size, self.causal = cfg, vocab_size, True
        self.backbone = Backbone(cfg, vocab_size)
        self.lm_head = nn.Linear(cfg.hidden_size, vocab_size, bias=False)
        self.lm_head.weight = self.backbone.embedding.weight
        rescale_out_proj(self, cfg.n_blocks)
        store_tied_once(self)

    def new_cache(self, batch: int, max_len: int, device: torch.device,
                  dtype: torch.dtype = torch.float32) -> MambaCache:
        return MambaCache(
            [layer.mixer.new_state(batch, device, dtype) for layer in self.backbone.layers],
            max_len
        )

    def forward(
        self,
        tokens: Tensor,
        sigma: Tensor | None = None,
        attention_mask: Tensor | None = None,
        output_mask: Tensor | None = None,
        kv_cache: MambaCache | None = None,
    ) -> Tensor:
        """Logits (B, L, V) (or (N, V) at `output_mask`); with `kv_cache`, of the new tokens
        only. The recurrence reads every position; `attention_mask` only concerns the loss
        (trailing padding comes after every real position, so no real position sees it)."""
        if kv_cache is not None:
            return self._decode(tokens, kv_cache)
        hidden = self._trunk(tokens, None)
        if output_mask is not None:
            hidden = hidden[output_mask]
        return F.linear(hidden, self.lm_head.weight).float()

    def features(self, tokens: Tensor, sigma: Tensor | None = None) -> Tensor:
        """Final hidden states (B, L, d) (what `mdlm classify` pools)."""
        return self._trunk(tokens, None)

    def _trunk(self, tokens: Tensor, states: list[MixerState] | None) -> Tensor:
        hs, residual = self.backbone.embedding(tokens), None
        for i, layer in enumerate(self.backbone.layers):
            residual = hs if residual is None else hs + residual
            hs = layer.mixer(layer.norm(residual), None if states is None else states[i])
        return self.backbone.norm_f(hs + residual)

    def _decode(self, tokens: Tensor, cache: MambaCache) -> Tensor:
        n = tokens.shape[1]
        if cache.length + n > cache.max_len:
            raise ValueError(
                f"the Mamba cache holds {cache.max_len} positions; {cache.length + n} asked for"
            )
        if cache.length == 0:  # prefill: the parallel scan, keeping each layer's final state
            hidden = self._trunk(tokens, cache.states)
        else:
            outs = [self._step(tokens[:, j:j + 1], cache.states) for j in range(n)]
            hidden = torch.cat(outs, dim=1)
        cache.length += n
        return _logits(hidden, self.lm_head.weight)

    def _step(self, token: Tensor, states: list[MixerState]) -> Tensor:
        hs, residual = self.backbone.embedding(token), None
        for layer, state in zip(self.backbone.layers, states, strict=True):
            residual = hs if residual is None else hs + residual
            hs = layer.mixer.step(layer.norm(residual), state)
        return self.backbone.norm_f(hs + residual)

    def num_parameters(self, non_embedding: bool = False) -> int:
        embedding = self.backbone.embedding.weight
        return count_parameters(self, [embedding] if non_embedding else [])
