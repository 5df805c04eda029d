"""A DiT pushed with `PyTorchModelHubMixin`: config.json holds the reference's Hydra config under
"config" (its `model` section among it) and the weights carry the reference's names."""

from __future__ import annotations

from ..folder import LoadedModel
from .assemble import load_dit_folder
from .base import Format, Found
from .reference import partial_from_hydra


def detect(found: Found) -> bool:
    inner = (found.config or {}).get("config")
    return isinstance(inner, dict) and isinstance(inner.get("model"), dict)


def load(found: Found, *, ema: bool, device) -> LoadedModel:
    partial = partial_from_hydra(found.config["config"], found.path / "config.json")
    return load_dit_folder(found, partial, device=device)


FORMAT = Format(detect, load, "a DiT pushed with PyTorchModelHubMixin (the Hydra config inside)")
