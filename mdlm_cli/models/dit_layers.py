"""The DiT's parts around its attention blocks (models/dit.py): the layer norm, adaLN's
modulation, the sinusoidal embedding of sigma(t), rotary position embeddings, the token
embedding and the zero-initialised output layer, under the reference implementation's module
names (so that published checkpoints load with a key rename)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LayerNorm(nn.Module):
    """LayerNorm with a weight and no bias, computed in float32."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):
            y = F.layer_norm(x.float(), (x.shape[-1],))
        return y * self.weight


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


class TimestepEmbedder(nn.Module):
    """Sinusoidal embedding of a scalar (sigma) followed by an MLP."""

    def __init__(self, cond_dim: int, frequency_dim: int = 256):
        super().__init__()
        self.frequency_dim = frequency_dim
        self.mlp = nn.Sequential(
            nn.Linear(frequency_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim)
        )

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:  # (B,) -> (B, C)
        half = self.frequency_dim // 2
        freqs = torch.exp(
            -math.log(10_000)
            * torch.arange(half, device=sigma.device, dtype=torch.float32) / half
        )
        args = sigma.float()[:, None] * freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class Rotary(nn.Module):
    """Rotary position embedding (non-interleaved halves, base 10000), no parameters."""

    def __init__(self, head_dim: int, base: float = 10_000.0):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._cache: tuple[int, torch.device, torch.Tensor, torch.Tensor] | None = None

    def forward(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        # part of the graph: a cache would recompile it on step 2
        if torch.compiler.is_compiling():
            return self._tables(seq_len, device)
        if self._cache is None or self._cache[0] != seq_len or self._cache[1] != device:
            self._cache = (seq_len, device, *self._tables(seq_len, device))
        return self._cache[2], self._cache[3]

    def _tables(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.arange(seq_len, device=device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq.to(device))
        emb = torch.cat([freqs, freqs], dim=-1)  # (L, D)
        return emb.cos()[:, None, :], emb.sin()[:, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, L, H, D); cos/sin: (L, 1, D), or (B, L, 1, D) with positions per row."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class EmbeddingLayer(nn.Module):
    def __init__(self, dim: int, vocab_size: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(vocab_size, dim))
        nn.init.kaiming_uniform_(self.embedding, a=math.sqrt(5))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding[tokens]


class DDitFinalLayer(nn.Module):
    def __init__(self, hidden_size: int, cond_dim: int, vocab_size: int):
        super().__init__()
        self.norm_final = LayerNorm(hidden_size)
        self.linear = nn.Linear(hidden_size, vocab_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.adaLN_modulation = nn.Linear(cond_dim, 2 * hidden_size)
        nn.init.zeros_(self.adaLN_modulation.weight)
        nn.init.zeros_(self.adaLN_modulation.bias)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        """x: (B, L, H) with c: (B, C), or (N, H) with one row of c per row of x."""
        shift, scale = self.adaLN_modulation(c).chunk(2, dim=-1)
        if x.dim() == 3:
            shift, scale = shift[:, None], scale[:, None]
        return self.linear(modulate(self.norm_final(x), shift, scale))
