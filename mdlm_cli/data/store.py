"""`mdlm prepare-data`: tokenise and pack a source into memory-mapped token files.

Layout of a prepared data set (one folder per cache key):
    meta.json                 tokeniser, vocab, mask id, length, packing, counts, source
    {split}.tokens.bin        uint16/uint32 (rows, L), row-major
    {split}.lengths.bin       int32 (rows,): real tokens per row, the rest is padding
    {split}.scored.bin        int32 (rows,): tokens of each row that count (DNA: N is stored as
                              the pad token inside rows too, and meta.json says `pad_anywhere`)
    {split}.prompt.bin        int32 (rows,), packing sft: the prompt's tokens at the start of each
                              row (clean context); the rest up to the row's length is the target
    {split}.segments.bin      uint16 (rows, L), packing sft-pack: each position's example (1, 2, ...
                              within its row; 0 = padding), attention stays within one
    {split}.targets.bin       uint8 (rows, L), packing sft-pack: 1 where the loss counts (responses)
    tokenizer/                the tokeniser's own files

The cache key hashes everything that changes the content (source fingerprint,
tokeniser vocabulary, length, packing, format version): the reference's key
ignores the tokeniser. The folder is built under a temporary name and renamed
when complete, so an interrupted run never leaves a cache that looks complete.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..config import SFT_PACKINGS
from ..errors import MdlmError
from ..io.files import pid_alive
from .packed_split import write_packed_split
from .sft import example_source, row_format, write_sft_split
from .sft_pack import write_sft_pack_split
from .source import SplitWrite
from .sources import Source, get_source
from .tokenizers import Tokenizer, default_cache_root, load_tokenizer

if TYPE_CHECKING:
    from ..config import DataConfig

FORMAT_VERSION = 1


def cache_key(source: Source, tokenizer: Tokenizer, length: int, packing: str,
              limits: dict | None = None) -> str:
    """`limits`: the row limits per split ({} or None when every row is kept: the key of every
    data set prepared before limits existed)."""
    payload = {
        "format": FORMAT_VERSION,
        "source": source.fingerprint,
        "tokenizer": tokenizer.fingerprint,
        "length": length,
        "packing": packing,
    }
    if limits:
        payload["row_limits"] = limits
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def row_limits(cfg: DataConfig, splits) -> dict[str, int]:
    """Rows to keep per split (data.max_rows for train, data.max_eval_rows for the others);
    unlimited ones left out."""
    limits = {split: cfg.max_rows if split == "train" else cfg.max_eval_rows for split in splits}
    return {split: n for split, n in limits.items() if n > 0}


def cache_root(cfg: DataConfig) -> Path:
    return Path(cfg.cache_dir) if cfg.cache_dir else default_cache_root()


@dataclass
class TokenSplit:
    """Memory-mapped rows of one split."""

    tokens: np.ndarray  # (rows, L)
    lengths: np.ndarray  # (rows,)
    # set: this token is excluded wherever it stands (DNA's N), not only at the end
    pad_id: int | None = None
    scored: np.ndarray | None = None  # (rows,) tokens that count per row, when pad_id is set
    prompt: np.ndarray | None = None  # (rows,) packing sft: prompt tokens at each row's start
    segments: np.ndarray | None = None  # (rows, L) packing sft-pack: example ids, 0 = padding
    target_map: np.ndarray | None = None  # (rows, L) packing sft-pack: 1 at the loss's positions

    def __len__(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.count(slice(None))

    def count(self, rows) -> int:
        """Tokens that count (enter the masking and the loss) in these rows: sft, the targets."""
        if self.target_map is not None:
            return int(self.target_map[rows].sum(dtype=np.int64))
        if self.prompt is not None:
            return int((self.lengths[rows].astype(np.int64) - self.prompt[rows]).sum())
        return int((self.lengths if self.scored is None else self.scored)[rows].sum())

    def batch_with_targets(self, rows, device: torch.device | str = "cpu"):
        """`batch` and the targets (B, L) bool of the loss: None (every real token), or for sft
        data the positions after each row's prompt (the prompt is clean, attended context).
        sft-pack data: the attention mask is the segment ids (B, L) long (0 = padding), which
        the DiT reads as "attend within your own example" (models/segments.py)."""
        if self.segments is not None:
            rows = np.asarray(rows)
            x0 = torch.from_numpy(self.tokens[rows].astype(np.int64))
            segments = torch.from_numpy(self.segments[rows].astype(np.int64))
            targets = torch.from_numpy(self.target_map[rows].astype(bool))
            return x0.to(device), segments.to(device), targets.to(device)
        x0, attention_mask = self.batch(rows, device)
        if self.prompt is None:
            return x0, attention_mask, None
        rows = np.asarray(rows)
        positions = torch.arange(self.tokens.shape[1])
        starts = torch.from_numpy(self.prompt[rows].astype(np.int64))
        ends = torch.from_numpy(self.lengths[rows].astype(np.int64))
        targets = (positions[None, :] >= starts[:, None]) & (positions[None, :] < ends[:, None])
        return x0, attention_mask, targets.to(device)

    def batch(self, rows,
              device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor | None]:
        """x0 (B, L) long and an attention mask (B, L) bool, or None when nothing is padded."""
        rows = np.asarray(rows)
        x0 = torch.from_numpy(self.tokens[rows].astype(np.int64))
        lengths = self.lengths[rows]
        inner = self.pad_id is not None and bool((x0 == self.pad_id).any())
        if (lengths == self.tokens.shape[1]).all() and not inner:
            return x0.to(device), None
        positions = torch.arange(self.tokens.shape[1])
        mask = positions[None, :] < torch.from_numpy(lengths.astype(np.int64))[:, None]
        if inner:
            mask &= x0 != self.pad_id
        return x0.to(device), mask.to(device)


class PreparedData:
    """A prepared data set folder: its metadata, splits and tokeniser."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        try:
            self.meta = json.loads((self.folder / "meta.json").read_text())
        except (OSError, json.JSONDecodeError):
            raise MdlmError(f"{self.folder} is not a prepared data set (meta.json missing or "
                            "corrupted); run mdlm prepare-data again") from None

    @property
    def length(self) -> int:
        return self.meta["length"]

    @property
    def splits(self) -> list[str]:
        return list(self.meta["splits"])

    def split(self, name: str) -> TokenSplit:
        if name not in self.meta["splits"]:
            available = ", ".join(self.splits)
            raise MdlmError(f"split {name!r} is not in {self.folder.name}; "
                            f"available: {available}")
        info = self.meta["splits"][name]
        shape = (info["rows"], self.length)
        try:
            if info["rows"] == 0:
                tokens = np.zeros(shape, dtype=self.meta["dtype"])
                lengths = np.zeros(0, dtype=np.int32)
            else:
                tokens = np.memmap(self.folder / f"{name}.tokens.bin", dtype=self.meta["dtype"],
                                   mode="r", shape=shape)
                lengths = np.memmap(self.folder / f"{name}.lengths.bin", dtype=np.int32,
                                    mode="r", shape=(info["rows"],))
            if self.meta.get("packing") == "sft-pack":
                return TokenSplit(tokens, lengths, **self._packed_maps(name, info["rows"]))
            if self.meta.get("packing") == "sft":
                prompt = (np.zeros(0, dtype=np.int32) if info["rows"] == 0 else
                          np.memmap(self.folder / f"{name}.prompt.bin", dtype=np.int32, mode="r",
                                    shape=(info["rows"],)))
                return TokenSplit(tokens, lengths, prompt=prompt)
            if not self.meta.get("pad_anywhere"):
                return TokenSplit(tokens, lengths)
            scored = (np.zeros(0, dtype=np.int32) if info["rows"] == 0 else
                      np.memmap(self.folder / f"{name}.scored.bin", dtype=np.int32, mode="r",
                                shape=(info["rows"],)))
        except (OSError, ValueError) as e:
            raise MdlmError(f"{self.folder}/{name}.*.bin is missing or truncated ({e}); "
                            f"delete {self.folder} and run mdlm prepare-data again") from None
        return TokenSplit(tokens, lengths, pad_id=self.meta["tokenizer"]["pad_id"],
                          scored=scored)

    def _packed_maps(self, name: str, rows: int) -> dict:
        """sft-pack's per-position segment ids and target map of a split, memory-mapped."""
        shape = (rows, self.length)
        if rows == 0:
            return {"segments": np.zeros(shape, np.uint16),
                    "target_map": np.zeros(shape, np.uint8)}
        return {
            "segments": np.memmap(self.folder / f"{name}.segments.bin", dtype=np.uint16,
                                  mode="r", shape=shape),
            "target_map": np.memmap(self.folder / f"{name}.targets.bin", dtype=np.uint8,
                                    mode="r", shape=shape),
        }

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(str(self.folder / "tokenizer"))


