"""The sampling arguments `sample`, `semi-ar`, `gen-ppl --sample-first` and `bench-sampler` share.

--sampler, --steps, --precision, --temperature, --top-p, one flag per sampler option (made
from the fields of the specs' options dataclasses: name, help, valid values) and
`--opt name=value` for any of them. `@sampling_arguments()` puts these parameters in the
command's signature where it declares `sampling` (Typer reads `__signature__`) and hands it
one parsed, checked `Sampling`; `@sampling_arguments(sweep=True)` (bench-sampler) takes
comma-separated lists, a row per value, and hands a `SamplingSweep`.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import Field, dataclass, field, fields
from typing import Annotated, Any

import typer

from ..engine.options import KINDS, describe, problem, value_type
from ..engine.sampling import SAMPLERS, get_sampler
from ..errors import MdlmError
from ..sample.bench_request import SamplingSweep
from ..sample.draw import Drawing
from .common import (
    PrecisionOpt,
    SamplerOpt,
    StepsOpt,
    TemperatureOpt,
    TopPOpt,
    dashed,
    int_list,
    resolve_sampler,
    user_errors,
)

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


@dataclass
class Sampling:
    """What the user asked of the sampler; `options` holds only the options given."""

    sampler: str | None
    steps: int | None
    precision: str = "fp64"
    temperature: float = 1.0
    top_p: float = 1.0
    options: dict[str, Any] = field(default_factory=dict)  # option name -> value: flags, --opt

    def resolve(self, objective) -> tuple[Any, int | None]:
        """The sampler spec and steps to run for the objective (`resolve_sampler`: a warning
        for each option given that the sampler does not read)."""
        return resolve_sampler(objective, self.sampler, self.steps, self.options)

    def read_by(self, spec) -> dict[str, Any]:
        """The options given that the sampler `spec` reads (engine.sample's keywords)."""
        return {k: v for k, v in self.options.items() if k in spec.option_names}

    def engine_kwargs(self, spec) -> dict[str, Any]:
        """engine.sample's keywords of the drawing: precision, temperature, top_p, options."""
        return {
            "precision": self.precision,
            "temperature": self.temperature,
            "top_p": self.top_p,
            **self.read_by(spec),
        }

    def record(self, spec, steps: int | None) -> dict[str, Any]:
        """How samples were drawn, for their JSONL records."""
        return {"sampler": spec.name, "steps": steps, **self.engine_kwargs(spec)}

    def drawing(self, objective) -> Drawing:
        """The sampler and steps resolved for the objective (`resolve`), as sample.draw takes
        them."""
        spec, steps = self.resolve(objective)
        return Drawing(spec.name, steps, self.engine_kwargs(spec), self.record(spec, steps))

    def given(self) -> list[str]:
        """The sampling flags given on the command line (away from their defaults)."""
        out = [f"--{name}" for name in ("sampler", "steps") if getattr(self, name) is not None]
        out += [f"--{dashed(k)}" for k in self.options]
        return out + [
            f"--{dashed(k)}"
            for k, default in (("precision", "fp64"), ("temperature", 1.0), ("top_p", 1.0))
            if getattr(self, k) != default
        ]


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


def _check_common(precisions: list[str], temperature: float, top_p: float) -> None:
    from ..engine import PRECISIONS

    for p in precisions:
        if p not in PRECISIONS:
            raise MdlmError(f"--precision must be one of: {', '.join(PRECISIONS)} (got {p!r})")
    if temperature <= 0:
        raise MdlmError(f"--temperature must be > 0 (got {temperature})")
    if not 0 < top_p <= 1:
        raise MdlmError(f"--top-p must be in (0, 1] (got {top_p})")


def parse_sampling(values: dict[str, Any]) -> Sampling:
    """The single-valued flags (sample, semi-ar, gen-ppl) as a checked `Sampling`."""
    flags = option_flags()
    if values["sampler"] is not None:
        get_sampler(values["sampler"])
    if values["steps"] is not None and values["steps"] < 1:
        raise MdlmError(f"--steps must be at least 1 (got {values['steps']})")
    _check_common([values["precision"]], values["temperature"], values["top_p"])
    given = {n: _check(n, flags[n].field, values[n]) for n in flags if values[n] is not None}
    opts = {n: _coerce(n, flags[n].field, t) for n, t in _opt_pairs(values["opt"], flags).items()}
    return Sampling(
        values["sampler"],
        values["steps"],
        values["precision"],
        values["temperature"],
        values["top_p"],
        _merge(given, opts),
    )


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
    _check_common(precisions, values["temperature"], values["top_p"])
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
        else [p("sampler", SamplerOpt), p("steps", StepsOpt), p("precision", PrecisionOpt, "fp64")]
    )
    head += [p("temperature", TemperatureOpt, 1.0), p("top_p", TopPOpt, 1.0)]
    options = [_option_parameter(name, flag, sweep) for name, flag in option_flags().items()]
    return head + options + [p("opt", SweepOptOpt if sweep else OptOpt)]


def sampling_arguments(*, sweep: bool = False):
    """Decorator: the shared sampling parameters in place of the command's `sampling`
    parameter, which receives them parsed (a `Sampling`, or with `sweep` a `SamplingSweep`).
    A mistake in them is a one-line error before the command runs."""

    def decorate(command):
        sig = inspect.signature(command, eval_str=True)
        params = list(sig.parameters.values())
        names = [q.name for q in params]
        generated = _parameters(sweep)
        clash = {q.name for q in generated} & set(names)
        if "sampling" not in names or clash:
            raise TypeError(
                f"{command.__name__} needs a `sampling` parameter and none of {sorted(clash)}"
            )
        at = names.index("sampling")

        @functools.wraps(command)
        def wrapper(**kwargs):
            values = {q.name: kwargs.pop(q.name, q.default) for q in generated}
            with user_errors():
                kwargs["sampling"] = parse_sweep(values) if sweep else parse_sampling(values)
            return command(**kwargs)

        new = (
            [q.replace(kind=KEYWORD) for q in params[:at]]
            + generated
            + [q.replace(kind=KEYWORD) for q in params[at + 1 :]]
        )
        wrapper.__signature__ = sig.replace(parameters=new)
        wrapper.__annotations__ = {q.name: q.annotation for q in new}
        del wrapper.__wrapped__  # what Typer reads is the signature above
        return wrapper

    return decorate
