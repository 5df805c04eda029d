"""Text sources: the embedded offline corpus, the paper's Hugging Face data sets
and local files. A source yields the documents of a split in batches.

Hub data sets need the network the first time (then the `datasets` cache);
every loader takes a `load_dataset` argument so tests can feed small data.

This module holds the registry of named sources (`SOURCES`) and `get_source`, which finds a
source by name, `hg38:` spec or path. The contract and the split are in source.py, the
sources by kind in local_sources.py, hub_sources.py and dna_sources.py; the names callers
use of them are importable from here.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import MdlmError
from .detokenize import (
    lambada_detokenize,
    lm1b_detokenize,
    papers_detokenize,
    ptb_detokenize,
    wikitext_detokenize,
)
from .dna_sources import HG38, SyntheticDNA
from .hub_sources import HubDataset, StreamedHubDataset, Text8
from .local_sources import BigTxt, LocalFiles, book_documents, read_text_file
from .source import (
    SPLITS,
    DocBatches,
    Source,
    _split_documents,  # noqa: F401 - imported from here (data/sft.py)
    split_of,
)

__all__ = [
    "HG38",
    "SOURCES",
    "SPLITS",
    "BigTxt",
    "DocBatches",
    "HubDataset",
    "LocalFiles",
    "Source",
    "StreamedHubDataset",
    "SyntheticDNA",
    "Text8",
    "book_documents",
    "get_source",
    "read_text_file",
    "split_of",
]


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
                   ("train", "valid", "test"), hub_id="armanc/scientific_papers",
                   config="pubmed",
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
        return LocalFiles(name=path.stem or "local", description=f"local files {path}",
                          path=path)
    raise MdlmError(
        f"unknown data set {name_or_path!r}: not a registered name ({', '.join(SOURCES)}) "
        "and no such file or folder"
    )
