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

from ..config import resolve_config
from ..engine.sampling import SAMPLERS
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
    err_console,
    int_list,
    load_for_command,
    user_errors,
    warn,
)

CheckpointOpt = Annotated[str | None, typer.Option(
    "--checkpoint", "-c", help="A trained model (default: runs/demo if present, else --preset).")]
PresetOpt = Annotated[str | None, typer.Option(
    "--preset", "-p", help="Benchmark a randomly initialised model of this preset's size and vocabulary.")]
SamplersOpt = Annotated[str | None, typer.Option(
    help="Comma-separated samplers (default: every exact sampler of the model's objective; name an "
         f"inexact one to add it: {', '.join(n for n, s in SAMPLERS.items() if not s.exact)}).")]
StepsListOpt = Annotated[str | None, typer.Option(
    help="Comma-separated step counts, for the samplers that take steps (default 100,1000).")]
NumOpt = Annotated[int, typer.Option("--num-samples", "-n", help="Samples per configuration.")]
BatchesOpt = Annotated[str, typer.Option(help="Comma-separated batch sizes.")]
LengthOpt = Annotated[int | None, typer.Option(help="Tokens per sample (default: the model's L).")]
PrecisionsOpt = Annotated[str, typer.Option(help="Comma-separated: fp64 (default), fp32 (the reference's draw).")]
RepeatsOpt = Annotated[int, typer.Option(help="Timed repeats after the warm-up.")]
CompileOpt = Annotated[bool, typer.Option(
    "--compile", help="torch.compile the network trunk (CUDA: reduce-overhead / CUDA graphs).")]
JsonOpt = Annotated[str | None, typer.Option("--json", help="Write the results as JSON here.")]
PlotOpt = Annotated[str | None, typer.Option(
    "--plot", help="Plot (needs matplotlib): seconds/sample vs steps; with --judge the frontier (gen PPL and "
    "entropy vs --plot-x).")]
PlotXOpt = Annotated[str, typer.Option(help="Frontier plot x axis: seconds (per sample) or nfe.")]
JudgeOpt = Annotated[str | None, typer.Option(
    help="Score each row's samples (those of its first timed run) with this judge, as mdlm gen-ppl does: "
         "an mdlm AR checkpoint, a Hugging Face causal LM, a .gguf file or smollm2.")]
ReferenceOpt = Annotated[str | None, typer.Option(
    help="With --judge: score real text of the same length from this split (test, valid, train) of the "
         "model's own prepared data, and its band over up to 8 sets of -n rows.")]
SaveSamplesOpt = Annotated[str | None, typer.Option(
    help="With --judge: write each row's scored samples here as mdlm sample JSONL (for mdlm gen-ppl).")]
TokensPerStepListOpt = Annotated[str | None, typer.Option(
    help="first-hitting: comma-separated tokens per network call, e.g. 1,2,4 (default 1).")]
ThresholdListOpt = Annotated[str | None, typer.Option(
    help="threshold: comma-separated thresholds, e.g. 0.5,0.9,0.99 (default 0.9).")]
EtaListOpt = Annotated[str | None, typer.Option(help="remdm: comma-separated eta values (default 0.008).")]
KScheduleListOpt = Annotated[str | None, typer.Option(help="confidence: comma-separated: linear, cosine.")]
RemdmScheduleListOpt = Annotated[str | None, typer.Option(help="remdm: comma-separated: cap, rescale.")]
COLUMNS = ("precision", "sampler", "steps / options", "batch", "s/sample", "min-max", "tok/s", "NFE",
           "NFE whole-batch", "NCS", "overhead")
QUALITY_COLUMNS = ("gen PPL", "nats/char", "entropy")


