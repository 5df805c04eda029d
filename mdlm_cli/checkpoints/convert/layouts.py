"""How each causal-LM architecture maps onto an mdlm backbone: the target family's config.json
from the source's, and each source weight's name in the target's layout (the state-dict
adapters, one per source). `LAYOUTS` is keyed by config.json's `architectures` entry.

- LlamaForCausalLM -> llada (models/llada.py): the same network under LLaDA's names
  (embed_tokens -> transformer.wte, o_proj -> attn_out, gate_proj -> ff_proj, down_proj ->
  ff_out, lm_head -> transformer.ff_out, ...) and a LLaDA-layout config.json.
- Qwen2ForCausalLM -> dream (models/dream.py): Dream is Qwen2 with the shift, names and config
  keys alike; only model_type and the mask id change.
- GPT2LMHeadModel -> gpt2 (models/gpt2.py): GPT-2's own names and Conv1D tensors, kept (the
  buffers of its causal mask are dropped, and the head, tied to the embedding).

What the target cannot run is refused here, naming the key (rope scaling, biases the target has
no place for, other activations), so nothing is written that would not load.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ...errors import MdlmError
from ...models.gpt2 import MODEL_TYPE as GPT2_MODEL_TYPE


@dataclass(frozen=True)
class Layout:
    """One source architecture's mapping: the target backbone (models.BACKBONES), the target's
    config.json from the source's (`family_config(raw, label)`, without the special ids), the
    target name of each source tensor (`rename`: None drops it), the target names of the token
    embedding and of an untied head, and the target config keys that hold the embedding rows."""

    architecture: str
    backbone: str
    family_config: Callable[[dict, str], dict]
    rename: Callable[[str], str | None]
    embedding: str
    head: str
    rows_keys: tuple[str, ...]


def refuse(label: str, key: str, value, why: str) -> MdlmError:
    return MdlmError(f"{label}: config.json has {key}={value!r}, which mdlm convert cannot map "
                     f"({why})")


def rope_theta(raw: dict, label: str) -> float:
    """The rotary base, from transformers 4's `rope_theta` or 5's `rope_parameters`; scaled
    rotary embeddings (YaRN, LLaMA-3's) are refused: the targets rotate plainly."""
    params = raw.get("rope_parameters") or {}
    kind = params.get("rope_type", "default")
    if raw.get("rope_scaling") or kind != "default":
        raise refuse(label, "rope_scaling", raw.get("rope_scaling") or kind,
                     "the target rotates without scaling")
    return float(raw.get("rope_theta") or params.get("rope_theta") or 10000.0)


def check_heads(raw: dict, label: str) -> None:
    """A head_dim other than hidden / heads has no place in the targets' configs."""
    heads = int(raw["num_attention_heads"])
    if raw.get("head_dim") not in (None, int(raw["hidden_size"]) // heads):
        raise refuse(label, "head_dim", raw["head_dim"], "the targets use hidden_size / heads")
    if raw.get("hidden_act", "silu") != "silu":
        raise refuse(label, "hidden_act", raw["hidden_act"], "the target's MLP is SwiGLU")


def llama_config(raw: dict, label: str) -> dict:
    """A LLaDA-layout config.json (the keys models/llada.py reads) of a LLaMA config."""
    check_heads(raw, label)
    for key in ("attention_bias", "mlp_bias"):
        if raw.get(key):
            raise refuse(label, key, raw[key], "LLaDA's output and MLP projections have no bias")
    rows = int(raw["vocab_size"])
    return {
        "model_type": "llada", "architectures": ["LLaDAModelLM"], "block_type": "llama",
        "d_model": int(raw["hidden_size"]), "n_heads": int(raw["num_attention_heads"]),
        "n_kv_heads": int(raw.get("num_key_value_heads") or raw["num_attention_heads"]),
        "n_layers": int(raw["num_hidden_layers"]),
        "mlp_hidden_size": int(raw["intermediate_size"]), "embedding_size": rows,
        "vocab_size": rows, "rope": True, "rope_theta": rope_theta(raw, label),
        "rope_full_precision": True, "rms_norm_eps": float(raw.get("rms_norm_eps", 1e-6)),
        "layer_norm_type": "rms", "activation_type": "silu", "alibi": False,
        "include_bias": False, "include_qkv_bias": False,
        "weight_tying": bool(raw.get("tie_word_embeddings", False)),
        "attention_dropout": float(raw.get("attention_dropout", 0.0)),
        "max_sequence_length": int(raw.get("max_position_embeddings", 4096)),
        "torch_dtype": raw.get("torch_dtype") or raw.get("dtype") or "float32",
    }


def qwen2_config(raw: dict, label: str) -> dict:
    """A Dream config.json: Qwen2's own keys, its rotary base spelt as Dream reads it."""
    check_heads(raw, label)
    if raw.get("use_sliding_window"):
        raise refuse(label, "use_sliding_window", True, "Dream attends the whole row")
    out = {k: v for k, v in raw.items() if k not in ("architectures", "rope_parameters")}
    out.update({"model_type": "Dream", "architectures": ["DreamModel"],
                "rope_theta": rope_theta(raw, label), "rope_scaling": None})
    return out


def gpt2_config(raw: dict, label: str) -> dict:
    """GPT-2's own config.json under mdlm's model_type (models/gpt2.py refuses what it lacks)."""
    out = {k: v for k, v in raw.items() if k != "architectures"}
    out["model_type"] = GPT2_MODEL_TYPE
    return out


LLAMA_NAMES = [(re.compile(a), b) for a, b in (
    (r"^model\.embed_tokens\.", "model.transformer.wte."),
    (r"^model\.norm\.", "model.transformer.ln_f."),
    (r"^lm_head\.", "model.transformer.ff_out."),
    (r"^model\.layers\.(\d+)\.input_layernorm\.", r"model.transformer.blocks.\1.attn_norm."),
    (r"^model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.",
     r"model.transformer.blocks.\1.\2_proj."),
    (r"^model\.layers\.(\d+)\.self_attn\.o_proj\.", r"model.transformer.blocks.\1.attn_out."),
    (r"^model\.layers\.(\d+)\.post_attention_layernorm\.",
     r"model.transformer.blocks.\1.ff_norm."),
    (r"^model\.layers\.(\d+)\.mlp\.gate_proj\.", r"model.transformer.blocks.\1.ff_proj."),
    (r"^model\.layers\.(\d+)\.mlp\.up_proj\.", r"model.transformer.blocks.\1.up_proj."),
    (r"^model\.layers\.(\d+)\.mlp\.down_proj\.", r"model.transformer.blocks.\1.ff_out."),
)]


def llama_name(name: str) -> str | None:
    """LLaDA's name of a LLaMA tensor (a name it does not know is kept: the target's key check
    then names it)."""
    if name.endswith("rotary_emb.inv_freq"):  # a buffer older checkpoints saved
        return None
    for pattern, replacement in LLAMA_NAMES:
        if pattern.match(name):
            return pattern.sub(replacement, name, count=1)
    return name


def qwen2_name(name: str) -> str | None:
    return None if name.endswith("rotary_emb.inv_freq") else name


# its causal mask, saved by old versions
GPT2_BUFFERS = re.compile(r"\.attn\.(bias|masked_bias)$")


def gpt2_name(name: str) -> str | None:
    """GPT-2's own name under `transformer.` (the original checkpoints omit that prefix)."""
    if GPT2_BUFFERS.search(name):
        return None
    if name.startswith(("transformer.", "lm_head.")):
        return name
    return f"transformer.{name}"


LAYOUTS: dict[str, Layout] = {
    "LlamaForCausalLM": Layout("LlamaForCausalLM", "llada", llama_config, llama_name,
                               "model.transformer.wte.weight", "model.transformer.ff_out.weight",
                               ("embedding_size", "vocab_size")),
    "Qwen2ForCausalLM": Layout("Qwen2ForCausalLM", "dream", qwen2_config, qwen2_name,
                               "model.embed_tokens.weight", "lm_head.weight", ("vocab_size",)),
    "GPT2LMHeadModel": Layout("GPT2LMHeadModel", "gpt2", gpt2_config, gpt2_name,
                              "transformer.wte.weight", "lm_head.weight", ("vocab_size",)),
}


def supported() -> str:
    """'LlamaForCausalLM (onto llada), ...': what the refusals name."""
    return ", ".join(f"{a} (onto {lay.backbone})" for a, lay in LAYOUTS.items())
