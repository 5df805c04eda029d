"""A released folder's weights (LLaDA, Dream, a converted folder): its safetensors, one file or
the shards its index names, checked and sized from their headers, then memory-mapped into a
backbone built on the meta device (`load_state_dict(assign=True)`), so that loading holds the
weights about once, in the checkpoint's dtype. The backbones themselves: open_weights.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from ..errors import MdlmError
from ..memory import check_weights_fit

INDEX = "model.safetensors.index.json"
# bytes per element of the safetensors dtypes the releases use (others count 4)
STORED_BYTES = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "U8": 1, "I8": 1}
SINGLE = "model.safetensors"


def shard_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder: model.safetensors, or the shards its index names,
    each checked to be there (one line naming the first that is not)."""
    if (folder / SINGLE).is_file():
        return [folder / SINGLE]
    index = folder / INDEX
    if not index.is_file():
        raise MdlmError(f"{folder} has a config.json but no {SINGLE} nor {INDEX}")
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise MdlmError(f"{index} is not a valid safetensors index "
                        f"({type(e).__name__})") from None
    for shard in shards:
        if not (folder / shard).is_file():
            raise MdlmError(f"{folder} lacks the shard {shard} that {INDEX} names; the download "
                            "is incomplete (fetch the folder again)")
    return [folder / s for s in shards]


def weight_bytes(shards: list[Path], dtype: torch.dtype | None = None) -> int:
    """The bytes the shards' tensors take in memory, as stored or cast to `dtype` (from the
    safetensors headers: nothing is read but them)."""
    from safetensors import safe_open

    total = 0
    for shard in shards:
        try:
            with safe_open(shard, framework="pt") as f:
                for key in f.keys():
                    piece = f.get_slice(key)
                    size = dtype.itemsize if dtype is not None else STORED_BYTES.get(
                        piece.get_dtype(), 4)
                    total += math.prod(piece.get_shape()) * size
        except (SafetensorError, OSError) as e:
            raise MdlmError(f"{shard} is not a readable safetensors file ({e}); the checkpoint "
                            "is corrupted") from None
    return total


def read_shards(shards: list[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of the shards, memory-mapped on the CPU (pages are read as they are used)."""
    weights: dict[str, torch.Tensor] = {}
    for shard in shards:
        try:
            weights.update(load_file(shard))
        except (SafetensorError, OSError) as e:
            raise MdlmError(f"{shard} is not a readable safetensors file ({e}); the "
                            "checkpoint is corrupted") from None
    return weights


def assign_weights(model: nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Make `weights` the parameters of a meta-built `model`, key for key and shape for shape,
    or one line naming the first mismatch."""
    target = model.state_dict()
    missing = sorted(set(target) - set(weights))
    unexpected = sorted(set(weights) - set(target))
    if missing or unexpected:
        what = f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}"
        raise MdlmError(f"{source} does not fit its config.json ({what}; {len(missing)} "
                        f"missing, {len(unexpected)} unexpected tensors)")
    for key, value in target.items():
        if tuple(value.shape) != tuple(weights[key].shape):
            raise MdlmError(f"{source}: {key} has shape {tuple(weights[key].shape)}, its "
                            f"config.json gives {tuple(value.shape)}")
    model.load_state_dict(weights, strict=True, assign=True)


def fill_released(
    model: nn.Module,
    folder: Path,
    device: torch.device | str = "cpu",
    *,
    dtype: torch.dtype | None = None,
) -> nn.Module:
    """Give a meta-built `model` the folder's weights (in their own dtype unless `dtype`) on
    `device`; refused in one line first when the weights cannot fit there."""
    shards = shard_files(folder)
    check_weights_fit(str(folder), weight_bytes(shards, dtype), torch.device(device))
    assign_weights(model, read_shards(shards), str(folder))
    if dtype is not None:
        model.to(dtype)
    return model.to(device)


def materialise(model: nn.Module) -> nn.Module:
    """A meta-built `model` with uninitialised float32 CPU parameters, to be overwritten by a
    checkpoint's weights (no time is spent on an initialisation that is thrown away)."""
    return model.to_empty(device="cpu").float()