@app.command("bench-sampler")
def bench_sampler_cmd(
    checkpoint: CheckpointOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
    samplers: SamplersOpt = None, steps: StepsListOpt = None, num_samples: NumOpt = 8, batch_size: BatchesOpt = "1,8",
    length: LengthOpt = None, precision: PrecisionsOpt = "fp64", repeats: RepeatsOpt = 3,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | mps.")] = None,
    tokens_per_step: TokensPerStepListOpt = None, threshold: ThresholdListOpt = None, eta: EtaListOpt = None,
    k_schedule: KScheduleListOpt = None, remdm_schedule: RemdmScheduleListOpt = None,
    judge: JudgeOpt = None, reference_text: ReferenceOpt = None, save_samples: SaveSamplesOpt = None,
    compile: CompileOpt = False, json_out: JsonOpt = None, plot_out: PlotOpt = None, plot_x: PlotXOpt = "seconds",
    threads: ThreadsOpt = None, allow_longer: AllowLongerOpt = False,
) -> None:
    """Time the samplers: seconds per sample, tokens/s, NFE, categorical draws, sampler overhead;
    with --judge, the quality of the same samples (gen PPL, nats/char, unigram entropy).

    Option lists (--tokens-per-step, --threshold, --eta, ...) add a row per value to the
    samplers that read them.

    [dim]Examples:[/]
      mdlm bench-sampler                                   # the demo model, steps 100 and 1000
      mdlm bench-sampler --preset test --set data.tokenizer=gpt2 --length 1024 --steps 100 -n 1 --batch-size 1
      mdlm bench-sampler -c runs/owt --steps 100,1000,10000 -n 64 --batch-size 1,8 --json b.json --plot b.png
      mdlm bench-sampler -c runs/demo-ar --batch-size 1,8  # an AR model: its left-to-right sampler
      mdlm bench-sampler -c runs/demo --samplers first-hitting,threshold --threshold 0.5,0.9 --tokens-per-step 1,4 \\
          --judge runs/demo-ar --reference-text test -n 16 --batch-size 16 --repeats 1 --plot frontier.png
    """
    from ..io.files import check_writable
    from ..sample.bench import environment, run_bench

    with user_errors():
        precisions, steps_list, batch_list = _check_flags(precision, steps, batch_size, repeats, num_samples, plot_out)
        options = _option_lists(tokens_per_step=tokens_per_step, threshold=threshold, eta=eta, k_schedule=k_schedule,
                                remdm_schedule=remdm_schedule)
        _check_quality_flags(judge, reference_text, save_samples, plot_x)
        check_positive(length=length)
        for path in (json_out, plot_out):
            if path:
                check_writable(path)
        checkpoint, preset = _model_source(checkpoint, preset, overrides)
        bm = _bench_model(checkpoint, preset, overrides or [], device, compile, threads)
        sampler_list = _samplers(bm.objective, samplers)
        _warn_unread(sampler_list, steps, options)
        length = _checked_length(bm, checkpoint, length, max(batch_list), allow_longer)
        meta = {**environment(bm.rt.device, bm.rt.dtype), "model": bm.source, "objective": bm.objective.name,
                "length": length, "seed": seed, "num_samples": num_samples, "repeats": repeats, "compile": compile,
                "vocab_size": bm.model.vocab_size, "judge": judge, "command": "mdlm " + " ".join(sys.argv[1:])}
        _announce(meta)
        scorer, reference = _quality(bm, judge, reference_text, save_samples, length, num_samples, seed)
        table = Table(*COLUMNS, *(QUALITY_COLUMNS if judge else ()), title=Text(  # a path, not markup
            f"{bm.source}, L={length}, {meta['device_name']}" + (f", judge {judge}" if judge else "")))
        report = run_bench(bm.objective.denoiser(bm.model, bm.rt.dtype), samplers=sampler_list, steps=steps_list,
                           batch_sizes=batch_list, precisions=precisions, num_samples=num_samples, length=length,
                           mask_id=bm.mask_id, repeats=repeats, seed=seed, device=bm.rt.device, meta=meta,
                           schedule=bm.objective.schedule, options=options, on_tokens=scorer,
                           on_row=lambda r: _add_row(table, r, judge is not None))
        report.reference = reference
        if reference is not None:
            _add_reference_row(table, reference)
        (console if console.is_terminal else Console(width=200)).print(table)
        _write_outputs(report, json_out, plot_out, plot_x, frontier=judge is not None)


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
    err_console.print(f"Benchmarking {meta['model']} at L={meta['length']} on {meta['device_name']} "
                      f"({meta['dtype']}, {meta['threads']} threads, torch {meta['torch']})",
                      highlight=False, markup=False)


