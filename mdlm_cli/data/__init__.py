"""Data: sources, tokenisers, packing and the memory-mapped token store."""

from .sources import SOURCES, get_source
from .store import PreparedData, TokenSplit, prepare
from .tokenizers import Tokenizer, load_tokenizer

__all__ = [
    "SOURCES",
    "PreparedData",
    "TokenSplit",
    "Tokenizer",
    "get_source",
    "load_tokenizer",
    "prepare",
]
