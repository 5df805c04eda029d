"""`mdlm bench-sampler`."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..build import resolve_config
from ..errors import MdlmError
from .common import (
    AllowLongerOpt,
    SetOpt,
    ThreadsOpt,
    app,
    check_length,
    check_memory,
    check_positive,
    console,
    dashed,
    err_console,
    int_list,
    load_for_command,
    user_errors,
    warn,
)
from .sampling_args import SamplingSweep, sampling_arguments

CheckpointOpt = Annotated[str | None, typer.Option(
    "--checkpoint", "-c", help="A trained model (default: runs/demo if present, else --preset).")]
PresetOpt = Annotated[
    str | None,
    typer.Option(
        "--preset",
        "-p",
        help="Benchmark a randomly initialised model of this preset's size and vocabulary.",
    ),
]
NumOpt = Annotated[int, typer.Option("--num-samples", "-n", help="Samples per configuration.")]
BatchesOpt = Annotated[str, typer.Option(help="Comma-separated batch sizes.")]
LengthOpt = Annotated[int | None, typer.Option(help="Tokens per sample (default: the model's L).")]
RepeatsOpt = Annotated[int, typer.Option(help="Timed repeats after the warm-up.")]
CompileOpt = Annotated[bool, typer.Option(
    "--compile", help="torch.compile the network trunk (CUDA: reduce-overhead / CUDA graphs).")]
JsonOpt = Annotated[str | None, typer.Option("--json", help="Write the results as JSON here.")]
PlotOpt = Annotated[
    str | None,
    typer.Option(
        "--plot",
        help="Plot (needs matplotlib): seconds/sample vs steps; with --judge the frontier (gen PPL and "
        "entropy vs --plot-x).",
    ),
]
PlotXOpt = Annotated[str, typer.Option(help="Frontier plot x axis: seconds (per sample) or nfe.")]
JudgeOpt = Annotated[
    str | None,
    typer.Option(
        help="Score each row's samples (those of its first timed run) with this judge, as mdlm gen-ppl does: "
        "an mdlm AR checkpoint, a Hugging Face causal LM, a .gguf file or smollm2."
    ),
]
ReferenceOpt = Annotated[
    str | None,
    typer.Option(
        help="With --judge: score real text of the same length from this split (test, valid, train) of the "
        "model's own prepared data, and its band over up to 8 sets of -n rows."
    ),
]
FeaturizerOpt = Annotated[str | None, typer.Option(
    help="With --reference-text: MAUVE's feature model (HF causal or masked LM, an mdlm AR "
         "checkpoint; default: the judge).")]
MauveSeedsOpt = Annotated[str, typer.Option(
    help="With --reference-text: MAUVE's k-means seeds (mean, sd).")]
SaveSamplesOpt = Annotated[
    str | None,
    typer.Option(
        help="With --judge: write each row's scored samples here as mdlm sample JSONL (for mdlm gen-ppl)."
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
    "NCS",
    "overhead",
)
QUALITY_COLUMNS = ("gen PPL", "nats/char", "entropy", "Dist-2", "self-BLEU", "rep-4", "MAUVE")


@app.command("bench-sampler")
@sampling_arguments(sweep=True)
def bench_sampler_cmd(
    *,
    checkpoint: CheckpointOpt = None,
    preset: PresetOpt = None,
    overrides: SetOpt = None,
    sampling: SamplingSweep,
    num_samples: NumOpt = 8,
    batch_size: BatchesOpt = "1,8",
    length: LengthOpt = None,
    repeats: RepeatsOpt = 3,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | mps.")] = None,
    judge: JudgeOpt = None,
    reference_text: ReferenceOpt = None,
    save_samples: SaveSamplesOpt = None,
    featurizer: FeaturizerOpt = None,
    mauve_seeds: MauveSeedsOpt = "0,1,2,3,4",
    compile: CompileOpt = False,
    json_out: JsonOpt = None,
    plot_out: PlotOpt = None,
    plot_x: PlotXOpt = "seconds",
    threads: ThreadsOpt = None,
    allow_longer: AllowLongerOpt = False,
) -> None:
    """Time the samplers: seconds per sample, tokens/s, NFE, categorical draws, sampler overhead;
    with --judge, the quality of the same samples (gen PPL, entropy, diversity, MAUVE vs real text).

    Option lists (--tokens-per-step, --threshold, --eta, ..., or --opt name=v1,v2) add a row
    per value to the samplers that read them.

    [dim]Examples:[/]
      mdlm bench-sampler                                   # the demo model, steps 100 and 1000
      mdlm bench-sampler --preset test --set data.tokenizer=gpt2 --length 1024 --steps 100 -n 1 --batch-size 1
      mdlm bench-sampler -c runs/owt --steps 100,1000,10000 -n 64 --batch-size 1,8 --json b.json --plot b.png
      mdlm bench-sampler -c runs/demo-ar --batch-size 1,8  # an AR model: its left-to-right sampler
      mdlm bench-sampler -c runs/demo --samplers first-hitting,threshold --threshold 0.5,0.9 --tokens-per-step 1,4 \\
          --judge runs/demo-ar --reference-text test -n 16 --batch-size 16 --repeats 1 --plot frontier.png
    """
    from ..io.files import check_all_writable
    from ..sample.bench import environment

    with user_errors():
        batch_list = _check_flags(batch_size, repeats, num_samples, plot_out, length)
        _check_quality_flags(judge, reference_text, save_samples, plot_x)
        check_all_writable(json_out, plot_out)
        checkpoint, preset = _model_source(checkpoint, preset, overrides)
        bm = _bench_model(checkpoint, preset, overrides or [], device, compile, threads)
        sampler_list = _samplers(bm.objective, sampling.samplers)
        _warn_unread(sampler_list, sampling.steps_text, sampling.options)
        length = _checked_length(bm, checkpoint, length, max(batch_list), allow_longer)
        meta = {
            **environment(bm.rt.device, bm.rt.dtype),
            "model": bm.source,
            "objective": bm.objective.name,
            "length": length,
            "seed": seed,
            "num_samples": num_samples,
            "repeats": repeats,
            "compile": compile,
            **sampling.drawing(),
            "vocab_size": bm.model.vocab_size,
            "judge": judge,
            "command": "mdlm " + " ".join(sys.argv[1:]),
        }
        _announce(meta)
        scorer, reference = _quality(bm, judge, reference_text, save_samples, length, num_samples,
                                     seed, featurizer=featurizer, mauve_seeds=mauve_seeds)
        report = _run(bm, sampling, sampler_list, batch_list, meta, scorer, reference)
        _write_outputs(report, json_out, plot_out, plot_x, frontier=judge is not None)


def _run(bm: BenchModel,
         sampling: SamplingSweep,
         sampler_list: list[str],
         batch_list: list[int],
         meta: dict,
         scorer,
         reference) -> Any:
    """Every row, printed as it comes and then as one table; the report."""
    from ..sample.bench import run_bench

    judge = meta["judge"]
    title = f"{bm.source}, L={meta['length']}, {meta['device_name']}"
    title += f", judge {judge}" if judge else ""
    table = Table(*COLUMNS, *(QUALITY_COLUMNS if judge else ()), title=Text(title))  # not markup
    report = run_bench(bm.objective.denoiser(bm.model, bm.rt.dtype), samplers=sampler_list,
                       steps=sampling.steps, batch_sizes=batch_list, precisions=sampling.precisions,
                       num_samples=meta["num_samples"], length=meta["length"], mask_id=bm.mask_id,
                       repeats=meta["repeats"], seed=meta["seed"], device=bm.rt.device, meta=meta,
                       schedule=bm.objective.schedule, options=sampling.options, on_tokens=scorer,
                       on_row=lambda r: _add_row(table, r, judge is not None), **sampling.drawing())
    report.reference = _add_reference_row(table, reference)  # None without --reference-text
    (console if console.is_terminal else Console(width=200)).print(table)
    return report


def _model_source(checkpoint: str | None, preset: str | None, overrides: list[str] | None
                  ) -> tuple[str | None, str | None]:
    """(checkpoint, preset): runs/demo where it exists and neither is given, else the demo preset."""
    if checkpoint is None and preset is None:
        checkpoint = "runs/demo" if Path("runs/demo/latest").is_file() else None
        preset = None if checkpoint else "demo"
    if checkpoint is not None and overrides:
        raise MdlmError("--set applies to --preset models; a checkpoint carries its own config")
    return checkpoint, preset


def _checked_length(bm, checkpoint, length: int | None, batch: int, allow_longer: bool) -> int:
    """`length` (default: the model's L), refused past a checkpoint's trained L without
    --allow-longer (a preset's random weights have none), or where a batch cannot fit."""
    length = length or bm.length
    if checkpoint is not None:
        check_length(bm, length, allow_longer)
    check_memory(bm.model, bm.model_cfg, bm.tokenizer.vocab_size, batch=batch, length=length,
                 device=bm.rt.device, what=f"benchmarking {batch} x {length} tokens",
                 fix="lower --length or --batch-size")
    return length


def _announce(meta: dict) -> None:
    err_console.print(
        f"Benchmarking {meta['model']} at L={meta['length']} on {meta['device_name']} "
        f"({meta['dtype']}, {meta['threads']} threads, torch {meta['torch']})",
        highlight=False,
        markup=False,
    )


def _warn_unread(sampler_list: list[str], steps: str | None, options: dict[str, list]) -> None:
    """A warning for --steps or an option list that none of the chosen samplers reads."""
    from ..engine import get_sampler

    if steps is not None and not any(get_sampler(name).uses_steps for name in sampler_list):
        warn(f"none of {', '.join(sampler_list)} takes steps; --steps {steps} is ignored")
    for name in options:
        if not any(name in get_sampler(s).option_names for s in sampler_list):
            warn(f"--{dashed(name)} does not apply to {', '.join(sampler_list)}; ignored")


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
            from ..sample.frontier import plot_frontier

            plot_frontier(report, plot_out, x=plot_x)
        else:
            plot(report, plot_out)
        console.print(f"Wrote {plot_out}", markup=False)


def _check_quality_flags(judge: str | None, reference_text: str | None, save_samples: str | None,
                         plot_x: str) -> None:
    from ..sample.frontier import X_AXES

    for flag, value in (("--reference-text", reference_text), ("--save-samples", save_samples)):
        if value is not None and judge is None:
            raise MdlmError(
                f"{flag} needs --judge (the samples and the real text are scored by the judge)"
            )
    if plot_x not in X_AXES:
        raise MdlmError(f"--plot-x must be one of: {', '.join(X_AXES)}")


def _quality(
    bm,
    judge: str | None,
    reference_text: str | None,
    save_samples: str | None,
    length: int,
    num_samples: int,
    seed: int,
    *,
    featurizer: str | None = None,
    mauve_seeds: str = "0",
):
    """The row scorer (judge loaded once) and the real-text reference, or (None, None)."""
    if judge is None:
        if featurizer is not None:
            raise MdlmError("--featurizer needs --judge and --reference-text (MAUVE against "
                            "real text)")
        return None, None
    from ..eval.features import load_featurizer
    from ..eval.genppl import load_judge
    from ..eval.mauve import parse_seeds, size_warning
    from ..sample.frontier import RowScorer, reference_quality, reference_split

    seeds = parse_seeds(mauve_seeds)
    with err_console.status(f"loading judge {judge}"):
        scorer = load_judge(judge, device=bm.rt.device)
    reference, mauve_set = None, None
    if reference_text is not None:
        features = None
        if num_samples >= 2:
            features = load_featurizer(featurizer, device=bm.rt.device, judge=scorer)
            if (message := size_warning(num_samples, num_samples)) is not None:
                warn(message)
        else:
            warn("MAUVE needs at least 2 samples per row: -n 1 rows get no MAUVE")
        split, name = reference_split(bm.data_cfg, bm.tokenizer, reference_text)
        reference, mauve_set = reference_quality(scorer, bm.tokenizer, split, split_name=name,
                                                 length=length, per_group=num_samples,
                                                 featurizer=features, seeds=seeds)
    elif featurizer is not None:
        raise MdlmError("--featurizer needs --reference-text (MAUVE compares the samples with "
                        "real text)")
    return RowScorer(scorer, bm.tokenizer, save_dir=save_samples, source=bm.source, seed=seed,
                     mauve_set=mauve_set), reference


def _check_flags(batch_size: str,
                 repeats: int,
                 num_samples: int,
                 plot_out: str | None,
                 length: int | None) -> list[int]:
    """The batch sizes, after the checks of the other flags."""
    check_positive(length=length)
    if repeats < 1 or num_samples < 1:
        raise MdlmError("--repeats and --num-samples must be positive")
    if plot_out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MdlmError("--plot needs matplotlib: pip install 'mdlm[plot]'") from None
    return int_list(batch_size, "--batch-size")


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
        f"{r.ncs:.1f}",
        f"{100 * r.overhead_share:.1f}%",
    )
    if with_quality:
        q = r.quality
        row += (f"{q.gen_ppl:.2f}", f"{q.nats_per_char:.4f}",
                f"{q.entropy:.3f}" + _pm(q.entropy_se), *_extra_cells(q))
    table.add_row(*row)
    err_console.print("  " + "  ".join(row), highlight=False, markup=False)


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
    table.add_row("", f"real text ({ref.split})", f"{ref.groups} x {ref.per_group} rows", *[""] * 8,
                  f"{q.gen_ppl:.2f} [{band['gen_ppl'][0]:.2f}-{band['gen_ppl'][1]:.2f}]",
                  f"{q.nats_per_char:.4f}",
                  f"{q.entropy:.3f} [{band['entropy'][0]:.3f}-{band['entropy'][1]:.3f}]",
                  *_extra_cells(q, band))
    return ref


def _samplers(objective, names: list[str] | None) -> list[str]:
    """The samplers to benchmark: the objective's exact ones by default (the inexact ones are
    frontier points, worth their time with --judge: name them); any other is refused."""
    from ..engine import get_sampler

    served = [spec.name for spec in objective.samplers]
    exact = [spec.name for spec in objective.samplers if spec.exact]
    chosen = names or exact
    for name in chosen:
        if get_sampler(name).name not in served:
            raise MdlmError(
                f"sampler {name} does not serve {objective.name} models; choose from: {', '.join(served)}"
            )
    return chosen


@dataclass
class BenchModel:
    objective: Any
    model: Any
    mask_id: int
    length: int
    source: str  # what the table calls it
    rt: Any  # Runtime
    tokenizer: Any
    data_cfg: Any  # DataConfig of its training data (the reference text)
    model_cfg: Any = None  # its ModelConfig (the memory estimate)


def _bench_model(
    checkpoint: str | None,
    preset: str | None,
    overrides: list[str],
    device: str | None,
    compile: bool,
    threads: int | None,
) -> BenchModel:
    """A checkpoint, or a randomly initialised model of a preset's size and vocabulary."""
    import torch

    from ..models import build_model
    from ..objectives import get_objective
    from ..runtime import Runtime

    if checkpoint is not None:
        loaded, rt = load_for_command(checkpoint, device, raw_weights=False, threads=threads)
        objective, model, mask_id, length = (
            loaded.objective,
            loaded.model,
            loaded.mask_id,
            loaded.length,
        )
        source, tokenizer, data_cfg = str(loaded.path), loaded.tokenizer, loaded.config.data
        model_cfg = loaded.config.model
    else:
        from ..data.tokenizers import load_tokenizer

        cfg = resolve_config(preset, overrides)
        rt = Runtime.create(device or "auto", threads=threads or 0)
        tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.data.cache_dir or None)
        objective = get_objective(cfg, tokenizer)
        torch.manual_seed(0)
        model = (
            build_model(cfg.model, tokenizer.vocab_size, causal=objective.causal)
            .to(rt.device)
            .eval()
        )
        mask_id, length, data_cfg = tokenizer.mask_id, cfg.data.length, cfg.data
        model_cfg = cfg.model
        source = f"preset {cfg.name} (random weights, vocab {tokenizer.vocab_size})"
    if compile:
        if not hasattr(model, "trunk"):
            raise MdlmError(f"--compile captures the DiT's trunk; {model.describe()} has none")
        model.trunk = torch.compile(
            model.trunk, mode="reduce-overhead" if rt.device.type == "cuda" else None
        )
    return BenchModel(objective, model, mask_id, length, source, rt, tokenizer, data_cfg, model_cfg)
