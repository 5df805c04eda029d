"""The model-loading flag group (`--checkpoint`, `--device`, `--raw-weights`, `--threads`, the
network's precision, a LoRA `--adapter`) as one `ModelLoading`, and loading the model a command
runs.

A command made with `@app.command(cls=loading_command(...))` gets these options beside its own
parameters (its signature stays what it reads) and reads them as `loading_from(ctx)`; with
`base=SamplingCommand` it gets the sampling flags too, and the network's precision is then
`--net-precision` (`--precision` is the draw's).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, fields
from typing import Annotated, Any, get_args

import typer
from typer.core import TyperCommand

from .console import note
from .options import (
    AdapterOpt,
    CheckpointOpt,
    DeviceOpt,
    NetPrecisionOpt,
    RawWeightsOpt,
    ThreadsOpt,
)
from .sampling_args import SamplingCommand, click_option


@dataclass(frozen=True)
class ModelLoading:
    """What `--checkpoint` and its loading flags ask for; each field's `option` is its flag."""

    checkpoint: str | None = field(default="runs/demo", metadata={"option": CheckpointOpt})
    device: str | None = field(default=None, metadata={"option": DeviceOpt})
    raw_weights: bool = field(default=False, metadata={"option": RawWeightsOpt})
    threads: int | None = field(default=None, metadata={"option": ThreadsOpt})
    net_precision: str = field(default="auto", metadata={"option": NetPrecisionOpt})
    adapter: str | None = field(default=None, metadata={"option": AdapterOpt})

    def load(self, device: str | None = None):
        """(loaded, rt): the checkpoint on its runtime, its notes printed; `device` replaces
        --device (eval-ppl's rank device under torchrun)."""
        from ..checkpoints.load import load_on_device

        loaded, rt = load_on_device(self.checkpoint, device=device or self.device,
                                    raw_weights=self.raw_weights, threads=self.threads,
                                    precision=self.net_precision, adapter=self.adapter)
        for text in loaded.state.get("notes") or []:  # e.g. an encoder's fresh MLM head
            note(text)
        return loaded, rt


def _parameters(checkpoint: str | None, checkpoint_help: str | None,
                precision_flag: str) -> list[inspect.Parameter]:
    """The group's parameters from ModelLoading's fields, with the command's own checkpoint
    default (and help) and the spelling of the network's precision flag."""
    out = []
    for f in fields(ModelLoading):
        annotation, default = f.metadata["option"], f.default
        base, info = get_args(annotation)
        if f.name == "checkpoint":
            default = checkpoint
            if checkpoint_help is not None:
                annotation = Annotated[str | None, typer.Option(
                    "--checkpoint", "-c", help=checkpoint_help)]
        elif f.name == "net_precision" and precision_flag != "--precision":
            annotation = Annotated[base, typer.Option(
                precision_flag, callback=info.callback, help=info.help)]
        out.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                     annotation=annotation))
    return out


class LoadingCommand(TyperCommand):
    """A command with the model-loading flags: generated from ModelLoading's fields, added to
    what Typer made of the function's parameters (--checkpoint first), taken out of the parsed
    values before the function runs and left as one `ModelLoading` (`loading_from(ctx)`)."""

    checkpoint_default: str | None = "runs/demo"
    checkpoint_help: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        flag = "--net-precision" if isinstance(self, SamplingCommand) else "--precision"
        self.loading = [click_option(q) for q in
                        _parameters(self.checkpoint_default, self.checkpoint_help, flag)]
        self.params = self.loading[:1] + self.params + self.loading[1:]

    def invoke(self, ctx: typer.Context) -> Any:
        values = {param.name: ctx.params.pop(param.name) for param in self.loading}
        ctx.meta[LOADING_KEY] = ModelLoading(**values)
        return super().invoke(ctx)


def loading_command(
    base: type[TyperCommand] = TyperCommand,
    *,
    checkpoint: str | None = "runs/demo",
    checkpoint_help: str | None = None,
) -> type[LoadingCommand]:
    """The command class of a command that loads a model: its --checkpoint default (and help,
    where it differs), on `base` (`SamplingCommand`, `SweepCommand`) for more flag groups."""
    attrs = {"checkpoint_default": checkpoint, "checkpoint_help": checkpoint_help}
    return type(f"Loading{base.__name__}", (LoadingCommand, base), attrs)


LOADING_KEY = "mdlm.loading"


def loading_from(ctx: typer.Context) -> ModelLoading:
    """The parsed model-loading flags of a `loading_command` command."""
    return ctx.meta[LOADING_KEY]
