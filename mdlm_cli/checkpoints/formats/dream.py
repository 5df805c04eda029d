"""A released Dream folder (config.json with model_type `Dream`: Dream-org/Dream-v0-Base-7B,
Dream-org/Dream-v0-Instruct-7B): the native dream backbone (models/dream.py); its auto_map,
modelling and tokenisation files are never read."""

from __future__ import annotations

from ...models.dream import Dream, read_shape
from ..folder import LoadedModel
from .base import Format, Found
from .open_models import load_open_model


def detect(found: Found) -> bool:
    return found.config is not None and found.config.get("model_type") == "Dream"


def load(found: Found, *, ema: bool, device) -> LoadedModel:
    shape = read_shape(found.config, str(found.path))
    return load_open_model(found, Dream, shape.max_length, device=device)


FORMAT = Format(detect, load, "a Dream folder (model_type Dream)")
