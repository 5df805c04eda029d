"""The assembly every DiT format shares (formats/reference_hf.py, hub_mixin.py, lightning.py,
sedd.py): the weights under the reference's names and a `Partial` become a LoadedModel, with the
tokeniser the checkpoint carries or its vocabulary names (data/tokenizers.TOKENIZERS) and
mdlm's config resolved from what the checkpoint records, then an export's saved config, then the
reference's runs with that tokeniser."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ...build import config_from_dict, model_dict
from ...config import Config
from ...data.tokenizers import (
    TOKENIZERS,
    ReferenceRun,
    Tokenizer,
    known_tokenizer,
    load_tokenizer,
    reference_tokenizer,
)
from ...errors import MdlmError
from ...io.safe_load import read_torch_file
from ...models import build_model
from ...models.hf_mlm import quiet_transformers
from ...objectives import get_objective
from ..folder import LoadedModel, load_state_into, load_weights
from . import reference as ref
from .base import Found, Partial, first_line

TOKENIZER_FILES = (
    "mdlm_tokenizer.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
)
# the data of a model whose tokeniser the reference never trained with: GPT-2's runs
_GPT2_RUN: ReferenceRun = TOKENIZERS["gpt2"].reference


def hf_state(mdlm_meta: dict, label: str) -> dict:
    """state.json of a Hugging Face-style folder: an export's own, with where it came from."""
    state = dict(mdlm_meta.get("state") or {})
    weights = mdlm_meta.get("weights", "as stored")
    state.update({"format": "hugging-face", "source": label, "weights": weights})
    return state


def export_section(config: dict) -> dict:
    """The "mdlm" section an `mdlm export` adds to config.json ({} in anyone else's)."""
    return config.get("mdlm") if isinstance(config.get("mdlm"), dict) else {}


def load_dit_folder(found: Found, partial: Partial, *, device,
                    read: tuple[Path, dict[str, torch.Tensor]] | None = None) -> LoadedModel:
    """A Hugging Face-style folder of a DiT format: its weights, tokeniser files and export
    section around the `partial` its format read from config.json. `read`: the folder's
    weights file and tensors where the format has read them already (read_hf_weights)."""
    mdlm_meta = export_section(found.config)
    weights_file, weights = read if read is not None else read_hf_weights(found.path)
    exported_tokenizer = (mdlm_meta.get("tokenizer") or {}).get("name")
    return assemble(DitCheckpoint(
        ref.backbone_state(weights, weights_file), partial, source=f"{weights_file}",
        path=found.path, tokenizer_folder=found.path,
        tokenizer_name=exported_tokenizer or partial.data.get("tokenizer"), shadow=None,
        state=hf_state(mdlm_meta, found.label), label=found.label, mdlm_meta=mdlm_meta),
        device)


