"""The DiT's key/value cache for causal (and block-causal) decoding: one (B, heads, max_len,
head_dim) tensor of keys and one of values per block."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class KVCache:
    """Keys and values of every block for causal decoding, (B, heads, max_len, head_dim)
    each, filled up to `length`: `DiT.forward(tokens, kv_cache=cache)` processes only the
    new tokens (as nanochat's `GPT.forward(..., kv_cache)`)."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    length: int = 0
    # a block cache (block diffusion, objectives/bd3lm.py): the new tokens attend each other
    # both ways, and a bidirectional model may use it
    block: bool = False

    @classmethod
    def empty(cls, model: torch.nn.Module, batch: int, max_len: int, device: torch.device,
              dtype: torch.dtype) -> KVCache:
        cfg = model.config
        shape = (batch, cfg.n_heads, max_len, cfg.hidden_size // cfg.n_heads)

        def per_block() -> list[torch.Tensor]:
            return [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_blocks)]

        return cls(per_block(), per_block())

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]
