"""The pieces LLaDA and Dream share (both are Llama-style decoders run without a causal mask):
RMSNorm, rotary embeddings at the config's theta, grouped-query SDPA attention over the whole
sequence, and the SwiGLU feed-forward. Each family's module (llada.py, dream.py) holds its own
projections under its release's weight names and calls these; the GPT-2 backbone (gpt2.py)
shares the attention (without rotary), the causal mask of a converted model's test setting and
the shift (`shift_states`: Dream's, and any converted causal LM's, one place for it; over
BD3-LM's x_t ⊕ x_0 pass, `predecessor_states`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import MdlmError
from .block_cache import BlockCall


class RMSNorm(nn.Module):
    """x / rms(x) * weight, the normalisation in float32 and the product in the weight's dtype
    (both releases cast back to the input's dtype before the weight multiplies)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        with torch.autocast(x.device.type, enabled=False):
            x32 = x.float()
            normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rotary_tables(length: int, head_dim: int, theta: float, device) -> tuple[Tensor, Tensor]:
    """cos and sin (L, head_dim) of the rotary embedding, in float32: frequency i is
    theta^(-2i / head_dim), repeated over the two halves of a head."""
    with torch.autocast(torch.device(device).type, enabled=False):
        inv_freq = 1.0 / theta ** (
            torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
        )
        angles = torch.outer(torch.arange(length, device=device, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)  # (L, head_dim)
    return angles.cos(), angles.sin()


def position_angles(tokens: Tensor, start: int, positions: Tensor | None, head_dim: int,
                    theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin (n, head_dim) of `tokens` (B, n): at positions start .. start + n - 1, or at
    `positions` (n,) where given (BD3-LM's x_0 copy at x_t's positions)."""
    if positions is None:
        cos, sin = rotary_tables(start + tokens.shape[1], head_dim, theta, tokens.device)
        return cos[start:], sin[start:]  # the positions' absolute angles
    end = int(positions.max()) + 1 if positions.numel() else 0
    cos, sin = rotary_tables(end, head_dim, theta, tokens.device)
    return cos[positions], sin[positions]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor, *, full_precision: bool) -> Tensor:
    """Rotate (B, H, L, head_dim) by position, the halves-split convention of both releases.
    LLaDA rotates in float32 (rope_full_precision); Dream in the activations' dtype."""
    dtype = x.dtype
    if full_precision:
        x = x.float()
    else:
        cos, sin = cos.to(dtype), sin.to(dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated * sin).to(dtype)


def shift_states(h: Tensor) -> Tensor:
    """States (B, L, H) moved one position right: position i reads the output at i - 1 (position
    0 its own), as an autoregressive head predicts the next token from the states before it.
    Dream's shift (its diffusion_generate: `torch.cat([logits[:, :1], logits[:, :-1]], dim=1)`),
    and that of every causal LM converted with the shift on (docs/conversion.md)."""
    return torch.cat([h[:, :1], h[:, :-1]], dim=1)


def predecessor_states(h: Tensor, keys: Tensor, positions: Tensor) -> Tensor:
    """The shift over a pass with per-query keys and given positions (BD3-LM's x_t ⊕ x_0, both
    halves at positions 0..L-1): the states (B, N, H) each position's logits are read from,
    those of the key it attends at the position before its own, or its own where it attends
    none (position 0). `keys` (B | 1, 1, N, N) bool, `positions` (N,).

    The previous token as the query sees it, which an AR head predicts from: in BD3-LM's pass
    a noisy position inside a block reads the noisy one before it (same block); a block's first
    reads the clean copy's last state of the block before, which sees the clean blocks only.
    The block mask makes that key unique. Over plain positions 0..N-1 with every earlier key
    attended it is `shift_states`."""
    before = positions[None, :] == positions[:, None] - 1  # (N, N): key one position earlier
    seen = keys[:, 0].bool() & before  # (B | 1, N, N)
    own = torch.arange(h.shape[1], device=h.device)
    index = torch.where(seen.any(-1), seen.float().argmax(-1), own)  # (B | 1, N)
    index = index.expand(h.shape[0], -1)[..., None].expand(-1, -1, h.shape[-1])
    return h.gather(1, index)


def causal_keys(attention_mask: Tensor | None, length: int, device) -> Tensor:
    """SDPA's boolean mask (B | 1, 1, L, L) of causal attention (query i attends keys <= i),
    padded keys left out."""
    allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return restricted_keys(allowed, attention_mask)


def restricted_keys(allowed: Tensor, attention_mask: Tensor | None) -> Tensor:
    """SDPA's boolean mask (B | 1, 1, L, L) of the (query, key) pairs `allowed` (L, L) gives,
    padded keys left out. Each query keeps its own key, padded or not, so that no row is masked
    whole (SDPA's output there would be NaN, and 0 * NaN spreads it to the other rows);
    `allowed` must hold the diagonal (causal and annealed masks do: models/anneal.py)."""
    allowed = allowed[None, None]
    if attention_mask is None:
        return allowed
    own = torch.eye(allowed.shape[-1], dtype=torch.bool, device=allowed.device)[None, None]
    return allowed & (attention_mask.bool()[:, None, None, :] | own)


def key_padding_mask(attention_mask: Tensor | None) -> Tensor | None:
    """SDPA's boolean mask (B, 1, 1, L) that keeps padded keys out; None when nothing is
    padded (both releases then attend to every position)."""
    if attention_mask is None or bool(attention_mask.bool().all()):
        return None
    return attention_mask.bool()[:, None, None, :]


@dataclass(frozen=True)
class Heads:
    """The attention heads of a layer: `n_heads` query heads over `n_kv_heads` key/value
    heads (each shared by n_heads / n_kv_heads of them), the rotary embedding applied in
    float32 (`full_precision_rotary`, LLaDA's rope_full_precision) or in the activations'
    dtype (Dream)."""

    n_heads: int
    n_kv_heads: int
    full_precision_rotary: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.n_heads < 1 or self.n_kv_heads < 1 or self.n_heads % self.n_kv_heads:
            raise MdlmError(f"{self.n_heads} attention heads cannot share {self.n_kv_heads} "
                            "key/value heads: the query heads must be a multiple of them")


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    heads: Heads,
    *,
    rotary: tuple[Tensor, Tensor] | None,
    keys: Tensor | None,
    dropout: float = 0.0,
    block_call: tuple[BlockCall, int] | None = None,
) -> Tensor:
    """Grouped-query attention of projected q (B, L, H*d) and k, v (B, L, Hkv*d): rotary on q
    and k (none for GPT-2's learned positions: `rotary` None), each key/value head shared by
    H / Hkv query heads, the keys each query sees given by `keys` (None: all); -> (B, L, H*d).
    `block_call` (call, layer index): a block cache's full pass (keys and values stored) or a
    slice attending to the cached keys and values of the others (models/block_cache.py)."""
    n_heads, n_kv_heads = heads.n_heads, heads.n_kv_heads
    B, L, _ = q.shape
    head_dim = q.shape[-1] // n_heads
    q = q.view(B, L, n_heads, head_dim).transpose(1, 2)  # (B, H, L, d)
    k = k.view(B, L, n_kv_heads, head_dim).transpose(1, 2)  # (B, Hkv, L, d)
    v = v.view(B, L, n_kv_heads, head_dim).transpose(1, 2)
    if rotary is not None:
        cos, sin = rotary
        q = apply_rotary(q, cos, sin, full_precision=heads.full_precision_rotary)
        k = apply_rotary(k, cos, sin, full_precision=heads.full_precision_rotary)
    if n_kv_heads != n_heads:
        k = k.repeat_interleave(n_heads // n_kv_heads, dim=1)
        v = v.repeat_interleave(n_heads // n_kv_heads, dim=1)
    if block_call is not None:
        call, index = block_call  # the cache takes (B, L, heads, d)
        out = call.attention(index, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        if out is not None:
            return out
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, dropout_p=dropout)
    return out.transpose(1, 2).reshape(B, L, n_heads * head_dim)


def swiglu(x: Tensor, gate: nn.Linear, up: nn.Linear, down: nn.Linear) -> Tensor:
    """down(silu(gate(x)) * up(x)): the feed-forward of both releases."""
    return down(F.silu(gate(x)) * up(x))
