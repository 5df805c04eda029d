"""The inverse of the packers (mdlm_cli.data.packing), for the tests: documents back from rows."""

from __future__ import annotations

import numpy as np


def unpack(rows: np.ndarray, lengths: np.ndarray, packing: str, *, bos: int, eos: int,
           separator: int | None = None) -> list[list[int]]:
    """Inverse of the packers, for tests and inspection: the documents' token lists."""
    if packing == "pad":
        return [list(r[1 : n - 1]) for r, n in zip(rows, lengths, strict=True)]
    if len(rows) == 0:
        return []
    strip = 1 if packing == "wrap" else 0
    stream = np.concatenate([r[strip : n - strip] for r, n in zip(rows, lengths, strict=True)])
    cut = eos if packing == "wrap" else separator
    if cut is None:
        return [list(stream)]
    docs, start = [], 0
    for i in np.flatnonzero(stream == cut):
        docs.append(list(stream[start:i]))
        start = i + 1
    if start < len(stream):
        docs.append(list(stream[start:]))
    return docs
