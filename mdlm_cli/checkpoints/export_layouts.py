"""The layout `mdlm export` writes for each backbone: weights and config.json in the form their
family's own loaders read, mdlm's section ("mdlm": config, data, state) added to config.json,
and the model card's words on what the folder holds.

- dit: the reference's (formats/reference.py: `MDLMConfig` fields, `backbone.*` names). A
  shifted DiT (an AR run `mdlm convert` made a diffusion model, `model.shift`) is written the
  same way: the reference has no field for the shift, so it lives in the "mdlm" section's
  model config, which mdlm's loader honours (formats/reference_hf.py); the card warns that the
  reference's own class would read the weights unshifted.
- hf-mlm: the Hugging Face model's own folder (`save_pretrained`).
- llada, dream: the family's released layout (LLaDA's or Dream's config.json, their tensor
  names: `ReleasedBackbone.released_layout`), which the released loaders read back
  (formats/llada.py, dream.py); a converted LLaMA or Qwen2 keeps its conversion record.
- gpt2: mdlm's GPT-2 layout, as `mdlm convert` writes it (formats/gpt2.py).

The weights and config.json go through released.write_released, the writer `mdlm convert`
uses too; the names come from each model's own state-dict adapter.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import MdlmError
from ..models import DiT, HFMaskedLM
from ..models.open_weights import ReleasedBackbone
from .folder import LoadedModel
from .formats.reference import hf_config, reference_state_dict
from .released import write_released

# a section's name in config.json (formats/assemble.export_section reads it back)
SECTION = "mdlm"


@dataclass(frozen=True)
class ExportLayout:
    """One layout: `write(loaded, folder, section)` writes the weights, config.json (with
    mdlm's `section`) and the tokeniser files into `folder` and returns config.json's content;
    `card(loaded)` is the model card's sentence on the files."""

    write: Callable[[LoadedModel, Path, dict], dict]
    card: Callable[[LoadedModel], str]


def write_dit(loaded: LoadedModel, folder: Path, section: dict) -> dict:
    config = hf_config(loaded, section)  # the reference's fields + mdlm's section
    write_released(folder, config, reference_state_dict(loaded.model))
    loaded.tokenizer.save(folder)
    return config


def dit_card(loaded: LoadedModel) -> str:
    text = ("`config.json` carries the reference implementation's `MDLMConfig` fields and "
            "`model.safetensors` its parameter names (`backbone.*`); ")
    if loaded.config.model.shift:
        text += ("**this DiT is shifted** (`model.shift`: position i's logits are read from the "
                 "output at i - 1, as the autoregressive model it was converted from predicted "
                 "the next token). The reference's config has no field for that: mdlm reads it "
                 "from the \"mdlm\" section and loads the model shifted, but the reference's "
                 "own `MDLM` class would read these weights unshifted and predict every "
                 "token from the wrong position, so load it with mdlm; ")
    return text


def write_hf(loaded: LoadedModel, folder: Path, section: dict) -> dict:
    config = loaded.model.save_pretrained_folder(folder)
    config[SECTION] = section
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    loaded.tokenizer.save(folder)
    return config


def hf_card(loaded: LoadedModel) -> str:
    return ("This is the Hugging Face masked LM's own folder "
            "(`AutoModelForMaskedLM.from_pretrained` loads it as it is), fine-tuned with MDLM; "
            "`config.json` also holds mdlm's section; ")


def write_family(loaded: LoadedModel, folder: Path, section: dict) -> dict:
    config, weights = loaded.model.released_layout()
    config = {**config, SECTION: section}  # an earlier export's section replaced
    write_released(folder, config, weights)
    loaded.tokenizer.save(folder)
    release_tokenizer_config(folder)
    return config


def release_tokenizer_config(folder: Path) -> None:
    """tokenizer_config.json as the releases write it, for their own code (transformers 4):
    the fast tokeniser's class by its old name and the chat template inside (transformers 5
    names the class TokenizersBackend and writes the template to chat_template.jinja, which
    it keeps too)."""
    path, template = folder / "tokenizer_config.json", folder / "chat_template.jinja"
    if not path.is_file():
        return
    settings = json.loads(path.read_text())
    if settings.get("tokenizer_class") == "TokenizersBackend":
        settings["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key in ("is_local", "local_files_only"):  # how this machine loaded it, not the model's
        settings.pop(key, None)
    if "chat_template" not in settings and template.is_file():
        settings["chat_template"] = template.read_text()
    path.write_text(json.dumps(settings, indent=2) + "\n")


def family_card(loaded: LoadedModel) -> str:
    model = loaded.model
    text = (f"`config.json` is the {model.title} release's own (its keys, model_type "
            f"`{model.model_type}`, plus mdlm's section) and the safetensors hold its parameter "
            f"names, so mdlm's {model.family} loader reads the folder as it reads the release; ")
    if "auto_map" in model.raw:
        text += ("its `auto_map` names the release's modelling files, which are not copied here "
                 "(put them beside it to run the release's own code); ")
    if model.conversion:
        text += (f"it was converted from {model.conversion.get('source')} by `mdlm convert` and "
                 "its record (`mdlm_conversion` in config.json: shift "
                 f"{'on' if model.shift else 'off'}, {model.attention} attention) travels with "
                 "it; ")
        target = model.conversion.get("target", "mdlm")
        if model.shift != model.default_shift or model.attention != "full" or target != "mdlm":
            text += (f"code that does not read that record (the {model.title} release's own) "
                     "would run it with its family's shift and full attention over whole rows, "
                     f"not as it was trained ({target}"
                     + (f", blocks of {model.conversion.get('block_size')}"
                        if target != "mdlm" else "") + "); ")
    return text


LAYOUTS = (
    (DiT, ExportLayout(write_dit, dit_card)),
    (HFMaskedLM, ExportLayout(write_hf, hf_card)),
    (ReleasedBackbone, ExportLayout(write_family, family_card)),  # LLaDA, Dream, GPT-2
)


def export_layout(loaded: LoadedModel) -> ExportLayout:
    """The layout of `loaded`'s backbone, or a one-line refusal for one that has none."""
    for cls, layout in LAYOUTS:
        if isinstance(loaded.model, cls):
            return layout
    raise MdlmError(
        "mdlm export writes the DiT (the reference's layout), LLaDA, Dream and GPT-2 (their "
        "released layouts) and Hugging Face masked LMs; a "
        f"{loaded.config.model.backbone} model is shared as its run folder (safetensors, "
        "config.yaml, tokenizer files)"
    )
