"""Dream (DreamLM: Dream-v0-Base-7B, Dream-v0-Instruct-7B) as a native backbone
(`model.backbone: dream`), read from its released folder without its Python files.

Dream is Qwen2 run without a causal mask: RMSNorm, rotary embeddings at `rope_theta`,
grouped-query attention with q/k/v biases (no bias on o_proj), the SwiGLU MLP, the output layer
`lm_head` (the embedding with `tie_word_embeddings`). Dream was adapted from an autoregressive
model and keeps its shift: the token at position i is predicted by the output at position i - 1
(position 0 by its own), as `diffusion_generate` reads the logits
(`torch.cat([logits[:, :1], logits[:, :-1]], dim=1)`); the denoiser gives exactly that.
Configurations the release never ships (rope scaling, sliding windows, other activations) are
refused, naming the key.
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
CONFIG_FILE = "dream_config.json"
REQUIRED = {"hidden_act": "silu", "rope_scaling": None, "use_sliding_window": False}


@dataclass(frozen=True)
class DreamShape:
    """What a Dream (Qwen2) config.json says of the network."""

    hidden_size: int
    intermediate_size: int
    n_heads: int  # num_attention_heads
    n_kv_heads: int  # num_key_value_heads
    n_layers: int  # num_hidden_layers
    vocab_rows: int  # vocab_size
    rope_theta: float
    eps: float  # rms_norm_eps
    tied: bool  # tie_word_embeddings
    attention_dropout: float
    max_length: int  # max_position_embeddings

    @property
    def mlp_ratio(self) -> int:
        return math.ceil(self.intermediate_size / self.hidden_size)

    @classmethod
    def read(cls, raw: dict, name: str) -> DreamShape:
        for key, wanted in REQUIRED.items():
            if raw.get(key, wanted) != wanted:
                raise refuse(name, key, raw[key], f"the released models have {wanted!r}")
        heads = int(raw["num_attention_heads"])
        return cls(
            hidden_size=int(raw["hidden_size"]), intermediate_size=int(raw["intermediate_size"]),
            n_heads=heads, n_kv_heads=int(raw.get("num_key_value_heads") or heads),
            n_layers=int(raw["num_hidden_layers"]), vocab_rows=int(raw["vocab_size"]),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            eps=float(raw.get("rms_norm_eps", 1e-6)),
            tied=bool(raw.get("tie_word_embeddings", False)),
            attention_dropout=float(raw.get("attention_dropout", 0.0)),
            max_length=int(raw.get("max_position_embeddings", 32768)))


def read_shape(raw: dict, name: str) -> DreamShape:
    try:
        return DreamShape.read(raw, name)
    except (KeyError, TypeError, ValueError) as e:
        raise MdlmError(f"{name}: config.json is not a Dream config ({type(e).__name__}: {e})"
                        ) from None


class DreamAttention(nn.Module):
    """self_attn: q/k/v projections with biases, o_proj without."""

    def __init__(self, s: DreamShape):
        super().__init__()
        self.shape = s
        self.heads = Heads(s.n_heads, s.n_kv_heads, full_precision_rotary=False)
        kv = s.n_kv_heads * (s.hidden_size // s.n_heads)
        self.q_proj = nn.Linear(s.hidden_size, s.hidden_size, bias=True)
        self.k_proj = nn.Linear(s.hidden_size, kv, bias=True)
        self.v_proj = nn.Linear(s.hidden_size, kv, bias=True)
        self.o_proj = nn.Linear(s.hidden_size, s.hidden_size, bias=False)

    def forward(self, h: Tensor, rotary: tuple[Tensor, Tensor], keys: Tensor | None,
                block_call: tuple[BlockCall, int] | None = None) -> Tensor:
        s = self.shape
        att = attend(self.q_proj(h), self.k_proj(h), self.v_proj(h), self.heads, rotary=rotary,
                     keys=keys, dropout=s.attention_dropout if self.training else 0.0,
                     block_call=block_call)
        return self.o_proj(att)


class DreamMLP(nn.Module):
    def __init__(self, s: DreamShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, h: Tensor) -> Tensor:
        return swiglu(h, self.gate_proj, self.up_proj, self.down_proj)


class DreamLayer(nn.Module):
    """model.layers.N: pre-norm attention and MLP, each added to the residual stream."""

    def __init__(self, s: DreamShape):
        super().__init__()
        self.input_layernorm = RMSNorm(s.hidden_size, s.eps)
        self.self_attn = DreamAttention(s)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.eps)
        self.mlp = DreamMLP(s)

    def forward(self, x: Tensor, rotary: tuple[Tensor, Tensor], keys: Tensor | None,
                block_call: tuple[BlockCall, int] | None = None) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, keys, block_call)
        return x + self.mlp(self.post_attention_layernorm(x))


class DreamDecoder(nn.Module):
    """The release's `model` module: embed_tokens, layers, norm."""

    def __init__(self, s: DreamShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_rows, s.hidden_size)
        self.layers = nn.ModuleList(DreamLayer(s) for _ in range(s.n_layers))
        self.norm = RMSNorm(s.hidden_size, s.eps)


