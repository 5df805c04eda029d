"""`mdlm glue`: GLUE fine-tuning of an encoder (Table 4); each task is `tasks.glue.run_task`."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from .app import app
from .console import console, err_console, say, user_errors
from .options import CheckpointOpt, DeviceOpt, JsonOpt, ThreadsOpt, float_in

ALL_TASKS = "cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte"
GlueTasksOpt = Annotated[str, typer.Option(
    help=f"Comma-separated tasks: {ALL_TASKS} (GLUE) or bigtxt-swap (offline).")]
GlueDataOpt = Annotated[str | None, typer.Option(
    help="Local task files: DIR/TASK/{train,validation}.jsonl|csv|tsv (MNLI: validation_matched "
         "and validation_mismatched), GLUE's columns and `label`.")]
GlueEpochsOpt = Annotated[float, typer.Option(
    help="Training epochs (HF text-classification example: 3).",
    callback=float_in(0, low_in=False))]
LrOpt = Annotated[float, typer.Option(
    help="Peak learning rate, decayed linearly to 0 (HF example: 2e-5).",
    callback=float_in(0, low_in=False))]
GlueBatchSizeOpt = Annotated[int, typer.Option(help="Training batch (app. D.6: 16).")]
GlueMaxLengthOpt = Annotated[int, typer.Option(help="Tokens per example, longer ones "
                                                    "truncated.")]
MaxTrainRowsOpt = Annotated[int, typer.Option(
    help="Train on a random subset of N rows (0 = all).")]
MaxEvalRowsOpt = Annotated[int, typer.Option(
    help="Evaluate on the first N rows of each split (0 = all).")]
GlueSeedOpt = Annotated[int, typer.Option(
    help="Seed of the head's initialisation and the data order.")]


@app.command("glue")
def glue_cmd(
    checkpoint: CheckpointOpt = "runs/demo-bert",
    tasks: GlueTasksOpt = ALL_TASKS,
    data: GlueDataOpt = None,
    epochs: GlueEpochsOpt = 3.0,
    lr: LrOpt = 2e-5,
    batch_size: GlueBatchSizeOpt = 16,
    max_length: GlueMaxLengthOpt = 128,
    max_train_rows: MaxTrainRowsOpt = 0,
    max_eval_rows: MaxEvalRowsOpt = 0,
    seed: GlueSeedOpt = 42,
    threads: ThreadsOpt = None,
    json_out: JsonOpt = None,
    device: DeviceOpt = None,
) -> None:
    """Fine-tune a classification head on a checkpoint's encoder for each GLUE task (Table 4).

    The encoder: an hf-mlm checkpoint (run, step folder or export) or a Hugging Face masked LM
    itself, so "before vs after MDLM fine-tuning" is two commands. Its pooler and classifier are
    freshly initialised in both cases. Metrics as the paper: F1 for QQP and MRPC, Spearman for
    STS-B, accuracy otherwise, matched / mismatched for MNLI, on GLUE's validation splits.

    [dim]Examples:[/]
      mdlm glue --checkpoint bert-base-uncased --json before.json           # GLUE from the Hub
      mdlm glue --checkpoint runs/bert-ft --json after.json
      mdlm glue --checkpoint runs/demo-bert --tasks bigtxt-swap              # offline task
      mdlm glue --checkpoint sentence-transformers/all-MiniLM-L6-v2 --tasks rte --data my-glue/
    """
    from ..runtime import Runtime
    from ..tasks.glue import GlueRecipe, GlueRows, load_encoder
    from ..tasks.glue_data import get_task

    with user_errors():
        chosen = [get_task(name.strip()) for name in tasks.split(",") if name.strip()]
        recipe = GlueRecipe(batch_size=batch_size, epochs=epochs, lr=lr, max_length=max_length,
                            seed=seed)
        rt = Runtime.create(device or "auto", "fp32", threads or 0)
        encoder = load_encoder(checkpoint)
        say(f"Encoder: {encoder.name}; device {rt.describe()}")
        rows = GlueRows(data_dir=data, max_train_rows=max_train_rows,
                        max_eval_rows=max_eval_rows)
        records = [_run_one(encoder, task, recipe, rt, rows) for task in chosen]
        _print_table(records)
        if json_out:
            _write_json(json_out, checkpoint, encoder, recipe, records)


def _run_one(encoder, task, recipe, rt, rows) -> dict:
    """One task fine-tuned and evaluated, with a progress bar of its steps and loss."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from ..tasks.glue import run_task

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeRemainingColumn())
    with Progress(*columns, console=err_console, transient=True) as progress:
        bar = progress.add_task(f"{task.name}: fine-tuning", total=None, info="")

        def on_step(step: int, total: int, loss: float) -> None:
            progress.update(bar, completed=step, total=total, info=f"loss {loss:.3f}")

        return run_task(encoder, task, recipe, device=rt.device, rows=rows, on_step=on_step)


def _write_json(path: str, checkpoint: str, encoder, recipe, records: list[dict]) -> None:
    from pathlib import Path

    from ..tasks.glue import recipe_dict

    record = {"checkpoint": checkpoint, "encoder": encoder.name, "recipe": recipe_dict(recipe),
              "pooler_and_head": "fresh", "tasks": records}
    Path(path).write_text(json.dumps(record, indent=2))
    console.print(f"Wrote {path}")


def _print_table(records: list[dict]) -> None:
    table = Table("task", "metric", "value", "details", "train rows", "seconds", box=None)
    for r in records:
        splits = [k for k in ("validation", "matched", "mismatched") if k in r]
        details = "; ".join(
            f"{s}: " + ", ".join(f"{k} {v:.4f}" for k, v in r[s].items() if k != "rows")
            for s in splits)
        table.add_row(r["task"], r["metric"], f"{r['value']:.4f}", details,
                      f"{r['train_rows']:,}", f"{r['seconds']:.0f}")
    console.print(table)
