"""Tiny random LLaDA and Dream folders in their releases' exact layout, for the tests: config.json
with the released key set (auto_map included), two safetensors shards and
model.safetensors.index.json under the released weight names, tokenizer.json (a word-level
tokeniser built with `tokenizers`, its special tokens at the ids the config names),
tokenizer_config.json with a chat template, special_tokens_map.json, generation_config.json,
and modelling / tokenisation files that raise if anything imports them."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

WORDS = [f"w{i}" for i in range(79)]  # ids 1..79 (0 is [UNK]); the specials follow from 80
ROWS = 96  # embedding rows: more than the tokeniser's 80 + specials, as in both releases
RAISES = "raise ImportError('{name} of the model folder was imported: mdlm must never run it')\n"

LLADA_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>", "<|mdm_mask|>"]  # ids 80..85
DREAM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]  # ids 80..83
LLADA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                  "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
                  "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
                  "\n\n{% endif %}")
DREAM_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                  "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                  "{% endif %}")


def llada_config(dtype: str = "float32", d_model: int = 32, n_layers: int = 2,
                 rows: int = ROWS, n_heads: int = 4, mlp_hidden: int | None = None,
                 window: int = 64) -> dict:
    """LLaDA-8B-Instruct's config.json key for key, at a tiny size."""
    return {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
        "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0,
        "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM",
                     "AutoModel": "modeling_llada.LLaDAModelLM"},
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama",
        "d_model": d_model, "embedding_dropout": 0.0, "embedding_size": rows,
        "eos_token_id": 81, "flash_attention": False, "include_bias": False,
        "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
        "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False,
        "layer_norm_type": "rms", "layer_norm_with_affine": True, "mask_token_id": 85,
        "max_sequence_length": window, "mlp_hidden_size": mlp_hidden or d_model * 3 // 2,
        "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None,
        "n_heads": n_heads, "n_kv_heads": n_heads,
        "n_layers": n_layers, "pad_token_id": 81, "precision": "amp_bf16",
        "residual_dropout": 0.0, "rms_norm_eps": 1e-05, "rope": True,
        "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
        "torch_dtype": dtype, "transformers_version": "4.46.3", "use_cache": False,
        "vocab_size": rows, "weight_tying": False,
    }


