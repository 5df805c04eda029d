"""One split of the streamed packings (wrap, chunk, pad, window: data/packing.py) written to
its files: documents tokenised batch by batch, packed into rows, the rows written as they
come (`{split}.tokens.bin`, `{split}.lengths.bin`, and `{split}.scored.bin` where the source
has unscored characters; the layout is data/store.py's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .packing import PACKERS

if TYPE_CHECKING:
    from ..config import DataConfig
    from .source import SplitWrite
    from .sources import Source
    from .tokenizers import Tokenizer


def write_packed_split(out: SplitWrite, source: Source, tokenizer: Tokenizer,
                       cfg: DataConfig) -> dict:
    """The split's files and its meta.json entry (rows, tokens, documents read); with
    `out.limit`, the source is read no further once that many rows are written."""
    batches, total_docs = source.documents(out.split, out.load_dataset)
    counts = {"docs": 0}
    unscored = [tokenizer.encode(c)[0] for c in source.unscored]

    def tokenized():
        for docs in batches:
            counts["docs"] += len(docs)
            out.read(len(docs), total_docs)
            yield _token_ids(docs, tokenizer, cfg.packing, unscored)

    rows_iter = _pack(tokenized(), tokenizer, cfg)
    n_rows, n_tokens = _write_rows(out, rows_iter, scored=bool(unscored),
                                   pad_id=tokenizer.pad_id)
    info = {"rows": n_rows, "tokens": n_tokens, "docs": counts["docs"]}
    if out.limit is not None:  # docs = documents read up to the limit
        info.update(row_limit=out.limit, stopped_at_limit=n_rows >= out.limit)
    return info


def _token_ids(docs: list[str], tokenizer: Tokenizer, packing: str, unscored: list[int]):
    """One batch of documents as token ids, unscored characters stored as the pad token."""
    arrays = packing == "window" and tokenizer.kind == "dna"  # genome pieces: arrays, not lists
    ids = [tokenizer.encode_array(d) for d in docs] if arrays else tokenizer.encode_batch(docs)
    if not unscored:
        return ids
    # stored as the pad token, which the attention mask then excludes anywhere
    pad = tokenizer.pad_id
    ids = [np.where(np.isin(np.asarray(d), unscored), pad, np.asarray(d)) for d in ids]
    return ids if arrays else [d.tolist() for d in ids]


def _pack(tokenized, tokenizer: Tokenizer, cfg: DataConfig):
    """The rows (and their lengths) of the configured packing over the tokenised batches."""
    packer = PACKERS[cfg.packing]
    if cfg.packing in ("chunk", "chunk-eos"):
        # text8's characters join documents with a space; chunk-eos always with EOS, so that a
        # model learns where documents end, not where rows do (BD3-LM's variable length)
        char_space = cfg.packing == "chunk" and tokenizer.is_character_level
        sep = tokenizer.encode(" ")[0] if char_space else tokenizer.eos_id
        return packer(tokenized, cfg.length, pad=tokenizer.pad_id, separator=sep)
    return packer(tokenized, cfg.length, bos=tokenizer.bos_id, eos=tokenizer.eos_id,
                  pad=tokenizer.pad_id)


def _write_rows(out: SplitWrite, rows_iter, *, scored: bool,
                pad_id: int | None) -> tuple[int, int]:
    """The split's token and length files (and, if `scored`, each row's tokens that are not
    the pad); (rows, tokens) written, stopping at `out.limit` rows."""
    n_rows = n_tokens = 0
    limit = out.limit
    scored_file = open(out.path("scored"), "wb") if scored else None
    with open(out.path("tokens"), "wb") as ft, open(out.path("lengths"), "wb") as fl:
        for rows, lengths in rows_iter:
            if limit is not None:
                rows, lengths = rows[: limit - n_rows], lengths[: limit - n_rows]
            ft.write(rows.astype(out.dtype).tobytes())
            fl.write(lengths.astype(np.int32).tobytes())
            n_rows += len(rows)
            if scored_file is not None:
                inside = np.arange(rows.shape[1])[None, :] < lengths[:, None]
                lengths = (inside & (rows != pad_id)).sum(1)
                scored_file.write(lengths.astype(np.int32).tobytes())
            n_tokens += int(lengths.sum())
            if limit is not None and n_rows >= limit:
                break  # a streamed source is read no further
    if scored_file is not None:
        scored_file.close()
    return n_rows, n_tokens
