"""The Typer app that every command module registers on, and the option names of a command."""

from __future__ import annotations

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
    import typer

    click_command = typer.main.get_command(app).commands[command]
    names = set()
    for param in click_command.params:
        for opt in [*param.opts, *getattr(param, "secondary_opts", [])]:
            if opt.startswith("--"):
                names.add(opt[2:])
    return names
