"""Published weights: where they come from (a Hugging Face hub id, a local folder, a pip-packaged
model, a Lightning or state-dict file) and which format reads them.

`load.load_checkpoint` hands every `--checkpoint` that is not an mdlm run or step folder to
`load_pretrained`: a hub id is downloaded by huggingface_hub (config.json, the safetensors
weights and any tokeniser files, never Python files: no remote code runs), then the formats of
`formats/registry.FORMATS` are tried in order (caduceus, sedd, llada, dream, bd3lm-hf, hf-mlm,
hub-mixin, reference-hf, lightning; each module says what it reads) and the first that detects
the checkpoint loads it.
The names and fields of the reference's formats, in both directions, are
`formats/reference.py`'s. Hyper-parameters come from the checkpoint (its config first, the
weight shapes otherwise), never from flags.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config import TrainConfig
from ..errors import MdlmError
from ..io.hub import download
from ..io.packaged import resolve_model
from .folder import LoadedModel
from .formats.base import Found
from .formats.registry import FORMATS

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
RUN_ROOT = TrainConfig.out_dir.split("/")[0]  # "runs": `runs/NAME` is always a local run folder


@dataclass
class Source:
    # "hub" | "hf" (folder with config.json) | "torch" (Lightning .ckpt or a state-dict file)
    # | "packaged"
    kind: str
    location: str


def pretrained_source(path: str | Path, which: str = "latest") -> Source | None:
    """What `path` is, if it is not an mdlm run or step folder (None: let folder.py handle
    it)."""
    p = Path(path)
    if p.is_file():
        if p.suffix == ".safetensors" and (p.parent / "config.json").is_file():
            return Source("hf", str(p.parent))
        return None if p.suffix == ".safetensors" else Source("torch", str(p))
    if p.is_dir():
        if (p / "model.json").is_file() or (p / which).is_file():
            return None
        return Source("hf", str(p)) if (p / "config.json").is_file() else None
    text = str(path)
    if resolve_model(text) is not None:  # a hub id whose files a pip package ships (packaged.py)
        return Source("packaged", text)
    # owner/name that is not a local path: not inside an existing folder, nor mdlm's run
    # root runs/
    owner = text.split("/")[0]
    if _HUB_ID.match(text) and owner != RUN_ROOT and not Path(owner).is_dir():
        return Source("hub", text)
    return None


def load_pretrained(
    source: Source, *, ema: bool = True, device: torch.device | str = "cpu"
) -> LoadedModel:
    """The model at `source`, loaded by the first format of FORMATS that detects it."""
    if source.kind == "hub":
        path = download(source.location)
    elif source.kind == "packaged":
        path = resolve_model(source.location)
    else:
        path = Path(source.location)
    found = Found.at(path, label=source.location)
    for fmt in FORMATS.values():
        if fmt.detect(found):
            return fmt.load(found, ema=ema, device=device)
    raise MdlmError(f"{source.location} is in no checkpoint format mdlm reads: "
                    + "; ".join(f.description for f in FORMATS.values()))