def _write_split(out: SplitWrite, source: Source, tokenizer: Tokenizer, cfg: DataConfig) -> dict:
    """Tokenise and pack one split; with `out.limit`, stop reading the source once that many
    rows are written."""
    if cfg.packing in SFT_PACKINGS:
        write = write_sft_pack_split if cfg.packing == "sft-pack" else write_sft_split
        return write(out, source, tokenizer, length=cfg.length, pad_as_eos=cfg.pad_as_eos)
    return write_packed_split(out, source, tokenizer, cfg)


def unigram_baseline(data: PreparedData, vocab_size: int) -> float | None:
    """Cross-entropy (nats/token) of the validation split under the training split's
    unigram distribution (add-one smoothed): the bound a model must beat (sft data: of the
    targets, the prompts left out)."""
    if "train" not in data.meta["splits"] or "valid" not in data.meta["splits"]:
        return None
    train, valid = data.split("train"), data.split("valid")
    if not len(train) or not len(valid):
        return None

    def counts(split: TokenSplit) -> np.ndarray:
        c = np.zeros(vocab_size, dtype=np.int64)
        for start in range(0, len(split), 4096):
            toks, lens = split.tokens[start:start + 4096], split.lengths[start:start + 4096]
            inside = np.arange(toks.shape[1])[None, :] < lens[:, None]
            # sft: the targets, as the conditional bound counts them
            if split.prompt is not None:
                prompt = split.prompt[start:start + 4096]
                inside &= np.arange(toks.shape[1])[None, :] >= prompt[:, None]
            if split.target_map is not None:  # sft-pack: the same, position by position
                inside &= split.target_map[start:start + 4096].astype(bool)
            real = toks[inside if split.pad_id is None else inside & (toks != split.pad_id)]
            c += np.bincount(real.astype(np.int64), minlength=vocab_size)[:vocab_size]
        return c

    train_counts = counts(train) + 1.0
    log_p = np.log(train_counts / train_counts.sum())
    valid_counts = counts(valid)
    return float(-(valid_counts * log_p).sum() / max(valid_counts.sum(), 1))


