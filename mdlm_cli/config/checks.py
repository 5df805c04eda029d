"""The checks a Config can make alone, before anything runs: the choices, ranges and sizes of
each section's keys (`validate_sections`), and what a resumed run must share with the
checkpoint it continues (`resume_differences`). The names of registries (objective,
backbone, schedule) are checked in build.py.
"""

from __future__ import annotations

from ..errors import MdlmError
from .sections import (
    LR_SCHEDULES,
    PACKINGS,
    PARALLELS,
    PRECISIONS,
    QUANTIZE,
    SFT_PACKINGS,
    Config,
    OptimConfig,
)


def check_choice(value: str, choices, where: str) -> None:
    if value not in choices:
        raise MdlmError(f"{where} must be one of: {', '.join(choices)} (got {value!r})")


def validate_sections(cfg: Config) -> None:
    """The checks each section can make alone (ranges, the choices of sections.py); the
    names of registries (objective, backbone, schedule) are checked in build.py."""
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
    _check_lora(cfg)
    if cfg.train.attention_anneal_steps < 0:
        raise MdlmError("train.attention_anneal_steps must be 0 (off) or a number of steps (got "
                        f"{cfg.train.attention_anneal_steps})")
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
                         ("optim.warmup_steps", o.warmup_steps),
                         ("optim.grad_clip", o.grad_clip)):
        if value < 0 or (where == "optim.eps" and value == 0):
            bound = "positive" if where == "optim.eps" else "at least 0"
            raise MdlmError(f"{where} must be {bound} (got {value})")
    if not 0.0 <= o.min_lr_ratio <= 1.0:
        raise MdlmError(f"optim.min_lr_ratio must be in [0, 1] (got {o.min_lr_ratio})")


def _check_lora(cfg: Config) -> None:
    """The adapter's sizes, and the base it adapts: LoRA freezes trained weights."""
    lora = cfg.lora
    check_choice(lora.quantize, QUANTIZE, "lora.quantize")
    if lora.rank < 0 or lora.alpha <= 0 or not 0.0 <= lora.dropout < 1.0:
        raise MdlmError(f"lora needs rank >= 0, alpha > 0 and dropout in [0, 1) (got rank "
                        f"{lora.rank}, alpha {lora.alpha}, dropout {lora.dropout})")
    if lora.rank == 0:
        changed = [k for k in ("targets", "train_embeddings", "quantize")
                   if getattr(lora, k) != getattr(type(lora)(), k)]
        if changed:
            raise MdlmError(f"lora.{changed[0]} applies to LoRA runs only: set lora.rank (e.g. "
                            "--set lora.rank=16) or remove it")
        return
    if not cfg.train.init_from:
        raise MdlmError("lora.rank > 0 adapts trained weights, which stay frozen: set "
                        "train.init_from to the base (an mdlm run, a LLaDA or Dream folder)")
    if cfg.train.parallel == "fsdp":
        raise MdlmError("LoRA runs are data-parallel only: use train.parallel=ddp (an adapter "
                        "is small enough to replicate)")


# What a resumed run must share with the checkpoint it continues: the data, objective, model,
# optimisation and batch. Everything else (max_steps, cadences, device, threads, compile,
# precision, parallelism, micro-batch size, output folder) may change between sessions.
# (and a LoRA run its base, train.init_from: its frozen weights are read from there again)
RESUME_KEYS = {"data": ("dataset", "tokenizer", "length", "packing", "pad_as_eos"),
               "model": None, "diffusion": None, "optim": None,
               "train": ("global_batch_size", "seed", "ema", "init_from",
                         "attention_anneal_steps"), "lora": None}


def resume_differences(saved: Config, new: Config) -> dict[str, list]:
    """{"section.key": [saved value, new value]} for every RESUME_KEYS key that differs."""
    old_d, new_d, out = saved.to_dict(), new.to_dict(), {}
    for section, keys in RESUME_KEYS.items():
        for key in keys or new_d[section]:
            if old_d[section].get(key) != new_d[section][key]:
                out[f"{section}.{key}"] = [old_d[section].get(key), new_d[section][key]]
    return out
