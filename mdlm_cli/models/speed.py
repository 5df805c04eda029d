"""What speed measurements need of a backbone: its FLOP count (`perf.ModelFlops`) and the part
of it worth compiling."""

from __future__ import annotations

import os
import shutil

import torch
from torch import nn

from ..distributed import unwrap
from ..perf import ModelFlops
from .dit import DiT
from .hf_mlm import HFMaskedLM


def model_flops(model: nn.Module) -> ModelFlops:
    """The weights used once per token (all but embedding tables, which are lookups) and the
    attention's shape: the DiT's blocks, an HF encoder's layers; none for Mamba and Caduceus."""
    model = unwrap(model)
    tables = [m.weight for m in model.modules() if isinstance(m, nn.Embedding)]
    lookups = {id(weight): weight.numel() for weight in tables}
    embed = model.vocab_embed.embedding if isinstance(model, DiT) else None  # the DiT's table
    if isinstance(embed, nn.Parameter):
        lookups[id(embed)] = embed.numel()
    tied = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    # a table tied to the output layer (Mamba's lm_head) is a matmul there: it counts once
    matmul = sum(p.numel() for p in model.parameters() if id(p) not in lookups or id(p) in tied)
    layers, width = attention_shape(model)
    vocab = {weight.shape[0] for weight in [*tables, *([embed] if embed is not None else [])]}
    output = sum(m.weight.numel() for m in model.modules()
                 if isinstance(m, nn.Linear) and m.out_features in vocab)
    return ModelFlops(matmul, layers, width, output)


def attention_shape(model: nn.Module) -> tuple[int, int]:
    """(attention layers, width of queries and keys) of a backbone; (0, 0) without attention."""
    if isinstance(model, DiT):
        return model.config.n_blocks, model.config.hidden_size
    if isinstance(model, HFMaskedLM):  # its HF config's names (BERT's, or DistilBERT's)
        c = model.hf.config
        layers = getattr(c, "num_hidden_layers", getattr(c, "n_layers", 0))
        return int(layers), int(getattr(c, "hidden_size", getattr(c, "dim", 0)))
    if model.family:  # LLaDA, Dream: the shape read from their config.json
        return model.config.n_layers, model.config.hidden_size
    return 0, 0


def model_width(model: nn.Module) -> int | None:
    """The hidden size of a backbone (what `runtime.autocast_dtype`'s CPU rule reads)."""
    model = unwrap(model)
    if isinstance(model, HFMaskedLM):
        c = model.hf.config
        return getattr(c, "hidden_size", getattr(c, "dim", None))
    return getattr(getattr(model, "config", None), "hidden_size", None)


def compile_trunk(model: nn.Module, mode: str | None = None) -> bool:
    """torch.compile the backbone's `trunk` (the DiT's blocks: fixed shapes, no host
    synchronisation) in place; False when it has none (compile the whole module instead).
    The output layer stays eager: at the masked positions only, its row count changes every
    step, and a compiled graph would recompile for it. The compiled function is an instance
    attribute, so the weights' names (the state dict) do not change."""
    model = unwrap(model)
    trunk = getattr(model, "trunk", None)
    if trunk is None:
        return False
    model.trunk = torch.compile(trunk, mode=mode)
    return True


def compile_unavailable(device: torch.device) -> str | None:
    """Why torch.compile cannot run on `device`, or None: on a CPU its code generator (inductor)
    builds C++ and needs a compiler (CXX, g++, c++ or clang++ on the PATH)."""
    if device.type != "cpu":
        return None
    names = [os.environ.get("CXX", ""), "g++", "c++", "clang++"]
    if any(shutil.which(name) for name in names if name):
        return None
    return ("train.compile: torch.compile needs a C++ compiler on a CPU and none is on the PATH "
            "(install g++, or set CXX); training without compiling")
