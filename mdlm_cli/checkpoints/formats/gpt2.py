"""A GPT-2 that `mdlm convert` made a diffusion model (config.json with model_type
`mdlm-gpt2`: GPT-2's keys, its conversion record, the mask token's id): the native gpt2
backbone (models/gpt2.py). A Hugging Face GPT-2 folder itself is a causal LM, not read here:
`mdlm convert` turns it into this one."""

from __future__ import annotations

from ...models.gpt2 import GPT2
from .open_models import released_format

FORMAT = released_format(GPT2, "a GPT-2 folder written by mdlm convert (model_type mdlm-gpt2)")
