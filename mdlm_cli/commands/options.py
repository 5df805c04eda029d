"""The option aliases that several commands share (`Annotated[type, typer.Option(...)]`), each
name meaning one flag; a command's own aliases stay in its module, the sampling flags are in
sampling_args.py."""

from __future__ import annotations

import math
from typing import Annotated

import typer
from rich.markup import escape

from ..errors import MdlmError
from ..numbers import check_float
from .console import err_console


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


NumSamplesOpt = Annotated[int, typer.Option("--num-samples", "-n", help="Sequences to draw.")]


SeedOpt = Annotated[int, typer.Option(help="Random seed.")]


PromptOpt = Annotated[str | None, typer.Option(help="Text the samples start with.")]


OutOpt = Annotated[str | None, typer.Option(help="Write JSONL records here (for mdlm gen-ppl).")]


DeviceOpt = Annotated[str | None, typer.Option(help="auto | cpu | cuda | cuda:N | mps.")]


JsonOpt = Annotated[str | None, typer.Option("--json", help="Write the results as JSON here.")]


DatasetOpt = Annotated[str | None, typer.Option(
    help="Data set name or local text path (default: the checkpoint's own data).")]


LengthOpt = Annotated[int | None, typer.Option(
    help="Tokens per sample (default: the model's L; mdlm sample of a LLaDA or Dream folder: "
         "the prompt and its family's 128 or 512 new tokens, docs/sampling.md).")]


RawWeightsOpt = Annotated[bool, typer.Option(help="Use the raw weights instead of the EMA.")]
AdapterOpt = Annotated[str | None, typer.Option(
    "--adapter", metavar="FOLDER",
    help="A LoRA adapter in peft's folder format (adapter_config.json, "
         "adapter_model.safetensors; a LoRA run's checkpoints/step-N/adapter), merged into the "
         "--checkpoint model it was trained on.")]


ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        help="CPU threads for torch (default: OMP_NUM_THREADS if set, else one per physical "
             "core "
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
         "units (AMX / AVX512-BF16) for models 192 wide or more, fp32 elsewhere; fp32 = no "
         "autocast.")]


AllowLongerOpt = Annotated[bool, typer.Option(
    help="Allow --length beyond the length L the model was trained at: the rotary DiT "
         "runs at any length, but its quality past L is unknown (it never saw those "
         "positions).")]


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
FeaturizerOpt, MauveSeedsOpt = mauve_options()  # gen-ppl's; bench-sampler's need a flag
