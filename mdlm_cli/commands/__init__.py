"""One module per group of `mdlm` subcommands; importing a module registers its commands."""
