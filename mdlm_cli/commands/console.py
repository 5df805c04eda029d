"""The consoles, the one-line messages (note, warning, progress) and `user_errors`: a user's
mistake as one red line and exit code 1."""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager

import typer
from rich.console import Console
from rich.markup import escape

from ..engine.errors import EngineError
from ..errors import MdlmError, MdlmWarning
from ..io.files import os_error_message

console = Console()


err_console = Console(stderr=True)


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
