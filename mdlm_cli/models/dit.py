"""The diffusion transformer (DiT) backbone of MDLM (§3.5.1).

Token embedding without absolute positions, rotary position embeddings,
adaLN-Zero blocks conditioned on a sinusoidal embedding of sigma(t),
bidirectional attention (causal for the AR baseline), GELU(tanh) MLP x4,
dropout on both residual branches and a zero-initialised output layer.

The module tree and parameter shapes follow the reference implementation
(`vocab_embed.embedding`, `sigma_map.mlp`, `blocks[i].{norm1, attn_qkv, attn_out,
norm2, mlp, adaLN_modulation}`, `output_layer.{norm_final, linear,
adaLN_modulation}`) so that published checkpoints load with a key rename.

With `model.shift` (an AR run converted by `mdlm convert --shift`) position i's logits are read
from the output at i - 1, as the AR head was trained (decoder_layers.shift_states, the one shift
of every backbone); off by default, the reference's in-place prediction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig
from ..errors import MdlmError
from .anneal import AttentionAnneal
from .block_cache import BlockCache, BlockCall
from .decoder_layers import predecessor_states, restricted_keys, shift_states
from .dit_layers import (
    DDitFinalLayer,
    EmbeddingLayer,
    LayerNorm,
    Rotary,
    TimestepEmbedder,
    apply_rotary,
    modulate,
)
from .kv_cache import KVCache  # noqa: F401 - re-exported: callers import it from here
from .section import keys_of, read_section
from .segments import is_segmented, segment_attention
from .tied import count_parameters
from .traits import BackboneTraits

if TYPE_CHECKING:
    from pathlib import Path

    from ..config import Config

try:  # optional, CUDA only
    from flash_attn import flash_attn_func  # type: ignore[import-not-found]
except Exception:  # noqa: BLE001 - any import failure means "not available"
    flash_attn_func = None


@dataclass(frozen=True)
class DiTConfig:
    """The DiT's own keys of the `model:` section (models/section.py), with ModelConfig's
    defaults (read from it: one place for them): the reference's small model, 12 x 768 with
    12 heads."""

    hidden_size: int = ModelConfig.hidden_size
    n_blocks: int = ModelConfig.n_blocks
    n_heads: int = ModelConfig.n_heads
    cond_dim: int = ModelConfig.cond_dim
    mlp_ratio: int = ModelConfig.mlp_ratio
    dropout: float = ModelConfig.dropout
    time_conditioning: bool = ModelConfig.time_conditioning
    shift: bool = ModelConfig.shift


class DDiTBlock(nn.Module):
    def __init__(self, cfg: DiTConfig, causal: bool = False):
        super().__init__()
        dim = cfg.hidden_size
        self.n_heads = cfg.n_heads
        self.causal = causal
        self.dropout = cfg.dropout
        self.norm1 = LayerNorm(dim)
        self.attn_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.attn_out = nn.Linear(dim, dim, bias=False)
        self.norm2 = LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, cfg.mlp_ratio * dim),
            nn.GELU(approximate="tanh"),
            nn.Linear(cfg.mlp_ratio * dim, dim),
        )
        # adaLN-Zero: shift/scale/gate for attention and MLP, zero at init.
        self.adaLN_modulation = nn.Linear(cfg.cond_dim, 6 * dim)
        nn.init.zeros_(self.adaLN_modulation.weight)
        nn.init.zeros_(self.adaLN_modulation.bias)

    def attention(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
                  key_mask: torch.Tensor | None,
                  cache: tuple[KVCache | BlockCall, int] | None = None) -> torch.Tensor:
        B, L, _ = x.shape
        q, k, v = self.attn_qkv(x).view(B, L, 3, self.n_heads, -1).unbind(dim=2)  # (B, L, H, D)
        cos, sin = rotary
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if cache is not None and isinstance(cache[0], BlockCall):
            # None on a full pass: it fills the cache
            out = cache[0].attention(cache[1], q, k, v)
            if out is not None:
                return out
        elif cache is not None:
            return self._cached_attention(q, k, v, *cache)
        if (flash_attn_func is not None and key_mask is None and x.is_cuda
                and q.dtype in (torch.float16, torch.bfloat16)):
            out = flash_attn_func(q, k, v, causal=self.causal)  # (B, L, H, D)
            return out.reshape(B, L, -1)
        attn_mask = None
        if key_mask is not None:  # (B, L) bool, True = attend; (B, L, L): per query (packed)
            attn_mask = key_mask[:, None] if key_mask.dim() == 3 else key_mask[:, None, None, :]
            if self.causal:
                attn_mask = attn_mask & torch.ones(L, L, dtype=torch.bool,
                                                   device=x.device).tril()
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
            attn_mask=attn_mask, is_causal=self.causal and attn_mask is None,
        )  # (B, H, L, D)
        return out.transpose(1, 2).reshape(B, L, -1)

    @staticmethod
    def _cached_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache,
                          index: int) -> torch.Tensor:
        """Causal attention of n new positions (after `cache.length` cached ones) over the
        cached keys and values and their own; the new keys and values are stored."""
        B, n = q.shape[:2]
        start, end = cache.length, cache.length + n
        cache.keys[index][:, :, start:end] = k.transpose(1, 2).to(cache.keys[index].dtype)
        cache.values[index][:, :, start:end] = v.transpose(1, 2).to(cache.values[index].dtype)
        keys, values = cache.keys[index][:, :, :end], cache.values[index][:, :, :end]
        # query j (absolute position start + j) sees keys 0 .. start + j
        causal = None
        if n > 1 and not cache.block:
            causal = torch.ones(n, end, dtype=torch.bool, device=q.device).tril(diagonal=start)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.to(q.dtype), values.to(q.dtype), attn_mask=causal
        )  # (B, heads, n, D)
        return out.transpose(1, 2).reshape(B, n, -1)

    def forward(self, x: torch.Tensor, rotary, c: torch.Tensor,
                key_mask: torch.Tensor | None = None,
                cache: tuple[KVCache | BlockCall, int] | None = None) -> torch.Tensor:
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            self.adaLN_modulation(c)[:, None].chunk(6, dim=2)
        )
        h = self.attention(modulate(self.norm1(x), shift_msa, scale_msa), rotary, key_mask,
                           cache)
        x = x + gate_msa * F.dropout(self.attn_out(h), self.dropout, self.training)
        h = self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x + gate_mlp * F.dropout(h, self.dropout, self.training)


class DiT(BackboneTraits, nn.Module):
    """`DiT(cfg, vocab_size)(tokens (B, L), sigma (B,) | None, attention_mask (B, L) | None)
    -> logits (B, L, V)`.

    `sigma` is the noise level -log alpha(t) fed to the time embedding; None means
    no time conditioning, in which case the conditioning vector is the embedding
    of sigma = 0, a constant (as in the reference code, so its checkpoints load).
    `attention_mask` marks real tokens (True/1); padded keys are never attended. Integer
    segment ids (packed examples, models/segments.py) keep attention within each segment.
    `causal=True` makes every position attend only to itself and earlier ones (the
    autoregressive baseline); with a `kv_cache` it then decodes incrementally.
    A bool `attention_mask` of shape (B | 1, 1, L, L) says which key each query attends (True =
    attend), as SDPA reads it, and `positions` ((L,) or (B, L)) gives each input its rotary
    position: block diffusion's pass over [x_t, x_0] (objectives/bd3lm.py) uses both.
    """

    # the model.* keys it reads (models.BACKBONES: a key it does not read is an error)
    config_keys = keys_of(DiTConfig)
    # the traits it has (models/traits.py; the others keep their defaults)
    packs_segments = True  # attention and positions per segment (data.packing=sft-pack)
    takes_query_masks = True  # a (B | 1, 1, L, L) attention mask and shared positions
    # attention annealing while training (train.attention_anneal_steps, models/anneal.py)
    anneals_attention = True
    attention_anneal: AttentionAnneal | None = None
    # LoRA's defaults (models/lora.py): each block's attention and MLP projections; with
    # lora.train_embeddings, the embedding and output layer whole
    lora_targets = ("attn_qkv", "attn_out", "mlp.0", "mlp.2")
    lora_whole = ("vocab_embed", "output_layer")

    @classmethod
    def validate_config(cls, cfg: Config) -> None:
        m = cfg.model
        for key in ("hidden_size", "n_blocks", "n_heads", "cond_dim", "mlp_ratio"):
            if getattr(m, key) <= 0:
                raise MdlmError(f"model.{key} must be positive (got {getattr(m, key)})")
        if m.hidden_size % m.n_heads or (m.hidden_size // m.n_heads) % 2:
            raise MdlmError(
                f"model.hidden_size ({m.hidden_size}) must be divisible by model.n_heads "
                f"({m.n_heads}) with an even head size"
            )
        if not 0.0 <= m.dropout < 1.0:
            raise MdlmError(f"model.dropout must be in [0, 1) (got {m.dropout})")

    @classmethod
    def from_checkpoint(cls, cfg: ModelConfig, vocab_size: int, folder: Path, *,
                        causal: bool = False) -> DiT:
        """config.yaml's model section is all it needs (the weights are loaded after)."""
        return cls(cfg, vocab_size, causal=causal)

    def save_checkpoint_files(self, folder: Path) -> None:
        """Nothing beside the weights: the config builds it."""

    @property
    def kv_cache_blocks(self) -> bool:
        """BD3-LM's sampling (objectives/bd3lm.py) may keep the finished blocks' keys and values
        (`kv_cache`): a shifted DiT decodes none, and recomputes them instead."""
        return not self.config.shift

    @property
    def shifted_logits(self) -> bool:
        """The engine's declaration (engine/protocols.py): logits at i read from i - 1."""
        return self.config.shift

    def describe(self) -> str:
        shift = ", shifted" if self.config.shift else ""
        return f"DiT {self.config.n_blocks}x{self.config.hidden_size}{shift}"

    def __init__(self, cfg: ModelConfig | DiTConfig, vocab_size: int, causal: bool = False):
        super().__init__()
        cfg = read_section(DiTConfig, cfg)
        if cfg.hidden_size % cfg.n_heads:
            raise ValueError(
                f"hidden_size {cfg.hidden_size} is not divisible by n_heads {cfg.n_heads}"
            )
        self.config, self.vocab_size, self.causal = cfg, vocab_size, causal
        self.vocab_embed = EmbeddingLayer(cfg.hidden_size, vocab_size)
        self.sigma_map = TimestepEmbedder(cfg.cond_dim)
        self.rotary_emb = Rotary(cfg.hidden_size // cfg.n_heads)
        self.blocks = nn.ModuleList(DDiTBlock(cfg, causal) for _ in range(cfg.n_blocks))
        self.output_layer = DDitFinalLayer(cfg.hidden_size, cfg.cond_dim, vocab_size)

    def forward(self, tokens: torch.Tensor, sigma: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None,
                output_mask: torch.Tensor | None = None,
                kv_cache: KVCache | None = None,
                positions: torch.Tensor | None = None) -> torch.Tensor:
        """With `output_mask` (B, L) bool, return logits (N, V) only at its N True
        positions (row-major order): the loss needs only the masked positions, and
        the output layer is most of the compute of a small model with a large vocab.
        With `kv_cache` (causal models), `tokens` (B, n) follow the cached positions:
        logits (B, n, V) of the new positions, which are added to the cache."""
        if sigma is None:
            sigma = torch.zeros(tokens.shape[0], device=tokens.device)
        if kv_cache is not None:
            return self._decode(tokens, sigma, kv_cache)
        key_mask = None
        if is_segmented(attention_mask):  # segment ids of packed examples (models/segments.py)
            key_mask, positions = segment_attention(attention_mask)
        elif attention_mask is not None and attention_mask.dim() == 4:  # (B | 1, 1, L, L)
            key_mask = attention_mask[:, 0].bool()  # per query, as the packed examples' mask
        elif attention_mask is not None and not bool(attention_mask.all()):
            key_mask = attention_mask.bool()
        if self.training and self.attention_anneal is not None:
            key_mask = self._annealed(key_mask, tokens.shape[1], tokens.device)
        x, c = self.trunk(tokens, sigma, key_mask, positions)
        if self.config.shift and key_mask is not None and key_mask.dim() == 3 \
                and positions is not None and positions.dim() == 1:  # BD3-LM's [x_t, x_0]
            x = predecessor_states(x, key_mask[:, None], positions)
        elif self.config.shift:
            x = shift_states(x)  # the conditioning is per row
        if output_mask is not None:
            # the one host synchronisation: N varies
            rows, cols = output_mask.nonzero().unbind(1)
            return self.output_layer(x[rows, cols], c[rows])  # (N, V)
        return self.output_layer(x, c)  # (B, L, V)

    def _annealed(self, key_mask: torch.Tensor | None, length: int,
                  device: torch.device) -> torch.Tensor | None:
        """The keys a training pass attends under the anneal (models/anneal.py), per query
        (B | 1, L, L): the anneal's causal and random pairs, within `key_mask`'s (padded keys
        out, each query keeping its own key; packed examples' segments kept)."""
        allowed = self.attention_anneal.allowed(length, device)
        if allowed is None:
            return key_mask
        if key_mask is None:
            return allowed[None]
        if key_mask.dim() == 2:  # (B, L): padded keys, as the folder backbones restrict them
            return restricted_keys(allowed, key_mask)[:, 0]
        return key_mask & allowed  # (B, L, L): packed examples' segments

    def trunk(self, tokens: torch.Tensor, sigma: torch.Tensor,
              key_mask: torch.Tensor | None = None,
              positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states (B, L, H) and conditioning (B, C): everything but the output
        layer, with fixed shapes (what `torch.compile` captures). `key_mask` (B, L) or
        (B | 1, L, L) bool; `positions` (B, L) or (L,): rotary positions per row (packed
        examples) or shared by the rows (block diffusion's [x_t, x_0])."""
        x = self.vocab_embed(tokens)  # (B, L, H)
        c = F.silu(self.sigma_map(sigma))  # (B, C)
        rotary = self.rotary_emb(tokens.shape[1], tokens.device)
        if positions is not None:
            rotary = (rotary[0][positions], rotary[1][positions])  # (B, L, 1, D) or (L, 1, D)
        for block in self.blocks:
            x = block(x, rotary, c, key_mask)
        return x, c

    def _decode(self, tokens: torch.Tensor, sigma: torch.Tensor, cache: KVCache) -> torch.Tensor:
        if not (self.causal or cache.block):
            raise ValueError("a key/value cache needs a causal model (or a block cache)")
        if self.config.shift:  # the next token's logits are those of the last position
            raise ValueError("a shifted DiT is a diffusion model; it decodes no key/value cache")
        start, end = cache.length, cache.length + tokens.shape[1]
        if end > cache.max_len:
            raise ValueError(
                f"the key/value cache holds {cache.max_len} positions; {end} asked for"
            )
        x = self.vocab_embed(tokens)  # (B, n, H)
        c = F.silu(self.sigma_map(sigma))  # (B, C)
        cos, sin = self.rotary_emb(cache.max_len, tokens.device)
        rotary = (cos[start:end], sin[start:end])
        for i, block in enumerate(self.blocks):
            x = block(x, rotary, c, None, (cache, i))
        cache.length = end
        return self.output_layer(x, c)  # (B, n, V)

    def new_block_cache(self, batch: int, length: int) -> BlockCache:
        return BlockCache.empty(batch, length, self.config.n_blocks)

    def block_cache(self, tokens: torch.Tensor, cache: BlockCache,
                    rows: torch.Tensor | None = None) -> tuple[torch.Tensor, BlockCache]:
        """A full pass (models/block_cache.py): logits (R, L, V), keys/values kept at `rows`."""
        return self._block_call(tokens, BlockCall(cache, 0, rows, refresh=True)), cache

    def from_cache(self, tokens: torch.Tensor, cache: BlockCache, start: int,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (R, n, V) of `tokens` (R, n), positions [start, start + n) of `rows`."""
        return self._block_call(tokens, BlockCall(cache, start, rows))

    def _block_call(self, tokens: torch.Tensor, call: BlockCall) -> torch.Tensor:
        if self.causal or self.config.time_conditioning:
            raise MdlmError("a block cache needs a bidirectional model without time "
                            "conditioning (its keys would depend on t): use --cache none")
        x = self.vocab_embed(tokens)  # (R, n, H)
        c = F.silu(self.sigma_map(torch.zeros(len(tokens), device=tokens.device)))  # (R, C)
        cos, sin = self.rotary_emb(call.cache.length, tokens.device)
        end = call.start + tokens.shape[1]  # the slice's absolute positions
        rotary = (cos[call.start:end], sin[call.start:end])
        for i, block in enumerate(self.blocks):
            x = block(x, rotary, c, None, (call, i))
        x = shift_states(x) if self.config.shift else x  # within the slice, as Dream's
        return self.output_layer(x, c)  # (R, n, V)

    def num_parameters(self, non_embedding: bool = False) -> int:
        tables = [self.vocab_embed.embedding, self.output_layer.linear.weight]
        return count_parameters(self, tables if non_embedding else [])
