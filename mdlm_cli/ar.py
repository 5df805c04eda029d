"""The autoregressive baseline: the DiT's blocks with causal attention and no time input.

Every token of a row is predicted from the tokens before it, the first from a start
token (BOS) put in front: inputs [BOS, x_0, ..., x_{L-2}], targets [x_0, ..., x_{L-1}].
The AR model is therefore scored on exactly the tokens the diffusion bound covers
(the reference predicts x[1:] from x[:-1] and never scores the first token), so its
exact perplexity and a diffusion model's bound are comparable row for row.

Generation uses a key/value cache: one network call per new token that processes only
that token (the reference AR sampler recomputes the whole prefix at every step and
pre-allocates a B x L x V noise buffer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .data.store import TokenSplit
from .engine.categorical import sample_tokens
from .engine.sampling import SampleStats
from .errors import MdlmError
from .evaluation import BoundResult
from .models import DiT, autocast_for
from .models.dit import apply_rotary, modulate


def shift_right(x0: Tensor, bos_id: int) -> Tensor:
    """Inputs of the AR model: [BOS, x_0, ..., x_{L-2}] (B, L)."""
    return torch.cat([torch.full_like(x0[:, :1], bos_id), x0[:, :-1]], dim=1)


def next_token_logits(logits: Tensor, mask_id: int) -> Tensor:
    """The mask token exists in the vocabulary (shared with the diffusion models) but is
    never a real token: it gets probability zero, as under SUBS."""
    return logits.float().index_fill(-1, torch.tensor([mask_id], device=logits.device), float("-inf"))


def sequence_nll(model: DiT, x0: Tensor, *, bos_id: int, mask_id: int,
                 attention_mask: Tensor | None = None,
                 autocast_dtype: torch.dtype | None = None) -> Tensor:
    """Exact negative log-likelihood of each row, summed over its real tokens: nats (B,).

    -log p(x) = sum_l -log p_theta(x_l | x_<l). Padding sits at the end of a row, so with
    causal attention no real position ever sees it; it is only excluded from the sum.
    """
    with autocast_for(x0.device, autocast_dtype):
        logits = model(shift_right(x0, bos_id))  # (B, L, V)
    nll = F.cross_entropy(next_token_logits(logits, mask_id).transpose(1, 2), x0, reduction="none")  # (B, L)
    if attention_mask is not None:
        nll = nll * attention_mask.to(nll.dtype)
    return nll.sum(dim=1)


@torch.no_grad()
def exact_nll(model: DiT, split: TokenSplit, *, bos_id: int, mask_id: int, batch_size: int,
              device: torch.device, rows: int = 0, autocast_dtype: torch.dtype | None = None,
              on_batch: Callable[[int], None] | None = None) -> BoundResult:
    """Exact NLL over the first `rows` rows of `split` (0 = all, remainder batch included)."""
    n = len(split) if rows <= 0 else min(rows, len(split))
    total = torch.zeros((), device=device, dtype=torch.float64)
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(start + batch_size, n))
        x0, attention_mask = split.batch(idx, device)
        total += sequence_nll(model, x0, bos_id=bos_id, mask_id=mask_id, attention_mask=attention_mask,
                              autocast_dtype=autocast_dtype).sum().double()
        if on_batch is not None:
            on_batch(len(idx))
    return BoundResult(float(total), int(split.lengths[:n].sum()), n, exact=True)


# ----------------------------------------------------------------------------- KV cache

@dataclass
class KVCache:
    """Keys and values of every block, (B, heads, max_len, head_dim) each, filled up to `length`."""

    keys: list[Tensor]
    values: list[Tensor]
    length: int = 0

    @classmethod
    def empty(cls, model: DiT, batch: int, max_len: int, device: torch.device, dtype: torch.dtype) -> KVCache:
        cfg = model.config
        shape = (batch, cfg.n_heads, max_len, cfg.hidden_size // cfg.n_heads)
        return cls([torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_blocks)],
                   [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_blocks)])

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]


@torch.no_grad()
def forward_cached(model: DiT, tokens: Tensor, cache: KVCache) -> Tensor:
    """Logits (B, n, V) of `tokens` (B, n) placed after the `cache.length` cached positions.

    The same computation as `DiT.forward` in eval mode with causal attention (dropout off,
    sigma = 0 conditioning), but each block attends to the cached keys and values
    instead of recomputing the prefix.
    """
    B, n = tokens.shape
    start, end = cache.length, cache.length + n
    if end > cache.max_len:
        raise MdlmError(f"the key/value cache holds {cache.max_len} positions; {end} asked for")
    c = F.silu(model.sigma_map(torch.zeros(B, device=tokens.device)))  # (B, C)
    cos, sin = model.rotary_emb(cache.max_len, tokens.device)
    cos, sin = cos[start:end], sin[start:end]
    # query j (absolute position start + j) sees keys 0 .. start + j
    causal = torch.ones(n, end, dtype=torch.bool, device=tokens.device).tril(diagonal=start)
    x = model.vocab_embed(tokens)  # (B, n, H)
    for i, block in enumerate(model.blocks):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            block.adaLN_modulation(c)[:, None].chunk(6, dim=2))
        h = modulate(block.norm1(x), shift_msa, scale_msa)
        q, k, v = block.attn_qkv(h).view(B, n, 3, block.n_heads, -1).unbind(dim=2)  # (B, n, heads, D)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        cache.keys[i][:, :, start:end] = k.transpose(1, 2).to(cache.keys[i].dtype)
        cache.values[i][:, :, start:end] = v.transpose(1, 2).to(cache.values[i].dtype)
        keys, values = cache.keys[i][:, :, :end], cache.values[i][:, :, :end]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), keys.to(q.dtype), values.to(q.dtype),
                                             attn_mask=None if n == 1 else causal)  # (B, heads, n, D)
        x = x + gate_msa * block.attn_out(out.transpose(1, 2).reshape(B, n, -1))
        x = x + gate_mlp * block.mlp(modulate(block.norm2(x), shift_mlp, scale_mlp))
    cache.length = end
    return model.output_layer(x, c)


def prompt_prefix(prompt: Tensor | None, mask_id: int) -> Tensor | None:
    """The fixed prefix of a sampling template ((length,) with mask_id at free positions).

    An AR model can only continue a prefix: a fixed token after a free one is an infill.
    """
    if prompt is None:
        return None
    free = (prompt == mask_id).nonzero()
    n = int(free[0, 0]) if len(free) else len(prompt)
    if (prompt[n:] != mask_id).any():
        raise MdlmError("an autoregressive model can only continue a prefix; use --prompt, not --infill")
    return prompt[:n]


@torch.no_grad()
def generate(model: DiT, *, num_samples: int, length: int, bos_id: int, mask_id: int,
             generator: torch.Generator | None = None, prompt: Tensor | None = None,
             batch_size: int | None = None, precision: str = "fp64", temperature: float = 1.0,
             top_p: float = 1.0, device: torch.device | str = "cpu",
             autocast_dtype: torch.dtype | None = None,
             on_batch: Callable[[int], None] | None = None) -> tuple[Tensor, SampleStats]:
    """Ancestral sampling token by token with a key/value cache: (num_samples, length), stats.

    `prompt` (P,) holds the first P tokens of every sample. Draws are exact float64
    inverse-CDF draws by default (engine.categorical), so rare tokens are not truncated away.
    NFE counts network calls per sequence: one per new token, the first of which also
    processes the prompt.
    """
    if num_samples < 1 or length < 1:
        raise MdlmError(f"num_samples and length must be positive (got {num_samples}, {length})")
    device = torch.device(device)
    prefix = torch.zeros(0, dtype=torch.long) if prompt is None else prompt.long().cpu()
    if len(prefix) >= length:
        raise MdlmError(f"the prompt ({len(prefix)} tokens) leaves nothing to generate in {length}")
    batch_size = batch_size or num_samples
    stats = SampleStats(num_sequences=num_samples)
    dtype = autocast_dtype or torch.float32
    outputs = []
    for first in range(0, num_samples, batch_size):
        B = min(batch_size, num_samples - first)
        out = torch.empty(B, length, dtype=torch.long, device=device)
        out[:, :len(prefix)] = prefix.to(device)
        cache = KVCache.empty(model, B, length, device, dtype)
        step_in = torch.cat([torch.full((B, 1), bos_id, dtype=torch.long), prefix[None].expand(B, -1)], 1)
        step_in = step_in.to(device)
        for pos in range(len(prefix), length):
            with autocast_for(device, autocast_dtype):
                logits = forward_cached(model, step_in, cache)[:, -1]  # (B, V)
            stats.calls += 1
            stats.sequence_evals += B
            stats.draws += B
            token = sample_tokens(logits, mask_id, generator=generator, precision=precision,
                                  temperature=temperature, top_p=top_p)
            out[:, pos] = token
            step_in = token[:, None]
        outputs.append(out)
        if on_batch is not None:
            on_batch(B)
    return torch.cat(outputs), stats
