"""FORMATS: the checkpoint formats that `load_pretrained` reads, in detection order (the first
whose `detect` accepts a found checkpoint loads it). A new format is a module beside these with a
`FORMAT` and one entry here."""

from __future__ import annotations

from . import (
    bd3lm_hf,
    caduceus,
    dream,
    gpt2,
    hf_mlm,
    hub_mixin,
    lightning,
    llada,
    reference_hf,
    sedd,
)
from .base import Format

FORMATS: dict[str, Format] = {
    "caduceus": caduceus.FORMAT,
    "sedd": sedd.FORMAT,
    "llada": llada.FORMAT,  # before hf-mlm, whose detect takes any model_type
    "dream": dream.FORMAT,
    "gpt2": gpt2.FORMAT,  # a GPT-2 that mdlm convert wrote (model_type mdlm-gpt2)
    "bd3lm-hf": bd3lm_hf.FORMAT,  # before hf-mlm too: the released BD3-LM folders
    "hf-mlm": hf_mlm.FORMAT,  # before the DiT folders: any model_type but mdlm's
    "hub-mixin": hub_mixin.FORMAT,
    "reference-hf": reference_hf.FORMAT,  # any other folder with a config.json
    "lightning": lightning.FORMAT,  # a file
}
