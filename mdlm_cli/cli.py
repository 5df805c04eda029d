"""`mdlm`: the command line. Thin: each command parses options, resolves the config and
calls one function; the commands live in `mdlm_cli/commands/`, one module per group."""

from __future__ import annotations

import importlib

from .commands.app import app

# Importing a command module registers its commands; this order is the order of `mdlm --help`.
COMMAND_MODULES = ("data", "train", "sample", "evaluate", "genppl", "lm_eval", "bench", "export",
                   "convert", "rl", "serve", "classify", "glue", "reproduce")
for _module in COMMAND_MODULES:
    importlib.import_module(f".commands.{_module}", __package__)

__all__ = ["app", "main"]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
