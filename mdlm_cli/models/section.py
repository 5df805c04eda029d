"""A backbone's own config: a dataclass whose fields are the `model.*` keys it reads.

Presets and checkpoints keep one flat `model:` section (config.ModelConfig) so that they stay
compatible across backbones; each backbone reads its own dataclass out of it, and the names of
that dataclass's fields are the keys it accepts (`config_keys`) and the keys a checkpoint saves.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from ..config import ModelConfig

C = TypeVar("C")


def keys_of(section: type) -> tuple[str, ...]:
    """The model.* keys a backbone config dataclass reads."""
    return tuple(f.name for f in dataclasses.fields(section))


def read_section(section: type[C], model: ModelConfig | C) -> C:
    """The backbone's dataclass from the flat model section (or the dataclass itself, as it
    is)."""
    if isinstance(model, section):
        return model
    return section(**{key: getattr(model, key) for key in keys_of(section)})