def dream_config(dtype: str = "float32") -> dict:
    """Dream-v0-Instruct-7B's config.json key for key, at a tiny size (grouped-query: 4 / 2)."""
    return {
        "architectures": ["DreamModel"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
        "bos_token_id": 80, "eos_token_id": 80, "hidden_act": "silu", "hidden_size": 32,
        "initializer_range": 0.02, "intermediate_size": 48, "mask_token_id": 83,
        "max_position_embeddings": 64, "max_window_layers": 2, "model_type": "Dream",
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "pad_token_id": 80, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": dtype, "transformers_version": "4.46.2", "use_cache": True,
        "use_sliding_window": False, "vocab_size": ROWS,
    }


def llada_weights(c: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    d, hidden, rows = c["d_model"], c["mlp_hidden_size"], c["embedding_size"]
    kv = c["n_kv_heads"] * d // c["n_heads"]
    w = {"model.transformer.wte.weight": (rows, d), "model.transformer.ln_f.weight": (d,),
         "model.transformer.ff_out.weight": (rows, d)}
    for i in range(c["n_layers"]):
        b = f"model.transformer.blocks.{i}."
        w.update({b + "attn_norm.weight": (d,), b + "q_proj.weight": (d, d),
                  b + "k_proj.weight": (kv, d), b + "v_proj.weight": (kv, d),
                  b + "attn_out.weight": (d, d), b + "ff_norm.weight": (d,),
                  b + "ff_proj.weight": (hidden, d), b + "up_proj.weight": (hidden, d),
                  b + "ff_out.weight": (d, hidden)})
    return random_tensors(w, gen)


def dream_weights(c: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    d, hidden, rows = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    kv = c["num_key_value_heads"] * d // c["num_attention_heads"]
    w = {"model.embed_tokens.weight": (rows, d), "model.norm.weight": (d,),
         "lm_head.weight": (rows, d)}
    for i in range(c["num_hidden_layers"]):
        b = f"model.layers.{i}."
        w.update({b + "input_layernorm.weight": (d,), b + "post_attention_layernorm.weight": (d,),
                  b + "self_attn.q_proj.weight": (d, d), b + "self_attn.q_proj.bias": (d,),
                  b + "self_attn.k_proj.weight": (kv, d), b + "self_attn.k_proj.bias": (kv,),
                  b + "self_attn.v_proj.weight": (kv, d), b + "self_attn.v_proj.bias": (kv,),
                  b + "self_attn.o_proj.weight": (d, d), b + "mlp.gate_proj.weight": (hidden, d),
                  b + "mlp.up_proj.weight": (hidden, d), b + "mlp.down_proj.weight": (d, hidden)})
    return random_tensors(w, gen)


def random_tensors(shapes: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Norm weights near 1, the rest N(0, 0.2^2): logits far from uniform."""
    out = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen)
        out[name] = 1 + 0.1 * noise if "norm" in name else 0.2 * noise
    return out


def write_shards(folder: Path, weights: dict[str, torch.Tensor], dtype: torch.dtype,
                 shards: int = 2) -> None:
    """`shards` safetensors files and the index that maps each tensor to its file."""
    names = sorted(weights)
    per = -(-len(names) // shards)
    weight_map, total = {}, 0
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n].to(dtype).contiguous() for n in names[i * per:(i + 1) * per]}
        save_file(part, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
        total += sum(t.numel() * t.element_size() for t in part.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tokenizer(folder: Path, specials: list[str], settings: dict) -> None:
    """tokenizer.json (word level, specials from id 80), tokenizer_config.json, the special
    tokens map."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(WORDS)}}
    raw = RawTokenizer(WordLevel(vocab, unk_token="[UNK]"))
    raw.pre_tokenizer = WhitespaceSplit()
    raw.add_special_tokens([AddedToken(s, special=True) for s in specials])
    raw.save(str(folder / "tokenizer.json"))
    decoder = {str(raw.token_to_id(s)): {"content": s, "special": True} for s in specials}
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**settings, "added_tokens_decoder": decoder}, indent=2))
    tokens = {k: v for k, v in settings.items() if k.endswith("_token")}
    (folder / "special_tokens_map.json").write_text(json.dumps(tokens, indent=2))


def write_llada(folder: Path, *, dtype: torch.dtype = torch.float32, seed: int = 0,
                **sizes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = llada_config(str(dtype).removeprefix("torch."), **sizes)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_shards(folder, llada_weights(config, torch.Generator().manual_seed(seed)), dtype)
    write_tokenizer(folder, LLADA_SPECIALS, {
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "chat_template": LLADA_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64})
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 80, "eos_token_id": 81, "pad_token_id": 81}))
    for name in ("modeling_llada.py", "configuration_llada.py"):
        (folder / name).write_text(RAISES.format(name=name))
    return folder


def write_dream(folder: Path, *, dtype: torch.dtype = torch.float32, seed: int = 0) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = dream_config(str(dtype).removeprefix("torch."))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    write_shards(folder, dream_weights(config, torch.Generator().manual_seed(seed)), dtype)
    write_tokenizer(folder, DREAM_SPECIALS, {
        "bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "chat_template": DREAM_TEMPLATE, "tokenizer_class": "DreamTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "model_max_length": 64})
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 80, "eos_token_id": 80, "pad_token_id": 80, "mask_token_id": 83,
         "alg": "entropy", "steps": 512}))
    for name in ("modeling_dream.py", "configuration_dream.py", "tokenization_dream.py",
                 "generation_utils.py"):
        (folder / name).write_text(RAISES.format(name=name))
    return folder
