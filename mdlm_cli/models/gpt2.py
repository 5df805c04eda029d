"""GPT-2 as a native backbone (`model.backbone: gpt2`): the network of Hugging Face's
`GPT2LMHeadModel`, for a GPT-2 converted into a diffusion model by `mdlm convert`
(checkpoints/convert/), read from the folder it writes (config.json with model_type
`mdlm-gpt2`, the GPT-2 keys otherwise).

The architecture is GPT-2's: token embeddings plus learned absolute positions (`wpe`), pre-norm
blocks of LayerNorm, multi-head attention (one `c_attn` projection for q, k, v) and a GELU MLP
(`c_fc`, `c_proj`, four times wider unless `n_inner`), a final LayerNorm and the output layer
tied to the token embedding. The projections keep GPT-2's Conv1D layout, weight (in, out) with
y = x W + b, so the converted folder holds the source's tensors byte for byte under their own
names (nothing is transposed). Without a conversion record the logits at i are read from the
output at i - 1 (GPT-2's AR head: the shift, open_weights.py), with full attention.
Configurations GPT-2 releases never ship (cross-attention, unscaled or layer-scaled attention,
other activations) are refused, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import MdlmError
from .block_cache import BlockCall
from .decoder_layers import Heads, attend
from .open_weights import ReleasedBackbone, refuse

CONFIG_FILE = "gpt2_config.json"  # the folder's config.json, beside an mdlm checkpoint's weights
MODEL_TYPE = "mdlm-gpt2"  # not transformers' "gpt2": the folder is a diffusion model now
# key -> the value the native backbone implements (GPT-2's own); an absent key passes
REQUIRED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
            "add_cross_attention": False}
# activation_function -> torch's GELU approximation ("tanh": gelu_new, GPT-2's own)
ACTIVATIONS = {"gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "gelu_fast": "tanh",
               "gelu": "none"}


@dataclass(frozen=True)
class GPT2Shape:
    """What a GPT-2 config.json says of the network (its own key names in comments)."""

    hidden_size: int  # n_embd
    n_heads: int  # n_head
    n_layers: int  # n_layer
    inner: int  # n_inner (None: 4 * n_embd)
    vocab_rows: int  # vocab_size
    max_length: int  # n_positions
    eps: float  # layer_norm_epsilon
    approximate: str  # activation_function, as torch's GELU names it
    tied: bool  # tie_word_embeddings
    dropout: tuple[float, float, float]  # embd_pdrop, attn_pdrop, resid_pdrop

    @classmethod
    def read(cls, raw: dict, name: str) -> GPT2Shape:
        for key, wanted in REQUIRED.items():
            if raw.get(key, wanted) != wanted:
                raise refuse(name, key, raw[key], f"GPT-2 has {wanted!r}")
        act = raw.get("activation_function", "gelu_new")
        if act not in ACTIVATIONS:
            raise refuse(name, "activation_function", act, f"one of {', '.join(ACTIVATIONS)}")
        d = int(raw["n_embd"])
        return cls(
            hidden_size=d, n_heads=int(raw["n_head"]), n_layers=int(raw["n_layer"]),
            inner=int(raw.get("n_inner") or 4 * d), vocab_rows=int(raw["vocab_size"]),
            max_length=int(raw.get("n_positions", 1024)),
            eps=float(raw.get("layer_norm_epsilon", 1e-5)), approximate=ACTIVATIONS[act],
            tied=bool(raw.get("tie_word_embeddings", True)),
            dropout=tuple(float(raw.get(k, 0.1)) for k in ("embd_pdrop", "attn_pdrop",
                                                          "resid_pdrop")))


def read_shape(raw: dict, name: str) -> GPT2Shape:
    try:
        return GPT2Shape.read(raw, name)
    except (KeyError, TypeError, ValueError) as e:
        raise MdlmError(f"{name}: config.json is not a GPT-2 config ({type(e).__name__}: {e})"
                        ) from None


def Conv1D(n_in: int, n_out: int) -> nn.Module:  # noqa: N802 - GPT-2's own name for it
    """GPT-2's projection: weight (in, out), y = x W + b (a Linear with its weight transposed).
    transformers' own class, so that peft adapts it (LoRA with fan_in_fan_out)."""
    from transformers.pytorch_utils import Conv1D as HFConv1D

    return HFConv1D(n_out, n_in)  # its arguments are (nf = out, nx = in)


class GPT2Attention(nn.Module):
    """attn: c_attn (q, k, v side by side), c_proj; no rotary (positions are learned)."""

    def __init__(self, s: GPT2Shape):
        super().__init__()
        self.shape = s
        self.heads = Heads(s.n_heads, s.n_heads)
        self.c_attn = Conv1D(s.hidden_size, 3 * s.hidden_size)
        self.c_proj = Conv1D(s.hidden_size, s.hidden_size)

    def forward(self, h: Tensor, keys: Tensor | None,
                block_call: tuple[BlockCall, int] | None = None) -> Tensor:
        q, k, v = self.c_attn(h).split(self.shape.hidden_size, dim=-1)
        att = attend(q, k, v, self.heads, rotary=None, keys=keys,
                     dropout=self.shape.dropout[1] if self.training else 0.0,
                     block_call=block_call)
        return self.c_proj(att)


