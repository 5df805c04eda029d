"""Checkpoints in the reference implementation's formats, built from its naming (REFERENCE.md §6),
not from mdlm's DiT, with random weights:

- `reference_state_dict`: the Lightning module's / HF `MDLM`'s `backbone.*` state dict, in the
  reference's module registration order, with the persistent rotary buffer `rotary_emb.inv_freq`;
- `save_hf_folder`: config.json (the reference `MDLMConfig` fields) + model.safetensors;
- `save_lightning`: a Lightning-style dictionary with `state_dict`, `ema` (models/ema.py:
  decay, num_updates, shadow_params as a list in parameter order) and hyper-parameters.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import torch
from safetensors.torch import save_file

BLOCK_PARAMS = ("norm1.weight", "attn_qkv.weight", "attn_out.weight", "norm2.weight", "mlp.0.weight", "mlp.0.bias",
                "mlp.2.weight", "mlp.2.bias", "adaLN_modulation.weight", "adaLN_modulation.bias")


def reference_param_shapes(vocab: int, hidden: int, cond: int, n_blocks: int) -> OrderedDict[str, tuple]:
    """The reference DIT's parameters in `parameters()` order (no prefix)."""
    h, c = hidden, cond
    shapes = OrderedDict([
        ("vocab_embed.embedding", (vocab, h)),
        ("sigma_map.mlp.0.weight", (c, 256)), ("sigma_map.mlp.0.bias", (c,)),
        ("sigma_map.mlp.2.weight", (c, c)), ("sigma_map.mlp.2.bias", (c,)),
    ])
    block = dict(zip(BLOCK_PARAMS, [(h,), (3 * h, h), (h, h), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,),
                                    (6 * h, c), (6 * h,)], strict=True))
    for i in range(n_blocks):
        shapes.update((f"blocks.{i}.{name}", shape) for name, shape in block.items())
    shapes.update([
        ("output_layer.norm_final.weight", (h,)), ("output_layer.linear.weight", (vocab, h)),
        ("output_layer.linear.bias", (vocab,)), ("output_layer.adaLN_modulation.weight", (2 * h, c)),
        ("output_layer.adaLN_modulation.bias", (2 * h,)),
    ])
    return shapes


def inv_freq(hidden: int, n_heads: int) -> torch.Tensor:
    head = hidden // n_heads
    return 1.0 / (10_000 ** (torch.arange(0, head, 2).float() / head))


def reference_state_dict(vocab: int = 35, hidden: int = 32, cond: int = 16, n_blocks: int = 2, n_heads: int = 4,
                         seed: int = 0, prefix: str = "backbone.") -> OrderedDict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, shape in reference_param_shapes(vocab, hidden, cond, n_blocks).items():
        out[prefix + name] = 0.2 * torch.randn(shape, generator=gen)
        if name == "sigma_map.mlp.2.bias":  # the rotary module sits between sigma_map and blocks
            out[prefix + "rotary_emb.inv_freq"] = inv_freq(hidden, n_heads)
    return out


def hf_config(vocab: int = 35, hidden: int = 32, cond: int = 16, n_blocks: int = 2, n_heads: int = 4,
              length: int = 32, time_conditioning: bool = False) -> dict:
    return {"model_type": "mdlm", "architectures": ["MDLM"], "vocab_size": vocab, "model_length": length,
            "hidden_dim": hidden, "cond_dim": cond, "n_blocks": n_blocks, "n_heads": n_heads, "dropout": 0.1,
            "time_conditioning": time_conditioning, "return_dict": False}


def save_hf_folder(folder: Path, state: dict | None = None, config: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(dict(state if state is not None else reference_state_dict()), folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(config if config is not None else hf_config()))
    return folder


def reference_hydra_config(hidden: int = 32, cond: int = 16, n_blocks: int = 2, n_heads: int = 4,
                           length: int = 32, tokenizer: str = "text8") -> dict:
    """The parts of the reference's configs/config.yaml that matter, with its interpolations."""
    return {
        "mode": "train", "diffusion": "absorbing_state", "backbone": "dit", "parameterization": "subs",
        "time_conditioning": False, "T": 0, "subs_masking": False, "seed": 1,
        "model": {"name": "tiny", "type": "ddit", "hidden_size": hidden, "cond_dim": cond, "length": length,
                  "n_blocks": n_blocks, "n_heads": n_heads, "scale_by_sigma": True, "dropout": 0.1},
        "data": {"train": "text8", "valid": "text8", "tokenizer_name_or_path": tokenizer, "wrap": True},
        "noise": {"type": "loglinear", "sigma_min": 1e-4, "sigma_max": 20},
        "loader": {"global_batch_size": 512, "eval_global_batch_size": "${.global_batch_size}"},
        "training": {"ema": 0.9999, "antithetic_sampling": True, "sampling_eps": 1e-3},
    }


def lightning_checkpoint(state: dict | None = None, seed: int = 1, hyper_parameters=None, **dims) -> dict:
    """A Lightning checkpoint dictionary as the reference's Diffusion module saves it."""
    state = state if state is not None else reference_state_dict(**dims)
    gen = torch.Generator().manual_seed(seed)
    shadow = [0.2 * torch.randn(v.shape, generator=gen) for k, v in state.items() if not k.endswith("inv_freq")]
    return {
        "epoch": 3, "global_step": 1234, "pytorch-lightning_version": "2.2.1",
        "state_dict": OrderedDict(state),
        "ema": {"decay": 0.9999, "num_updates": 1234, "shadow_params": shadow},
        "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 3}}}},
        "optimizer_states": [{"state": {}, "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.999)}]}],
        "hparams_name": "kwargs",
        "hyper_parameters": hyper_parameters if hyper_parameters is not None else {"config": reference_hydra_config()},
    }
