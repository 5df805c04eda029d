"""Tiny random Hugging Face masked LMs (BERT, DistilBERT, RoBERTa) and a tiny WordPiece
tokenizer, saved as the folders a hub download would give: the hf-mlm backbone's test models."""

from __future__ import annotations

import string
from pathlib import Path

import torch

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ["the", "and", "of", "to", "in", "was", "he", "it", "that", "his", "is", "with", "as", "had"]
VOCAB = (SPECIALS + list(string.ascii_lowercase) + [f"##{c}" for c in string.ascii_lowercase]
         + list(".,;:!?'\"-") + WORDS)  # every lowercase word tokenises, letter by letter at worst
TEXT = ("it was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
        "foolishness, it was the epoch of belief, it was the epoch of incredulity.\n\n")


def tiny_config(arch: str = "bert", vocab: int = len(VOCAB), positions: int = 64):
    from transformers import BertConfig, DistilBertConfig, RobertaConfig

    if arch == "bert":
        return BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=positions, initializer_range=0.2)
    if arch == "distilbert":
        return DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                max_position_embeddings=positions, initializer_range=0.2)
    return RobertaConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=positions + 2, pad_token_id=0,
                         initializer_range=0.2)


def tiny_mlm(arch: str = "bert", **kwargs) -> torch.nn.Module:
    """A randomly initialised masked LM (seed 0; weights 10x the usual scale, so that every
    input visibly changes the output)."""
    from transformers import AutoModelForMaskedLM

    torch.manual_seed(0)
    return AutoModelForMaskedLM.from_config(tiny_config(arch, **kwargs)).eval()


def save_tokenizer(folder: Path) -> Path:
    from transformers import BertTokenizerFast

    raw = folder.parent / f".{folder.name}-vocab"
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    (raw / "tokenizer_config.json").write_text('{"do_lower_case": true}')
    BertTokenizerFast.from_pretrained(raw).save_pretrained(folder)
    return folder


def save_tiny_mlm(folder: Path, arch: str = "bert", *, head: bool = True, **kwargs) -> Path:
    """A model folder (config.json, model.safetensors, tokenizer files); `head=False` saves the
    bare encoder (`BertModel`), as a sentence-embedding model is shipped."""
    from transformers import AutoModel

    if head:
        tiny_mlm(arch, **kwargs).save_pretrained(folder)
    else:
        torch.manual_seed(0)
        AutoModel.from_config(tiny_config(arch, **kwargs)).save_pretrained(folder)
    return save_tokenizer(folder)


def write_corpus(path: Path, repeats: int = 40) -> Path:
    path.write_text(TEXT * repeats)
    return path
