"""A tiny folder in the layout of the released BD3-LM weights (kuleshov-group/bd3lm-owt-*), and
the released module's forward transcribed from kuleshov-group/bd3lms models/hf/modeling_bd3lm.py
(`DITBackbone.forward` with `cross_attn`, the sdpa path, inference) as plain functions over the
state dict: what mdlm's loading of the folder must reproduce.

The folder: config.json as `BD3LMConfig.to_dict()` writes it (model_type, architectures,
auto_map and every field), model.safetensors with the HF `BD3LM`'s names (`backbone.*`, the
persistent rotary buffer, the `sampling_eps_min` / `sampling_eps_max` buffers) and a
modeling_bd3lm.py / configuration_bd3lm.py that raise when imported: loading must never run
them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from .reference_weights import reference_state_dict

GPT2_VOCAB = 50258  # GPT-2's 50257 tokens and the mask (BD3LMConfig: tokenizer.vocab_size + 1)
RAISES = "raise RuntimeError('the folder\\'s code was imported')\n"


def released_config(block_size: int = 4, length: int = 64, hidden: int = 32, cond: int = 16,
                    n_blocks: int = 2, n_heads: int = 4, **changes) -> dict:
    name = f"kuleshov-group/bd3lm-owt-block_size{block_size}"
    config = {
        "_name_or_path": name, "architectures": ["BD3LM"],
        "auto_map": {"AutoConfig": f"{name}--configuration_bd3lm.BD3LMConfig",
                     "AutoModelForMaskedLM": f"{name}--modeling_bd3lm.BD3LM"},
        "adaln": True, "attn_backend": "flex", "block_size": block_size, "causal": False,
        "cond_dim": cond, "cross_attn": True, "dropout": 0.1, "hidden_dim": hidden,
        "model_length": length, "model_type": "bd3lm", "n_blocks": n_blocks, "n_heads": n_heads,
        "return_dict": False, "sampling_eps_max": 0.999, "sampling_eps_min": 0.001,
        "time_conditioning": False, "torch_dtype": "float32", "transformers_version": "4.49.0",
        "var_min": True, "vocab_size": GPT2_VOCAB,
    }
    config.update(changes)
    return config


def released_weights(hidden: int = 32, cond: int = 16, n_blocks: int = 2, n_heads: int = 4,
                     clip: tuple[float, float] = (0.3, 0.8), seed: int = 0) -> dict:
    """The HF BD3LM's state dict: its DiT has the MDLM DiT's names in the same order."""
    state = dict(reference_state_dict(vocab=GPT2_VOCAB, hidden=hidden, cond=cond,
                                      n_blocks=n_blocks, n_heads=n_heads, seed=seed))
    state["sampling_eps_min"] = torch.tensor(clip[0])
    state["sampling_eps_max"] = torch.tensor(clip[1])
    return state


def save_released_folder(folder: Path, config: dict | None = None,
                         weights: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = config if config is not None else released_config()
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    weights = weights if weights is not None else released_weights(
        hidden=config["hidden_dim"], cond=config["cond_dim"], n_blocks=config["n_blocks"],
        n_heads=config["n_heads"])
    save_file(weights, folder / "model.safetensors")
    for code in ("modeling_bd3lm.py", "configuration_bd3lm.py"):
        (folder / code).write_text(RAISES)
    return folder


# ---------------------------------------------------------------------- the released forward

def block_diff_mask(n: int, block_size: int) -> torch.Tensor:
    """`block_diff_mask` over q, kv in [0, 2n): (2n, 2n) bool."""
    q, kv = torch.arange(2 * n)[:, None], torch.arange(2 * n)[None, :]
    x0_q, x0_kv = q >= n, kv >= n
    block_q = torch.where(x0_q, (q - n) // block_size, q // block_size)
    block_kv = torch.where(x0_kv, (kv - n) // block_size, kv // block_size)
    diagonal = (block_q == block_kv) & (x0_q == x0_kv)
    offset_block_causal = (block_q > block_kv) & x0_kv & ~x0_q
    block_causal = (block_q >= block_kv) & x0_kv & x0_q
    return diagonal | offset_block_causal | block_causal


def _layer_norm(x, weight):
    return F.layer_norm(x.float(), [x.shape[-1]]) * weight[None, None, :]


def _modulate(x, shift, scale):
    return x * (1 + scale) + shift


def _linear(w: dict, name: str, x):
    return F.linear(x, w[f"{name}.weight"], w.get(f"{name}.bias"))


def _timestep_embedding(t, dim: int = 256, max_period: int = 10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _rotary(seq_len: int, inv_freq):
    """`Rotary.forward`: (1, L, 3, 1, D) cos and sin, the identity on v."""
    t = torch.arange(seq_len).type_as(inv_freq)
    freqs = torch.einsum("i,j->ij", t, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos()[None, :, None, None, :].repeat(1, 1, 3, 1, 1)
    sin = emb.sin()[None, :, None, None, :].repeat(1, 1, 3, 1, 1)
    cos[:, :, 2], sin[:, :, 2] = 1.0, 0.0
    return cos, sin


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _get_qkv(w: dict, p: str, x, rotary, n_heads: int):
    qkv = _linear(w, f"{p}.attn_qkv", x)
    b, s, _ = qkv.shape
    qkv = qkv.view(b, s, 3, n_heads, -1)  # 'b s (three h d) -> b s three h d'
    cos, sin = rotary
    return qkv * cos + _rotate_half(qkv) * sin


def _block(w: dict, p: str, x, rotary, c, mask, n_heads: int, sample_mode: bool):
    (shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp) = _linear(
        w, f"{p}.adaLN_modulation", c)[:, None].chunk(6, dim=2)
    x_skip = x
    x = _modulate(_layer_norm(x, w[f"{p}.norm1.weight"]), shift_msa, scale_msa)
    if mask is not None and not sample_mode:  # x_t and x0 halves, each at positions 0..n-1
        n = mask.shape[-1] // 2
        qkv = torch.cat((_get_qkv(w, p, x[:, :n], rotary, n_heads),
                         _get_qkv(w, p, x[:, n:], rotary, n_heads)), dim=1)
    else:
        qkv = _get_qkv(w, p, x, rotary, n_heads)
    head = qkv.shape[-1]
    qkv = qkv.transpose(1, 3)  # (b, h, three, s, d)
    x = F.scaled_dot_product_attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2],
                                       attn_mask=mask, scale=1 / math.sqrt(head))
    x = x.transpose(1, 2).flatten(2)  # 'b s h d -> b s (h d)'
    x = x_skip + gate_msa * _linear(w, f"{p}.attn_out", x)
    mlp_in = _modulate(_layer_norm(x, w[f"{p}.norm2.weight"]), shift_mlp, scale_mlp)
    mlp = _linear(w, f"{p}.mlp.2", F.gelu(_linear(w, f"{p}.mlp.0", mlp_in), approximate="tanh"))
    return x + gate_mlp * mlp


def released_logits(weights: dict, config: dict, indices: torch.Tensor,
                    sample_mode: bool = False) -> torch.Tensor:
    """`BD3LM.forward(input_ids, timesteps, sample_mode)` without a key/value cache: training
    (x_t ⊕ x0, (B, 2n) -> logits of the x_t half) or sampling (the first m <= n tokens under the
    x0 half's block-causal mask -> (B, m, V))."""
    w = {k.removeprefix("backbone."): v.float() for k, v in weights.items()}
    n, n_heads = config["model_length"], config["n_heads"]
    full = block_diff_mask(n, config["block_size"])
    sigma = torch.zeros(indices.shape[0])  # time_conditioning False: sigma zeroed
    x = w["vocab_embed.embedding"][indices]
    h = _linear(w, "sigma_map.mlp.0", _timestep_embedding(sigma))
    c = F.silu(_linear(w, "sigma_map.mlp.2", F.silu(h)))
    if not sample_mode:
        rotary, mask = _rotary(n, w["rotary_emb.inv_freq"]), full
    else:
        m = indices.shape[1]
        rotary, mask = _rotary(m, w["rotary_emb.inv_freq"]), full[n:n + m, n:n + m]
    for i in range(config["n_blocks"]):
        x = _block(w, f"blocks.{i}", x, rotary, c, mask, n_heads, sample_mode)
    shift, scale = _linear(w, "output_layer.adaLN_modulation", c)[:, None].chunk(2, dim=2)
    x = _modulate(_layer_norm(x, w["output_layer.norm_final.weight"]), shift, scale)
    logits = _linear(w, "output_layer.linear", x)
    return logits if sample_mode else logits[:, :n]
