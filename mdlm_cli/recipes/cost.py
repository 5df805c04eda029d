"""What a recipe's training costs, estimated (`mdlm reproduce --list`): 6 x parameters x
training tokens at an assumed utilisation of an A100, summed over the recipe's models."""

from __future__ import annotations

from ..build import resolve_config
from ..data.tokenizers import known_tokenizer
from .schema import Recipe

A100_BF16_FLOPS, ASSUMED_MFU = 312e12, 0.4  # NVIDIA A100 data sheet, dense bf16; an assumption


def gpu_days(recipe: Recipe) -> str:
    """The estimated A100-days as text: "?" where a model's size is not known without its
    tokeniser (or it is no DiT), "-" where nothing is trained."""
    import torch

    from ..models import build_model

    flops = 0.0
    for model in recipe.models.values():
        if model.preset is None:
            continue
        cfg = resolve_config(model.preset, model.overrides)
        known = known_tokenizer(cfg.data.tokenizer)
        if known is None or cfg.model.backbone != "dit":
            return "?"
        with torch.device("meta"):
            params = sum(p.numel()
                         for p in build_model(cfg.model, known.vocab_size).parameters())
        steps = model.max_steps or cfg.train.max_steps
        flops += 6 * params * steps * cfg.train.global_batch_size * cfg.data.length
    return f"{flops / (A100_BF16_FLOPS * ASSUMED_MFU) / 86400:,.1f}" if flops else "-"
