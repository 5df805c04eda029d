"""Hugging Face data sets as text sources: a data set downloaded whole (then the `datasets`
cache), text8 cut into the paper's character splits, and a data set read by streaming up to
the split's row limit. Hub data sets need the network the first time; every loader takes a
`load_dataset` argument so tests can feed small data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import MdlmError
from .source import Source


@dataclass
class HubDataset(Source):
    """A Hugging Face data set; `split_specs` maps our split names to its split strings."""

    hub_id: str = ""
    config: str | None = None
    revision: str | None = None
    text_field: str = "text"
    split_specs: dict[str, str] = field(default_factory=dict)
    detokenize: Callable[[str], str] | None = None

    @property
    def fingerprint(self) -> str:
        # -v2: the rules follow the reference's order (data prepared by the earlier ones is
        # stale)
        detok = f"{self.detokenize.__name__}-v2" if self.detokenize else "none"
        return f"hub:{self.hub_id}:{self.config}:{self.revision}:{self.split_specs}:{detok}"

    def load(self, split: str, load_dataset: Callable | None, **kwargs):
        if load_dataset is None:
            from datasets import load_dataset

            from ..io.hub import hub_offline

            hub_offline()  # fail fast (or use the local datasets cache) without a network
        try:
            return load_dataset(self.hub_id, self.config, split=self.split_specs[split],
                                revision=self.revision, **kwargs)
        except Exception as e:  # noqa: BLE001 - any failure here is "could not load"
            raise self._unreachable(split, e) from None

    def _unreachable(self, split: str, e: BaseException) -> MdlmError:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        return MdlmError(f"could not load data set {self.hub_id!r} ({self.name}, split {split}) "
                         f"from the Hugging Face Hub (no network?): {first}. Use --dataset PATH "
                         "for local files.")

    def documents(self, split, load_dataset=None):
        ds = self.load(split, load_dataset)
        detok = self.detokenize or (lambda x: x)

        def batches():
            for batch in ds.iter(batch_size=1000):
                yield [detok(t) for t in batch[self.text_field]]

        return batches(), len(ds)


@dataclass
class Text8(HubDataset):
    """text8: 100M characters; train/valid/test = 90M/5M/5M as in D3PM and the paper."""

    def documents(self, split, load_dataset=None):
        ds = self.load("train", load_dataset)
        text = "".join(ds[self.text_field])
        bounds = {"train": (0, 90_000_000), "valid": (90_000_000, 95_000_000),
                  "test": (95_000_000, None)}[split]
        chunk = text[bounds[0]:bounds[1]]
        return iter([[chunk]] if chunk else []), 1 if chunk else 0


@dataclass
class StreamedHubDataset(HubDataset):
    """A Hugging Face data set read with `datasets` streaming: only the documents read are
    downloaded, and reading stops where the split's row limit is reached (data.max_rows,
    data.max_eval_rows; the store records where it stopped). For corpora too large to
    download whole (C4 en: 365M documents)."""

    batch_size: int = 1000

    @property
    def fingerprint(self) -> str:
        return super().fingerprint + ":streamed"

    def documents(self, split, load_dataset=None):
        stream = self.load(split, load_dataset, streaming=True)
        detok = self.detokenize or (lambda x: x)

        def batches():
            batch = []
            try:
                for record in stream:
                    batch.append(detok(record[self.text_field]))
                    if len(batch) == self.batch_size:
                        yield batch
                        batch = []
            except MdlmError:
                raise
            except Exception as e:  # noqa: BLE001 - a stream can fail at any record
                raise self._unreachable(split, e) from None
            if batch:
                yield batch

        return batches(), None
