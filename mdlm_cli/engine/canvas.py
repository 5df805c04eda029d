"""What `sample` and `semi_ar` fill, and what watches them run: the types their parameters
travel in (a `Canvas` of rows, a `SemiArPlan` of windows, `SampleHooks`), and the split of
the Python API's keyword form (`engine.sample(d, sampler=..., num_samples=4, length=128,
mask_id=...)`) into them and the `SamplingSettings`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

import torch
from torch import Tensor

from .errors import EngineError


@dataclass(frozen=True)
class Canvas:
    """`num_samples` rows of `length` tokens to fill: `prompt` (length,) or (num_samples,
    length) holds mask_id at the free positions and fixes every other one (prefix, suffix,
    infilling); `batch_size` rows run per batch (None: all); `device` (None: the prompt's, else
    the CPU)."""

    num_samples: int
    length: int
    mask_id: int
    prompt: Tensor | None = None
    batch_size: int | None = None
    device: torch.device | str | None = None

    def validate(self) -> Canvas:
        if self.num_samples < 1 or self.length < 1:
            raise EngineError(f"num_samples and length must be positive (got "
                              f"{self.num_samples}, {self.length})")
        return self

    @property
    def where(self) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return self.prompt.device if self.prompt is not None else torch.device("cpu")


@dataclass(frozen=True)
class SemiArPlan:
    """Semi-AR generation (§4.2): windows of `window` tokens, each after the first keeping the
    last window - stride as its clean prefix; `rounds` after the first window, or enough for
    `target_length`; the first window starts with `prompt` (P,) or (num_samples, P), P < L;
    with `stop_token` no round starts once every row holds it after the prompt."""

    num_samples: int
    window: int
    stride: int
    mask_id: int
    rounds: int | None = None
    target_length: int | None = None
    prompt: Tensor | None = None
    stop_token: int | None = None
    batch_size: int | None = None
    device: torch.device | str | None = None


@dataclass(frozen=True)
class SampleHooks:
    """What sees a run: `on_batch(n)` after each batch; `on_changes(steps, n_steps)` from the
    caching samplers, per batch (what benchmarks need for a whole-batch cache); `recorder`, a
    `RevealRecorder` (num_samples, length) for the `records_reveals` samplers; `on_block(round,
    new_tokens)` after each semi-AR window (for streaming); `on_step(z)` with the batch's whole
    state before each network call of every sampler, and once after its last (then
    `on_batch`): generation/decode.py's events."""

    on_batch: Callable[[int], None] | None = None
    on_changes: Callable[[list[int], int], None] | None = None
    recorder: Any = None
    on_block: Callable[[int, Tensor], None] | None = None
    on_step: Callable[[Tensor], None] | None = None  # the batch's state at each call and end


def _names(kind: type) -> set[str]:
    return {f.name for f in fields(kind)}


def split_keywords(kind: type, given: Any, hooks: SampleHooks | None,
                   keywords: dict[str, Any]) -> tuple[Any, SampleHooks, dict[str, Any]]:
    """(the `kind` instance (Canvas or SemiArPlan), the hooks, the settings keywords left) from
    the keyword form; a type given and its fields as keywords too is an EngineError."""
    own = {k: keywords.pop(k) for k in _names(kind) & set(keywords)}
    hooked = {k: keywords.pop(k) for k in _names(SampleHooks) & set(keywords)}
    for value, named, what in ((given, own, kind.__name__), (hooks, hooked, "SampleHooks")):
        if value is not None and named:
            raise EngineError(f"give the {what} or its fields as keywords, not both (got "
                              f"{', '.join(sorted(named))})")
    if given is None:
        missing = [f.name for f in fields(kind) if f.default is MISSING
                   and f.default_factory is MISSING and f.name not in own]
        if missing:
            raise EngineError(f"missing {', '.join(missing)} (or a {kind.__name__})")
        given = kind(**own)
    return given, hooks or SampleHooks(**hooked), keywords
