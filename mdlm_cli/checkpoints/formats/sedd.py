"""SEDD's published format (louaaron/Score-Entropy-Discrete-Diffusion; hub ids such as
`louaaron/sedd-small`): a config.json holding SEDD's Hydra config (`tokens`, `graph`,
`noise`, `model`), written by `PyTorchModelHubMixin` (at the top level, or under "config"),
and the weights of its `SEDD` module under bare names.

SEDD's DiT is the module tree mdlm's DiT copies (`vocab_embed.embedding`, `sigma_map.mlp`,
`rotary_emb.inv_freq`, `blocks[i]...`, `output_layer...`), so the weights load as they are;
its `scale_by_sigma` output and the zeroed observed-token entry are the sedd objective's
parameterisation (`engine.sedd.sedd_log_score`). Its absorbing state (the mask) is the last
id, `tokens`, so the model vocabulary is `tokens + 1`.
"""

from __future__ import annotations

from ...data.tokenizers import TOKENIZERS
from ...errors import MdlmError
from ..folder import LoadedModel
from .assemble import load_dit_folder
from .base import Format, Found, Partial
from .reference import noise_schedule, number, read_fields

# SEDD's model fields -> mdlm's config (section, key, type), as reference.HF_FIELDS
MODEL_FIELDS = {
    "hidden_size": ("model", "hidden_size", int),
    "n_blocks": ("model", "n_blocks", int),
    "n_heads": ("model", "n_heads", int),
    "cond_dim": ("model", "cond_dim", int),
    "dropout": ("model", "dropout", float),
    "length": ("data", "length", int),
}
# SEDD's noise.type -> mdlm's schedule
SCHEDULES = {"loglinear": "loglinear", "geometric": "geometric"}


def sedd_config(raw: dict) -> dict | None:
    """SEDD's Hydra config inside a config.json, or None if it is not one."""
    for candidate in (raw, raw.get("config")):
        if (
            isinstance(candidate, dict)
            and isinstance(candidate.get("graph"), dict)
            and "tokens" in candidate
        ):
            return candidate
    return None


def partial_from_sedd_config(config: dict, source) -> Partial:
    """mdlm's partial config (reference_format's layout) for a SEDD absorbing-graph model."""
    graph = config["graph"].get("type")
    if graph != "absorb":
        raise MdlmError(
            f"{source} is a SEDD model with the {graph!r} graph; mdlm implements SEDD's "
            "absorbing graph"
        )
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    if model.get("type", "ddit") != "ddit":
        raise MdlmError(
            f"{source} holds a SEDD {model.get('type')!r} network; mdlm loads its DiT (ddit)"
        )
    if not number(model.get("scale_by_sigma", True), bool, "model.scale_by_sigma", source):
        raise MdlmError(
            f"{source} was trained without scale_by_sigma, a different score parameterisation "
            "than SEDD's published models (and mdlm's sedd objective)"
        )
    tokens = number(config["tokens"], int, "tokens", source)
    partial = Partial(vocab_size=tokens + 1, mask_id=tokens)
    read_fields(partial, model, MODEL_FIELDS, source, prefix="model.")
    partial.model["time_conditioning"] = True
    noise = config.get("noise") or {}
    schedule = noise_schedule(noise, SCHEDULES, source, default="loglinear")
    partial.diffusion.update(objective="sedd", schedule=schedule)
    gpt2 = TOKENIZERS["gpt2"]
    if tokens + 1 == gpt2.vocab_size:  # GPT-2's vocabulary: SEDD's published OpenWebText models
        run = gpt2.reference
        partial.data.update(tokenizer=gpt2.name, dataset=run.dataset, packing=run.packing)
    return partial


def detect(found: Found) -> bool:
    return found.config is not None and sedd_config(found.config) is not None


def load(found: Found, *, ema: bool, device) -> LoadedModel:
    partial = partial_from_sedd_config(sedd_config(found.config), found.path / "config.json")
    return load_dit_folder(found, partial, device=device)


FORMAT = Format(detect, load, "SEDD's hub format (its Hydra config with tokens and graph)")
