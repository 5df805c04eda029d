"""`mdlm export`."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import MdlmError
from .common import CheckpointOpt, ThreadsOpt, app, console, user_errors


@app.command("export")
def export_cmd(
    out: Annotated[str, typer.Option(help="Folder to write (config.json, model.safetensors, tokenizer, README).")],
    checkpoint: CheckpointOpt = "runs/demo",
    push_to_hub: Annotated[str | None, typer.Option(
        "--push-to-hub", help="Also upload the folder to this Hugging Face model repo (owner/name).")] = None,
    private: Annotated[bool, typer.Option(help="Create the hub repo as private.")] = False,
    raw_weights: Annotated[bool, typer.Option(help="Export the raw weights instead of the EMA.")] = False,
    results: Annotated[list[str] | None, typer.Option(
        help="JSON/JSONL evaluation records to list in the model card (repeatable).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace --out if it exists.")] = False,
    verify: Annotated[bool, typer.Option(help="Reload the export and check it gives identical logits.")] = True,
    threads: ThreadsOpt = None,
) -> None:
    """Export a checkpoint as a Hugging Face-style folder that mdlm (and the Hub) can load.

    EMA weights by default, the reference's parameter names and config.json fields, no Python code.

    [dim]Examples:[/]
      mdlm export --checkpoint runs/owt --out exports/mdlm-owt-mine
      mdlm export --checkpoint last.ckpt --out exports/from-lightning     # a reference Lightning checkpoint
      mdlm export --checkpoint runs/owt --out exports/x --push-to-hub me/mdlm-owt-mine
      mdlm sample --checkpoint exports/mdlm-owt-mine                      # loads back
    """
    from ..checkpoints.export import export_folder, read_results, verify_export, weights_kind
    from ..checkpoints.export import push_to_hub as push
    from ..checkpoints.load import load_checkpoint
    from ..runtime import Runtime

    with user_errors():
        Runtime.create("cpu", threads=threads or 0)
        records = read_results(results or [])
        loaded = load_checkpoint(checkpoint, ema=not raw_weights, device="cpu")
        folder = export_folder(loaded, out, weights=weights_kind(loaded, not raw_weights), results=records,
                               overwrite=overwrite, hub_id=push_to_hub)
        console.print(f"Exported {loaded.path} to {folder}", markup=False, highlight=False)
        if verify:
            diff = verify_export(loaded, folder)
            if diff != 0.0:
                raise MdlmError(f"{folder} reloads with different logits (max difference {diff:.3g})")
            console.print("Verified: the export reloads with identical logits")
        if push_to_hub:
            console.print(f"Pushed to {push(folder, push_to_hub, private=private)}", markup=False)
