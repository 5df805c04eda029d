"""A released Dream folder (config.json with model_type `Dream`: Dream-org/Dream-v0-Base-7B,
Dream-org/Dream-v0-Instruct-7B): the native dream backbone (models/dream.py); its auto_map,
modelling and tokenisation files are never read."""

from __future__ import annotations

from ...models.dream import Dream
from .open_models import released_format

FORMAT = released_format(Dream, "a Dream folder (model_type Dream)")
