"""What every checkpoint format is given and gives: `Found` (a path and, for a folder, its
config.json read once), `Partial` (the hyper-parameters a checkpoint records, in mdlm's config
layout) and `Format` (detect + load), the entry of `formats.FORMATS`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...io.files import read_json_object

if TYPE_CHECKING:
    from ..folder import LoadedModel


@dataclass(frozen=True)
class Found:
    """A checkpoint to load: a Lightning / state-dict file (config None) or a Hugging Face-style
    folder with the JSON object of its config.json."""

    path: Path
    config: dict | None
    label: str  # how the user named it (a hub id, a folder)

    @classmethod
    def at(cls, path: Path, label: str) -> Found:
        if path.is_file():
            return cls(path, None, label)
        return cls(path, read_json_object(path / "config.json"), label)


@dataclass
class Partial:
    """mdlm's config layout holding only what a checkpoint records; the rest comes from the
    weight shapes or the defaults. A format's reader builds it; nothing after changes it."""

    model: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    diffusion: dict[str, Any] = field(default_factory=dict)
    vocab_size: int | None = None
    # where the format fixes the mask token (SEDD: the last id), checked against the tokeniser
    mask_id: int | None = None


@dataclass(frozen=True)
class Format:
    """A checkpoint format: `detect` says whether a found checkpoint is in it (FORMATS is
    tried in order, the first that detects loads), `load` makes the model."""

    detect: Callable[[Found], bool]
    load: Callable[..., LoadedModel]  # (found, *, ema: bool, device) -> the loaded model
    description: str


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__

