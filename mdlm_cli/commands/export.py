"""`mdlm export`: a checkpoint as a Hugging Face-style folder; the export is
`checkpoints.export.export_checkpoint`."""

from __future__ import annotations

from typing import Annotated

import typer

from .app import app
from .console import console, user_errors
from .options import CheckpointOpt, ThreadsOpt

ExportOutOpt = Annotated[str, typer.Option(
    help="Folder to write (config.json, model.safetensors, tokenizer, README).")]
PushOpt = Annotated[str | None, typer.Option(
    "--push-to-hub",
    help="Also upload the folder to this Hugging Face model repo (owner/name).")]
PrivateOpt = Annotated[bool, typer.Option(help="Create the hub repo as private.")]
ExportRawWeightsOpt = Annotated[bool, typer.Option(
    help="Export the raw weights instead of the EMA.")]
ResultsOpt = Annotated[list[str] | None, typer.Option(
    help="JSON/JSONL evaluation records to list in the model card (repeatable).")]
OverwriteOpt = Annotated[bool, typer.Option(help="Replace --out if it exists.")]
VerifyOpt = Annotated[bool, typer.Option(
    help="Reload the export and check it gives identical logits (and, with an adapter, the "
         "unmerged model's).")]
MergeAdapterOpt = Annotated[str | None, typer.Option(
    "--merge-adapter", "--adapter", metavar="FOLDER",
    help="A LoRA adapter folder (peft's format) to merge into the exported weights; a LoRA "
         "run's own adapter is merged without it.")]


@app.command("export")
def export_cmd(
    out: ExportOutOpt,
    checkpoint: CheckpointOpt = "runs/demo",
    push_to_hub: PushOpt = None,
    private: PrivateOpt = False,
    raw_weights: ExportRawWeightsOpt = False,
    results: ResultsOpt = None,
    overwrite: OverwriteOpt = False,
    verify: VerifyOpt = True,
    threads: ThreadsOpt = None,
    merge_adapter: MergeAdapterOpt = None,
) -> None:
    """Export a checkpoint as a Hugging Face-style folder that mdlm (and the Hub) can load.

    EMA weights by default, no Python code; the backbone's layout: a DiT under the reference's
    parameter names and config.json fields, a LLaDA or Dream run (full or LoRA, merged) in its
    release's layout, a converted model in the layout mdlm convert wrote.

    [dim]Examples:[/]
      mdlm export --checkpoint runs/owt --out exports/mdlm-owt-mine
      mdlm export --checkpoint last.ckpt --out exports/from-lightning  # a reference Lightning .ckpt
      mdlm export --checkpoint runs/owt --out exports/x --push-to-hub me/mdlm-owt-mine
      mdlm sample --checkpoint exports/mdlm-owt-mine                   # loads back
      mdlm export --checkpoint runs/owt-lora --out exports/merged      # a LoRA run, merged
      mdlm export -c runs/owt --merge-adapter ADAPTER --out exports/m  # a peft adapter, merged
      mdlm export -c runs/llada-sft --out exports/llada-sft            # LLaDA's released layout
    """
    from ..checkpoints.export import ExportOptions, export_checkpoint

    with user_errors():
        options = ExportOptions(
            out, raw_weights=raw_weights, results=results or [], overwrite=overwrite,
            verify=verify, push_to_hub=push_to_hub, private=private, threads=threads,
            adapter=merge_adapter)
        export_checkpoint(checkpoint, options, on_step=_print)


def _print(line: str) -> None:
    console.print(line, markup=False, highlight=False)
