"""Typed configuration: dataclasses are the truth, YAML presets only set values.

Precedence: dataclass defaults < preset YAML < `--set section.key=value` < explicit
CLI flags. Unknown sections or keys are errors that list the valid ones.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import MdlmError
from .numbers import check_config_float

PACKINGS = ("wrap", "pad", "chunk", "chunk-eos", "window", "sft", "sft-pack")
SFT_PACKINGS = ("sft", "sft-pack")  # prompt/response rows: the loss on the responses only
LR_SCHEDULES = ("constant", "cosine")
PRECISIONS = ("auto", "bf16", "fp32")
PARALLELS = ("ddp", "fsdp")


@dataclass
class DataConfig:
    dataset: str = "bigtxt"  # registry name (`mdlm prepare-data --help`) or a local text/jsonl path
    tokenizer: str = "gpt2"  # gpt2 | bert-base-uncased | char | local tokenizer folder | hub id
    length: int = 128  # tokens per row (L)
    # wrap (BOS/EOS, OWT) | pad (one doc per row, LM1B) | chunk (text8) | chunk-eos (BD3-LM:
    # documents joined by EOS, nothing per row) | window (DNA)
    # | sft (prompt/response examples, one per row, loss on the response: data/sft.py)
    # | sft-pack (several examples per row, attention within each: data/sft_pack.py)
    packing: str = "wrap"
    pad_as_eos: bool = True  # sft*: fill with EOS, learnt (the model picks the length); false: pad
    cache_dir: str = ""  # "" = $MDLM_CACHE or ~/.cache/mdlm
    rc_augment: bool = False  # DNA: each training row reverse-complemented with probability 1/2
    max_rows: int = 0  # rows of the train split to prepare, 0 = all (a stream stops there)
    max_eval_rows: int = 0  # rows of each evaluation split (valid, test), 0 = all


@dataclass
class ModelConfig:
    """The backbone's hyper-parameters: the one model config of training, loading and export.
    The vocabulary comes from the tokeniser and causal attention from the objective. Each
    backbone reads only its own keys (`config_keys` of its class in models.BACKBONES); giving
    one it does not read is an error, and only its own keys are saved (both in build.py)."""

    backbone: str = "dit"  # models.BACKBONES
    hf_model: str = ""  # hf-mlm: a Hugging Face masked LM (hub id, folder, or a pip-packaged model)
    hidden_size: int = 768
    n_blocks: int = 12
    n_heads: int = 12
    cond_dim: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.1
    time_conditioning: bool = False  # reference default; the paper's 23.21 used it on
    # Mamba-based DNA backbones (caduceus, mamba; models.caduceus.MambaConfig): hidden_size is
    # d_model, n_blocks the number of layers; the DiT does not take these
    mixer: str = "auto"  # selective scan: auto | cuda (mamba-ssm) | torch (mambapy)
    d_state: int = 16
    d_conv: int = 4
    expand: int = 2
    rcps: bool = False  # caduceus: Caduceus-PS (reverse-complement equivariant) instead of Ph
    # caduceus PS layout: true = the released checkpoints' (halves swapped per block)
    fused_add_norm: bool = True
    bidirectional_strategy: str = "add"  # caduceus: add | ew_multiply
    # caduceus: mamba_rev shares mamba_fwd's in/out projections
    bidirectional_weight_tie: bool = True
    rms_norm: bool = True  # RMSNorm (else LayerNorm)
    norm_epsilon: float = 1e-5


@dataclass
class DiffusionConfig:
    # objectives.OBJECTIVES: mdlm | sedd | d3pm | ar (autoregressive baseline)
    objective: str = "mdlm"
    schedule: str = "loglinear"  # loglinear | cosine | cosine-squared | linear | geometric
    eps: float = 1e-3
    antithetic: bool = True  # low-discrepancy t over the global batch
    T: int = 0  # 0 = continuous time; T > 0 = discrete-time bound (Table 8); d3pm needs T > 0
    # The two halves of SUBS (§3.2.3), switches of the Table 8 ablation (mdlm, d3pm):
    # the model gives the mask token probability 0 (d3pm: the reference's subs_masking)
    zero_masking: bool = True
    carry_over: bool = True  # unmasked tokens are copied; off adds the t = 0 reconstruction term
    # bd3lm (docs/bd3lm.md): L' per block, training's t ~ U[clip_min, clip_max], its search
    block_size: int = 0
    clip_min: float = 0.0
    clip_max: float = 1.0
    clip_search_widths: tuple[float, ...] = ()  # empty: no search
    clip_search_delta: float = 0.05  # the searched intervals' starts are this far apart


@dataclass
class OptimConfig:
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    warmup_steps: int = 2500
    schedule: str = "constant"  # constant | cosine (after warmup)
    min_lr_ratio: float = 0.1  # cosine floor, as a fraction of lr
    grad_clip: float = 1.0  # 0 = off


@dataclass
class TrainConfig:
    global_batch_size: int = 512
    micro_batch_size: int = 16
    max_steps: int = 1_000_000
    # minutes of training to fit the schedule to, 0 = off: max_steps becomes what the budget
    # holds at the run's measured speed, at most the max_steps above (train/budget.py)
    time_budget: float = 0.0
    ema: float = 0.9999  # 0 = off; warmup min(ema, (1 + n) / (10 + n))
    seed: int = 1
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | cuda:1 | mps
    # auto (bf16 on CUDA and on CPUs with bf16 units: runtime.py) | bf16 | fp32
    precision: str = "auto"
    compile: bool = False
    threads: int = 0  # CPU threads, 0 = torch default
    # under torchrun: ddp (replicated) | fsdp (FSDP2 fully_shard: sharded weights/optimizer)
    parallel: str = "ddp"
    log_every: int = 10
    eval_every: int = 10_000
    eval_rows: int = 0  # validation rows per periodic evaluation, 0 = all
    save_every: int = 10_000
    keep_last: int = 2
    out_dir: str = "runs/{name}"
    # start from these weights: an mdlm checkpoint, or a Caduceus hub id / folder
    init_from: str = ""


@dataclass
class Config:
    name: str = "custom"
    description: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        """Every key of every section; `build.config_dict` keeps only the backbone's model keys
        (what checkpoints save)."""
        d = dataclasses.asdict(self)
        d["optim"]["betas"] = list(d["optim"]["betas"])
        d["diffusion"]["clip_search_widths"] = list(d["diffusion"]["clip_search_widths"])
        return d

    @property
    def out_dir(self) -> Path:
        return Path(self.train.out_dir.format(name=self.name))


SECTIONS = {name: typ for name, typ in typing.get_type_hints(Config).items()
            if name not in ("name", "description")}


# ----------------------------------------------------------------------------- presets

def preset_dir() -> Path:
    """Packaged presets (a wheel puts them in mdlm_cli/presets), else the source tree's."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "presets", here.parent / "presets"):
        if candidate.is_dir():
            return candidate
    raise MdlmError("the preset folder is missing from this installation; reinstall mdlm")


