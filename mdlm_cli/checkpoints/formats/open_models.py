"""What the LLaDA and Dream formats share (formats/llada.py, formats/dream.py): a released
folder (or hub id: config, safetensors and tokeniser files are fetched, never code) becomes a
LoadedModel of its native backbone, its weights memory-mapped in their own dtype, with the
config of LLaDA's training objective (MDLM's loss under the linear schedule: mask rate t,
weight 1/t) and no time input, so that the denoiser is time-agnostic. A folder `mdlm convert`
wrote (its config.json's conversion record) says so in state.json and in a note every command
prints. A folder `mdlm export` wrote (config.json's "mdlm" section) keeps the config, data and
state of the run it came from."""

from __future__ import annotations

import warnings
from pathlib import Path

from ...build import config_from_dict
from ...data.tokenizers import Tokenizer, load_tokenizer
from ...errors import MdlmError, MdlmWarning
from ...models.open_weights import conversion_diffusion
from ...objectives import OBJECTIVES
from ..folder import LoadedModel
from .assemble import data_meta, export_section, hf_state
from .base import Format, Found

DEFAULT_LENGTH = 4096  # rows of at most this many tokens (at most the model's positions)
# rows per split a plain model's evaluation data keeps (as for the hf-mlm format)
EVAL_ROWS = 100_000


def open_model_config(label: str, backbone: str, max_length: int, diffusion: dict | None = None):
    """mdlm's config for a released folder: MDLM under the linear schedule, no time input; a
    converted folder's `diffusion` keys (its target objective: models.open_weights.
    conversion_diffusion) replace MDLM's, the rows whole blocks."""
    diffusion = {"objective": "mdlm", "schedule": "linear", **(diffusion or {})}
    length = min(max_length, DEFAULT_LENGTH)
    length -= length % diffusion.get("block_size", 1)
    return config_from_dict({
        "name": label.rstrip("/").split("/")[-1], "description": f"imported from {label}",
        "data": {"dataset": "c4", "tokenizer": label, "length": length,
                 "packing": "wrap", "max_rows": EVAL_ROWS, "max_eval_rows": EVAL_ROWS},
        "model": {"backbone": backbone, "hf_model": label, "time_conditioning": False},
        "diffusion": diffusion,
    })


def folder_tokenizer(folder: Path, label: str) -> Tokenizer:
    """The folder's own tokeniser, named as the model is (so data prepared for it is shared)."""
    tokenizer = load_tokenizer(str(folder))
    if not Path(label).is_dir():
        tokenizer.name = label  # a hub id
    return tokenizer


def load_open_model(found: Found, backbone_cls, max_length: int, *, device) -> LoadedModel:
    """The folder as a `backbone_cls` (models.llada.LLaDA or models.dream.Dream) on `device`;
    state.json says its family and its sampling defaults (the family's transfer schedule).
    An `mdlm export` of a fine-tuned model (config.json's "mdlm" section) gets the config,
    data and state it was trained with, its model read from this folder."""
    folder, label, family = found.path, found.label, backbone_cls.family
    mdlm_meta = export_section(found.config)
    tokenizer = folder_tokenizer(folder, label)
    config = exported_config(mdlm_meta, label, family) or open_model_config(
        label, family, max_length, conversion_diffusion(found.config))
    model = backbone_cls.from_folder(config.model, tokenizer.vocab_size, folder, found.config,
                                     device)
    state = hf_state(mdlm_meta, label)
    # the family's transfer schedule is for its whole-row samplers, not block-by-block ones
    by_blocks = OBJECTIVES[config.diffusion.objective].samples_by_blocks
    defaults = {} if by_blocks else dict(backbone_cls.sampling_defaults)
    if model.shifted_logits and not by_blocks:  # a converted causal LM: its block loop is
        defaults["k_schedule"] = "dream"  # Fast-dLLM's Dream loop, whose schedule is Dream's
    state.update({"family": family, "sampling_defaults": {
        **defaults, **(state.get("sampling_defaults") or {})}})
    if model.conversion:
        state["converted_from"] = dict(model.conversion)
        state["notes"] = [model.describe()]
    return LoadedModel(folder, model.eval(), config, tokenizer,
                       data_meta(mdlm_meta, config, tokenizer), state)


def exported_config(mdlm_meta: dict, label: str, family: str):
    """The config an export saved, its model and tokeniser this folder; None for a release
    (or an export whose config this version cannot read: the release's defaults then)."""
    saved = mdlm_meta.get("config")
    if not isinstance(saved, dict):
        return None
    data = {**(saved.get("data") or {}), "tokenizer": label}
    model = {"backbone": family, "hf_model": label, "time_conditioning": False}
    try:
        return config_from_dict({**saved, "data": data, "model": model})
    except MdlmError as e:  # said, not silent: the model then runs with the release's defaults
        warnings.warn(f"{label}: its export's saved config cannot be read by this version "
                      f"({e}); using the {family} release's defaults", MdlmWarning, stacklevel=2)
        return None


def released_format(backbone_cls, description: str) -> Format:
    """The format of a family's released folders: config.json's model_type names it."""

    def detect(found: Found) -> bool:
        config = found.config
        return config is not None and config.get("model_type") == backbone_cls.model_type

    def load(found: Found, *, ema: bool, device) -> LoadedModel:
        shape = backbone_cls.read_shape(found.config, str(found.path))
        return load_open_model(found, backbone_cls, shape.max_length, device=device)

    return Format(detect, load, description)
