"""The sampling arguments `sample`, `semi-ar`, `gen-ppl --sample-first` and `bench-sampler` share
(made here as Typer options; their values read by sampling_parse.py).

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
from typing import Annotated, Any, get_args

import typer
import typer.main
from typer.core import TyperCommand, TyperOption
from typer.models import ParamMeta

from ..engine.options import describe, value_type
from ..engine.sampling import SAMPLERS
from ..objectives import OBJECTIVES
from .console import user_errors
from .sampling_parse import OptionFlag, dashed, option_flags, parse_sampling, parse_sweep

KEYWORD = inspect.Parameter.KEYWORD_ONLY

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
        help="Sampling steps, for the samplers that take steps (default 1000; a D3PM model's "
             "T). "
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
        name, KEYWORD, default=None,
        annotation=Annotated[annotation, typer.Option(decl, help=text)]
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
        "name an inexact one to add it: "
        f"{', '.join(n for n, s in SAMPLERS.items() if not s.exact)}"
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
            ctx.meta[SAMPLING_KEY] = (parse_sweep(values) if self.sweep
                                      else parse_sampling(values))
        return super().invoke(ctx)


class SweepCommand(SamplingCommand):
    """bench-sampler's: comma-separated lists, a row per value."""

    sweep = True


SAMPLING_KEY = "mdlm.sampling"


def sampling_from(ctx: typer.Context):
    """The parsed sampling flags of a `SamplingCommand` (or `SweepCommand`)."""
    return ctx.meta[SAMPLING_KEY]