def list_presets() -> dict[str, str]:
    """name -> one-line description, for every shipped preset."""
    out = {}
    for path in sorted(preset_dir().glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        description = str(data.get("description", "")).strip()
        out[path.stem] = description.splitlines()[0] if description else ""
    return out


def load_preset(name_or_path: str) -> dict:
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = preset_dir() / f"{name_or_path}.yaml"
        if not path.is_file():
            raise MdlmError(
                f"unknown preset {name_or_path!r}; choose one of: {', '.join(list_presets())} "
                "(or give a path to a .yaml file)"
            )
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise MdlmError(f"preset {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise MdlmError(f"preset {path} must be a mapping of sections to keys")
    data.setdefault("name", path.stem)
    return data


# ----------------------------------------------------------------------------- building

def _coerce(value, typ, where: str):
    origin = typing.get_origin(typ)
    try:
        if typ is bool:
            if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
                return value.lower() in ("true", "yes", "1")
            if isinstance(value, bool):
                return value
            raise TypeError
        if typ is int:
            if isinstance(value, bool):
                raise TypeError
            f = float(value)
            if f != int(f):
                raise TypeError
            return int(f)
        if typ is float:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if typ is str:
            return str(value)
        if origin is tuple:
            items = value if isinstance(value, list | tuple) else yaml.safe_load(str(value))
            args = typing.get_args(typ)
            if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: any length
                args = (args[0],) * len(items)
            if len(items) != len(args):
                raise TypeError
            return tuple(_coerce(v, a, where) for v, a in zip(items, args, strict=True))
    except (TypeError, ValueError):
        pass
    else:
        return value
    name = getattr(typ, "__name__", str(typ))
    raise MdlmError(f"{where} expects {name}, got {value!r}")


def _section_from_dict(cls, values: dict, section: str):
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in valid:
            raise MdlmError(f"unknown key {section}.{key}; valid keys: {', '.join(valid)}")
        kwargs[key] = _coerce(value, hints[key], f"{section}.{key}")
        for number in kwargs[key] if isinstance(kwargs[key], tuple) else (kwargs[key],):
            if isinstance(number, float):  # finite and in range, before any check compares it
                check_config_float(f"{section}.{key}", number)
    return cls(**kwargs)


def parse_config(data: dict) -> Config:
    """A Config from nested dicts, with the checks each section can make alone
    (`validate_sections`); `build.config_from_dict` adds the checks across the registries."""
    data = dict(data)
    cfg_kwargs = {"name": str(data.pop("name", "custom")),
                  "description": str(data.pop("description", "") or "")}
    for section, values in data.items():
        if section not in SECTIONS:
            raise MdlmError(
                f"unknown config section {section!r}; valid sections: {', '.join(SECTIONS)}"
            )
        if not isinstance(values, dict):
            raise MdlmError(f"config section {section!r} must be a mapping")
        cfg_kwargs[section] = _section_from_dict(SECTIONS[section], values, section)
    cfg = Config(**cfg_kwargs)
    validate_sections(cfg)
    return cfg


def apply_override(data: dict, assignment: str) -> None:
    """`section.key=value` into a nested dict; value parsed as YAML (1e-4, true, [0.9, 0.95])."""
    key, sep, raw = assignment.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise MdlmError(f"--set expects section.key=value (e.g. optim.lr=1e-4), got {assignment!r}")
    section, name = parts
    if section not in SECTIONS:
        raise MdlmError(
            f"unknown config section {section!r} in --set; valid sections: {', '.join(SECTIONS)}"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as e:  # a python tag (!!python/...) or broken YAML: plain values only
        reason = str(e).strip().splitlines()[0]
        raise MdlmError(
            f"--set {key.strip()}: {raw.strip()!r} is not a plain YAML value ({reason})"
        ) from None
    data.setdefault(section, {})[name] = value


def merge_sources(preset: str | None, overrides: typing.Sequence[str] = (),
                  flags: dict[str, typing.Any] | None = None) -> dict:
    """The nested dict of defaults < preset < --set overrides < explicit flags ({"train.seed": 3,
    ...}, None = unset); `build.resolve_config` turns it into a checked Config."""
    data = load_preset(preset) if preset else {}
    for assignment in overrides:
        apply_override(data, assignment)
    for key, value in (flags or {}).items():
        # a flag's value is taken as it is: a path like 'x[1].txt' is not YAML
        if value is not None:
            section, name = key.split(".")
            data.setdefault(section, {})[name] = value
    return data


def check_choice(value: str, choices, where: str) -> None:
    if value not in choices:
        raise MdlmError(f"{where} must be one of: {', '.join(choices)} (got {value!r})")


def validate_sections(cfg: Config) -> None:
    """The checks each section can make alone (ranges, choices of this module); the names of
    registries (objective, backbone, schedule) are checked in build.py."""
    check_choice(cfg.data.packing, PACKINGS, "data.packing")
    if cfg.data.packing in SFT_PACKINGS and cfg.data.rc_augment:
        raise MdlmError("data.rc_augment does not apply to prompt/response rows "
                        f"(data.packing={cfg.data.packing}); set it false")
    check_choice(cfg.optim.schedule, LR_SCHEDULES, "optim.schedule")
    check_choice(cfg.train.precision, PRECISIONS, "train.precision")
    check_choice(cfg.train.parallel, PARALLELS, "train.parallel")
    _check_sizes(cfg)
    if not 0.0 <= cfg.train.ema < 1.0:
        raise MdlmError(f"train.ema must be in [0, 1) (got {cfg.train.ema})")
    _check_optim(cfg.optim)
    if cfg.train.threads < 0:
        raise MdlmError("train.threads must be 0 (the default choice) or a positive count "
                        f"(got {cfg.train.threads})")
    try:
        cfg.train.out_dir.format(name=cfg.name)
    except (KeyError, IndexError, ValueError, AttributeError):
        raise MdlmError(
            f"train.out_dir may contain {{name}} (the config's name) and no other {{...}} field "
            f"(got {cfg.train.out_dir!r}); write {{{{ and }}}} for literal braces"
        ) from None


def _check_sizes(cfg: Config) -> None:
    """Row length, batch sizes, step counts and cadences, row limits: in range."""
    positive = {
        "data.length": cfg.data.length,
        "train.global_batch_size": cfg.train.global_batch_size,
        "train.micro_batch_size": cfg.train.micro_batch_size,
        "train.max_steps": cfg.train.max_steps,
        "train.log_every": cfg.train.log_every,
        "train.eval_every": cfg.train.eval_every,
        "train.save_every": cfg.train.save_every,
        "train.keep_last": cfg.train.keep_last,
    }
    for where, value in positive.items():
        if value <= 0:
            raise MdlmError(f"{where} must be positive (got {value})")
    if cfg.data.length < 4:
        raise MdlmError(f"data.length must be at least 4 (got {cfg.data.length})")
    for where, value in (
        ("data.max_rows", cfg.data.max_rows),
        ("data.max_eval_rows", cfg.data.max_eval_rows),
    ):
        if value < 0:
            raise MdlmError(f"{where} must be 0 (all rows) or a number of rows (got {value})")
    if cfg.train.global_batch_size % cfg.train.micro_batch_size:
        raise MdlmError(
            f"train.global_batch_size ({cfg.train.global_batch_size}) must be a multiple of "
            f"train.micro_batch_size ({cfg.train.micro_batch_size})"
        )


def _check_optim(o: OptimConfig) -> None:
    """The ranges AdamW and the schedule accept, checked before anything runs."""
    if o.lr <= 0:
        raise MdlmError(f"optim.lr must be positive (got {o.lr})")
    if not all(0.0 <= b < 1.0 for b in o.betas):
        raise MdlmError(f"optim.betas must both be in [0, 1) (got {list(o.betas)})")
    for where, value in (("optim.eps", o.eps), ("optim.weight_decay", o.weight_decay),
                         ("optim.warmup_steps", o.warmup_steps), ("optim.grad_clip", o.grad_clip)):
        if value < 0 or (where == "optim.eps" and value == 0):
            bound = "positive" if where == "optim.eps" else "at least 0"
            raise MdlmError(f"{where} must be {bound} (got {value})")
    if not 0.0 <= o.min_lr_ratio <= 1.0:
        raise MdlmError(f"optim.min_lr_ratio must be in [0, 1] (got {o.min_lr_ratio})")


# What a resumed run must share with the checkpoint it continues: the data, objective, model,
# optimisation and batch. Everything else (max_steps, cadences, device, threads, compile,
# precision, parallelism, micro-batch size, output folder) may change between sessions.
RESUME_KEYS = {"data": ("dataset", "tokenizer", "length", "packing", "pad_as_eos"), "model": None,
               "diffusion": None, "optim": None, "train": ("global_batch_size", "seed", "ema")}


def resume_differences(saved: Config, new: Config) -> dict[str, list]:
    """{"section.key": [saved value, new value]} for every RESUME_KEYS key that differs."""
    old_d, new_d, out = saved.to_dict(), new.to_dict(), {}
    for section, keys in RESUME_KEYS.items():
        for key in keys or new_d[section]:
            if old_d[section].get(key) != new_d[section][key]:
                out[f"{section}.{key}"] = [old_d[section].get(key), new_d[section][key]]
    return out
