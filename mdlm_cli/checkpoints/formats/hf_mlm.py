"""A Hugging Face masked LM that transformers implements (config.json with model_type `bert`,
`roberta`, ...): an `mdlm export` of an hf-mlm run, or any pretrained MLM such as
`google-bert/bert-base-uncased`, or a pip-packaged one such as
`sentence-transformers/all-MiniLM-L6-v2` (io/packaged.py): the hf-mlm backbone around it."""

from __future__ import annotations

from pathlib import Path

from ...build import config_from_dict
from ...data.tokenizers import Tokenizer, load_tokenizer
from ...errors import MdlmError
from ...models.hf_mlm import HFMaskedLM, check_native, quiet_transformers
from ..folder import LoadedModel
from .assemble import TOKENIZER_FILES, data_meta, export_section, hf_state
from .base import Format, Found

# rows per split a plain masked LM's evaluation data keeps (bert-ft's validation too)
PLAIN_MLM_ROWS = 100_000


def detect(found: Found) -> bool:
    """Any model_type but mdlm's own (formats before it in FORMATS claim caduceus and SEDD)."""
    return found.config is not None and found.config.get("model_type") not in (None, "mdlm")


def load(found: Found, *, ema: bool, device) -> LoadedModel:
    """A masked LM that transformers implements, as an MDLM denoiser (the hf-mlm backbone): an
    `mdlm export` of an hf-mlm run (its "mdlm" section gives the config it was trained with), or
    any MLM, which gets the defaults of an encoder to fine-tune: C4, L = 128 (at most its
    positions), wrap packing, the first PLAIN_MLM_ROWS rows of each split (C4 is streamed)."""
    folder, raw, label = found.path, found.config, found.label
    mdlm_meta = export_section(raw)
    check_native(raw, str(folder))
    tokenizer = _hf_mlm_tokenizer(folder, label)
    model_section = {"backbone": "hf-mlm", "hf_model": label}
    saved = mdlm_meta.get("config") if isinstance(mdlm_meta.get("config"), dict) else None
    if saved is not None:
        config = config_from_dict({**saved, "model": model_section})
    else:
        length = min(128, raw.get("max_position_embeddings") or 128)
        config = config_from_dict({
            "name": label.rstrip("/").split("/")[-1], "description": f"imported from {label}",
            "data": {"dataset": "c4", "tokenizer": label, "length": length, "packing": "wrap",
                     "max_rows": PLAIN_MLM_ROWS, "max_eval_rows": PLAIN_MLM_ROWS},
            "model": model_section})
    model = HFMaskedLM(config.model, tokenizer.vocab_size, folder=folder)
    meta = data_meta(mdlm_meta, config, tokenizer)
    state = hf_state(mdlm_meta, label)
    if model.notes:
        state["notes"] = model.notes
    return LoadedModel(folder, model.to(device).eval(), config, tokenizer, meta, state)


def _hf_mlm_tokenizer(folder: Path, label: str) -> Tokenizer:
    """The folder's own tokeniser, named as the model is (so data prepared for it is shared)."""
    if not any((folder / f).is_file() for f in TOKENIZER_FILES):
        raise MdlmError(
            f"{folder} carries no tokenizer files; a masked LM needs its own tokenizer next to "
            "its config.json"
        )
    with quiet_transformers():
        tokenizer = load_tokenizer(str(folder))
    if not (folder / "mdlm_tokenizer.json").is_file() and not Path(label).is_dir():
        tokenizer.name = label  # a hub id or packaged name, as load_tokenizer(label) names it
    return tokenizer


FORMAT = Format(detect, load, "a Hugging Face masked LM (model_type bert, roberta, ...)")
