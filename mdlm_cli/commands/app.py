"""The Typer app that every command module registers on, and the option names of a command."""

from __future__ import annotations

import functools

import typer

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


def command_flags(command: str) -> set[str]:
    """The option names of an mdlm command (without dashes; `no-x` for a boolean's off switch):
    what `mdlm reproduce` checks a recipe's steps against."""
    return set(_all_command_flags()[command])


@functools.cache
def _all_command_flags() -> dict[str, frozenset[str]]:
    """Every command's option names, from one build of the click group: building it reads every
    command's signature (about 40 ms), and loading the recipes asks for flags 766 times."""
    group = typer.main.get_command(app)
    return {
        name: frozenset(
            opt[2:]
            for param in command.params
            for opt in [*param.opts, *getattr(param, "secondary_opts", [])]
            if opt.startswith("--")
        )
        for name, command in group.commands.items()
    }
