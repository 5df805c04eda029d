"""`mdlm classify`: Genomic Benchmarks fine-tuning of a DNA checkpoint (Table 7)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..errors import MdlmError
from .common import (
    CheckpointOpt,
    DeviceOpt,
    RawWeightsOpt,
    app,
    check_float,
    console,
    err_console,
    load_for_command,
    user_errors,
)


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MdlmError(f"{name} expects comma-separated numbers, e.g. 1e-3,2e-3 (got {text!r})") from None
    if not values:
        raise MdlmError(f"{name} expects positive numbers (got {text!r})")
    return [check_float(name, v, 0, low_in=False) for v in values]


@app.command("classify")
def classify_cmd(
    data: Annotated[str, typer.Option(help="A Genomic Benchmarks task folder: <task>/{train,test}/<class>/*.txt.")],
    checkpoint: CheckpointOpt = "runs/dna-caduceus-ps-1k",
    lrs: Annotated[str, typer.Option(help="Learning rates of the sweep.")] = "1e-3,2e-3",
    batch_sizes: Annotated[str, typer.Option(help="Batch sizes of the sweep.")] = "128,256",
    seeds: Annotated[str, typer.Option(help="Seeds (each its own 90/10 train/validation split).")] = "1,2,3,4,5",
    epochs: Annotated[int, typer.Option(help="Epochs per run (the best validation epoch is tested).")] = 10,
    max_length: Annotated[int, typer.Option(
        help="Bases per sequence (left-padded, truncated); 0 = the task's (Caduceus's table, else the longest).")] = 0,
    rc_augment: Annotated[bool | None, typer.Option(
        "--rc-augment/--no-rc-augment", help="RC augmentation in training (default: Mamba yes, Caduceus no).")] = None,
    conjoin: Annotated[bool | None, typer.Option(
        "--conjoin/--no-conjoin", help="Average logits of x and rc(x) in evaluation (default: Caduceus-Ph).")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write every run's numbers as JSON here.")] = None,
    device: DeviceOpt = None,
    threads: Annotated[int, typer.Option(help="CPU threads (0 = torch default).")] = 0,
    raw_weights: RawWeightsOpt = False,
) -> None:
    """Fine-tune a DNA checkpoint's encoder on one Genomic Benchmarks task: Table 7's recipe.

    Every (lr, batch size) of the sweep runs once per seed; the setting of the best mean
    validation accuracy is reported: test accuracy mean and max - min over the seeds.

    [dim]Examples:[/]
      mdlm classify --checkpoint runs/dna-caduceus-ps-1k --data gb/human_nontata_promoters --json nontata.json
      mdlm classify -c runs/dna-tiny --data tiny_task --lrs 1e-3 --batch-sizes 16 --seeds 1,2 --epochs 2
    """
    from ..data.dna import read_genomic_task
    from ..tasks.genomic import ClassifyConfig, classify
    from .common import int_list

    with user_errors():
        import torch

        if threads > 0:
            torch.set_num_threads(threads)
        if epochs < 1:
            raise MdlmError(f"--epochs must be at least 1 (got {epochs})")
        cfg = ClassifyConfig(lrs=_floats(lrs, "--lrs"), batch_sizes=int_list(batch_sizes, "--batch-sizes"),
                             seeds=int_list(seeds, "--seeds"), epochs=epochs, max_length=max(0, max_length),
                             rc_augment=rc_augment, conjoin=conjoin)
        task = read_genomic_task(data)
        loaded, rt = load_for_command(checkpoint, device, raw_weights)
        err_console.print(f"{task.name}: {len(task.train)} train / {len(task.test)} test sequences, classes "
                          f"{', '.join(task.classes)}; {len(cfg.lrs) * len(cfg.batch_sizes)} setting(s) x "
                          f"{len(cfg.seeds)} seed(s) on {rt.describe()}", markup=False, highlight=False)

        def on_run(lr, batch_size, run):
            err_console.print(f"  lr {lr:g} batch {batch_size} seed {run['seed']}: val {run['val_accuracy']:.4f} "
                              f"(epoch {run['best_epoch']}), test {run['test_accuracy']:.4f}", highlight=False)

        result = classify(loaded, task, cfg, rt.device, on_run=on_run)
        best = result["best"]
        console.print(f"{task.name}: test accuracy {best['test_accuracy_mean']:.4f} ± "
                      f"{best['test_accuracy_max_minus_min']:.4f} (mean ± max-min over {len(cfg.seeds)} seeds; "
                      f"lr {best['lr']:g}, batch {best['batch_size']} by validation)", highlight=False)
        if json_out:
            Path(json_out).write_text(json.dumps(result, indent=2))
            console.print(f"Wrote {json_out}")
