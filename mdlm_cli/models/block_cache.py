"""Block-wise key/value caching for bidirectional models (Fast-dLLM's prefix and dual cache).

In semi-autoregressive block decoding the keys and values of the positions outside the block
being decoded change little while it is decoded, so one full pass per block stores every
position's keys and values (`BlockCache`), and the calls after it run only a slice of positions
[start, start + n) (`BlockCall`): the slice's fresh keys and values are written over its
entries, in place, and its queries attend to the whole cache. The caller picks the slice:
- prefix cache: the block and the whole suffix, [block start, L): only the entries before the
  block are ever read from the cache (the rest were just overwritten);
- dual cache: the block only: the suffix's entries are those of the last full pass (stale).
Inexact in both: the cached entries are computed from tokens since revealed, and in every
layer past the first from hidden states that saw the old block. Nothing here depends on the
backbone but the shapes; a backbone with rotary positions gives a slice its absolute ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor


@dataclass
class BlockCache:
    """Keys and values of every position of `batch` rows of `length` tokens, per layer,
    (batch, heads, length, head_dim) each, allocated by the first full pass (its dtype)."""

    batch: int
    length: int
    keys: list[Tensor | None] = field(default_factory=list)
    values: list[Tensor | None] = field(default_factory=list)

    @classmethod
    def empty(cls, batch: int, length: int, layers: int) -> BlockCache:
        return cls(batch, length, [None] * layers, [None] * layers)


@dataclass
class BlockCall:
    """One network call's use of a cache, for the rows `rows` of its batch (all if None):
    `refresh` (a full pass over all positions: store their keys and values), or a slice of
    positions [start, start + n) attending to the cached keys and values of the others."""

    cache: BlockCache
    start: int = 0
    rows: Tensor | None = None
    refresh: bool = False

    def attention(self, index: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor | None:
        """A slice's attention output (R, n, heads * head_dim); None on a full pass, whose keys
        and values are stored (its attention is the backbone's own)."""
        if self.refresh:
            self.store(index, k, v)
            return None
        return self.attend(index, q, k, v)

    def store(self, index: int, k: Tensor, v: Tensor) -> None:
        """Keep a full pass's keys and values (R, L, heads, head_dim) of layer `index`."""
        cache = self.cache
        if cache.keys[index] is None:
            shape = (cache.batch, k.shape[2], cache.length, k.shape[3])
            cache.keys[index] = k.new_zeros(shape)
            cache.values[index] = v.new_zeros(shape)
        self._write(cache.keys[index], k, 0)
        self._write(cache.values[index], v, 0)

    def attend(self, index: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """Bidirectional attention of the slice's queries (R, n, heads, head_dim) over the
        cache of layer `index`, its entries [start, start + n) replaced by the slice's own."""
        keys, values = self.cache.keys[index], self.cache.values[index]
        if keys is None:
            raise ValueError("the block cache is empty: a full pass (refresh) fills it first")
        self._write(keys, k, self.start)
        self._write(values, v, self.start)
        if self.rows is not None:
            keys, values = keys[self.rows], values[self.rows]  # (R, heads, L, head_dim)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys.to(q.dtype), values.to(q.dtype)
        )  # (R, heads, n, head_dim)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)

    def _write(self, store: Tensor, fresh: Tensor, start: int) -> None:
        """store[rows, :, start:start + n] = fresh (R, n, heads, head_dim), in place."""
        fresh = fresh.transpose(1, 2).to(store.dtype)
        end = start + fresh.shape[2]
        if end > store.shape[2]:
            raise ValueError(f"the block cache holds {store.shape[2]} positions; {end} asked "
                             "for")
        if self.rows is None:
            store[:, :, start:end] = fresh
        else:
            store[self.rows, :, start:end] = fresh
