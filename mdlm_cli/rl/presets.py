"""`mdlm rl --preset NAME`: a shipped configuration of the command (presets/rl/NAME.yaml, or
a path to such a file), its keys the command's own option names (`max_steps` or
`max-steps`), read as the command's defaults: a flag given on the command line still wins.

    checkpoint: GSAI-ML/LLaDA-8B-Instruct
    data: gsm8k
    reward: ["2*exact", "0.5*format:..."]
    group: 6

A key the command does not have is refused with the valid ones, before anything loads.
"""

from __future__ import annotations

from pathlib import Path

from ..config.loading import preset_dir, read_preset_file
from ..errors import MdlmError


def rl_preset_dir() -> Path:
    return preset_dir() / "rl"


def list_rl_presets() -> list[str]:
    return sorted(p.stem for p in rl_preset_dir().glob("*.yaml"))


def read_rl_preset(name_or_path: str, valid: set[str]) -> dict:
    """The preset's values by option name (`valid`: the command's parameter names)."""
    path, data = read_preset_file(name_or_path, rl_preset_dir(), "rl preset", list_rl_presets())
    values = {str(k).replace("-", "_"): v for k, v in data.items() if k != "description"}
    unknown = sorted(set(values) - valid)
    if unknown:
        raise MdlmError(f"rl preset {path}: unknown option {', '.join(unknown)}; the options "
                        f"are {', '.join(sorted(valid))}")
    return values
