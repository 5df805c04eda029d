"""Released Caduceus checkpoints (Hugging Face: kuleshov-group/caduceus-{ph,ps}_seqlen-...):
their config.json (`model_type: caduceus`, an `auto_map` to custom code that imports
mamba-ssm) is read as data and their safetensors load into mdlm's own `caduceus` backbone, on
a CPU too; no remote code runs. They are masked LMs, so they load as `mlm` models on HG38
windows; `mdlm train --set train.init_from=HUB_ID` fine-tunes one with any objective (Table
6).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ...build import config_from_dict
from ...data.tokenizers import load_tokenizer
from ...errors import MdlmError
from ...models import build_model
from ...models.tied import canonical_state
from ..folder import LoadedModel, load_state_into
from .assemble import read_hf_weights
from .base import Format, Found


def caduceus_model_config(raw: dict, source: str) -> dict:
    """mdlm's `model` section from a CaduceusConfig (config.json)."""
    ssm = raw.get("ssm_cfg") or {}
    if not raw.get("bidirectional", True):
        raise MdlmError(
            f"{source}: a unidirectional Caduceus is a plain Mamba; mdlm loads bidirectional "
            "ones"
        )
    for key, expected in (("dt_rank", "auto"), ("conv_bias", True), ("bias", False)):
        if ssm.get(key, expected) != expected:
            raise MdlmError(
                f"{source}: ssm_cfg.{key}={ssm[key]!r} is not supported (mdlm's mixer has "
                f"{expected!r})"
            )
    try:
        return {
            "backbone": "caduceus",
            "hidden_size": int(raw["d_model"]),
            "n_blocks": int(raw["n_layer"]),
            "d_state": int(ssm.get("d_state", 16)),
            "d_conv": int(ssm.get("d_conv", 4)),
            "expand": int(ssm.get("expand", 2)),
            "rcps": bool(raw.get("rcps", False)),
            "fused_add_norm": bool(raw.get("fused_add_norm", True)),
            "bidirectional_strategy": raw.get("bidirectional_strategy") or "add",
            "bidirectional_weight_tie": bool(raw.get("bidirectional_weight_tie", True)),
            "rms_norm": bool(raw.get("rms_norm", True)),
            "norm_epsilon": float(raw.get("norm_epsilon", 1e-5)),
        }
    except (KeyError, TypeError, ValueError) as e:
        raise MdlmError(f"{source}: not a Caduceus config.json "
                        f"({type(e).__name__}: {e})") from None


def seqlen_from_name(label: str) -> int | None:
    """The training length in a released name (`..._seqlen-131k_...` -> 131072), if any."""
    match = re.search(r"seqlen-(\d+)k", label)
    return int(match.group(1)) * 1024 if match else None


def caduceus_from_hf(folder: Path, raw: dict, weights: dict[str, torch.Tensor], *, label: str,
                     device) -> LoadedModel:
    """A LoadedModel (objective mlm, tokenizer dna, data hg38) from a Caduceus folder's config
    and weights."""
    source = str(folder)
    length = seqlen_from_name(label) or seqlen_from_name(folder.name)
    cfg = config_from_dict(
        {
            "name": label.rstrip("/").split("/")[-1],
            "description": f"Caduceus from {label}",
            "data": {
                "dataset": "hg38",
                "tokenizer": "dna",
                "length": length or 1024,
                "packing": "window",
            },
            "model": caduceus_model_config(raw, source),
            "diffusion": {"objective": "mlm"},
        }
    )
    tokenizer = load_tokenizer("dna")
    embed = [
        v
        for k, v in weights.items()
        if k.endswith("word_embeddings.weight") or k.endswith("embedding.weight")
    ]
    if not embed or embed[0].shape[0] != tokenizer.vocab_size:
        raise MdlmError(
            f"{source}: the embedding has {embed[0].shape[0] if embed else 'no'} rows; "
            f"mdlm's DNA tokenizer has {tokenizer.vocab_size} ids"
        )
    model = build_model(cfg.model, tokenizer.vocab_size)
    complement = model.complement_map
    for key in [
        k for k in weights if k.endswith("complement_map")
    ]:  # Caduceus keeps its map as a buffer
        stored = weights.pop(key)
        if not torch.equal(stored.long(), complement[: len(stored)]):
            raise MdlmError(f"{source}: {key} is not the DNA complement map mdlm uses")
    load_state_into(model, canonical_state(model, weights, source), Path(source))
    state = {"format": "caduceus", "source": label, "weights": "as stored"}
    if length is None:
        state["inferred"] = ["length 1024 (the name gives no seqlen)"]
    data_meta = {"length": cfg.data.length, "packing": "window",
                 "tokenizer": tokenizer.describe(), "source": {"name": "hg38"}}
    return LoadedModel(folder, model.to(device).eval(), cfg, tokenizer, data_meta, state)


def detect(found: Found) -> bool:
    return found.config is not None and found.config.get("model_type") == "caduceus"


def load(found: Found, *, ema: bool, device) -> LoadedModel:
    weights = read_hf_weights(found.path)[1]
    return caduceus_from_hf(found.path, found.config, weights, label=found.label, device=device)


FORMAT = Format(detect, load, "a released Caduceus (model_type caduceus)")
