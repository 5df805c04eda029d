"""`mdlm train`'s memory check: a micro-batch the device cannot hold is refused before the
data and the model are set up."""

from __future__ import annotations

from ..data.tokenizers import TOKENIZERS, known_tokenizer


def check_train_memory(cfg) -> None:
    """Refuse, before the data and the model are set up, a micro-batch the device cannot hold:
    the weights, gradients, AdamW state and EMA of the model, built on the meta device (no
    memory), and the activations and logits at data.length."""
    import torch

    from ..memory import check_fits, footprint
    from ..models import BACKBONES, build_model
    from ..objectives import OBJECTIVES
    from ..runtime import pick_device

    if "hidden_size" not in BACKBONES[cfg.model.backbone].config_keys:
        return  # a Hugging Face backbone: its shape is the hub model's, not the config's
    # the estimate needs a vocabulary before any data is prepared: a named tokeniser's, else
    # GPT-2's (a hub tokeniser's size is not known offline)
    known = known_tokenizer(cfg.data.tokenizer) or TOKENIZERS["gpt2"]
    vocab = known.vocab_size
    with torch.device("meta"):
        model = build_model(cfg.model, vocab, causal=OBJECTIVES[cfg.diffusion.objective].causal)
        params = sum(p.numel() for p in model.parameters())
    m, t = cfg.model, cfg.train
    factor = OBJECTIVES[cfg.diffusion.objective].pass_factor  # bd3lm runs x_t ⊕ x_0: 2L
    need = footprint(params=params, hidden=m.hidden_size, n_blocks=m.n_blocks,
                     mlp_ratio=m.mlp_ratio, vocab=vocab, batch=t.micro_batch_size,
                     length=factor * cfg.data.length, training=True)
    what = (f"training at data.length={cfg.data.length} with "
            f"train.micro_batch_size={t.micro_batch_size}")
    check_fits(what, need, pick_device(t.device), "lower data.length or train.micro_batch_size")
