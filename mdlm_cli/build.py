"""The checks that span registries, and the Config every command runs with.

config.py is a leaf (pure dataclasses and the checks each section can make alone); what needs
the registries lives here, one layer above the backbones (models.BACKBONES), the objectives
(objectives.OBJECTIVES) and the schedules (engine.SCHEDULES): the names a config gives, which
model keys its backbone reads, whether the backbone attends the way the objective needs, and
each backbone's and objective's own checks; and what a released folder named by
`train.init_from` fixes in the other sections (`adopt_released_folder`), or an mdlm diffusion
run named there fixes in the model section (`adopt_run_shift`).
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import yaml

from .config import Config, DataConfig, ModelConfig, check_choice, merge_sources, parse_config
from .data.open_tokenizers import hub_open_model_folder, open_model_family
from .engine.schedules import SCHEDULES
from .errors import MdlmError
from .io.files import read_json_object
from .models import BACKBONES
from .models.open_weights import conversion_diffusion
from .objectives import OBJECTIVES

# a backbone that only attends one way, and the objectives it then cannot serve
CAUSAL_ALTERNATIVE = {
    True: "the dit backbone, or mamba on DNA",
    False: "the dit backbone, or caduceus on DNA",
}


def resolve_config(preset: str | None, overrides: typing.Sequence[str] = (),
                   flags: dict[str, typing.Any] | None = None) -> Config:
    """defaults < preset < --set overrides < explicit flags ({"train.seed": 3, ...}, None =
    unset), checked as a whole; a LLaDA or Dream folder as `train.init_from` fixes its model,
    tokenizer and objective (`adopt_released_folder`)."""
    merged = merge_sources(preset, overrides, flags)
    return config_from_dict(adopt_run_shift(adopt_released_folder(merged)))


def config_from_dict(data: dict) -> Config:
    """A checked Config from nested dicts (a preset, a saved config.yaml)."""
    cfg = parse_config(data)
    check_choice(cfg.diffusion.objective, list(OBJECTIVES), "diffusion.objective")
    check_choice(cfg.model.backbone, list(BACKBONES), "model.backbone")
    check_choice(cfg.diffusion.schedule, list(SCHEDULES), "diffusion.schedule")
    _check_model_keys(cfg.model.backbone, data.get("model") or {})
    backbone, objective = BACKBONES[cfg.model.backbone], OBJECTIVES[cfg.diffusion.objective]
    _check_attention(cfg, backbone, objective)
    _check_packing(cfg, backbone)
    _check_annealing(cfg, backbone, objective)
    backbone.validate_config(cfg)
    _check_own_keys(cfg, objective)
    objective.validate(cfg)
    return cfg


def backbone_keys(backbone: str) -> tuple[str, ...]:
    """The model.* keys a backbone reads; every key for an unknown one (validation names it)."""
    cls = BACKBONES.get(backbone)
    if cls is None:
        return tuple(f.name for f in dataclasses.fields(ModelConfig))
    return ("backbone", *cls.config_keys)


def model_dict(model: ModelConfig) -> dict:
    """The model keys the backbone reads (`backbone` first): what a checkpoint saves."""
    keys = backbone_keys(model.backbone)
    return {k: v for k, v in dataclasses.asdict(model).items() if k in keys}


def config_dict(cfg: Config) -> dict:
    """The config as a checkpoint saves it: every section, the model's own keys only."""
    return {**cfg.to_dict(), "model": model_dict(cfg.model)}


def config_yaml(cfg: Config) -> str:
    return yaml.safe_dump(config_dict(cfg), sort_keys=False)


def _check_model_keys(backbone: str, given: dict) -> None:
    """No model key is silently ignored: each one given must be read by the backbone."""
    keys = backbone_keys(backbone)
    unread = [k for k in given if k not in keys]
    if unread:
        raise MdlmError(f"model.{unread[0]} does not apply to the {backbone} backbone (it "
                        f"reads: {', '.join(k for k in keys if k != 'backbone')}); remove it")


def _check_packing(cfg: Config, backbone) -> None:
    """Several examples per row need a backbone that keeps attention within each one."""
    if cfg.data.packing == "sft-pack" and not backbone.packs_segments:
        raise MdlmError(f"data.packing=sft-pack needs attention kept within each example, which "
                        f"the {cfg.model.backbone} backbone cannot do; use data.packing=sft "
                        "(one example per row) or model.backbone=dit")


def _check_attention(cfg: Config, backbone, objective) -> None:
    """A backbone's `requires_causal` (True: causal only, False: bidirectional only, None:
    either) against the objective's need."""
    needs = backbone.requires_causal
    if needs is not None and needs != objective.causal:
        kind = "causal" if objective.causal else "bidirectional"
        raise MdlmError(
            f"the {cfg.model.backbone} backbone is {'causal' if needs else 'bidirectional'}; "
            f"the {cfg.diffusion.objective} objective needs {kind} attention "
            f"({CAUSAL_ALTERNATIVE[objective.causal]})"
        )


def _check_annealing(cfg: Config, backbone, objective) -> None:
    """train.attention_anneal_steps needs a backbone that anneals (`anneals_attention`) and an
    objective that trains full attention."""
    if not cfg.train.attention_anneal_steps:
        return
    if not backbone.anneals_attention:
        raise MdlmError(f"train.attention_anneal_steps: the {cfg.model.backbone} backbone "
                        "cannot anneal its attention (dit, llada, dream and gpt2 can); set "
                        "it to 0")
    if objective.causal:
        raise MdlmError(f"train.attention_anneal_steps anneals towards full attention; the "
                        f"{cfg.diffusion.objective} objective attends causally; set it to 0")


