"""`SamplingSettings`: how to draw, the one type every surface passes to `sample`.

The sampler, its steps, the categorical draw's precision, temperature, nucleus mass,
vocabulary top-k (None: the model's own default, Dream's 50; 0: off) and the sampler options
given (by name, and/or as an instance of the sampler's options dataclass).
The CLI flags, the Python API, `bench-sampler`'s rows, the server's request fields and
`lm-eval` all build one and call `validate()`, the one check of these values: its messages
name each value as the caller spells it (`--top-p` on the command line, `top_p` in a request).

One rule for temperature everywhere: a finite number, at least 0, with no upper cap (the
server once capped it at 2.0, OpenAI's range; nothing else did). Temperature 0 is greedy:
every categorical draw takes the most likely real token, without noise (top-p and top-k do
not change an argmax); a confidence is then the argmax's untempered softmax probability over
the tokens the top-p / top-k filters keep (Dream's sample_tokens; LLaDA's k-schedule reads
the unfiltered one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from .categorical import PRECISIONS
from .errors import EngineError
from .options import build_options, problem


class SettingsError(EngineError):
    """A sampling setting out of range; `name` is the setting's field (or option) name."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


def _as_is(name: str) -> str:
    return name


@dataclass(frozen=True)
class SamplingSettings:
    """How to draw. `sampler=None` leaves the choice to the model's objective
    (`Objective.choose_sampler`); the engine's `sample` needs a name."""

    sampler: str | None = None
    steps: int | None = None  # for the samplers that take steps
    precision: str = "fp64"  # the categorical draw's: fp64 (exact) or fp32 (the reference's)
    temperature: float = 1.0
    top_p: float = 1.0
    options: Mapping[str, Any] = field(default_factory=dict)  # option name -> value, as given
    # an instance of the sampler's options dataclass: the base `options` edit
    instance: Any = None
    top_k: int | None = None  # the k likeliest tokens kept; None: the model's default; 0: all
    cfg_scale: float = 0.0  # LLaDA's classifier-free guidance (engine/guidance.py); 0: off

    def validate(self, spell: Callable[[str], str] = _as_is) -> SamplingSettings:
        """These settings, checked; else a SettingsError whose message names the value as
        `spell(name)` writes it. The options are checked against every sampler declaring them."""
        from .registry import SAMPLERS, get_sampler

        if self.sampler is not None:
            get_sampler(self.sampler)
        if self.steps is not None and (isinstance(self.steps, bool) or self.steps < 1):
            raise SettingsError("steps", f"{spell('steps')} must be at least 1 "
                                f"(got {self.steps})")
        if self.precision not in PRECISIONS:
            raise SettingsError("precision", f"{spell('precision')} must be one of: "
                                f"{', '.join(PRECISIONS)} (got {self.precision!r})")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise SettingsError("temperature", f"{spell('temperature')} must be a finite number "
                                f"at least 0 (0: greedy) (got {self.temperature})")
        if not 0 < self.top_p <= 1:  # NaN fails too
            raise SettingsError("top_p", f"{spell('top_p')} must be a finite number in (0, 1] "
                                f"(got {self.top_p})")
        if not (math.isfinite(self.cfg_scale) and self.cfg_scale >= 0):
            raise SettingsError("cfg_scale", f"{spell('cfg_scale')} must be a finite number at "
                                f"least 0 (0: no guidance) (got {self.cfg_scale})")
        if self.top_k is not None and (isinstance(self.top_k, bool)
                                       or not isinstance(self.top_k, int) or self.top_k < 0):
            raise SettingsError("top_k", f"{spell('top_k')} must be an integer at least 0 "
                                f"(0: every token) (got {self.top_k})")
        declared = {f.name: f for spec in SAMPLERS.values() if spec.options
                    for f in fields(spec.options)}
        for name, value in self.options.items():
            if name not in declared:
                raise SettingsError(name, f"unknown sampler option {name!r}; the options are: "
                                    f"{', '.join(sorted(declared))}")
            wrong = problem(declared[name], value)
            if wrong is not None:
                raise SettingsError(name, f"{spell(name)} {wrong}")
        self._check_rules(spell)
        return self

    def _check_rules(self, spell: Callable[[str], str]) -> None:
        """The named sampler's rules across its options (e.g. a cache needs a block length),
        checked here rather than mid-run: its options dataclass's `rules(options)`."""
        from .registry import get_sampler

        spec = get_sampler(self.sampler) if self.sampler is not None else None
        if spec is not None and self.cfg_scale > 0:
            if not spec.guided:
                raise SettingsError("cfg_scale", f"{spell('cfg_scale')} does not apply to "
                                    f"{spec.name}: a left-to-right model has no prompt to mask")
            if self.options.get("cache", "none") != "none":
                raise SettingsError("cfg_scale", f"{spell('cfg_scale')} needs {spell('cache')} "
                                    "none (a cached call sees its block only)")
        rules = (getattr(spec.options, "rules", None)
                 if spec is not None and spec.options else None)
        if rules is None:
            return
        spelled = {f.name: spell(f.name) for f in fields(spec.options)}
        for name, message in rules(self.options_for(spec)):
            raise SettingsError(name, message.format(**spelled))

    def with_(self, **changes: Any) -> SamplingSettings:
        """A copy with `changes` (e.g. the sampler and steps an objective chose)."""
        return replace(self, **changes)

    def with_defaults(self, defaults: Mapping[str, Any] | None) -> SamplingSettings:
        """A copy with a model's own generation defaults (e.g. {"k_schedule": "llada"} for
        LLaDA, {"top_k": 50, ...} for Dream): `top_k` where none was given, and the options its
        sampler (named) reads that were not given: a given option, or one of the options
        instance, wins; others' options are not added (nothing to warn)."""
        from .registry import get_sampler

        if not defaults:
            return self
        spec, base = get_sampler(self.sampler), self.instance
        added = {k: v for k, v in defaults.items() if k in spec.option_names
                 and k not in self.options and (base is None or k not in _edited(base))}
        top_k = self.top_k if self.top_k is not None else defaults.get("top_k")
        return replace(self, options={**added, **self.options}, top_k=top_k)

    def read_by(self, spec) -> dict[str, Any]:
        """The options given that the sampler `spec` (a SamplerSpec) reads."""
        return {k: v for k, v in self.options.items() if k in spec.option_names}

    def options_for(self, spec) -> Any:
        """The checked instance of `spec`'s options dataclass these settings run it with."""
        from .registry import option_names

        return build_options(spec.options, self.instance, self.options, option_names(),
                             spec.name)

    def record(self) -> dict[str, Any]:
        """How samples were drawn (the sampler named), for their JSONL records."""
        from .registry import get_sampler

        spec = get_sampler(self.sampler)
        return {"sampler": spec.name, "steps": self.steps, "precision": self.precision,
                "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k or 0,
                **({"cfg_scale": self.cfg_scale} if self.cfg_scale else {}),
                **self.read_by(spec)}


def _edited(instance: Any) -> set[str]:
    """The fields of an options instance away from their defaults (given by the caller)."""
    return {f.name for f in fields(instance) if getattr(instance, f.name) != f.default}


def settings_of(values: Mapping[str, Any]) -> SamplingSettings:
    """Settings from engine.sample's keywords: sampler, steps, precision, temperature, top_p,
    top_k, `options=` (an options instance) and the option keywords (any other name)."""
    own = {"sampler", "steps", "precision", "temperature", "top_p", "top_k", "cfg_scale"}
    kept = {k: v for k, v in values.items() if k in own}
    named = {k: v for k, v in values.items() if k not in own | {"options"}}
    return SamplingSettings(**kept, options=named, instance=values.get("options"))
