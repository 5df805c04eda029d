"""LLaDA (ML-GSAI: LLaDA-8B-Base, LLaDA-8B-Instruct, LLaDA-1.5) as a native backbone
(`model.backbone: llada`), read from its released folder without its Python files.

The architecture is the release's "llama" block: x + attn_out(attention(attn_norm(x))), then
x + ff_out(silu(ff_proj(h)) * up_proj(h)) with h = ff_norm(x); RMSNorm, rotary embeddings at
`rope_theta` rotated in float32, no causal mask; the output layer `transformer.ff_out` (or the
tied embedding with `weight_tying`). The denoiser's logits at a position are the model's logits
there (LLaDA predicts each masked token in place); a LLaMA converted by `mdlm convert` into this
layout keeps its AR head's shift instead (its config.json's conversion record: open_weights.py).
Configurations the release never ships (ALiBi, block types other than llama, MoE layers, QK
norms, ...) are refused, naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import Tensor, nn

from ..errors import MdlmError
from .block_cache import BlockCall
from .decoder_layers import Heads, RMSNorm, attend, position_angles, swiglu
from .open_weights import ReleasedBackbone, refuse

# the release's config.json, beside an mdlm checkpoint's weights
CONFIG_FILE = "llada_config.json"
# key -> the values the native backbone implements (the released models'); an absent key passes
REQUIRED = {
    "block_type": ("llama",), "alibi": (False,), "rope": (True,), "layer_norm_type": ("rms",),
    "activation_type": ("silu",), "include_bias": (False,), "attention_layer_norm": (False,),
    "block_group_size": (1,), "layer_norm_with_affine": (True,),
    "bias_for_layer_norm": (None, False), "multi_query_attention": (None, False),
}


@dataclass(frozen=True)
class LLaDAShape:
    """What a LLaDA config.json says of the network (the release's own key names in comments)."""

    hidden_size: int  # d_model
    n_heads: int
    n_kv_heads: int  # n_kv_heads (None: n_heads)
    n_layers: int
    mlp_hidden: int  # mlp_hidden_size (None: mlp_ratio * d_model)
    vocab_rows: int  # embedding_size (None: vocab_size)
    rope_theta: float
    rope_full_precision: bool  # rotary embeddings applied in float32
    eps: float  # rms_norm_eps
    weight_tying: bool
    qkv_bias: bool  # include_qkv_bias
    input_emb_norm: bool  # embeddings times sqrt(d_model)
    scale_logits: bool  # logits over sqrt(d_model)
    dropout: tuple[float, float, float]  # embedding, attention, residual
    max_length: int  # max_sequence_length

    @property
    def mlp_ratio(self) -> int:
        return math.ceil(self.mlp_hidden / self.hidden_size)

    @classmethod
    def read(cls, raw: dict, name: str) -> LLaDAShape:
        for key, wanted in REQUIRED.items():
            if key in raw and raw[key] not in wanted:
                raise refuse(name, key, raw[key], f"the released models have {wanted[0]!r}")
        experts = sorted(k for k in raw if "expert" in k and raw[k])
        if experts:
            raise refuse(name, experts[0], raw[experts[0]], "mixture-of-experts layers")
        d, heads = int(raw["d_model"]), int(raw["n_heads"])
        return cls(
            hidden_size=d, n_heads=heads, n_kv_heads=int(raw.get("n_kv_heads") or heads),
            n_layers=int(raw["n_layers"]),
            mlp_hidden=int(raw.get("mlp_hidden_size") or raw.get("mlp_ratio", 4) * d),
            vocab_rows=int(raw.get("embedding_size") or raw["vocab_size"]),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            rope_full_precision=bool(raw.get("rope_full_precision", True)),
            eps=float(raw["rms_norm_eps"]),
            weight_tying=bool(raw.get("weight_tying", False)),
            qkv_bias=bool(raw.get("include_qkv_bias", False)),
            input_emb_norm=bool(raw.get("input_emb_norm", False)),
            scale_logits=bool(raw.get("scale_logits", False)),
            dropout=tuple(float(raw.get(k, 0.0)) for k in (
                "embedding_dropout", "attention_dropout", "residual_dropout")),
            max_length=int(raw.get("max_sequence_length", 4096)))


def read_shape(raw: dict, name: str) -> LLaDAShape:
    try:
        return LLaDAShape.read(raw, name)
    except (KeyError, TypeError, ValueError) as e:
        raise MdlmError(f"{name}: config.json is not a LLaDA config ({type(e).__name__}: {e})"
                        ) from None


class LLaDABlock(nn.Module):
    """One "llama" block under the release's names (transformer.blocks.N.*)."""

    def __init__(self, s: LLaDAShape):
        super().__init__()
        self.shape = s
        self.heads = Heads(s.n_heads, s.n_kv_heads, full_precision_rotary=s.rope_full_precision)
        kv = s.n_kv_heads * (s.hidden_size // s.n_heads)
        self.attn_norm = RMSNorm(s.hidden_size, s.eps)
        self.q_proj = nn.Linear(s.hidden_size, s.hidden_size, bias=s.qkv_bias)
        self.k_proj = nn.Linear(s.hidden_size, kv, bias=s.qkv_bias)
        self.v_proj = nn.Linear(s.hidden_size, kv, bias=s.qkv_bias)
        self.attn_out = nn.Linear(s.hidden_size, s.hidden_size, bias=False)
        self.ff_norm = RMSNorm(s.hidden_size, s.eps)
        self.ff_proj = nn.Linear(s.hidden_size, s.mlp_hidden, bias=False)  # the gate (silu)
        self.up_proj = nn.Linear(s.hidden_size, s.mlp_hidden, bias=False)
        self.ff_out = nn.Linear(s.mlp_hidden, s.hidden_size, bias=False)
        self.drop = nn.Dropout(s.dropout[2])

    def forward(self, x: Tensor, rotary: tuple[Tensor, Tensor], keys: Tensor | None,
                block_call: tuple[BlockCall, int] | None = None) -> Tensor:
        h = self.attn_norm(x)
        att = attend(self.q_proj(h), self.k_proj(h), self.v_proj(h), self.heads, rotary=rotary,
                     keys=keys, dropout=self.shape.dropout[1] if self.training else 0.0,
                     block_call=block_call)
        x = x + self.drop(self.attn_out(att))
        return x + self.drop(swiglu(self.ff_norm(x), self.ff_proj, self.up_proj, self.ff_out))


class LLaDATransformer(nn.Module):
    """The release's `model` module: transformer.{wte, blocks, ln_f, ff_out}."""

    def __init__(self, s: LLaDAShape):
        super().__init__()
        parts = {"wte": nn.Embedding(s.vocab_rows, s.hidden_size),
                 "blocks": nn.ModuleList(LLaDABlock(s) for _ in range(s.n_layers)),
                 "ln_f": RMSNorm(s.hidden_size, s.eps)}
        if not s.weight_tying:
            parts["ff_out"] = nn.Linear(s.hidden_size, s.vocab_rows, bias=False)
        self.transformer = nn.ModuleDict(parts)


class LLaDA(ReleasedBackbone):
    """`LLaDA(cfg, vocab_size)(tokens (B, L), None, attention_mask=, output_mask=) -> logits`.

    Built from `cfg.hf_model`'s folder for training (float32 weights); `from_folder` keeps the
    checkpoint's dtype (bf16) for inference; `from_checkpoint` rebuilds an mdlm run's model.
    """

    family, title, config_file = "llada", "LLaDA", CONFIG_FILE
    model_type = "llada"  # config.json's model_type of the released folders
    # what the samplers default to for this family (its own transfer schedule)
    # its transfer schedule, and the likelihood estimator of its evaluation code (masked
    # counts: get_log_likelihood.py)
    sampling_defaults = {"k_schedule": "llada", "estimator": "l"}
    answer_tokens = 128  # generate.py's gen_length default
    # LoRA's defaults (models/lora.py), as dllm's LLaDA recipes: every linear layer of a block
    lora_targets = ("q_proj", "k_proj", "v_proj", "attn_out", "ff_proj", "up_proj", "ff_out")
    lora_whole = ("transformer.wte", "transformer.ff_out")
    read_shape = staticmethod(read_shape)

    def build_network(self) -> None:
        self.model = LLaDATransformer(self.config)  # the release's names: model.transformer.*

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.model.transformer.blocks)

    def hidden_states(self, tokens: Tensor, attention_mask: Tensor | None,
                      call: BlockCall | None = None, positions: Tensor | None = None) -> Tensor:
        """ln_f of the last block's output, (B, L, H); with a block `call`, of the positions
        [call.start, call.start + n) that `tokens` (B, n) hold; with `positions` (L,), at
        those."""
        s, t = self.config, self.model.transformer
        x = t.wte(tokens)
        if s.input_emb_norm:
            x = x * math.sqrt(s.hidden_size)
        x = nn.functional.dropout(x, s.dropout[0], self.training)
        rotary = position_angles(tokens, 0 if call is None else call.start, positions,
                                 s.hidden_size // s.n_heads, s.rope_theta)
        keys = self.attention_keys(attention_mask, tokens.shape[1], tokens.device)
        for i, block in enumerate(t.blocks):
            x = self.run_block(block, x, rotary, keys, None if call is None else (call, i))
        return t.ln_f(x)

    def _head(self, h: Tensor) -> Tensor:
        t = self.model.transformer
        weight = t.wte.weight if self.config.weight_tying else t.ff_out.weight
        logits = nn.functional.linear(h, weight)
        if self.config.scale_logits:
            logits = logits / math.sqrt(self.config.hidden_size)
        return logits[..., : self.vocab_size].float()
