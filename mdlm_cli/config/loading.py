"""From the sources of values to a Config: the shipped YAML presets, `--set section.key=value`
overrides and explicit flags merged in that order of precedence (`merge_sources`), then each
value coerced to its key's type (`parse_config`). Unknown sections or keys are errors that
list the valid ones.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import yaml

from ..errors import MdlmError
from ..numbers import check_config_float
from .checks import validate_sections
from .sections import SECTIONS, Config

# ----------------------------------------------------------------------------- presets

def preset_dir() -> Path:
    """Packaged presets (a wheel puts them in mdlm_cli/presets), else the source tree's."""
    package = Path(__file__).resolve().parents[1]  # mdlm_cli/
    for candidate in (package / "presets", package.parent / "presets"):
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


def read_preset_file(name_or_path: str, folder: Path, what: str,
                     listing: list[str]) -> tuple[Path, dict]:
    """(path, mapping) of a preset: a .yaml path, or NAME in `folder`; unknown names, bad YAML
    and a file that is not a mapping are one line each (`what`: "preset", "rl preset")."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.is_file()):
        path = folder / f"{name_or_path}.yaml"
        if not path.is_file():
            raise MdlmError(f"unknown {what} {name_or_path!r}; choose one of: "
                            f"{', '.join(listing)} (or give a path to a .yaml file)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise MdlmError(f"{what} {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise MdlmError(f"{what} {path} must be a mapping of keys to values")
    return path, data


def load_preset(name_or_path: str) -> dict:
    path, data = read_preset_file(name_or_path, preset_dir(), "preset", list(list_presets()))
    data.setdefault("name", path.stem)
    return data


# ----------------------------------------------------------------------------- building

def _coerce(value, typ, where: str):
    origin = typing.get_origin(typ)
    try:
        if typ is bool:
            if (isinstance(value, str)
                    and value.lower() in ("true", "false", "yes", "no", "1", "0")):
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
        raise MdlmError("--set expects section.key=value (e.g. optim.lr=1e-4), "
                        f"got {assignment!r}")
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
