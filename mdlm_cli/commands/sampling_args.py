"""The sampling arguments `sample`, `semi-ar`, `gen-ppl --sample-first` and `bench-sampler` share.

--sampler, --steps, --precision, --temperature, --top-p, one flag per sampler option (made
from the fields of the specs' options dataclasses: name, help, valid values) and
`--opt name=value` for any of them. A command made with `@app.command(cls=SamplingCommand)`
gets these options beside its own parameters (its signature stays what it reads) and reads
them, parsed and checked, as `sampling_from(ctx)`: one `SamplingSettings`; with
`cls=SweepCommand` (bench-sampler) they take comma-separated lists, a row per value, and
arrive as a `SamplingSweep`.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import Field, dataclass, fields
from typing import Annotated, Any, get_args

import typer
import typer.main
from typer.core import TyperCommand, TyperOption
from typer.models import ParamMeta

from ..engine.errors import EngineError
from ..engine.options import KINDS, describe, problem, value_type
from ..engine.sampling import SAMPLERS, get_sampler
from ..engine.settings import SamplingSettings
from ..errors import MdlmError
from ..objectives import OBJECTIVES
from ..sample.bench_request import SamplingSweep
from .console import err_console, user_errors, warn
from .flag_checks import int_list

SamplerOpt = Annotated[
    str | None,
    typer.Option(
        help="Sampler (default: the model's own: "
        + ", ".join(f"{o.default_sampler} for {name.upper()}"  # from the objectives' registry
                    for name, o in OBJECTIVES.items() if o.default_sampler)
        + "; with --steps a step-based one). "
        + "; ".join(f"{name}: {spec.help}" for name, spec in SAMPLERS.items())
        + "."
    ),
]
StepsOpt = Annotated[
    int | None,
    typer.Option(
        help="Sampling steps, for the samplers that take steps (default 1000; a D3PM model's T). "
        "Given without --sampler, it picks the model's exact step-based sampler (the cached one "
        "where the model ignores time)."
    ),
]
DrawPrecisionOpt = Annotated[str, typer.Option(  # the draw's; the network's is NetPrecisionOpt
    "--precision",
    help="Categorical sampling: fp64 (exact) or fp32 (the reference's truncated draw).")]
# checked with the other sampling settings (SamplingSettings.validate), not here
TemperatureOpt = Annotated[float, typer.Option(
    help="Softmax temperature: a finite number, at least 0 (0: greedy, the argmax at every "
    "draw).")]
TopPOpt = Annotated[float, typer.Option(help="Nucleus sampling mass, in (0, 1].")]
CfgScaleOpt = Annotated[float, typer.Option(
    help="LLaDA's classifier-free guidance: each call runs the model on z and on z with the "
         "prompt masked (one call of twice the rows) and takes un + (s + 1)(cond - un); 0: "
         "off. Not with a block cache or a left-to-right model.")]
TopKOpt = Annotated[int | None, typer.Option(
    help="Vocabulary top-k: draw from the k likeliest tokens only (after --top-p), and rank "
         "confidences over them. Default: the model's own (50 for a Dream folder, as its "
         "released generation code; none for others); 0 turns it off.")]


def dashed(name: str) -> str:
    """An option's name as its flag is spelt: tokens_per_step -> tokens-per-step."""
    return name.replace("_", "-")


def flag_text(name: str, value) -> str:
    """A sampler option as its flag reads on the command line: `--eta 0.1`, `--no-final-denoise`."""
    if isinstance(value, bool):
        return f"--{'' if value else 'no-'}{dashed(name)}"
    return f"--{dashed(name)} {value}"


def resolve_sampler(objective, sampler: str | None, steps: int | None, options: dict | None = None):
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
KEYWORD = inspect.Parameter.KEYWORD_ONLY


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
    opts = {n: _coerce(n, flags[n].field, t) for n, t in _opt_pairs(values["opt"], flags).items()}
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


