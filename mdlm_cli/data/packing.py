"""Packing token streams into fixed-length rows.

- `wrap` (OWT): documents + EOS are concatenated and cut into L-2 token pieces,
  each emitted as [BOS] piece [EOS]. The remainder becomes a last, shorter row.
- `chunk` (text8): the stream is cut into L-token rows (no specials; documents joined by a
  space for characters, by EOS for other tokenisers).
- `chunk-eos`: `chunk` with documents always joined by EOS and no BOS/EOS added per row (the
  BD3-LM reference's `insert_train_special=False`): EOS marks where documents end, at any
  position, never where a row does.
- `pad` (LM1B): one document per row, [BOS] doc[:L-2] [EOS], padded to L.
- `window` (DNA): each document cut into consecutive L-token rows (no specials, never
  across documents); a document's last, shorter row is padded.

Every packer yields (rows (n, L) int64, lengths (n,) int32); positions at or
after a row's length are padding, excluded by the attention mask and the loss.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import numpy as np

Rows = tuple[np.ndarray, np.ndarray]


def _flat(docs: list[list[int]], separator: int | None) -> np.ndarray:
    tail = [] if separator is None else [separator]
    return np.fromiter(itertools.chain.from_iterable(d + tail for d in docs), dtype=np.int64)


def wrap_rows(doc_batches: Iterable[list[list[int]]], length: int, *, bos: int, eos: int,
              pad: int) -> Iterator[Rows]:
    piece = length - 2
    buffer = np.zeros(0, dtype=np.int64)
    for docs in doc_batches:
        buffer = np.concatenate([buffer, _flat(docs, eos)])
        n = len(buffer) // piece
        if n:
            body = buffer[: n * piece].reshape(n, piece)
            rows = np.concatenate([np.full((n, 1), bos), body, np.full((n, 1), eos)], axis=1)
            yield rows, np.full(n, length, dtype=np.int32)
            buffer = buffer[n * piece:]
    if len(buffer):
        row = np.full((1, length), pad, dtype=np.int64)
        row[0, : len(buffer) + 2] = np.concatenate([[bos], buffer, [eos]])
        yield row, np.array([len(buffer) + 2], dtype=np.int32)


def chunk_rows(doc_batches: Iterable[list[list[int]]], length: int, *, pad: int,
               separator: int | None = None) -> Iterator[Rows]:
    buffer = np.zeros(0, dtype=np.int64)
    for docs in doc_batches:
        buffer = np.concatenate([buffer, _flat(docs, separator)])
        n = len(buffer) // length
        if n:
            yield buffer[: n * length].reshape(n, length), np.full(n, length, dtype=np.int32)
            buffer = buffer[n * length:]
    if len(buffer):
        row = np.full((1, length), pad, dtype=np.int64)
        row[0, : len(buffer)] = buffer
        yield row, np.array([len(buffer)], dtype=np.int32)


def pad_rows(doc_batches: Iterable[list[list[int]]], length: int, *, bos: int, eos: int,
             pad: int) -> Iterator[Rows]:
    for docs in doc_batches:
        if not docs:
            continue
        rows = np.full((len(docs), length), pad, dtype=np.int64)
        lengths = np.zeros(len(docs), dtype=np.int32)
        for i, doc in enumerate(docs):
            seq = [bos] + doc[: length - 2] + [eos]
            rows[i, : len(seq)] = seq
            lengths[i] = len(seq)
        yield rows, lengths


def window_rows(doc_batches: Iterable[list], length: int, *, pad: int, **_) -> Iterator[Rows]:
    """Documents are token lists or int arrays (a genome piece is millions of tokens)."""
    for docs in doc_batches:
        rows, lengths = [], []
        for doc in docs:
            arr = np.asarray(doc, dtype=np.int64)
            n = len(arr) // length
            if n:
                rows.append(arr[: n * length].reshape(n, length))
                lengths.append(np.full(n, length, dtype=np.int32))
            if len(arr) > n * length:
                row = np.full((1, length), pad, dtype=np.int64)
                row[0, : len(arr) - n * length] = arr[n * length:]
                rows.append(row)
                lengths.append(np.array([len(arr) - n * length], dtype=np.int32))
        if rows:
            yield np.concatenate(rows), np.concatenate(lengths)


PACKERS = {
    "wrap": wrap_rows, "chunk": chunk_rows, "chunk-eos": chunk_rows,
    "pad": pad_rows, "window": window_rows,
}
