"""What `mdlm convert SOURCE` names: a Hugging Face causal-LM folder (config.json and
safetensors, as `save_pretrained` writes them), a hub id read from the local Hugging Face cache
only, or an mdlm run. Every refusal is one line and comes before anything is written: a folder
asking for remote code (config.json's `auto_map`, refused as the open-model folders refuse it),
an encoder (already bidirectional: nothing to convert), an architecture with no backbone here,
missing or unreadable safetensors, a folder without its tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import MdlmError
from ...io.files import read_json_object
from ...io.hub import HUB_FILES, is_hub_id
from ...models.folder_weights import read_shards, shard_files
from ...models.hf_mlm import REMOTE_CODE_HINT
from .layouts import LAYOUTS, Layout, supported

# config.json's model_type of the encoders mdlm reads as masked LMs (backbone hf-mlm)
ENCODERS = ("bert", "roberta", "distilbert", "albert", "electra", "deberta", "deberta-v2",
            "modernbert", "xlm-roberta", "camembert")


@dataclass
class CausalFolder:
    """A Hugging Face causal LM to convert: its folder, config.json, layout and tensors."""

    folder: Path
    label: str  # how the user named it (a folder, a hub id)
    config: dict
    layout: Layout
    weights: dict[str, torch.Tensor]


def is_mdlm_run(path: Path) -> bool:
    """An mdlm run folder (its `latest` pointer) or step folder (its model.json)."""
    return path.is_dir() and ((path / "latest").is_file() or (path / "model.json").is_file())


def local_folder(spec: str) -> Path:
    """The folder of `spec`: itself, or a hub id's snapshot in the local Hugging Face cache
    (never the network: the cache holds it, or one line says it does not)."""
    path = Path(spec)
    if path.is_dir():
        return path
    if path.exists() or not is_hub_id(spec):
        raise MdlmError(f"{spec} is neither a folder nor a hub id; give a Hugging "
                        "Face causal-LM folder, a hub id in the local cache or an mdlm AR run")
    from huggingface_hub import snapshot_download

    try:  # local_files_only: the cache, never the network
        return Path(snapshot_download(spec, allow_patterns=HUB_FILES, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached (the hub library raises several types)
        raise MdlmError(f"{spec} is not in the local Hugging Face cache and mdlm convert reads "
                        f"the hub offline; download it first (hf download {spec}) or give its "
                        "folder") from None


def read_causal_folder(folder: Path, label: str) -> CausalFolder:
    """The folder's config.json, checked as the module says, and its tensors (memory-mapped)."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise MdlmError(f"{label} has no config.json: not a Hugging Face model folder (nor an "
                        "mdlm run, which has a `latest` file)")
    config = read_json_object(config_path)
    model_type = config.get("model_type")
    if config.get("auto_map"):
        raise MdlmError(f"{label} holds a {model_type!r} model that needs remote code (its "
                        f"config.json has auto_map); {REMOTE_CODE_HINT}")
    layout = layout_of(config, label)
    shards = shard_files(folder)
    return CausalFolder(folder, label, config, layout, read_shards(shards))


def layout_of(config: dict, label: str) -> Layout:
    """The layout of config.json's architecture, or one line: an encoder, or no backbone."""
    architectures = config.get("architectures") or []
    model_type = config.get("model_type")
    name = architectures[0] if architectures else f"model_type {model_type!r}"
    if model_type in ENCODERS or any("MaskedLM" in a for a in architectures):
        raise MdlmError(f"{label} is an encoder ({name}): it attends both ways already and has "
                        "no next-token head to convert; load it as a masked LM "
                        "(model.backbone=hf-mlm)")
    for architecture in architectures:
        if architecture in LAYOUTS:
            return LAYOUTS[architecture]
    raise MdlmError(f"{label} is a {name}, which no mdlm backbone implements; mdlm convert "
                    f"reads {supported()} and mdlm AR runs")


def load_source_tokenizer(folder: Path, label: str):
    """The source's own fast tokeniser (its files next to config.json; never remote code)."""
    from transformers import AutoTokenizer

    from ...models.hf_mlm import quiet_transformers

    if not any((folder / f).is_file() for f in ("tokenizer.json", "vocab.json",
                                                "tokenizer.model")):
        raise MdlmError(f"{label} has no tokenizer files (tokenizer.json, or vocab.json and "
                        "merges.txt); save the tokenizer next to the model (save_pretrained)")
    try:
        with quiet_transformers():
            return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - tokenizers and transformers raise their own types
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise MdlmError(f"{label}'s tokenizer cannot be read ({first})") from None
