"""The `Tokenizer` every tokeniser is wrapped in: it knows the ids the diffusion model needs
(mask, BOS, EOS, pad) and saves itself as plain files (never a pickle) so that a checkpoint
carries its tokeniser. The character tokenisers' alphabets live here too: text8's
characters and Caduceus's DNA, which `Tokenizer` encodes itself.

Which tokenisers mdlm knows by name, and `load_tokenizer`, are in tokenizers.py; Hugging
Face tokenisers are loaded in hf_tokenizers.py.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

META_FILE = "mdlm_tokenizer.json"

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