def _option_parameter(name: str, flag: OptionFlag, sweep: bool) -> inspect.Parameter:
    f = flag.field
    kind, readers = value_type(f), ", ".join(flag.samplers)
    default = ("on" if f.default else "off") if kind is bool else f"{f.default!r}".strip("'")
    if kind is bool:
        decl, annotation = f"--{dashed(name)}/--no-{dashed(name)}", bool | None
        text = f"{readers}: {f.metadata['help']} Default: {default}."
    elif sweep:
        decl, annotation = f"--{dashed(name)}", str | None
        text = (
            f"{readers}: {f.metadata['help']} Comma-separated values, a row each "
            f"({describe(f)}; default {default})."
        )
    else:
        decl, annotation = f"--{dashed(name)}", kind | None
        text = f"{readers}: {f.metadata['help']} {describe(f).capitalize()}; default {default}."
    return inspect.Parameter(
        name, KEYWORD, default=None, annotation=Annotated[annotation, typer.Option(decl, help=text)]
    )


OptOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--opt",
        help="A sampler option by name, e.g. --opt eta=0.02 (repeatable; the flags above "
        "name the options and the samplers that read them).",
    ),
]
SweepOptOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--opt",
        help="A sampler option by name with comma-separated values, e.g. --opt eta=0,0.02 "
        "(repeatable).",
    ),
]
SamplersOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated samplers (default: every exact sampler of the model's objective; "
        f"name an inexact one to add it: {', '.join(n for n, s in SAMPLERS.items() if not s.exact)}"
        ")."
    ),
]
StepsListOpt = Annotated[
    str | None,
    typer.Option(
        "--steps",
        help="Comma-separated step counts, for the samplers that take steps (default 100,1000).",
    ),
]
PrecisionsOpt = Annotated[
    str,
    typer.Option(
        "--precision", help="Comma-separated: fp64 (default), fp32 (the reference's draw)."
    ),
]


def _parameters(sweep: bool) -> list[inspect.Parameter]:
    """The generated parameters, in the order `--help` lists them."""

    def p(name, annotation, default=None):
        return inspect.Parameter(name, KEYWORD, default=default, annotation=annotation)

    head = (
        [
            p("samplers", SamplersOpt),
            p("steps", StepsListOpt),
            p("precision", PrecisionsOpt, "fp64"),
        ]
        if sweep
        else [
            p("sampler", SamplerOpt),
            p("steps", StepsOpt),
            p("precision", DrawPrecisionOpt, "fp64"),
        ]
    )
    head += [p("temperature", TemperatureOpt, 1.0), p("top_p", TopPOpt, 1.0),
             p("top_k", TopKOpt, None)]
    if not sweep:  # bench-sampler's rows draw without guidance
        head.append(p("cfg_scale", CfgScaleOpt, 0.0))
    options = [_option_parameter(name, flag, sweep) for name, flag in option_flags().items()]
    return head + options + [p("opt", SweepOptOpt if sweep else OptOpt)]


def click_option(q: inspect.Parameter) -> TyperOption:
    """The Typer option of one generated parameter, built as Typer builds a signature's
    (`Annotated[type, typer.Option(...)] = default`), so --help shows it the same way."""
    base, info = get_args(q.annotation)[0], copy.copy(get_args(q.annotation)[1])
    if info.default is not ...:  # in Annotated, Option's first argument is a flag name
        info.param_decls = (info.default, *(info.param_decls or ()))
    info.default = q.default
    return typer.main._get_param(ParamMeta(name=q.name, default=info, annotation=base))


class SamplingCommand(TyperCommand):
    """A command with the sampling flags: the options generated from SAMPLERS are appended
    to what Typer made of the function's own parameters; before the function runs they are
    taken out of the parsed values, checked, and left as one `SamplingSettings` (a
    `SamplingSweep` for `SweepCommand`) that the function reads with `sampling_from(ctx)`."""

    sweep = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = [click_option(q) for q in _parameters(self.sweep)]
        self.params += self.group

    def invoke(self, ctx: typer.Context) -> Any:
        values = {}
        for param in self.group:
            value = ctx.params.pop(param.name)
            values[param.name] = list(value) if isinstance(value, tuple) else value
        with user_errors():
            ctx.meta[SAMPLING_KEY] = parse_sweep(values) if self.sweep else parse_sampling(values)
        return super().invoke(ctx)


class SweepCommand(SamplingCommand):
    """bench-sampler's: comma-separated lists, a row per value."""

    sweep = True


SAMPLING_KEY = "mdlm.sampling"


def sampling_from(ctx: typer.Context):
    """The parsed sampling flags of a `SamplingCommand` (or `SweepCommand`)."""
    return ctx.meta[SAMPLING_KEY]