class GPT2MLP(nn.Module):
    def __init__(self, s: GPT2Shape):
        super().__init__()
        self.c_fc = Conv1D(s.hidden_size, s.inner)
        self.c_proj = Conv1D(s.inner, s.hidden_size)
        self.approximate = s.approximate

    def forward(self, h: Tensor) -> Tensor:
        return self.c_proj(nn.functional.gelu(self.c_fc(h), approximate=self.approximate))


class GPT2Block(nn.Module):
    """transformer.h.N: x + attn(ln_1(x)), then x + mlp(ln_2(x)), dropout on both branches."""

    def __init__(self, s: GPT2Shape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(s.hidden_size, eps=s.eps)
        self.attn = GPT2Attention(s)
        self.ln_2 = nn.LayerNorm(s.hidden_size, eps=s.eps)
        self.mlp = GPT2MLP(s)
        self.drop = nn.Dropout(s.dropout[2])

    def forward(self, x: Tensor, keys: Tensor | None,
                block_call: tuple[BlockCall, int] | None = None) -> Tensor:
        x = x + self.drop(self.attn(self.ln_1(x), keys, block_call))
        return x + self.drop(self.mlp(self.ln_2(x)))


class GPT2Transformer(nn.Module):
    """GPT2LMHeadModel's `transformer` module: wte, wpe, h, ln_f."""

    def __init__(self, s: GPT2Shape):
        super().__init__()
        self.wte = nn.Embedding(s.vocab_rows, s.hidden_size)
        self.wpe = nn.Embedding(s.max_length, s.hidden_size)
        self.h = nn.ModuleList(GPT2Block(s) for _ in range(s.n_layers))
        self.ln_f = nn.LayerNorm(s.hidden_size, eps=s.eps)


class GPT2(ReleasedBackbone):
    """`GPT2(cfg, vocab_size)(tokens (B, L), None, attention_mask=, output_mask=) -> logits`,
    the logits of position i read from the output at i - 1 (GPT-2's shift) unless the folder's
    conversion record turned it off.

    Built from `cfg.hf_model`'s folder for training (float32 weights); `from_folder` keeps the
    checkpoint's dtype for inference; `from_checkpoint` rebuilds an mdlm run's model.
    """

    family, title, config_file = "gpt2", "GPT-2", CONFIG_FILE
    model_type = MODEL_TYPE
    sampling_defaults: dict = {}  # no released diffusion GPT-2 to follow: mdlm's own defaults
    answer_tokens = None  # the rest of the window (models/protocols.py)
    # LoRA's defaults (models/lora.py): the blocks' Conv1D projections, whose (in, out) weights
    # peft adapts with fan_in_fan_out
    lora_targets = ("c_attn", "c_proj", "c_fc")
    lora_whole = ("wte", "wpe")
    lora_fan_in_fan_out = True
    read_shape = staticmethod(read_shape)
    default_shift = True  # GPT-2's head predicts the next token

    def build_network(self) -> None:
        self.transformer = GPT2Transformer(self.config)  # GPT-2's names: transformer.*
        if not self.config.tied:
            self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_rows, bias=False)

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.h)

    def hidden_states(self, tokens: Tensor, attention_mask: Tensor | None,
                      call: BlockCall | None = None, positions: Tensor | None = None) -> Tensor:
        """ln_f of the last block's output (B, L, H), unshifted; with a block `call`, of the
        positions [call.start, call.start + n) that `tokens` (B, n) hold; with `positions`
        (L,), at those (the learned embedding of each token's own position)."""
        t, s = self.transformer, self.config
        start = 0 if call is None else call.start
        end = start + tokens.shape[1]
        if positions is None:
            positions = torch.arange(start, end, device=tokens.device)
        elif positions.numel():
            end = int(positions.max()) + 1
        if end > s.max_length:
            raise MdlmError(f"{end} positions exceed GPT-2's learned "
                            f"{s.max_length}; use rows of at most {s.max_length} tokens")
        x = t.wte(tokens) + t.wpe(positions)[None]  # (B, L, H)
        x = nn.functional.dropout(x, s.dropout[0], self.training)
        keys = self.attention_keys(attention_mask, tokens.shape[1], tokens.device)
        for i, block in enumerate(t.h):
            x = block(x, keys, None if call is None else (call, i))
        return t.ln_f(x)

    def _head(self, h: Tensor) -> Tensor:
        weight = self.transformer.wte.weight if self.config.tied else self.lm_head.weight
        return nn.functional.linear(h, weight)[..., : self.vocab_size].float()

