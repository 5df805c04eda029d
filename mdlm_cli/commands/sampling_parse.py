"""From the sampling flags' values to what the engine reads: a checked `SamplingSettings`
(`parse_sampling`: sample, semi-ar, gen-ppl, lm-eval) or `SamplingSweep` (`parse_sweep`:
bench-sampler's comma-separated lists), the sampler the objective picks (`resolve_sampler`,
`resolved`), and the flags' names (`dashed`, `flag`, `option_flags`). sampling_args.py makes
the flags; this module reads them."""

from __future__ import annotations

from dataclasses import Field, dataclass, fields
from typing import Any

from ..engine.errors import EngineError
from ..engine.options import KINDS, describe, problem, value_type
from ..engine.sampling import SAMPLERS, get_sampler
from ..engine.settings import SamplingSettings
from ..errors import MdlmError
from ..sample.bench_request import SamplingSweep
from .console import err_console, warn
from .flag_checks import int_list


def dashed(name: str) -> str:
    """An option's name as its flag is spelt: tokens_per_step -> tokens-per-step."""
    return name.replace("_", "-")


def flag_text(name: str, value) -> str:
    """A sampler option as its flag reads on the command line: `--eta 0.1`, `--no-final-denoise`."""
    if isinstance(value, bool):
        return f"--{'' if value else 'no-'}{dashed(name)}"
    return f"--{dashed(name)} {value}"


def resolve_sampler(
    objective, sampler: str | None, steps: int | None, options: dict | None = None
):
    """The sampler spec and steps a command runs, from the user's flags and the objective's
    samplers (`Objective.choose_sampler`); a warning for each flag the sampler does not read.

    `options`: the sampler options the user gave (name -> value).
    """
    choice = objective.choose_sampler(sampler, steps, options)
    if choice.note:
        err_console.print(f"[dim]--{choice.note}[/]", highlight=False)
    for name, value in choice.ignored.items():
        if name == "steps":
            warn(f"{choice.spec.name} takes no steps; --steps {value} is ignored")
        else:
            warn(f"{flag_text(name, value)} does not apply to {choice.spec.name}; ignored")
    return choice.spec, choice.steps


TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


@dataclass(frozen=True)
class OptionFlag:
    field: Field  # its first declaration (registry order); tests check that the others agree
    samplers: tuple[str, ...]  # the samplers that read it


def option_flags() -> dict[str, OptionFlag]:
    """Every sampler option by name, with the samplers that read it (registry order)."""
    found: dict[str, list] = {}
    for spec in SAMPLERS.values():
        for f in fields(spec.options) if spec.options else ():
            found.setdefault(f.name, [f, []])[1].append(spec.name)
    return {name: OptionFlag(f, tuple(names)) for name, (f, names) in found.items()}


def flag(name: str) -> str:
    """How a setting is spelt on the command line: top_p -> --top-p (`validate`'s spelling)."""
    return f"--{dashed(name)}"


def resolved(settings: SamplingSettings, loaded) -> SamplingSettings:
    """The settings with the sampler and steps the loaded model's objective chose
    (`resolve_sampler`: a warning for each option given that the sampler does not read), and
    the model's own option defaults for those not given (`LoadedModel.sampling_defaults`)."""
    spec, steps = resolve_sampler(loaded.objective, settings.sampler, settings.steps,
                                  settings.options)
    how = settings.with_(sampler=spec.name, steps=steps)
    return _validated(how.with_defaults(loaded.sampling_defaults))


def given(settings: SamplingSettings) -> list[str]:
    """The sampling flags given on the command line (away from their defaults)."""
    default = SamplingSettings()
    names = ["sampler", "steps", *settings.options, "precision", "temperature", "top_p", "top_k",
             "cfg_scale"]
    return [flag(k) for k in names
            if k in settings.options or getattr(settings, k, None) != getattr(default, k, None)]


def _check(name: str, f: Field, value: Any) -> Any:
    wrong = problem(f, value)
    if wrong is not None:
        raise MdlmError(f"--{dashed(name)} {wrong}")
    return value


