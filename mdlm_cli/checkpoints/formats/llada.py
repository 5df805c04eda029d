"""A released LLaDA folder (config.json with model_type `llada`: GSAI-ML/LLaDA-8B-Base,
GSAI-ML/LLaDA-8B-Instruct, GSAI-ML/LLaDA-1.5): the native llada backbone (models/llada.py);
its auto_map and modelling files are never read."""

from __future__ import annotations

from ...models.llada import LLaDA
from .open_models import released_format

FORMAT = released_format(LLaDA, "a LLaDA folder (model_type llada)")
