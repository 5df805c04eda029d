"""The Typer app, consoles, error handling and options shared by the commands."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console

from ..errors import MdlmError

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

PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="Preset name (see `mdlm presets`) or a YAML file.")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", "-s", help="Override a config value, e.g. --set optim.lr=1e-4 (repeatable).")]


@contextmanager
def user_errors():
    """One red line and exit code 1 for user mistakes; tracebacks only with MDLM_DEBUG=1."""
    try:
        yield
    except MdlmError as e:
        if os.environ.get("MDLM_DEBUG"):
            raise
        rank = os.environ.get("RANK", "0")  # set by torchrun
        where = "" if rank == "0" else f"(rank {rank}) "
        err_console.print(f"[bold red]error:[/] {where}{e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None


CheckpointOpt = Annotated[str, typer.Option(
    "--checkpoint", "-c", help="Run folder (its latest checkpoint), step folder, Hugging Face hub id "
    "(e.g. kuleshov-group/mdlm-owt) or Hugging Face-style folder, or a reference Lightning .ckpt.")]
SamplerOpt = Annotated[str, typer.Option(
    help="ancestral | ancestral-cache | first-hitting (autoregressive checkpoints always sample left to right).")]
AR_SAMPLER = "autoregressive-kv-cache"


def load_for_command(checkpoint: str, device: str | None, raw_weights: bool):
    from ..checkpoint import load_checkpoint
    from ..runtime import Runtime

    rt = Runtime.create(device or "auto")
    loaded = load_checkpoint(checkpoint, ema=not raw_weights, device=rt.device)
    return loaded, rt


def check_sampler(sampler: str, precision: str) -> None:
    from ..engine import PRECISIONS, SAMPLERS

    if sampler not in SAMPLERS:
        raise MdlmError(f"unknown sampler {sampler!r}; choose one of: {', '.join(SAMPLERS)}")
    if precision not in PRECISIONS:
        raise MdlmError(f"--precision must be one of: {', '.join(PRECISIONS)}")


def int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MdlmError(f"{name} expects comma-separated integers, e.g. 100,1000 (got {text!r})") from None
    if not values or min(values) < 1:
        raise MdlmError(f"{name} expects positive integers (got {text!r})")
    return values