def read_hf_weights(folder: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    single, index, pickled = (folder / "model.safetensors",
                              folder / "model.safetensors.index.json",
                              folder / "pytorch_model.bin")
    if single.is_file():
        return single, load_weights(single)
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise MdlmError(
                f"{index} is not a valid safetensors index ({first_line(e)})"
            ) from None
        weights: dict[str, torch.Tensor] = {}
        for shard in shards:
            weights.update(load_weights(folder / shard))
        return index, weights
    if pickled.is_file():
        obj = read_torch_file(pickled)
        if (not isinstance(obj, dict)
                or not all(isinstance(v, torch.Tensor) for v in obj.values())):
            raise MdlmError(f"{pickled} does not hold a state dict of tensors")
        return pickled, obj
    raise MdlmError(f"{folder} has a config.json but no weights (model.safetensors, "
                    "model.safetensors.index.json or pytorch_model.bin)")


@dataclass
class DitCheckpoint:
    """What a DiT format hands to `assemble`."""

    weights: dict[str, torch.Tensor]  # under the DiT's own names (ref.backbone_state)
    partial: Partial
    source: str  # the file the weights came from, as messages name it
    path: Path
    tokenizer_folder: Path | None  # where tokeniser files may lie next to the weights
    tokenizer_name: str | None  # the tokeniser the checkpoint names, if it names one
    shadow: list | None  # the EMA's parameters in parameter order, if loaded
    state: dict  # state.json of the loaded model: format, source, weights
    label: str
    mdlm_meta: dict = field(default_factory=dict)  # an `mdlm export`'s own section


def assemble(ckpt: DitCheckpoint, device) -> LoadedModel:
    weights, partial, source, state = dict(ckpt.weights), ckpt.partial, ckpt.source, ckpt.state
    inv_freq = weights.pop(ref.INV_FREQ, None)
    model_cfg, vocab, inferred = ref.model_config(weights, partial, inv_freq, source)
    embedding = tuple(weights["vocab_embed.embedding"].shape)
    # checked before a tokeniser is fetched for the wrong vocabulary
    if embedding != (vocab, model_cfg.hidden_size):
        raise MdlmError(f"{source}: vocab_embed.embedding has shape {embedding}, the model "
                        f"expects {(vocab, model_cfg.hidden_size)} (its config says "
                        f"vocab {vocab}, hidden {model_cfg.hidden_size})")
    tokenizer = _tokenizer(ckpt.tokenizer_folder, ckpt.tokenizer_name, vocab, source)
    if tokenizer.vocab_size != vocab:
        raise MdlmError(
            f"{source}: the tokenizer {tokenizer.name!r} has {tokenizer.vocab_size} tokens "
            f"(mask included) but the model's vocabulary is {vocab}; they do not belong "
            "together"
        )
    if partial.mask_id is not None and tokenizer.mask_id != partial.mask_id:
        raise MdlmError(
            f"{source}: the model's mask (absorbing state) is id {partial.mask_id}, but the "
            f"tokenizer {tokenizer.name!r} masks with id {tokenizer.mask_id}; they do not "
            "belong together"
        )
    config = mdlm_config(model_cfg, partial, tokenizer, ckpt.mdlm_meta, ckpt.label)
    inferred += _length_note(partial, tokenizer, ckpt.mdlm_meta)
    model = build_model(model_cfg, vocab, causal=get_objective(config, tokenizer).causal)
    if ckpt.shadow is not None:
        weights = ref.apply_ema(model, weights, ckpt.shadow, source)
    load_state_into(model, weights, source)
    ref.check_rotary(inv_freq, model_cfg, source)
    meta = data_meta(ckpt.mdlm_meta, config, tokenizer)
    if inferred:
        state["inferred"] = inferred
    model.to(device).eval()
    return LoadedModel(ckpt.path, model, config, tokenizer, meta, state)


def data_meta(mdlm_meta: dict, config: Config, tokenizer: Tokenizer) -> dict:
    """data.json of an imported model: an export's own (its "mdlm" section), with what the
    resolved config says of the rows and the tokeniser."""
    data_meta = dict(mdlm_meta.get("data") or {})
    data_meta.update({"length": config.data.length, "packing": config.data.packing,
                      "tokenizer": tokenizer.describe()})
    data_meta.setdefault("source", {"name": config.data.dataset})
    return data_meta


def _reference_run(tokenizer: Tokenizer) -> ReferenceRun:
    known = known_tokenizer(tokenizer.name)
    return known.reference if known is not None and known.reference else _GPT2_RUN


def _saved_config(mdlm_meta: dict) -> dict:
    return mdlm_meta.get("config") if isinstance(mdlm_meta.get("config"), dict) else {}


def _length_note(partial: Partial, tokenizer: Tokenizer, mdlm_meta: dict) -> list[str]:
    """The note of a length that neither the checkpoint nor an export's config records."""
    if "length" in partial.data or "length" in (_saved_config(mdlm_meta).get("data") or {}):
        return []
    length = _reference_run(tokenizer).length
    return [f"length {length} (the reference default for {tokenizer.name})"]


def mdlm_config(
    model_cfg, partial: Partial, tokenizer: Tokenizer, mdlm_meta: dict, label: str
) -> Config:
    """mdlm's typed config for an imported model: the exporter's own when present, else the
    reference's."""
    run = _reference_run(tokenizer)
    dataset, packing, length = run.dataset, run.packing, run.length
    saved = _saved_config(mdlm_meta)
    saved_data = saved.get("data") or {}
    recorded = partial.data
    model = {k: v for k, v in model_dict(model_cfg).items() if k != "time_conditioning"}
    if "time_conditioning" in partial.model:
        model["time_conditioning"] = partial.model["time_conditioning"]
    data = {
        "dataset": recorded.get("dataset") or saved_data.get("dataset", dataset),
        "packing": recorded.get("packing") or saved_data.get("packing", packing),
        "length": recorded.get("length") or saved_data.get("length", length),
        "tokenizer": tokenizer.name,
    }
    if saved:
        merged = {
            **saved,
            "data": {**saved_data, **data},
            "model": {**(saved.get("model") or {}), **model},
            "diffusion": {**(saved.get("diffusion") or {}), **partial.diffusion},
        }
        try:
            return config_from_dict(merged)
        except MdlmError:
            pass  # written by another mdlm version: keep what this one understands
    return config_from_dict(
        {
            "name": label.rstrip("/").split("/")[-1],
            "description": f"imported from {label}",
            "data": data,
            "model": model,
            "diffusion": partial.diffusion,
        }
    )


def _tokenizer(folder: Path | None, name: str | None, vocab_size: int, source) -> Tokenizer:
    """The checkpoint's own tokeniser files, else the reference tokeniser its config or
    vocabulary names."""
    if folder is not None and any((folder / f).is_file() for f in TOKENIZER_FILES):
        with quiet_transformers():
            return load_tokenizer(str(folder))
    known = reference_tokenizer(vocab_size)
    name = name or (known.name if known is not None else None)
    if name is None:
        raise MdlmError(
            f"{source} carries no tokenizer files and its vocabulary ({vocab_size}) is not "
            f"{_reference_vocabularies()}; put the tokenizer files next to its config.json"
        )
    return load_tokenizer(name)


def _reference_vocabularies() -> str:
    """"GPT-2's (50258), BERT's (30522) or text8's (35)": the vocabularies an import
    recognises."""
    known = [f"{t.label} ({t.vocab_size})" for t in TOKENIZERS.values() if t.reference]
    return ", ".join(known[:-1]) + " or " + known[-1]
