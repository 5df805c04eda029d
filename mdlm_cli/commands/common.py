"""The Typer app, consoles, error handling and options shared by the commands."""

from __future__ import annotations

import math
import os
import warnings
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ..engine.errors import EngineError
from ..engine.sampling import SAMPLERS
from ..errors import MdlmError, MdlmWarning
from ..io.files import os_error_message
from ..numbers import check_float
from ..objectives import OBJECTIVES

app = typer.Typer(
    name="mdlm",
    help="Train, evaluate and sample masked diffusion language models (MDLM).\n\n"
         "Start offline with [bold]mdlm train[/] (the embedded demo preset), then "
         "[bold]mdlm presets[/] to see the paper's configurations.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

def float_in(
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_in: bool = True,
    high_in: bool = True,
):
    """The callback of a float option: `check_float` at parse time, its error as one red line."""

    def check(param: typer.CallbackParam, value: float | None) -> float | None:
        if value is None:
            return value
        try:
            return check_float(param.opts[0], value, low, high, low_in=low_in, high_in=high_in)
        except MdlmError as e:
            err_console.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False,
                              soft_wrap=True)
            raise typer.Exit(1) from None

    return check


PresetOpt = Annotated[
    str, typer.Option("--preset", "-p", help="Preset name (see `mdlm presets`) or a YAML file.")
]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", "-s", help="Override a config value, e.g. --set optim.lr=1e-4 (repeatable).")]


@contextmanager
def user_errors():
    """One red line and exit code 1 for user mistakes and I/O failures (disk full, read-only
    folder); tracebacks only with MDLM_DEBUG=1. MdlmWarnings print as one yellow line.
    A first SIGTERM stops as Ctrl-C does, a second SIGTERM or Ctrl-C at once
    (signals.StopSignals)."""
    from ..signals import StopSignals

    try:
        stop = StopSignals(first="stopping", kept="the files written so far stay as they are")
        with warnings.catch_warnings(), stop:
            warnings.simplefilter("always", MdlmWarning)
            shown = warnings.showwarning

            def show(message, category, *args, **kwargs):
                if issubclass(category, MdlmWarning):
                    warn(str(message))
                else:
                    shown(message, category, *args, **kwargs)

            warnings.showwarning = show
            yield
    except (MdlmError, EngineError, OSError) as e:
        if os.environ.get("MDLM_DEBUG"):
            raise
        rank = os.environ.get("RANK", "0")  # set by torchrun
        where = "" if rank == "0" else f"(rank {rank}) "
        text = os_error_message(e) if isinstance(e, OSError) else str(e)
        err_console.print(
            f"[bold red]error:[/] {escape(where + text)}", highlight=False, soft_wrap=True
        )
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None


CheckpointOpt = Annotated[
    str,
    typer.Option(
        "--checkpoint",
        "-c",
        help="Run folder (its latest checkpoint), step folder, Hugging Face hub id "
        "(e.g. kuleshov-group/mdlm-owt) or Hugging Face-style folder, or a reference Lightning "
        ".ckpt.",
    ),
]
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


NumSamplesOpt = Annotated[int, typer.Option("--num-samples", "-n", help="Sequences to draw.")]
SeedOpt = Annotated[int, typer.Option(help="Random seed.")]
PromptOpt = Annotated[str | None, typer.Option(help="Text the samples start with.")]
PrecisionOpt = Annotated[str, typer.Option(
    help="Categorical sampling: fp64 (exact) or fp32 (the reference's truncated draw).")]
TemperatureOpt = Annotated[float, typer.Option(
    help="Softmax temperature.", callback=float_in(0, low_in=False))]
TopPOpt = Annotated[float, typer.Option(
    help="Nucleus sampling mass.", callback=float_in(0, 1, low_in=False))]
