"""The reference's Hugging Face folder (what `mdlm export` writes, or a download of
kuleshov-group/mdlm-owt): config.json with the `MDLMConfig` fields (`vocab_size`,
`model_length`, `hidden_dim`, `cond_dim`, `n_blocks`, `n_heads`, `dropout`,
`time_conditioning`) and `model.safetensors` (or a sharded index, or `pytorch_model.bin` read
with weights_only=True) holding the reference's `backbone.*` keys."""

from __future__ import annotations

from ..folder import LoadedModel
from .assemble import export_section, load_dit_folder
from .base import Format, Found
from .reference import partial_from_hf_config


def detect(found: Found) -> bool:
    """Any folder with a config.json: the last folder format in FORMATS, the one left."""
    return found.config is not None


def load(found: Found, *, ema: bool, device) -> LoadedModel:
    partial = partial_from_hf_config(found.config, found.path / "config.json")
    saved_model = (export_section(found.config).get("config") or {}).get("model") or {}
    if isinstance(saved_model.get("shift"), bool):  # MDLMConfig has no field for it
        partial.model["shift"] = saved_model["shift"]
    return load_dit_folder(found, partial, device=device)


FORMAT = Format(detect, load, "the reference's Hugging Face folder (MDLMConfig fields)")
