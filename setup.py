"""The package list, found rather than written by hand: every package under mdlm_cli/, plus the
top-level presets/ folder shipped as mdlm_cli.presets (pyproject.toml maps it; setuptools' own
discovery cannot add a mapped folder to the packages it finds). Everything else is in pyproject.toml."""

from setuptools import find_packages, setup

setup(packages=[*find_packages(include=["mdlm_cli", "mdlm_cli.*"]), "mdlm_cli.presets", "mdlm_cli.presets.tables"])
