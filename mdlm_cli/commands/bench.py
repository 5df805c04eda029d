"""`mdlm bench-sampler`: the flags, the table and the files; the benchmark itself is
`sample.bench_request.benchmark`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import MdlmError
from ..sample.bench_request import BenchHooks, BenchRequest, benchmark
from .app import app
from .console import console, err_console, note, user_errors
from .flag_checks import int_list
from .loading import loading_command, loading_from
from .options import (
    MAUVE_SEEDS,
    AllowLongerOpt,
    JsonOpt,
    LengthOpt,
    SeedOpt,
    SetOpt,
    mauve_options,
)
from .sampling_args import SweepCommand, sampling_from

BenchPresetOpt = Annotated[
    str | None,
    typer.Option(
        "--preset",
        "-p",
        help="Benchmark a randomly initialised model of this preset's size and vocabulary.",
    ),
]
NumOpt = Annotated[int, typer.Option("--num-samples", "-n", help="Samples per configuration.")]
BatchesOpt = Annotated[str, typer.Option(help="Comma-separated batch sizes.")]
RepeatsOpt = Annotated[int, typer.Option(help="Timed repeats after the warm-up.")]
CompileOpt = Annotated[bool, typer.Option(
    "--compile", help="torch.compile the network trunk (CUDA: reduce-overhead / CUDA graphs).")]
PlotOpt = Annotated[
    str | None,
    typer.Option(
        "--plot",
        help="Plot (needs matplotlib): seconds/sample vs steps; with --judge the frontier "
        "(gen PPL and entropy vs --plot-x).",
    ),
]
PlotXOpt = Annotated[str, typer.Option(help="Frontier plot x axis: seconds (per sample) or "
                                            "nfe.")]
BenchJudgeOpt = Annotated[
    str | None,
    typer.Option(
        help="Score each row's samples (those of its first timed run) with this judge, as mdlm "
        "gen-ppl does: an mdlm AR checkpoint, a Hugging Face causal LM, a .gguf file or smollm2."
    ),
]
ReferenceOpt = Annotated[
    str | None,
    typer.Option(
        help="With --judge: score real text of the same length from this split (test, valid, "
        "train) of the model's own prepared data, and its band over up to 8 sets of -n rows."
    ),
]
ReferenceFeaturizerOpt, ReferenceSeedsOpt = mauve_options(needs="--reference-text")
SaveSamplesOpt = Annotated[
    str | None,
    typer.Option(
        help="With --judge: write each row's scored samples here as mdlm sample JSONL (for mdlm "
        "gen-ppl)."
    ),
]
COLUMNS = (
    "precision",
    "sampler",
    "steps / options",
    "batch",
    "s/sample",
    "min-max",
    "tok/s",
    "NFE",
    "NFE whole-batch",
    "positions/call",
    "NCS",
    "calls/s",
    "MFU",
    "overhead",
)
QUALITY_COLUMNS = ("gen PPL", "nats/char", "entropy", "Dist-2", "self-BLEU", "rep-4", "MAUVE")


HELP = """Time the samplers: seconds per sample, tokens/s, NFE, categorical draws, sampler overhead;
    with --judge, the quality of the same samples (gen PPL, entropy, diversity, MAUVE vs real text).

    Option lists (--tokens-per-step, --threshold, --eta, ..., or --opt name=v1,v2) add a row
    per value to the samplers that read them.

    [dim]Examples:[/]
      mdlm bench-sampler                                   # the demo model, steps 100 and 1000
      mdlm bench-sampler --preset test --set data.tokenizer=gpt2 --length 1024 --steps 100 \\
          -n 1 --batch-size 1
      mdlm bench-sampler -c runs/owt --steps 100,1000,10000 -n 64 --batch-size 1,8 \\
          --json b.json --plot b.png
      mdlm bench-sampler -c runs/demo-ar --batch-size 1,8  # an AR model: its left-to-right sampler
      mdlm bench-sampler -c runs/demo --samplers first-hitting,threshold --threshold 0.5,0.9 \\
          --tokens-per-step 1,4 --judge runs/demo-ar --reference-text test -n 16 \\
          --batch-size 16 --repeats 1 --plot frontier.png
    """


@app.command("bench-sampler", help=HELP, cls=loading_command(
    SweepCommand, checkpoint=None,
    checkpoint_help="A trained model (default: runs/demo if present, else --preset)."))
def bench_sampler_cmd(
    *,
    preset: BenchPresetOpt = None,
    overrides: SetOpt = None,
    ctx: typer.Context,
    num_samples: NumOpt = 8,
    batch_size: BatchesOpt = "1,8",
    length: LengthOpt = None,
    repeats: RepeatsOpt = 3,
    seed: SeedOpt = 0,
    judge: BenchJudgeOpt = None,
    reference_text: ReferenceOpt = None,
    save_samples: SaveSamplesOpt = None,
    featurizer: ReferenceFeaturizerOpt = None,
    mauve_seeds: ReferenceSeedsOpt = MAUVE_SEEDS,
    compile: CompileOpt = False,
    json_out: JsonOpt = None,
    plot_out: PlotOpt = None,
    plot_x: PlotXOpt = "seconds",
    allow_longer: AllowLongerOpt = False,
) -> None:
    sampling, loading = sampling_from(ctx), loading_from(ctx)
    with user_errors():
        batch_sizes = _check_outputs(batch_size, json_out, plot_out, plot_x)
        request = BenchRequest(
            sampling, batch_sizes, checkpoint=loading.checkpoint, preset=preset,
            overrides=overrides or [], num_samples=num_samples, length=length, repeats=repeats,
            seed=seed, device=loading.device, threads=loading.threads,
            raw_weights=loading.raw_weights, compile=compile, judge=judge,
            net_precision=loading.net_precision, adapter=loading.adapter,
            allow_longer=allow_longer, reference_text=reference_text, save_samples=save_samples,
            featurizer=featurizer, mauve_seeds=mauve_seeds, command=_command_line())
        view = _TableView(with_quality=judge is not None)
        report = benchmark(request, view.hooks())
        view.show(report.reference)
        _write_outputs(report, json_out, plot_out, plot_x, frontier=judge is not None)


def _command_line() -> str:
    return "mdlm " + " ".join(sys.argv[1:])


def _check_outputs(batch_size: str, json_out: str | None, plot_out: str | None,
                   plot_x: str) -> list[int]:
    """The batch sizes, after the checks of the output flags (before any model is loaded)."""
    from ..io.files import check_all_writable
    from ..sample.frontier_plot import X_AXES

    if plot_out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MdlmError("--plot needs matplotlib: pip install 'mdlm[plot]'") from None
    batch_sizes = int_list(batch_size, "--batch-size")
    if plot_x not in X_AXES:
        raise MdlmError(f"--plot-x must be one of: {', '.join(X_AXES)}")
    check_all_writable(json_out, plot_out)
    return batch_sizes


class _TableView:
    """The rows as they come (on stderr: the runs are long), then as one table."""

    def __init__(self, with_quality: bool):
        self.with_quality = with_quality
        self.table: Table | None = None

    def hooks(self) -> BenchHooks:
        return BenchHooks(on_note=note, on_start=self.start, on_row=self.row,
                          status=err_console.status)

    def start(self, meta: dict) -> None:
        err_console.print(f"Benchmarking {meta['model']} at L={meta['length']} on "
                          f"{meta['device_name']} ({meta['dtype']}, {meta['threads']} threads, "
                          f"torch {meta['torch']})", highlight=False, markup=False)
        title = f"{meta['model']}, L={meta['length']}, {meta['device_name']}"
        title += f", judge {meta['judge']}" if meta["judge"] else ""
        columns = (*COLUMNS, *(QUALITY_COLUMNS if self.with_quality else ()))
        self.table = Table(*columns, title=Text(title))  # not markup

    def row(self, r) -> None:
        _add_row(self.table, r, self.with_quality)

    def show(self, reference) -> None:
        _add_reference_row(self.table, reference)  # nothing without --reference-text
        (console if console.is_terminal else Console(width=200)).print(self.table)


def _write_outputs(
    report, json_out: str | None, plot_out: str | None, plot_x: str, *, frontier: bool
) -> None:
    """The JSON, and the plot: the frontier where the rows were judged, else time against steps."""
    from ..sample.bench import plot

    if json_out:
        Path(json_out).write_text(json.dumps(report.to_dict(), indent=2))
        console.print(f"Wrote {json_out}", markup=False)
    if plot_out:
        if frontier:
            from ..sample.frontier_plot import plot_frontier

            plot_frontier(report, plot_out, x=plot_x)
        else:
            plot(report, plot_out)
        console.print(f"Wrote {plot_out}", markup=False)


def _add_row(table: Table, r, with_quality: bool = False) -> None:
    """One benchmark row: into the final table, and printed at once (the runs are long)."""
    row = (
        r.precision,
        r.sampler,
        r.setting or "-",
        str(r.batch_size),
        f"{r.seconds_per_sample:.3f}",
        f"{r.seconds_per_sample_min:.3f}-{r.seconds_per_sample_max:.3f}",
        f"{r.tokens_per_second:,.0f}",
        f"{r.nfe:.1f}",
        "-" if r.nfe_whole_batch is None else f"{r.nfe_whole_batch:.1f}",
        _positions_per_call(r),
        f"{r.ncs:.1f}",
        f"{r.calls_per_second:,.1f}",
        "-" if r.mfu is None else f"{100 * r.mfu:.1f}%",
        f"{100 * r.overhead_share:.1f}%",
    )
    if with_quality:
        q = r.quality
        row += (f"{q.gen_ppl:.2f}", f"{q.nats_per_char:.4f}",
                f"{q.entropy:.3f}" + _pm(q.entropy_se), *_extra_cells(q))
    table.add_row(*row)
    err_console.print("  " + "  ".join(row), highlight=False, markup=False)


def _positions_per_call(r) -> str:
    """The positions a call runs the network over, per sequence: L without a cache, the block
    (and suffix) under a block cache, one under an AR cache; "-" where nothing was counted."""
    return f"{r.input_tokens / r.nfe:.1f}" if r.nfe and r.input_tokens else "-"


def _pm(se: float | None) -> str:
    return "" if se is None else f" ±{se:.3f}"


def _extra_cells(q, band: dict | None = None) -> tuple[str, ...]:
    """Dist-2, self-BLEU, rep-4 and MAUVE (with its sd over seeds, or the band's range)."""
    cells = []
    for name in ("dist_2", "self_bleu", "repetition_4", "mauve"):
        value = getattr(q, name)
        text = "-" if value is None else f"{value:.3f}"
        if value is not None and band and name in band:
            text += f" [{band[name][0]:.3f}-{band[name][1]:.3f}]"
        elif name == "mauve" and value is not None:
            text += _pm(q.mauve_sd)
        cells.append(text)
    return tuple(cells)


def _add_reference_row(table: Table, ref):
    """The real-text row (where there is a reference); returns the reference."""
    if ref is None:
        return None
    q, band = ref.quality, ref.band
    table.add_row("", f"real text ({ref.split})", f"{ref.groups} x {ref.per_group} rows",
                  *[""] * (len(COLUMNS) - 3),  # the speed columns: none for real text
                  f"{q.gen_ppl:.2f} [{band['gen_ppl'][0]:.2f}-{band['gen_ppl'][1]:.2f}]",
                  f"{q.nats_per_char:.4f}",
                  f"{q.entropy:.3f} [{band['entropy'][0]:.3f}-{band['entropy'][1]:.3f}]",
                  *_extra_cells(q, band))
    return ref
