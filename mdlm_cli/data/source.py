"""What a text source is: the `Source` contract (a name, a fingerprint for the cache key, and
the documents of a split in batches), the split names, the deterministic split of a
list of documents into train / valid / test, and `SplitWrite`: one split being written to a
prepared folder, what every packing's writer takes.

The sources themselves are in local_sources.py (the embedded corpus, local files),
hub_sources.py (Hugging Face data sets) and dna_sources.py (genomes); their registry is
`SOURCES` in sources.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DocBatches = Iterator[list[str]]

SPLITS = ("train", "valid", "test")


def split_of(index: int, n: int) -> str:
    """Deterministic document split: 1 in 20 to valid, 1 in 20 to test (in blocks of 10
    consecutive documents when there are enough, so neighbours mostly share a split)."""
    if n < 20:
        return "valid" if index == n - 1 else "test" if index == n - 2 and n >= 3 else "train"
    block = (index // (10 if n >= 400 else 1)) % 20
    return "valid" if block == 18 else "test" if block == 19 else "train"


@dataclass
class Source(ABC):
    name: str
    description: str
    splits: tuple[str, ...] = SPLITS
    # characters stored as the tokeniser's pad, never masked nor scored (DNA's N)
    unscored: str = ""

    @property
    @abstractmethod
    def fingerprint(self) -> str:
        """Identifies the content; part of the cache key."""

    @abstractmethod
    def documents(self, split: str,
                  load_dataset: Callable | None = None) -> tuple[DocBatches, int | None]:
        """(batches of document strings, number of documents if known)."""


@dataclass(frozen=True)
class SplitWrite:
    """One split written to a folder, whatever the packing: where (`folder`, the `split`'s
    name), the token ids' `dtype`, the row `limit` past which the source is read no further
    (None: all of it), `load_dataset` (a Hub loader; None: the `datasets` one) and
    `progress(split, documents read now, total documents or None)`."""

    folder: Path
    split: str
    dtype: Any  # a numpy unsigned integer type (uint16 or uint32: data/store.py)
    limit: int | None = None
    load_dataset: Callable | None = None
    progress: Callable[[str, int, int | None], None] | None = None

    def path(self, kind: str) -> Path:
        """The split's `kind` file (tokens, lengths, prompt, ...): `{split}.{kind}.bin`."""
        return self.folder / f"{self.split}.{kind}.bin"

    def read(self, count: int, total: int | None) -> None:
        """Report `count` more documents read (of `total`) to `progress`, if any."""
        if self.progress is not None:
            self.progress(self.split, count, total)


def _split_documents(docs: list[str], split: str, batch: int = 256) -> tuple[DocBatches, int]:
    chosen = [d for i, d in enumerate(docs) if split_of(i, len(docs)) == split]
    return (chosen[i:i + batch] for i in range(0, len(chosen), batch)), len(chosen)
