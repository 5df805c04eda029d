"""`mdlm eval-ppl`: the test perplexity of a checkpoint (a bound, or exact for AR); the
flags, the progress and the table (the evaluation is `eval.ppl`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..errors import MdlmError
from ..objectives.bound import relation
from .app import app
from .console import console, err_console, note, split_bars, user_errors
from .loading import loading_command, loading_from
from .options import DatasetOpt, JsonOpt

EvalDataOpt = Annotated[str | None, typer.Option(
    help="A prepared data folder (mdlm prepare-data) or local path.")]
DatasetsOpt = Annotated[str | None, typer.Option(
    help="Comma-separated data sets for one zero-shot table, e.g. wikitext2,ptb,lambada.")]
EvalSplitOpt = Annotated[str, typer.Option(
    help="test | valid | train (test falls back to valid where absent).")]
EvalMcSamplesOpt = Annotated[int | None, typer.Option(
    "--mc-samples", "-k",
    help="Independent Monte-Carlo passes of a bound (default 4); K >= 2 gives a standard error. "
         "Exact likelihoods take one pass.")]
TOpt = Annotated[int | None, typer.Option(
    "--T", help="0 = continuous-time bound, T > 0 = T-step discrete bound "
                "(default: as trained).")]
ScheduleOpt = Annotated[str | None, typer.Option(
    help="Evaluate the bound under this noise schedule instead of the trained one (a model "
         "without time conditioning only: its continuous-time bound is the same integral under "
         "every schedule; Table 9).")]
EvalBatchSizeOpt = Annotated[int | None, typer.Option(
    help="Rows per batch (default: the training micro-batch).")]
EvalRowsOpt = Annotated[int, typer.Option(help="Evaluate only the first N rows (0 = every "
                                               "row).")]
EvalSeedOpt = Annotated[int, typer.Option(help="Seed of the Monte-Carlo draws.")]
HELP = """Test perplexity: the NELBO bound of a diffusion model, the exact value of an AR model.

    The bound is averaged over every token of the split (K passes, one t per sequence,
    antithetic), with its standard error across passes; character data also gets bits per
    character. Zero-shot data sets are tokenised and packed as the checkpoint's training data.

    [dim]Examples:[/]
      mdlm eval-ppl --checkpoint runs/demo                     # bound on the demo's test split
      mdlm eval-ppl --checkpoint runs/demo-ar                  # exact perplexity, same tokens
      mdlm eval-ppl --checkpoint runs/owt --T 1000 --mc-samples 1
      mdlm eval-ppl --checkpoint runs/demo --schedule cosine -k 8   # Table 9's variance
      mdlm eval-ppl --checkpoint runs/owt \\
          --datasets wikitext103,ptb,lm1b,lambada,ag_news,pubmed,arxiv
    """


PplEstimatorOpt = Annotated[str | None, typer.Option(
    help="How a diffusion model's bound is estimated: t (a time per row and pass) or l (a "
         "masked count per row and pass, uniform in 1..n: LLaDA's). Default: the model "
         "family's (l for LLaDA, else t).")]


@app.command("eval-ppl", help=HELP, cls=loading_command())
def eval_ppl_cmd(
    ctx: typer.Context,
    dataset: DatasetOpt = None,
    data: EvalDataOpt = None,
    datasets: DatasetsOpt = None,
    split: EvalSplitOpt = "test",
    mc_samples: EvalMcSamplesOpt = None,
    T: TOpt = None,
    schedule: ScheduleOpt = None,
    batch_size: EvalBatchSizeOpt = None,
    rows: EvalRowsOpt = 0,
    seed: EvalSeedOpt = 0,
    json_out: JsonOpt = None,
    estimator: PplEstimatorOpt = None,
) -> None:
    from ..distributed import session
    from ..engine.schedules import get_schedule
    from ..eval.ppl import PplOptions, eval_options
    from ..io.files import check_all_writable

    loading = loading_from(ctx)
    # under torchrun the batches are split over the ranks
    with user_errors(), session(loading.device or "auto") as dist:
        names = _dataset_names(datasets, dataset, data)
        check_all_writable(json_out)
        if schedule is not None:
            get_schedule(schedule)  # a misspelt name fails before the model loads
        loaded, rt = loading.load(str(dist.device))
        flags = PplOptions(split=split, mc_samples=mc_samples, T=T, batch_size=batch_size,
                           seed=seed, rows=rows, rank=dist.rank, world_size=dist.world_size,
                           estimator=estimator)
        options, trained = eval_options(loaded, rt.device, flags, schedule=schedule)
        results = [_eval_one(loaded, rt, name, data, options) for name in names]
        if dist.is_main:
            _report_eval(results, loaded, schedule, trained, json_out, loading.raw_weights)


def _dataset_names(datasets: str | None, dataset: str | None, data: str | None) -> list:
    """The data sets of one table (--datasets), or the one --dataset (None: the checkpoint's)."""
    if datasets and (dataset or data):
        raise MdlmError("give --datasets, or one --dataset / --data, not both")
    return [d.strip() for d in datasets.split(",") if d.strip()] if datasets else [dataset]


def _report_eval(results, loaded, schedule: str | None, trained: str, json_out: str | None,
                 raw_weights: bool) -> None:
    """The table, the schedule it was evaluated under, and the JSON record."""
    from ..io.files import write_text_atomic

    _print_ppl_table(results, loaded)
    if schedule is not None:
        console.print(f"[dim]evaluated under the {schedule} schedule (trained with "
                      f"{trained})[/]")
    if json_out:
        record = {"checkpoint": str(loaded.path), "weights": "raw" if raw_weights else "ema",
                  "schedule": schedule or trained, "trained_schedule": trained,
                  "results": [r.to_dict() for r in results]}
        write_text_atomic(Path(json_out), json.dumps(record, indent=2))
        console.print(f"Wrote {json_out}", markup=False)


def _eval_one(loaded, rt, dataset: str | None, data: str | None, options):
    """Prepare (if needed) and evaluate one data set, with progress bars."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from ..distributed import is_main_process
    from ..eval.ppl import evaluate, evaluation_data, pick_split

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        disable=not is_main_process(),
    ) as progress:
        on_docs = split_bars(progress, "preparing ")
        label, prepared = evaluation_data(loaded, dataset=dataset, data=data, progress=on_docs)
        n_rows = prepared.meta["splits"][pick_split(prepared, options.split)[0]]["rows"]
        n_rows = min(options.rows, n_rows) if options.rows > 0 else n_rows
        exact = loaded.objective.exact
        kind = "exact" if exact else loaded.objective.kind or "bound"
        task = progress.add_task(f"{escape(label)}: {kind}", total=n_rows * options.mc_samples)
        result = evaluate(loaded, prepared, options, name=label, device=rt.device,
                          dtype=rt.dtype, on_batch=lambda n: progress.advance(task, n))
    for text in result.notes:
        note(text)
    return result


def _print_ppl_table(results, loaded) -> None:
    char = any(r.char_level for r in results)
    table = Table("data set", "split", "tokens", "K", "nats/tok", "SE", "1-pass sd", "PPL",
                  *(["bits/char"] if char else []), box=None)
    for r in results:
        rel = relation(r.exact, r.kind)
        se = (
            "exact"
            if r.exact
            else ("n/a" if r.standard_error is None else f"{r.standard_error:.4f}")
        )
        sd = "" if r.exact or r.pass_std is None else f"{r.pass_std:.4f}"
        name = f"{r.dataset} (conditional)" if r.conditional else r.dataset
        row = [name, r.split, f"{r.tokens:,}", "-" if r.exact else str(len(r.passes)),
               f"{r.nats_per_token:.4f}", se, sd, f"{rel} {r.perplexity:.3f}"]
        if char:
            row.append("" if r.bits_per_char is None else f"{rel} {r.bits_per_char:.4f}")
        table.add_row(*(Text(cell) for cell in row))  # data set names are paths, not markup
    console.print(table)
    _print_footnote(results, loaded.objective)


def _print_footnote(results, objective) -> None:
    """What the table's numbers are: a masked-token perplexity, an exact likelihood, or a
    bound (with its per-datapoint spread)."""
    name = objective.name
    if objective.kind == "masked-token":
        console.print(f"[dim]~ masked-token perplexity of the {name} model: exp of the mean "
                      "cross-entropy at the 15% selected positions (80/10/10 corruption); not "
                      "a bound[/]")
        return
    if objective.exact:
        console.print(f"[dim]= exact likelihood of the {name} model (every token of each row, "
                      f"{objective.first_token_context})[/]")
        _print_conditional(results)
        return
    T = results[0].T if results else 0
    kind = "continuous-time NELBO" if T == 0 else f"{T}-step discrete-time NELBO"
    console.print(f"[dim]≤ upper bound ({name}): {kind}, one antithetic t per sequence per "
                  "pass, K passes; SE = sd of the pass estimates / sqrt(K)[/]")
    _print_conditional(results)
    for r in results:
        if r.sequence_sd is not None:
            console.print(f"[dim]{escape(r.dataset)}: per-datapoint sd of a one-pass bound "
                          f"{r.sequence_sd:.4f} nats/token (variance {r.sequence_var:.4f}; "
                          "each sequence's spread over the K passes, averaged over sequences: "
                          "Table 9)[/]", highlight=False)


def _print_conditional(results) -> None:
    """The line that says a data set's value is conditional (prompt/response rows)."""
    for r in results:
        if r.conditional:
            console.print(f"[dim]{escape(r.dataset)}: conditional, -log p(response | prompt) "
                          f"per response token ({r.tokens:,} tokens: each response and its end "
                          "token, the only positions masked and scored; the prompt is always "
                          "clean)[/]", highlight=False)
