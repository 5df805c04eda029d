"""A released LLaDA folder (config.json with model_type `llada`: GSAI-ML/LLaDA-8B-Base,
GSAI-ML/LLaDA-8B-Instruct, GSAI-ML/LLaDA-1.5): the native llada backbone (models/llada.py);
its auto_map and modelling files are never read."""

from __future__ import annotations

from ...models.llada import LLaDA, read_shape
from ..folder import LoadedModel
from .base import Format, Found
from .open_models import load_open_model


def detect(found: Found) -> bool:
    return found.config is not None and found.config.get("model_type") == "llada"


def load(found: Found, *, ema: bool, device) -> LoadedModel:
    shape = read_shape(found.config, str(found.path))
    return load_open_model(found, LLaDA, shape.max_length, device=device)


FORMAT = Format(detect, load, "a LLaDA folder (model_type llada)")