OutOpt = Annotated[str | None, typer.Option(help="Write JSONL records here (for mdlm gen-ppl).")]
DeviceOpt = Annotated[str | None, typer.Option(help="auto | cpu | cuda | cuda:N | mps.")]
JsonOpt = Annotated[str | None, typer.Option("--json", help="Write the results as JSON here.")]
RawWeightsOpt = Annotated[bool, typer.Option(help="Use the raw weights instead of the EMA.")]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        help="CPU threads for torch (default: OMP_NUM_THREADS if set, else one per physical core "
        "left idle by the machine's load, so a busy machine is not oversubscribed; see README).",
        min=1,
    ),
]


def net_precision(value: str | None) -> str | None:
    """Typer callback: the network precisions (`runtime.autocast_dtype`), a one-line error else."""
    if value is not None and value not in ("auto", "bf16", "fp32"):
        raise typer.BadParameter(f"must be auto, bf16 or fp32 (got {value!r})")
    return value


NetPrecisionOpt = Annotated[str, typer.Option(
    "--precision", callback=net_precision,
    help="The network's arithmetic: auto = bf16 autocast on CUDA and on CPUs with bf16 matrix "
         "units (AMX / AVX512-BF16), fp32 elsewhere; fp32 = no autocast.")]


def load_for_command(checkpoint: str, device: str | None, raw_weights: bool,
                     threads: int | None = None, precision: str = "auto"):
    from ..checkpoints.load import load_on_device

    loaded, rt = load_on_device(checkpoint, device=device, raw_weights=raw_weights,
                                threads=threads, precision=precision)
    for text in loaded.state.get("notes") or []:  # e.g. an encoder's freshly initialised MLM head
        note(text)
    return loaded, rt


def note(message: str) -> None:
    err_console.print(f"[yellow]note:[/] {escape(message)}", highlight=False)


def split_bars(progress, label: str):
    """The callback of data preparation, `on_docs(split, n, total)`, as one bar of `progress`
    per split, named `label` + the split's name."""
    bars: dict[str, int] = {}

    def on_docs(split: str, n: int, total: int | None) -> None:
        if split not in bars:
            bars[split] = progress.add_task(f"{label}{split}", total=total)
        progress.advance(bars[split], n)

    return on_docs


def say(line: str) -> None:
    """A line of progress on stderr as it is (names and paths in it are never markup)."""
    err_console.print(line, markup=False, highlight=False)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


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


def check_positive(**values: int | None) -> None:
    """Counts given on the command line (None = not given) must be at least 1."""
    for name, value in values.items():
        if value is not None and value < 1:
            raise MdlmError(f"--{name.replace('_', '-')} must be at least 1 (got {value})")


def int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MdlmError(
            f"{name} expects comma-separated integers, e.g. 100,1000 (got {text!r})"
        ) from None
    if not values or min(values) < 1:
        raise MdlmError(f"{name} expects positive integers (got {text!r})")
    return values


def command_flags(command: str) -> set[str]:
    """The option names of an mdlm command (without dashes; `no-x` for a boolean's off switch):
    what `mdlm reproduce` checks a recipe's steps against."""
    import typer

    click_command = typer.main.get_command(app).commands[command]
    names = set()
    for param in click_command.params:
        for opt in [*param.opts, *getattr(param, "secondary_opts", [])]:
            if opt.startswith("--"):
                names.add(opt[2:])
    return names


AllowLongerOpt = Annotated[bool, typer.Option(
    help="Allow --length beyond the length L the model was trained at: the rotary DiT runs at any "
         "length, but its quality past L is unknown (it never saw those positions).")]


def mauve_options(needs: str = "") -> tuple[object, object]:
    """The --featurizer and --mauve-seeds options (gen-ppl, bench-sampler); `needs` names the
    flag they apply with, where they need one. The seeds' default: MAUVE_SEEDS."""
    lead = f"With {needs}: " if needs else ""
    featurizer = Annotated[str | None, typer.Option(
        help=lead + "MAUVE's feature model: HF causal or masked LM (hub id, folder), an mdlm AR "
        "checkpoint, smollm2 (default: the judge).")]
    seeds = Annotated[str, typer.Option(
        help=lead + "MAUVE's k-means seeds, comma-separated (mean and sd).")]
    return featurizer, seeds


MAUVE_SEEDS = "0,1,2,3,4"
