"""A Hugging Face causal LM in its target family's released layout: the target's config.json
(with the mask id and the conversion record), every source tensor under the target's name (the
embedding and head grown where the mask needs a row) and the tokenizer with its mask token;
checked against the target backbone built on the meta device before anything is written."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...models import BACKBONES
from ...models.folder_weights import assign_weights
from ...models.open_weights import CONVERSION_KEY, FolderModelConfig
from .layouts import Layout
from .source import CausalFolder
from .vocab import add_mask_token, grow_rows, special_ids


@dataclass
class Target:
    """What the output folder holds: config.json, the tensors, the tokeniser."""

    config: dict
    weights: dict[str, torch.Tensor]
    tokenizer: object  # the transformers tokeniser, its mask token added
    record: dict


def build_target(src: CausalFolder, tokenizer, record: dict) -> Target:
    """The converted folder's contents (see the module). `record` is the conversion record
    (source, shift, attention); the mask's line is added to it."""
    layout = src.layout
    config = layout.family_config(src.config, src.label)
    weights = {}
    for name, tensor in src.weights.items():
        new = layout.rename(name)
        if new is not None:
            weights[new] = tensor
    mask = add_mask_token(tokenizer, int(config[layout.rows_keys[0]]), src.label)
    for name in (layout.embedding, layout.head):
        if name in weights:
            weights[name] = grow_rows(weights[name], mask.rows)
    config.update(dict.fromkeys(layout.rows_keys, mask.rows))
    config.update(special_ids(tokenizer, src.config, mask.id))
    record = {**record, "mask": mask.how}
    config[CONVERSION_KEY] = record
    check_against_backbone(layout, config, weights, src.label,
                           max(len(tokenizer), mask.id + 1))
    return Target(config, weights, tokenizer, record)


def check_against_backbone(layout: Layout, config: dict, weights: dict[str, torch.Tensor],
                           label: str, vocab_size: int) -> None:
    """The target backbone, built from `config` on the meta device, takes `weights` key for key
    and shape for shape (a tied head the source saved anyway is dropped), or one line."""
    cls = BACKBONES[layout.backbone]
    model = cls(FolderModelConfig(hf_model=label), vocab_size, raw=config, load=False)
    if layout.head not in model.state_dict():  # tied in the target: the embedding is the head
        weights.pop(layout.head, None)
    assign_weights(model, dict(weights), label)
