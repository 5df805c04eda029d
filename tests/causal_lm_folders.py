"""Tiny random Hugging Face causal LMs (LLaMA, Qwen2, GPT-2) that transformers builds offline,
saved with `save_pretrained` beside a word-level tokenizer (open_model_folders.write_tokenizer):
the sources of `mdlm convert`'s tests. Weights at 10x the usual scale, so logits are far from
uniform and a wrong mapping shows."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .open_model_folders import write_tokenizer

# arch -> (special tokens from id 80, tokenizer_config.json's settings, embedding rows)
TOKENS = {
    "llama": (["<s>", "</s>"], {"bos_token": "<s>", "eos_token": "</s>"}, 82),  # no spare row
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
              {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}, 96),  # spare rows
    "gpt2": (["<|endoftext|>"], {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"},
             81),  # no spare row, as GPT-2's own
}
ARCHS = tuple(TOKENS)


def tiny_config(arch: str, rows: int):
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    if arch == "gpt2":
        return GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=rows, n_positions=64,
                          bos_token_id=80, eos_token_id=80, initializer_range=0.2)
    shape = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": rows,
             "max_position_embeddings": 64, "initializer_range": 0.2, "eos_token_id": 81}
    if arch == "llama":
        return LlamaConfig(**shape, bos_token_id=80, rope_theta=500000.0)
    return Qwen2Config(**{**shape, "eos_token_id": 80}, rope_theta=1000000.0)


def tiny_causal_lm(arch: str, seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, TOKENS[arch][2]))
    with torch.no_grad():  # norms near 1 (their init is exactly 1: a mapping error could hide)
        for name, p in model.named_parameters():
            if "norm" in name or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def write_causal_lm(folder: Path, arch: str, seed: int = 0) -> Path:
    """A tiny random `arch` model and its tokenizer, as a hub download would give them."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_causal_lm(arch, seed).save_pretrained(folder)
    specials, settings, _ = TOKENS[arch]
    write_tokenizer(folder, specials, {**settings, "tokenizer_class": "PreTrainedTokenizerFast",
                                       "model_max_length": 64})
    return folder


def write_encoder(folder: Path) -> Path:
    """A tiny BERT masked LM folder (an encoder: nothing to convert)."""
    from transformers import BertConfig, BertForMaskedLM

    folder.mkdir(parents=True, exist_ok=True)
    BertForMaskedLM(BertConfig(vocab_size=90, hidden_size=32, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=64)).save_pretrained(folder)
    return folder


def edit_config(folder: Path, **changes) -> Path:
    """config.json with keys set (a value None removes the key)."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return folder


def write_ar_run(run: Path, seed: int = 0) -> Path:
    """An mdlm AR run (the `test` preset's 2x64 DiT, objective ar, character tokens) of random
    weights, every one of them nonzero (the DiT zero-initialises its output layer)."""
    from mdlm_cli.build import resolve_config
    from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.models import build_model

    cfg = resolve_config("test", ["diffusion.objective=ar"])
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    model = build_model(cfg.model, tokenizer.vocab_size, causal=True)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen) + (1 if p.dim() == 1 else 0))
    data_meta = {"length": cfg.data.length, "packing": cfg.data.packing,
                 "tokenizer": tokenizer.describe(), "source": {"name": cfg.data.dataset}}
    save_checkpoint(run, 1, CheckpointContents(model.eval(), cfg, {"step": 1}, tokenizer,
                                               data_meta))
    return run