def _check_own_keys(cfg: Config, objective) -> None:
    """A diffusion key that only other objectives read (their `own_keys`), moved from its
    default, is refused: no switch is silently ignored."""
    others = {key for cls in OBJECTIVES.values() if cls is not objective for key in cls.own_keys}
    objective.refuse_unused(cfg, *sorted(others - set(objective.own_keys)))


# what the open diffusion LLMs were trained with, whatever the folder: LLaDA's objective (MDLM's
# loss under the linear schedule) and no time input (a time-agnostic denoiser); a converted
# folder's record may name another target objective (`conversion_diffusion`: BD3-LM's blocks)
RELEASED_FIXES = {("diffusion", "objective"): "mdlm", ("diffusion", "schedule"): "linear",
                  ("model", "time_conditioning"): False}


def released_folder(spec: str) -> tuple[type, dict] | None:
    """(backbone class, config.json) of a local LLaDA or Dream folder or a hub id of one;
    None for anything else (an mdlm run, a Caduceus, a hub id the Hub and cache cannot place)."""
    path = Path(spec)
    if path.is_dir():
        folder = path if open_model_family(path) else None
    else:
        folder = hub_open_model_folder(spec) if spec.count("/") == 1 else None
    if folder is None:
        return None
    raw = read_json_object(folder / "config.json")
    cls = next(c for c in BACKBONES.values() if c.model_type == raw["model_type"])
    return cls, raw


def adopt_released_folder(data: dict) -> dict:
    """The merged config with what `train.init_from`'s LLaDA or Dream folder fixes: the backbone,
    model.hf_model, the tokenizer (the folder's own: its mask id), the objective, the linear
    schedule, no time input; an unset data.length becomes at most the model's positions. A value
    given (by the preset or --set) that contradicts the folder is refused in one line naming
    its key, never silently overridden. Any other init_from leaves `data` as it is."""
    spec = (data.get("train") or {}).get("init_from")
    found = released_folder(spec) if isinstance(spec, str) and spec else None
    if found is None:
        return data
    cls, raw = found
    backbone = next(k for k, c in BACKBONES.items() if c is cls)
    what = f"train.init_from {spec} (a {cls.title} folder"
    unread = [k for k in data.get("model") or {} if k not in backbone_keys(backbone)]
    if unread:
        key = unread[0]
        raise MdlmError(f"model.{key}={data['model'][key]!r} contradicts {what}, whose "
                        f"config.json fixes the model's sizes); remove model.{key}")
    fixed = {("model", "backbone"): backbone, ("model", "hf_model"): spec,
             ("data", "tokenizer"): spec, **RELEASED_FIXES,
             **{("diffusion", k): v for k, v in conversion_diffusion(raw).items()}}
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for (section, key), value in fixed.items():
        given = out.setdefault(section, {}).get(key, value)
        if not _same(given, value):
            raise MdlmError(f"{section}.{key}={given!r} contradicts {what} fixes "
                            f"{section}.{key}={value!r}); remove the setting")
        out[section][key] = value
    positions = cls.read_shape(raw, spec).max_length
    length = out["data"].setdefault("length", min(DataConfig.length, positions))
    if isinstance(length, int) and length > positions:
        raise MdlmError(f"data.length={length} exceeds the {positions} positions of {spec}; "
                        f"set data.length={positions} or less")
    return out


def _same(given, value) -> bool:
    """Equal values, or two names of one local folder."""
    if given == value:
        return True
    if isinstance(given, str) and isinstance(value, str) and Path(given).is_dir():
        return Path(given).resolve() == Path(value).resolve()
    return False


def adopt_run_shift(data: dict) -> dict:
    """The DiT's `model.shift` of the mdlm diffusion run that `train.init_from` names (an AR run
    that `mdlm convert` made an MDLM run, or a fine-tune of one): adopted where the merged
    config leaves it unset, refused in one line where it says otherwise, so a fine-tune reads
    each position's logits where the weights were trained to give them. An AR run (causal
    objective) fixes nothing: whether its fine-tune shifts is the run's choice."""
    spec = (data.get("train") or {}).get("init_from")
    saved = _run_config(spec) if isinstance(spec, str) and spec else None
    model = data.get("model") or {}
    if saved is None or model.get("backbone", "dit") != "dit":
        return data
    saved_model = saved.get("model") or {}
    objective = OBJECTIVES.get((saved.get("diffusion") or {}).get("objective", "mdlm"))
    if saved_model.get("backbone", "dit") != "dit" or objective is None or objective.causal:
        return data
    shift = bool(saved_model.get("shift", False))
    given = model.get("shift", shift)
    if given != shift:
        where = "one position to the left" if shift else "at their own position"
        raise MdlmError(f"model.shift={given!r} contradicts train.init_from {spec}, trained "
                        f"with model.shift={shift} (its logits read {where}); remove the "
                        "setting")
    return {**data, "model": {**model, "shift": shift}} if shift else data


def _run_config(spec: str) -> dict | None:
    """The saved config.yaml of an mdlm run or step folder; None for anything else (the loader
    says what is wrong with an unreadable one)."""
    path = Path(spec) / "config.yaml"
    try:
        saved = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return None
    return saved if isinstance(saved, dict) else None
