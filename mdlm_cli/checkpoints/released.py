"""A model folder in a released layout: config.json and the weights under the layout's names,
in one `model.safetensors` or, past `SHARD_BYTES`, in shards named as transformers names them
(`model-00001-of-00003.safetensors`) with the `model.safetensors.index.json` that maps each
tensor to its shard. The one writer of these files: `mdlm convert` (a causal LM in its target
family's layout: convert/) and `mdlm export` (a trained model: export_layouts.py) both call
`write_released`; which names and which config.json a layout has is the model's own (its
state-dict adapter: formats/reference.py for the DiT, the modules' own names for LLaDA, Dream
and GPT-2, convert/layouts.py for a causal LM's source names), never this module's.

Every reader of these folders takes both forms (models/open_weights.shard_files,
formats/assemble.read_hf_weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..models.folder_weights import INDEX, SINGLE

# transformers' own default (`max_shard_size="5GB"`): an 8B model in bf16 is four shards
SHARD_BYTES = 5 * 10**9


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def shard_groups(weights: dict[str, torch.Tensor], shard_bytes: int) -> list[list[str]]:
    """The tensor names of each shard, in name order, a shard closed before it would pass
    `shard_bytes` (a tensor larger than that is a shard of its own)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name in sorted(weights):
        nbytes = tensor_bytes(weights[name])
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def write_weights(folder: Path, weights: dict[str, torch.Tensor],
                  shard_bytes: int | None = None) -> list[str]:
    """The tensors as model.safetensors, or as shards and their index past `shard_bytes`
    (SHARD_BYTES when None); the files written."""
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in weights.items()}
    groups = shard_groups(tensors, SHARD_BYTES if shard_bytes is None else shard_bytes)
    if len(groups) == 1:
        save_file(tensors, folder / SINGLE, metadata={"format": "pt"})
        return [SINGLE]
    weight_map, files = {}, []
    for i, names in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in names}, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, file))
        files.append(file)
    total = sum(tensor_bytes(t) for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / INDEX).write_text(json.dumps(index, indent=2) + "\n")
    return [*files, INDEX]


def write_released(folder: Path, config: dict, weights: dict[str, torch.Tensor], *,
                   shard_bytes: int | None = None) -> list[str]:
    """config.json and the weights (write_weights) into `folder`, which exists; the files
    written. The caller writes into a temporary folder it swaps in (nothing half-written)."""
    files = write_weights(folder, weights, shard_bytes)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ["config.json", *files]
