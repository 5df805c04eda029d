"""`mdlm classify`: Genomic Benchmarks fine-tuning of a DNA checkpoint (Table 7); the sweep is
`tasks.genomic.classify`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from ..errors import MdlmError
from ..numbers import check_float
from .app import app
from .console import console, err_console, user_errors
from .flag_checks import check_positive, int_list
from .loading import loading_command, loading_from

ClassifyDataOpt = Annotated[str, typer.Option(
    help="A Genomic Benchmarks task folder: <task>/{train,test}/<class>/*.txt.")]
LrsOpt = Annotated[str, typer.Option(help="Learning rates of the sweep.")]
BatchSizesOpt = Annotated[str, typer.Option(help="Batch sizes of the sweep.")]
SeedsOpt = Annotated[str, typer.Option(
    help="Seeds (each its own 90/10 train/validation split).")]
ClassifyFoldsOpt = Annotated[int, typer.Option(
    help="K > 0: stratified K-fold cross-validation of the training set instead of the seeds' "
         "splits (the first seed cuts the folds); mean ± std over the K folds.")]
ClassifyEpochsOpt = Annotated[int, typer.Option(
    help="Epochs per run (the best validation epoch is tested).")]
ClassifyMaxLengthOpt = Annotated[int, typer.Option(
    help="Bases per sequence (left-padded, truncated); 0 = the task's (Caduceus's table, else "
         "the longest).")]
RcAugmentOpt = Annotated[bool | None, typer.Option(
    "--rc-augment/--no-rc-augment",
    help="RC augmentation in training (default: Mamba yes, Caduceus no).")]
ConjoinOpt = Annotated[bool | None, typer.Option(
    "--conjoin/--no-conjoin",
    help="Average logits of x and rc(x) in evaluation (default: Caduceus-Ph).")]
RunsJsonOpt = Annotated[str | None, typer.Option(
    "--json", help="Write every run's numbers as JSON here.")]


@app.command("classify", cls=loading_command(checkpoint="runs/dna-caduceus-ps-1k"))
def classify_cmd(
    ctx: typer.Context,
    data: ClassifyDataOpt,
    lrs: LrsOpt = "1e-3,2e-3",
    batch_sizes: BatchSizesOpt = "128,256",
    seeds: SeedsOpt = "1,2,3,4,5",
    folds: ClassifyFoldsOpt = 0,
    epochs: ClassifyEpochsOpt = 10,
    max_length: ClassifyMaxLengthOpt = 0,
    rc_augment: RcAugmentOpt = None,
    conjoin: ConjoinOpt = None,
    json_out: RunsJsonOpt = None,
) -> None:
    """Fine-tune a DNA checkpoint's encoder on one Genomic Benchmarks task: Table 7's recipe.

    Every (lr, batch size) of the sweep runs once per seed (or per fold, --folds); the setting
    of the best mean validation accuracy is reported: test accuracy mean, std and max - min.

    [dim]Examples:[/]
      mdlm classify --checkpoint runs/dna-caduceus-ps-1k --data gb/human_nontata_promoters \\
          --json nontata.json
      mdlm classify -c runs/dna-tiny --data tiny_task --lrs 1e-3 --batch-sizes 16 --seeds 1,2 \\
          --epochs 2
      mdlm classify -c runs/dna-tiny --data tiny_task --folds 5 --json folds.json
    """
    from ..data.dna import read_genomic_task
    from ..tasks.genomic import ClassifyConfig, classify

    with user_errors():
        check_positive(epochs=epochs)
        cfg = ClassifyConfig(
            lrs=_floats(lrs, "--lrs"), batch_sizes=int_list(batch_sizes, "--batch-sizes"),
            seeds=int_list(seeds, "--seeds"), folds=max(0, folds), epochs=epochs,
            max_length=max(0, max_length),
            rc_augment=rc_augment, conjoin=conjoin)
        task = read_genomic_task(data)
        loaded, rt = loading_from(ctx).load()
        _print_task(task, cfg, rt)
        result = classify(loaded, task, cfg, rt.device, on_run=_print_run)
        _print_best(task.name, result["best"])
        if json_out:
            Path(json_out).write_text(json.dumps(result, indent=2))
            console.print(f"Wrote {json_out}")


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MdlmError(f"{name} expects comma-separated numbers, e.g. 1e-3,2e-3 (got "
                        f"{text!r})") from None
    if not values:
        raise MdlmError(f"{name} expects positive numbers (got {text!r})")
    return [check_float(name, v, 0, low_in=False) for v in values]


def _print_task(task, cfg, rt) -> None:
    settings = len(cfg.lrs) * len(cfg.batch_sizes)
    runs = f"{cfg.folds} folds" if cfg.folds else f"{len(cfg.seeds)} seed(s)"
    err_console.print(f"{task.name}: {len(task.train)} train / {len(task.test)} test sequences, "
                      f"classes {', '.join(task.classes)}; {settings} setting(s) x "
                      f"{runs} on {rt.describe()}", markup=False,
                      highlight=False)


def _print_run(lr: float, batch_size: int, run: dict) -> None:
    fold = f" fold {run['fold']}" if "fold" in run else ""
    err_console.print(f"  lr {lr:g} batch {batch_size} seed {run['seed']}{fold}: val "
                      f"{run['val_accuracy']:.4f} (epoch {run['best_epoch']}), test "
                      f"{run['test_accuracy']:.4f}", highlight=False)


def _print_best(name: str, best: dict) -> None:
    console.print(f"{name}: test accuracy {best['test_accuracy_mean']:.4f} ± "
                  f"{best['test_accuracy_max_minus_min']:.4f} (mean ± max-min over "
                  f"{best['over']}; std {best['test_accuracy_std']:.4f}; "
                  f"lr {best['lr']:g}, batch {best['batch_size']} by validation)",
                  highlight=False)
