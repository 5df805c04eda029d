"""Several prompt/response examples per row (`data.packing: sft-pack`).

Rows are filled greedily in the source's order; an example that does not fit in what is left
of the row starts the next one:

    [BOS] prompt response [EOS] [BOS] prompt response [EOS] ... fill ...   (L tokens)

Each example is one segment, numbered 1, 2, ... within its row; a position attends only to
the positions of its own segment and its rotary positions restart at the segment's start
(the DiT, models/segments.py), so a packed row computes what one row per example would, at
a fraction of the padding. `fill` is as under `sft` (data/sft.py): with `data.pad_as_eos`
it is EOS in the row's last segment (attended and scored, so the model learns where an answer
ends), else the pad token in segment 0 (never attended, masked or scored).

Stored next to the tokens: `{split}.segments.bin` (uint16 (rows, L), the segment id of each
position, 0 = padding) and `{split}.targets.bin` (uint8 (rows, L), 1 at the positions the
loss covers: responses, their EOS and the EOS fill). A prompt is clean, attended context.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from ..errors import MdlmError
from .sft import ExampleSource, encode_example
from .source import SplitWrite
from .tokenizers import Tokenizer

MAX_SEGMENT_ID = np.iinfo(np.uint16).max

# (tokens (n, L), lengths (n,), segments (n, L), targets (n, L) bool, examples dropped)
PackedRows = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]


class RowPacker:
    """Greedy packing of encoded examples into rows of `length`; the open row carries over
    from one batch to the next."""

    def __init__(self, length: int, fill: int, pad_as_eos: bool):
        self.length, self.fill, self.pad_as_eos = length, fill, pad_as_eos
        self.open: list[tuple[list[int], list[int]]] = []  # (prompt, response) of the open row
        self.used = 0

    def add(self, examples: list[tuple[list[int], list[int]]]) -> list[list[tuple]]:
        """The rows completed by these examples (each a list of (prompt, response))."""
        done = []
        for p, r in examples:
            if self.used + len(p) + len(r) > self.length:
                done.append(self.open)
                self.open, self.used = [], 0
            self.open.append((p, r))
            self.used += len(p) + len(r)
        return done

    def flush(self) -> list[list[tuple]]:
        done, self.open, self.used = ([self.open] if self.open else []), [], 0
        return done

    def arrays(self, rows: list[list[tuple]]) -> tuple[np.ndarray, ...]:
        """tokens, lengths, segments, targets of completed rows."""
        n, L = len(rows), self.length
        tokens = np.full((n, L), self.fill, dtype=np.int64)
        segments = np.zeros((n, L), dtype=np.uint16)
        targets = np.zeros((n, L), dtype=bool)
        lengths = np.full(n, L, dtype=np.int32)
        for i, row in enumerate(rows):
            at = 0
            for s, (p, r) in enumerate(row, 1):
                end = at + len(p) + len(r)
                tokens[i, at:end] = p + r
                segments[i, at:end] = s
                targets[i, at + len(p):end] = True
                at = end
            if self.pad_as_eos:  # the EOS fill belongs to the last answer: scored with it
                segments[i, at:] = len(row)
                targets[i, at:] = True
            else:
                lengths[i] = at
        return tokens, lengths, segments, targets


def sft_pack_rows(example_batches: Iterable[list[dict]], length: int, tokenizer: Tokenizer, *,
                  pad_as_eos: bool) -> Iterator[PackedRows]:
    """The packed rows completed by each batch of examples (the last batch also flushes the
    open row), with the number of examples dropped as longer than a row (never cut)."""
    if length // 2 > MAX_SEGMENT_ID:
        raise MdlmError(f"data.packing=sft-pack numbers segments in 16 bits: data.length must "
                        f"be at most {2 * MAX_SEGMENT_ID} (got {length}); use data.packing=sft")
    packer = RowPacker(length, tokenizer.eos_id if pad_as_eos else tokenizer.pad_id, pad_as_eos)
    batches = iter(example_batches)
    batch = next(batches, None)
    while batch is not None:
        encoded = [encode_example(tokenizer, e) for e in batch]
        kept = [(p, r) for p, r in encoded if len(p) + len(r) <= length]
        rows = packer.add(kept)
        batch = next(batches, None)
        if batch is None:
            rows += packer.flush()
        yield (*packer.arrays(rows), len(encoded) - len(kept))


def write_sft_pack_split(out: SplitWrite, source: ExampleSource, tokenizer: Tokenizer, *,
                         length: int, pad_as_eos: bool) -> dict:
    """Tokens, lengths, segments and targets of one split; the split's entry of meta.json."""
    batches, total = source.examples(out.split, out.load_dataset)
    info = {"rows": 0, "tokens": 0, "docs": 0, "dropped": 0, "target_tokens": 0, "examples": 0}
    limit = out.limit

    def counted():
        for batch in batches:
            out.read(len(batch), total)
            info["docs"] += len(batch)
            yield batch

    names = ("tokens", "lengths", "segments", "targets")
    files = {name: open(out.path(name), "wb") for name in names}
    try:
        for tokens, lengths, segments, targets, dropped in sft_pack_rows(
                counted(), length, tokenizer, pad_as_eos=pad_as_eos):
            if limit is not None:
                tokens, lengths, segments, targets = (
                    a[: limit - info["rows"]] for a in (tokens, lengths, segments, targets))
            files["tokens"].write(tokens.astype(out.dtype).tobytes())
            files["lengths"].write(lengths.tobytes())
            files["segments"].write(segments.tobytes())
            files["targets"].write(targets.astype(np.uint8).tobytes())
            info["rows"] += len(tokens)
            info["dropped"] += dropped
            info["tokens"] += int(lengths.sum())
            info["target_tokens"] += int(targets.sum())
            info["examples"] += int(segments.max(axis=1).sum()) if len(segments) else 0
            if limit is not None and info["rows"] >= limit:
                break
    finally:
        for f in files.values():
            f.close()
    return info