def key_packing(cfg: DataConfig, tokenizer: Tokenizer) -> str:
    """The packing as the cache key sees it (sft, sft-pack: with the padding convention and the
    tokeniser's chat template, which renders the examples)."""
    if cfg.packing not in SFT_PACKINGS:
        return cfg.packing
    padding = f"{cfg.packing}:pad-as-eos" if cfg.pad_as_eos else f"{cfg.packing}:pad"
    return padding + row_format(tokenizer)


def prepared_folder(cfg: DataConfig) -> tuple[Path, Source, Tokenizer]:
    root = cache_root(cfg)
    sft = cfg.packing in SFT_PACKINGS
    source = example_source(cfg.dataset) if sft else get_source(cfg.dataset)
    tokenizer = load_tokenizer(cfg.tokenizer, root)
    key = cache_key(source, tokenizer, cfg.length, key_packing(cfg, tokenizer),
                    row_limits(cfg, source.splits))
    name = (f"{source.name}-{tokenizer.name.replace('/', '_')}-"
            f"{cfg.packing}{cfg.length}-{key[:12]}")
    return root / "data" / name, source, tokenizer


def prepare(cfg: DataConfig, *, load_dataset=None, progress=None,
            force: bool = False) -> PreparedData:
    """Prepare (or find in the cache) the data set described by `cfg`.

    `progress(split, n_docs_done_now, total_docs)` is called as documents are read.
    Re-running with the same config is a no-op.
    """
    folder, source, tokenizer = prepared_folder(cfg)
    if (folder / "meta.json").is_file() and not force:
        return PreparedData(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(folder)
    tmp = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        dtype = np.uint16 if tokenizer.vocab_size <= 65536 else np.uint32
        tokenizer.save(tmp / "tokenizer")
        splits, limits = {}, row_limits(cfg, source.splits)
        for split in source.splits:
            out = SplitWrite(tmp, split, dtype, limits.get(split), load_dataset, progress)
            splits[split] = _write_split(out, source, tokenizer, cfg)
        meta = _meta(cfg, source, tokenizer, dtype, splits, limits)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        meta["unigram_valid_nats"] = unigram_baseline(PreparedData(tmp), tokenizer.vocab_size)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
        if force and folder.exists():
            shutil.rmtree(folder)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process completed the same folder first
            if not (folder / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return PreparedData(folder)


def _meta(cfg: DataConfig, source: Source, tokenizer: Tokenizer, dtype, splits: dict,
          limits: dict) -> dict:
    """meta.json of a prepared data set (before its unigram baseline is known)."""
    return {
        "format": FORMAT_VERSION,
        "key": cache_key(source, tokenizer, cfg.length, key_packing(cfg, tokenizer), limits),
        "source": {"name": source.name, "description": source.description,
                   "fingerprint": source.fingerprint},
        "tokenizer": tokenizer.describe(), "length": cfg.length, "packing": cfg.packing,
        "dtype": np.dtype(dtype).name, "splits": splits,
        **({"pad_anywhere": True} if source.unscored else {}),
        **({"pad_as_eos": cfg.pad_as_eos} if cfg.packing in SFT_PACKINGS else {}),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _remove_stale_partials(folder: Path) -> None:
    for partial in folder.parent.glob(f"{folder.name}.partial-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and pid_alive(int(pid)) and int(pid) != os.getpid():
            continue
        shutil.rmtree(partial, ignore_errors=True)