def _coerce(name: str, f: Field, text: str) -> Any:
    """One value of an option from text (--opt, or one item of a list), checked."""
    kind, text = value_type(f), text.strip()
    if kind is bool and text.lower() in TRUE + FALSE:
        return text.lower() in TRUE
    try:
        value = kind(text) if kind is not bool else None
    except ValueError:
        value = None
    if value is None:
        valid = describe(f)
        expected = KINDS[kind] + ("" if valid == KINDS[kind] else f", {valid}")
        raise MdlmError(f"--{dashed(name)} expects {expected} (got {text!r})")
    return _check(name, f, value)


def _opt_pairs(opt: list[str] | None, flags: dict[str, OptionFlag]) -> dict[str, str]:
    """--opt name=value items as name -> text (names with - or _)."""
    out: dict[str, str] = {}
    for item in opt or []:
        name, eq, text = item.partition("=")
        name = name.strip().replace("-", "_")
        if not eq:
            raise MdlmError(f"--opt expects name=value, e.g. --opt eta=0.02 (got {item!r})")
        if name not in flags:
            raise MdlmError(
                f"--opt {item}: unknown sampler option {name!r}; the options are: "
                f"{', '.join(sorted(flags))}"
            )
        out[name] = text
    return out


def _merge(flag_values: dict[str, Any], opt_values: dict[str, Any]) -> dict[str, Any]:
    twice = sorted(set(flag_values) & set(opt_values))
    if twice:
        raise MdlmError(f"--{dashed(twice[0])} is given twice (as a flag and as --opt)")
    return flag_values | opt_values


def parse_sampling(values: dict[str, Any]) -> SamplingSettings:
    """The single-valued flags (sample, semi-ar, gen-ppl) as checked `SamplingSettings`."""
    flags = option_flags()
    given = {n: values[n] for n in flags if values[n] is not None}
    opts = {n: _coerce(n, flags[n].field, t)
            for n, t in _opt_pairs(values["opt"], flags).items()}
    settings = SamplingSettings(
        values["sampler"],
        values["steps"],
        values["precision"],
        values["temperature"],
        values["top_p"],
        _merge(given, opts),
        top_k=values.get("top_k"),
        cfg_scale=values.get("cfg_scale") or 0.0,
    )
    return _validated(settings)


def _validated(settings: SamplingSettings) -> SamplingSettings:
    try:
        return settings.validate(flag)
    except EngineError as e:
        raise MdlmError(str(e)) from None


def _value_list(name: str, f: Field, text: str) -> list:
    values = [_coerce(name, f, x) for x in text.split(",") if x.strip()]
    if not values:
        raise MdlmError(f"--{dashed(name)} needs at least one value")
    return values


def parse_sweep(values: dict[str, Any]) -> SamplingSweep:
    """bench-sampler's flags (comma-separated lists) as a checked `SamplingSweep`."""
    flags = option_flags()
    names = (
        [x.strip() for x in values["samplers"].split(",") if x.strip()]
        if values["samplers"]
        else None
    )
    for name in names or []:
        get_sampler(name)
    precisions = [x.strip() for x in values["precision"].split(",") if x.strip()]
    for p in precisions:
        _validated(SamplingSettings(None, None, p, values["temperature"], values["top_p"],
                                    top_k=values.get("top_k")))
    steps = int_list(values["steps"] or "100,1000", "--steps")
    given = {}
    for n, flag in flags.items():
        if values[n] is not None:
            given[n] = (
                [_check(n, flag.field, values[n])]
                if value_type(flag.field) is bool
                else _value_list(n, flag.field, values[n])
            )
    opts = {
        n: _value_list(n, flags[n].field, t) for n, t in _opt_pairs(values["opt"], flags).items()
    }
    return SamplingSweep(
        names,
        steps,
        values["steps"],
        precisions,
        values["temperature"],
        values["top_p"],
        _merge(given, opts),
        values.get("top_k"),
    )
