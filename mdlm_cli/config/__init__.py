"""Typed configuration: dataclasses are the truth, YAML presets only set values.

Precedence: dataclass defaults < preset YAML < `--set section.key=value` < explicit
CLI flags. Unknown sections or keys are errors that list the valid ones.

The package holds the sections (`sections.py`: the dataclasses and the choices of their
keys), their loading (`loading.py`: presets, overrides, flags, typed values) and the checks
each section makes alone (`checks.py`); every name is importable from `mdlm_cli.config`.
"""

from .checks import RESUME_KEYS, check_choice, resume_differences, validate_sections
from .loading import (
    apply_override,
    list_presets,
    load_preset,
    merge_sources,
    parse_config,
    preset_dir,
)
from .sections import (
    LR_SCHEDULES,
    PACKINGS,
    PARALLELS,
    PRECISIONS,
    SECTIONS,
    SFT_PACKINGS,
    Config,
    DataConfig,
    DiffusionConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    TrainConfig,
)

__all__ = [
    "LR_SCHEDULES",
    "PACKINGS",
    "PARALLELS",
    "PRECISIONS",
    "RESUME_KEYS",
    "SECTIONS",
    "SFT_PACKINGS",
    "Config",
    "DataConfig",
    "DiffusionConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "TrainConfig",
    "apply_override",
    "check_choice",
    "list_presets",
    "load_preset",
    "merge_sources",
    "parse_config",
    "preset_dir",
    "resume_differences",
    "validate_sections",
]