def _warn_unread(sampler_list: list[str], steps: str | None, options: dict[str, list]) -> None:
    """A warning for --steps or an option list that none of the chosen samplers reads."""
    from ..engine import get_sampler

    if steps is not None and not any(get_sampler(name).uses_steps for name in sampler_list):
        warn(f"none of {', '.join(sampler_list)} takes steps; --steps {steps} is ignored")
    for name in options:
        if not any(name in get_sampler(s).options for s in sampler_list):
            warn(f"--{name.replace('_', '-')} does not apply to {', '.join(sampler_list)}; ignored")


def _write_outputs(report, json_out: str | None, plot_out: str | None, plot_x: str, *, frontier: bool) -> None:
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


def _option_lists(**flags: str | None) -> dict[str, list]:
    """Sampler option flags (comma-separated) as name -> values, each value checked."""
    from .common import sampler_options

    parse = {"tokens_per_step": int, "threshold": float, "eta": float, "k_schedule": str, "remdm_schedule": str}
    out = {}
    for name, text in flags.items():
        if text is None:
            continue
        try:
            values = [parse[name](x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise MdlmError(f"--{name.replace('_', '-')} expects comma-separated values (got {text!r})") from None
        if not values:
            raise MdlmError(f"--{name.replace('_', '-')} needs at least one value")
        if name == "tokens_per_step" and min(values) < 1:
            raise MdlmError("--tokens-per-step values must be at least 1")
        for v in values:
            if name != "tokens_per_step":
                sampler_options(**{name: v})
        out[name] = values
    return out


def _check_quality_flags(judge: str | None, reference_text: str | None, save_samples: str | None,
                         plot_x: str) -> None:
    from ..sample.frontier import X_AXES

    for flag, value in (("--reference-text", reference_text), ("--save-samples", save_samples)):
        if value is not None and judge is None:
            raise MdlmError(f"{flag} needs --judge (the samples and the real text are scored by the judge)")
    if plot_x not in X_AXES:
        raise MdlmError(f"--plot-x must be one of: {', '.join(X_AXES)}")


def _quality(bm, judge: str | None, reference_text: str | None, save_samples: str | None, length: int,
             num_samples: int, seed: int):
    """The row scorer (judge loaded once) and the real-text reference, or (None, None)."""
    if judge is None:
        return None, None
    from ..eval.genppl import load_judge
    from ..sample.frontier import RowScorer, reference_quality, reference_split

    with err_console.status(f"loading judge {judge}"):
        scorer = load_judge(judge, device=bm.rt.device)
    reference = None
    if reference_text is not None:
        split, name = reference_split(bm.data_cfg, bm.tokenizer, reference_text)
        reference = reference_quality(scorer, bm.tokenizer, split, split_name=name, length=length,
                                      per_group=num_samples)
    return RowScorer(scorer, bm.tokenizer, save_dir=save_samples, source=bm.source, seed=seed), reference


def _check_flags(precision: str, steps: str | None, batch_size: str, repeats: int, num_samples: int,
                 plot_out: str | None) -> tuple[list[str], list[int], list[int]]:
    from ..engine import PRECISIONS

    precisions = [x.strip() for x in precision.split(",") if x.strip()]
    for p in precisions:
        if p not in PRECISIONS:
            raise MdlmError(f"--precision must be among: {', '.join(PRECISIONS)} (got {p!r})")
    if repeats < 1 or num_samples < 1:
        raise MdlmError("--repeats and --num-samples must be positive")
    if plot_out:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise MdlmError("--plot needs matplotlib: pip install 'mdlm[plot]'") from None
    return precisions, int_list(steps or "100,1000", "--steps"), int_list(batch_size, "--batch-size")


def _add_row(table: Table, r, with_quality: bool = False) -> None:
    """One benchmark row: into the final table, and printed at once (the runs are long)."""
    row = (r.precision, r.sampler, r.setting or "-", str(r.batch_size), f"{r.seconds_per_sample:.3f}",
           f"{r.seconds_per_sample_min:.3f}-{r.seconds_per_sample_max:.3f}", f"{r.tokens_per_second:,.0f}",
           f"{r.nfe:.1f}", "-" if r.nfe_whole_batch is None else f"{r.nfe_whole_batch:.1f}", f"{r.ncs:.1f}",
           f"{100 * r.overhead_share:.1f}%")
    if with_quality:
        q = r.quality
        row += (f"{q.gen_ppl:.2f}", f"{q.nats_per_char:.4f}", f"{q.entropy:.3f}" + _pm(q.entropy_se))
    table.add_row(*row)
    err_console.print("  " + "  ".join(row), highlight=False, markup=False)


def _pm(se: float | None) -> str:
    return "" if se is None else f" ±{se:.3f}"


def _add_reference_row(table: Table, ref) -> None:
    q, band = ref.quality, ref.band
    table.add_row("", f"real text ({ref.split})", f"{ref.groups} x {ref.per_group} rows", *[""] * 8,
                  f"{q.gen_ppl:.2f} [{band['gen_ppl'][0]:.2f}-{band['gen_ppl'][1]:.2f}]",
                  f"{q.nats_per_char:.4f}",
                  f"{q.entropy:.3f} [{band['entropy'][0]:.3f}-{band['entropy'][1]:.3f}]")


def _samplers(objective, names: str | None) -> list[str]:
    """The samplers to benchmark: the objective's exact ones by default (the inexact ones are
    frontier points, worth their time with --judge: name them); any other is refused."""
    from ..engine import get_sampler

    served = [spec.name for spec in objective.samplers]
    exact = [spec.name for spec in objective.samplers if spec.exact]
    chosen = [x.strip() for x in names.split(",") if x.strip()] if names else exact
    for name in chosen:
        if get_sampler(name).name not in served:
            raise MdlmError(f"sampler {name} does not serve {objective.name} models; choose from: {', '.join(served)}")
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


def _bench_model(checkpoint: str | None, preset: str | None, overrides: list[str], device: str | None,
                 compile: bool, threads: int | None) -> BenchModel:
    """A checkpoint, or a randomly initialised model of a preset's size and vocabulary."""
    import torch

    from ..models import build_model
    from ..objectives import get_objective
    from ..runtime import Runtime

    if checkpoint is not None:
        loaded, rt = load_for_command(checkpoint, device, raw_weights=False, threads=threads)
        objective, model, mask_id, length = loaded.objective, loaded.model, loaded.mask_id, loaded.length
        source, tokenizer, data_cfg = str(loaded.path), loaded.tokenizer, loaded.config.data
        model_cfg = loaded.config.model
    else:
        from ..data.tokenizers import load_tokenizer

        cfg = resolve_config(preset, overrides)
        rt = Runtime.create(device or "auto", threads=threads or 0)
        tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.data.cache_dir or None)
        objective = get_objective(cfg, tokenizer)
        torch.manual_seed(0)
        model = build_model(cfg.model, tokenizer.vocab_size, causal=objective.causal).to(rt.device).eval()
        mask_id, length, data_cfg = tokenizer.mask_id, cfg.data.length, cfg.data
        model_cfg = cfg.model
        source = f"preset {cfg.name} (random weights, vocab {tokenizer.vocab_size})"
    if compile:
        if not hasattr(model, "trunk"):
            raise MdlmError(f"--compile captures the DiT's trunk; {model.describe()} has none")
        model.trunk = torch.compile(model.trunk, mode="reduce-overhead" if rt.device.type == "cuda" else None)
    return BenchModel(objective, model, mask_id, length, source, rt, tokenizer, data_cfg, model_cfg)
