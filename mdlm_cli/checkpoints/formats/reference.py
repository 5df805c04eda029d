"""The reference implementation's formats (kuleshov-group/mdlm), both ways: the one adapter.

Import: its weights are keyed `backbone.*` (the Lightning module and its Hugging Face `MDLM`
class), `backbone.backbone.*` (a Lightning module around the HF model) or bare, and carry a
rotary table `rotary_emb.inv_freq` that mdlm recomputes. Its hyper-parameters live in the
HF `MDLMConfig` fields of a config.json or in the Hydra config of a Lightning checkpoint.
Export: the same names and fields. mdlm's DiT has the reference's module tree
(models/dit.py), so the key mapping is a prefix.

Hyper-parameters are read into a *partial config* (base.Partial): mdlm's own config layout
(model, data, diffusion, plus vocab_size) holding only what the checkpoint records; the rest
comes from the weight shapes or the defaults.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

import torch

from ...config import ModelConfig
from ...data.tokenizers import TOKENIZERS
from ...engine.schedules import SCHEDULES, get_schedule
from ...errors import MdlmError
from ...models import unwrap
from .base import Partial

if TYPE_CHECKING:
    from ..folder import LoadedModel

INV_FREQ = "rotary_emb.inv_freq"
# Key prefixes, tried in order: a Lightning module around the HF model, the Lightning
# module or the HF `MDLM` (`backbone.`), a bare DiT state dict.
PREFIXES = ("backbone.backbone.", "backbone.", "")
# the reference's noise.type -> mdlm's schedule
REFERENCE_SCHEDULES = {"loglinear": "loglinear", "cosine": "cosine",
                       "cosinesqr": "cosine-squared", "linear": "linear",
                       "geometric": "geometric"}
# mdlm's schedules with fixed sigmas (their defaults in engine/schedules.py): a checkpoint must
# record these
SIGMA_RANGES = {name: (s.sigma_min, s.sigma_max) for name, s in
                ((name, get_schedule(name)) for name in SCHEDULES) if hasattr(s, "sigma_min")}
# the reference's `parameterization` -> mdlm's objective and the switches it implies: its d3pm
# always adds the reconstruction term (no carry-over) and zero-masks only with `subs_masking`
PARAMETERIZATIONS = {"subs": {"objective": "mdlm"}, "sedd": {"objective": "sedd"},
                     "d3pm": {"objective": "d3pm", "carry_over": False, "zero_masking": False}}
DATASET_NAMES = (
    "openwebtext",
    "lm1b",
    "text8",
    "wikitext103",
    "wikitext2",
    "ptb",
    "lambada",
    "ag_news",
)
# config.json field of the reference's MDLMConfig -> where mdlm keeps it (section, key, type);
# key None: the section is the partial config's top-level entry (read_fields)
HF_FIELDS = {
    "vocab_size": ("vocab_size", None, int),
    "model_length": ("data", "length", int),
    "hidden_dim": ("model", "hidden_size", int),
    "cond_dim": ("model", "cond_dim", int),
    "n_blocks": ("model", "n_blocks", int),
    "n_heads": ("model", "n_heads", int),
    "dropout": ("model", "dropout", float),
    "time_conditioning": ("model", "time_conditioning", bool),
}


# ---------------------------------------------------------------------- hyper-parameters

def partial_from_hf_config(raw: dict, source) -> Partial:
    """The MDLMConfig fields of a config.json (`hidden_size` accepted for `hidden_dim`)."""
    recorded = {k: v for k, v in raw.items() if v is not None}
    raw = {"hidden_dim": raw.get("hidden_size"), **recorded}
    partial = Partial()
    read_fields(partial, raw, HF_FIELDS, source)
    return partial


def read_fields(partial: Partial, values: dict, fields: dict, source, prefix: str = "") -> None:
    """Put each of `values`' fields that `fields` maps (name -> (section, key, type)) where
    `partial` keeps it, when recorded (not None); a key of None is the section itself, a
    top-level field. Errors name the field `prefix + name`. (The reader of a format calls it on
    the Partial it is building.)"""
    for name, (section, key, typ) in fields.items():
        value = number(values.get(name), typ, prefix + name, source)
        if value is None:
            continue
        if key is None:
            setattr(partial, section, value)
        else:
            getattr(partial, section)[key] = value


def hydra_value(config: dict, dotted: str):
    """The value at `dotted` (`model.length`) of a Hydra config, None where there is none; an
    absolute interpolation (`${model.length}`) is resolved once."""
    value = config
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str) and value.startswith("${"):
        target = value[2:-1]
        resolvable = value.endswith("}") and re.fullmatch(r"[\w.]+", target) and target != dotted
        return hydra_value(config, target) if resolvable else None
    return value


def partial_from_hydra(config: dict, source) -> Partial:
    """Hyper-parameters from the reference's Hydra config (`model.*`, `noise.type`, `data.*`,
    ...)."""
    get = functools.partial(hydra_value, config)
    backbone, parameterization = get("backbone"), get("parameterization") or "subs"
    if backbone not in (None, "dit", "hf_dit"):
        raise MdlmError(f"{source} holds a {backbone!r} backbone; mdlm loads MDLM's DiT")
    if parameterization not in PARAMETERIZATIONS:
        raise MdlmError(
            f"{source} was trained with parameterization={parameterization!r}; mdlm implements "
            f"{', '.join(PARAMETERIZATIONS)}"
        )
    partial = Partial(diffusion=dict(PARAMETERIZATIONS[parameterization]))
    if get("subs_masking") and parameterization == "d3pm":
        partial.diffusion["zero_masking"] = True
    if parameterization == "sedd" and get("time_conditioning") is not None and \
            not number(get("time_conditioning"), bool, "time_conditioning", source):
        raise MdlmError(
            f"{source} is a SEDD model trained without time conditioning: the reference "
            "then feeds sigma = 0 and its log-score is -inf everywhere, so it has no "
            "usable output"
        )
    for key, typ in (("hidden_size", int), ("n_blocks", int), ("n_heads", int),
                     ("cond_dim", int), ("dropout", float)):
        partial.model[key] = number(get(f"model.{key}"), typ, f"model.{key}", source)
    partial.model["time_conditioning"] = number(
        get("time_conditioning"), bool, "time_conditioning", source
    )
    partial.data["length"] = number(get("model.length"), int, "model.length", source)
    noise = {key: get(f"noise.{key}") for key in ("type", "sigma_min", "sigma_max")}
    if noise["type"] is not None:
        partial.diffusion["schedule"] = noise_schedule(noise, REFERENCE_SCHEDULES, source)
    partial.diffusion["T"] = number(get("T"), int, "T", source)
    tokenizer = get("data.tokenizer_name_or_path")
    char = TOKENIZERS["char"]  # the reference names it text8, one of its aliases
    partial.data["tokenizer"] = char.name if tokenizer in char.aliases else tokenizer
    train, wrap = str(get("data.train") or ""), get("data.wrap")
    partial.data["dataset"] = next((name for name in DATASET_NAMES if name in train), None)
    partial.data["packing"] = None if wrap is None else ("wrap" if wrap else "pad")
    for section in ("model", "data", "diffusion"):
        setattr(partial, section, {k: v for k, v in getattr(partial, section).items()
                                   if v is not None})
    return partial


def noise_schedule(noise: dict, names: dict[str, str], source,
                   default: str | None = None) -> str:
    """mdlm's schedule for a format's noise section (`type`, else `default`; `sigma_min`,
    `sigma_max`): `names` maps the format's noise types to mdlm's; the schedules with fixed
    sigmas (SIGMA_RANGES) match only with those (a sigma of a schedule without one, such as
    loglinear's, is not read)."""
    kind = noise.get("type", default)
    sigmas = (noise.get("sigma_min"), noise.get("sigma_max"))
    name = names.get(kind)
    if name is None:
        supported = [f"{k} with {_sigma_text(SIGMA_RANGES[v])}" if v in SIGMA_RANGES else k
                     for k, v in names.items()]
        raise MdlmError(
            f"{source} uses the noise schedule {kind!r}, which mdlm does not implement "
            f"(supported: {', '.join(supported)})"
        )
    if name in SIGMA_RANGES:
        keys = ("noise.sigma_min", "noise.sigma_max")
        got = tuple(number(v, float, k, source) for k, v in zip(keys, sigmas, strict=True))
        if got != SIGMA_RANGES[name]:
            recorded = "no sigma range" if None in got else _sigma_text(got)
            raise MdlmError(
                f"{source} uses the noise schedule {kind!r} with {recorded}; mdlm implements "
                f"{kind} noise with {_sigma_text(SIGMA_RANGES[name])} only"
            )
    return name


def _sigma_text(sigmas: tuple) -> str:
    return f"sigma {sigmas[0]}..{sigmas[1]}"


def model_config(weights: dict[str, torch.Tensor], partial: Partial,
                 inv_freq: torch.Tensor | None, source) -> tuple[ModelConfig, int, list[str]]:
    """(ModelConfig, vocabulary, what was inferred): the checkpoint records what it records, the
    rest comes from the weight shapes. Where both exist and disagree, the strict load reports the
    mismatch."""
    recorded, inferred = partial.model, []
    vocab, hidden = weights["vocab_embed.embedding"].shape
    cond = weights.get("sigma_map.mlp.0.weight")
    mlp = weights.get("blocks.0.mlp.0.weight")
    indices = {
        int(k.split(".")[1])
        for k in weights
        if k.startswith("blocks.") and k.split(".")[1].isdigit()
    }
    hidden = recorded.get("hidden_size") or hidden
    n_heads = recorded.get("n_heads")
    if n_heads is None and inv_freq is not None and inv_freq.numel():
        n_heads = hidden // (2 * inv_freq.numel())
        inferred.append("n_heads (from rotary_emb.inv_freq)")
    if not n_heads:
        raise MdlmError(
            f"{source} records no number of attention heads (no n_heads in its config, no "
            "rotary_emb.inv_freq in its weights), so it cannot be loaded unambiguously"
        )
    if hidden % n_heads or (hidden // n_heads) % 2:
        raise MdlmError(
            f"{source}: n_heads={n_heads} does not split hidden size {hidden} into even "
            "head sizes"
        )
    cfg = ModelConfig(
        hidden_size=hidden,
        n_blocks=recorded.get("n_blocks") or (max(indices) + 1 if indices else 0),
        n_heads=n_heads,
        cond_dim=recorded.get("cond_dim") or (cond.shape[0] if cond is not None else 128),
        mlp_ratio=(mlp.shape[0] // hidden
                   if mlp is not None and mlp.shape[0] % hidden == 0 else 4),
        dropout=recorded.get("dropout", 0.1),
        time_conditioning=recorded.get("time_conditioning", False),
        shift=recorded.get("shift", False),  # only an export's "mdlm" section records it
    )
    return cfg, partial.vocab_size or vocab, inferred


def hf_config(loaded: LoadedModel, mdlm_section: dict) -> dict:
    """config.json of an export: the reference's MDLMConfig fields, then mdlm's own section."""
    cfg, model = loaded.config, loaded.model
    values = {
        "vocab_size": model.vocab_size,
        "data": {"length": loaded.length},
        "model": vars(cfg.model),
    }
    fields = {
        name: values[section] if key is None else values[section][key]
        for name, (section, key, _) in HF_FIELDS.items()
    }
    return {
        "model_type": "mdlm",
        "architectures": ["MDLM"],
        **fields,
        "torch_dtype": "float32",
        "mdlm": mdlm_section,
    }


def number(value, typ, name: str, source):
    """A recorded number as `typ` (None stays None); a one-line error for anything else."""
    if value is None:
        return None
    try:
        if typ is bool:
            if isinstance(value, bool) or value in (0, 1):
                return bool(value)
            if str(value).lower() in ("true", "false"):
                return str(value).lower() == "true"
            raise ValueError
        result = typ(value)
        if typ is int and result != float(value):
            raise ValueError
        return result
    except (TypeError, ValueError):
        raise MdlmError(f"{source}: {name} should be a {typ.__name__}, got {value!r}") from None


# ---------------------------------------------------------------------- weights

def backbone_state(state: dict, source) -> dict[str, torch.Tensor]:
    """The DiT's weights under mdlm's names: the reference prefix stripped (`torch.compile`'s
    too)."""
    tensors = {
        k.replace("_orig_mod.", ""): v for k, v in state.items() if isinstance(v, torch.Tensor)
    }
    for prefix in PREFIXES:
        if prefix + "vocab_embed.embedding" in tensors:
            return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    raise MdlmError(f"{source} holds no MDLM DiT weights (no 'backbone.vocab_embed.embedding'); "
                    "is it an MDLM checkpoint?")


def reference_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """mdlm's DiT weights under the reference's `MDLM` names, rotary table included."""
    base = unwrap(model)
    out = {
        f"backbone.{k}": v.detach().to("cpu", torch.float32).contiguous()
        for k, v in base.state_dict().items()
    }
    out[f"backbone.{INV_FREQ}"] = base.rotary_emb.inv_freq.detach().cpu().float().contiguous()
    return out


def check_rotary(inv_freq: torch.Tensor | None, cfg: ModelConfig, source) -> None:
    if inv_freq is None:
        return
    head = cfg.hidden_size // cfg.n_heads
    expected = 1.0 / (10_000 ** (torch.arange(0, head, 2).float() / head))
    if inv_freq.shape != expected.shape:
        raise MdlmError(
            f"{source}: rotary_emb.inv_freq has {inv_freq.numel()} frequencies, but n_heads="
            f"{cfg.n_heads} gives head size {head} ({head // 2} frequencies); config and "
            "weights disagree"
        )
    if not torch.allclose(inv_freq.float(), expected, rtol=1e-4, atol=0.0):
        raise MdlmError(
            f"{source}: rotary_emb.inv_freq is not the base-10000 table mdlm computes"
        )


def apply_ema(
    model: torch.nn.Module, weights: dict[str, torch.Tensor], shadow, source
) -> dict[str, torch.Tensor]:
    """The reference EMA is a list in `backbone.parameters()` order (then the noise module's,
    which has none); mdlm's DiT registers its parameters in the same order."""
    names = [name for name, _ in model.named_parameters()]
    if (not isinstance(shadow, list | tuple)
            or not all(isinstance(t, torch.Tensor) for t in shadow)):
        raise MdlmError(f"{source}: ema.shadow_params is not a list of tensors")
    if len(shadow) != len(names):
        raise MdlmError(
            f"{source}: the EMA holds {len(shadow)} tensors but this DiT has {len(names)} "
            "parameters; the checkpoint does not fit the model its config describes"
        )
    out = dict(weights)
    for name, tensor in zip(names, shadow, strict=True):
        expected = tuple(model.get_parameter(name).shape)
        if tuple(tensor.shape) != expected:
            raise MdlmError(f"{source}: EMA tensor for {name} has shape {tuple(tensor.shape)}, "
                            f"the model expects {expected}")
        out[name] = tensor
    return out
