"""The order in which training reads the rows: stateless, so a resumed run continues it
exactly."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ..runtime import derive_seed


class DataOrder:
    """Stateless epoch-shuffled order: global sample i is row perm_{i // N}[i % N].

    The position in the stream is just the number of samples consumed, so a run
    resumed from a checkpoint (with any number of ranks) neither repeats nor skips data.
    """

    def __init__(self, num_rows: int, seed: int):
        self.num_rows, self.seed = num_rows, seed
        self._perm = lru_cache(maxsize=2)(self._permutation)

    def _permutation(self, epoch: int) -> np.ndarray:
        g = torch.Generator().manual_seed(derive_seed(self.seed, "epoch", epoch))
        return torch.randperm(self.num_rows, generator=g).numpy()

    def rows(self, start: int, count: int) -> np.ndarray:
        idx = np.arange(start, start + count)
        out = np.empty(count, dtype=np.int64)
        for epoch in np.unique(idx // self.num_rows):
            sel = idx // self.num_rows == epoch
            out[sel] = self._perm(int(epoch))[idx[sel] % self.num_rows]
        return out