class Dream(ReleasedBackbone):
    """`Dream(cfg, vocab_size)(tokens (B, L), None, attention_mask=, output_mask=) -> logits`,
    the logits of position i being the network's output at i - 1 (Dream's shift).

    Built from `cfg.hf_model`'s folder for training (float32 weights); `from_folder` keeps the
    checkpoint's dtype (bf16) for inference; `from_checkpoint` rebuilds an mdlm run's model.
    """

    family, title, config_file = "dream", "Dream", CONFIG_FILE
    model_type = "Dream"  # config.json's model_type of the released folders
    # what the samplers default to for this family (its own transfer schedule)
    # top_k 50: Dream's diffusion_generate, under the transformers 4.46 it pins, builds its
    # generation config from the model config, whose inherited default top_k is 50, and its
    # sample_tokens applies it before any confidence is computed
    # and its evaluation's scoring conventions (eval/eval.py: a clean EOS after the target, the
    # tokeniser's BOS text before the context)
    sampling_defaults = {"k_schedule": "dream", "top_k": 50, "append_eos": True,
                         "tokenizer_bos": True}
    answer_tokens = 512  # the max_new_tokens of the release's README and demos
    # LoRA's defaults (models/lora.py): every linear layer of a decoder layer
    lora_targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    lora_whole = ("embed_tokens", "lm_head")
    read_shape = staticmethod(read_shape)
    # logits at i read from the output at i - 1 (`shifted_logits`, engine/protocols.py): a block
    # cache's sliced call cannot give its first position's, so the block samplers follow
    # Fast-dLLM's Dream loop; a Qwen2 converted by `mdlm convert` keeps it too
    default_shift = shift_fixed = True

    def build_network(self) -> None:
        self.model = DreamDecoder(self.config)  # the release's names: model.*, lm_head.*
        if not self.config.tied:
            self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_rows, bias=False)

    @property
    def blocks(self) -> list[nn.Module]:
        return list(self.model.layers)

    def hidden_states(self, tokens: Tensor, attention_mask: Tensor | None,
                      call: BlockCall | None = None, positions: Tensor | None = None) -> Tensor:
        """The final norm's output (B, L, H), unshifted; with a block `call`, of the positions
        [call.start, call.start + n) that `tokens` (B, n) hold, at their absolute rotary angles;
        with `positions` (L,), at those."""
        s, decoder = self.config, self.model
        x = decoder.embed_tokens(tokens)
        rotary = position_angles(tokens, 0 if call is None else call.start, positions,
                                 s.hidden_size // s.n_heads, s.rope_theta)
        keys = self.attention_keys(attention_mask, tokens.shape[1], tokens.device)
        for i, layer in enumerate(decoder.layers):
            x = self.run_block(layer, x, rotary, keys, None if call is None else (call, i))
        return decoder.norm(x)

    def _head(self, h: Tensor) -> Tensor:
        """The output layer. Each position's logits come from the states one to its left, as
        Dream's generation reads them (`read_positions`, before this). A cached call's slice is
        shifted within itself, as Fast-dLLM's modeling_dream.py: the slice's first position
        reads its own output (Fast-dLLM's loop decides that position from the full pass:
        engine/dream_blocks.py)."""
        weight = self.model.embed_tokens.weight if self.config.tied else self.lm_head.weight
        return nn.functional.linear(h, weight)[..., : self.vocab_size].float()

