"""A LoRA run (lora.rank > 0): the base from train.init_from, frozen (in 4-bit nf4 with
lora.quantize=4bit: QLoRA, Dettmers et al., 2023), adapters injected (models/lora.py), and
--resume of one (checkpoints/adapter.py holds the step folder's layout)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.console import Console
from torch import nn

from ..checkpoints.adapter import restore_adapters
from ..checkpoints.folder import read_optimizer_state
from ..config import Config
from ..distributed import load_full_optimizer_state
from ..models.lora import add_lora, prepare_base, trainable
from .memory_model import describe, estimate, plan_of, shape_of
from .optim import AdapterEMA


def adapt(model: nn.Module, cfg: Config, rt, console: Console) -> nn.Module:
    """`model` (the base, its weights loaded) with fresh adapters (float32), everything else
    frozen: in bf16 where the run computes in bf16 (a frozen weight needs no float32 master
    copy: LLaDA-8B's weights are 16 GB, not 32), in nf4 with lora.quantize=4bit."""
    lora = cfg.lora
    model = add_lora(prepare_base(model, lora, rt), lora, cfg.train.init_from)
    total = sum(p.numel() for p in model.parameters())
    mine = sum(p.numel() for _, p in trainable(model))
    console.print(f"LoRA: rank {lora.rank}, alpha {lora.alpha:g}, "
                  f"{mine / 1e6:.3f}M trainable parameters of {total / 1e6:.1f}M "
                  f"({100 * mine / total:.2f}%)", highlight=False)
    console.print(describe(estimate(shape_of(model), plan_of(cfg, model, dtype=rt.dtype))),
                  highlight=False)
    return model


def restore_lora_run(step_dir: Path, model: nn.Module, ema: AdapterEMA | None,
                     optimizer: torch.optim.Optimizer) -> dict:
    """--resume of a LoRA run in place: its adapters, their EMA, the optimizer; returns
    state.json."""
    averages = restore_adapters(step_dir, model)
    if ema is not None and averages is not None:
        ema.shadow = averages
    load_full_optimizer_state(model, optimizer, read_optimizer_state(step_dir))
    return json.loads((step_dir / "state.json").read_text())
