"""`mdlm bench-sampler`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..config import resolve_config
from ..errors import MdlmError
from .common import (
    SetOpt,
    ThreadsOpt,
    app,
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
    help="Comma-separated samplers (default: every sampler of the model's objective).")]
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
PlotOpt = Annotated[str | None, typer.Option("--plot", help="Plot seconds/sample vs steps (needs matplotlib).")]
COLUMNS = ("precision", "sampler", "steps", "batch", "s/sample", "min-max", "tok/s", "NFE", "NFE whole-batch", "NCS",
           "overhead")


@app.command("bench-sampler")
def bench_sampler_cmd(
    checkpoint: CheckpointOpt = None, preset: PresetOpt = None, overrides: SetOpt = None,
    samplers: SamplersOpt = None, steps: StepsListOpt = None, num_samples: NumOpt = 8, batch_size: BatchesOpt = "1,8",
    length: LengthOpt = None, precision: PrecisionsOpt = "fp64", repeats: RepeatsOpt = 3,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | mps.")] = None,
    compile: CompileOpt = False, json_out: JsonOpt = None, plot_out: PlotOpt = None, threads: ThreadsOpt = None,
) -> None:
    """Time the samplers: seconds per sample, tokens/s, NFE, categorical draws, sampler overhead.

    [dim]Examples:[/]
      mdlm bench-sampler                                   # the demo model, steps 100 and 1000
      mdlm bench-sampler --preset test --set data.tokenizer=gpt2 --length 1024 --steps 100 -n 1 --batch-size 1
      mdlm bench-sampler -c runs/owt --steps 100,1000,10000 -n 64 --batch-size 1,8 --json b.json --plot b.png
      mdlm bench-sampler -c runs/demo-ar --batch-size 1,8  # an AR model: its left-to-right sampler
    """
    from ..bench import environment, plot, run_bench
    from ..engine import get_sampler
    from ..files import check_writable

    with user_errors():
        precisions, steps_list, batch_list = _check_flags(precision, steps, batch_size, repeats, num_samples, plot_out)
        check_positive(length=length)
        for path in (json_out, plot_out):
            if path:
                check_writable(path)
        if checkpoint is None and preset is None:
            checkpoint = "runs/demo" if Path("runs/demo/latest").is_file() else None
            preset = None if checkpoint else "demo"
        if checkpoint is not None and overrides:
            raise MdlmError("--set applies to --preset models; a checkpoint carries its own config")
        objective, model, mask_id, model_length, source, rt = _bench_model(checkpoint, preset, overrides or [],
                                                                           device, compile, threads)
        sampler_list = _samplers(objective, samplers)
        if steps is not None and not any(get_sampler(name).uses_steps for name in sampler_list):
            warn(f"none of {', '.join(sampler_list)} takes steps; --steps {steps} is ignored")
        length = length or model_length
        meta = {**environment(rt.device, rt.dtype), "model": source, "objective": objective.name, "length": length,
                "seed": seed, "num_samples": num_samples, "repeats": repeats, "compile": compile,
                "vocab_size": model.vocab_size, "command": "mdlm " + " ".join(sys.argv[1:])}
        err_console.print(f"Benchmarking {source} at L={length} on {meta['device_name']} ({meta['dtype']}, "
                          f"{meta['threads']} threads, torch {meta['torch']})", highlight=False, markup=False)
        table = Table(*COLUMNS, title=Text(f"{source}, L={length}, {meta['device_name']}"))  # a path, not markup
        report = run_bench(objective.denoiser(model, rt.dtype), samplers=sampler_list, steps=steps_list,
                           batch_sizes=batch_list, precisions=precisions, num_samples=num_samples, length=length,
                           mask_id=mask_id, repeats=repeats, seed=seed, device=rt.device, meta=meta,
                           schedule=objective.schedule, on_row=lambda r: _add_row(table, r))
        (console if console.is_terminal else Console(width=140)).print(table)
        if json_out:
            Path(json_out).write_text(json.dumps(report.to_dict(), indent=2))
            console.print(f"Wrote {json_out}", markup=False)
        if plot_out:
            plot(report, plot_out)
            console.print(f"Wrote {plot_out}", markup=False)


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


def _add_row(table: Table, r) -> None:
    """One benchmark row: into the final table, and printed at once (the runs are long)."""
    row = (r.precision, r.sampler, str(r.steps or "-"), str(r.batch_size), f"{r.seconds_per_sample:.3f}",
           f"{r.seconds_per_sample_min:.3f}-{r.seconds_per_sample_max:.3f}", f"{r.tokens_per_second:,.0f}",
           f"{r.nfe:.1f}", "-" if r.nfe_whole_batch is None else f"{r.nfe_whole_batch:.1f}", f"{r.ncs:.1f}",
           f"{100 * r.overhead_share:.1f}%")
    table.add_row(*row)
    err_console.print("  " + "  ".join(row), highlight=False, markup=False)


def _samplers(objective, names: str | None) -> list[str]:
    """The samplers to benchmark: the objective's own by default; any other is refused."""
    from ..engine import get_sampler

    served = [spec.name for spec in objective.samplers]
    chosen = [x.strip() for x in names.split(",") if x.strip()] if names else served
    for name in chosen:
        if get_sampler(name).name not in served:
            raise MdlmError(f"sampler {name} does not serve {objective.name} models; choose from: {', '.join(served)}")
    return chosen


def _bench_model(checkpoint: str | None, preset: str | None, overrides: list[str], device: str | None,
                 compile: bool, threads: int | None):
    """(objective, model, mask id, length, description, runtime) of a checkpoint or a random preset model."""
    import torch

    from ..models import build_model
    from ..objectives import get_objective
    from ..runtime import Runtime

    if checkpoint is not None:
        loaded, rt = load_for_command(checkpoint, device, raw_weights=False, threads=threads)
        objective, model, mask_id, length = loaded.objective, loaded.model, loaded.mask_id, loaded.length
        source = str(loaded.path)
    else:
        from ..data.tokenizers import load_tokenizer

        cfg = resolve_config(preset, overrides)
        rt = Runtime.create(device or "auto", threads=threads or 0)
        tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.data.cache_dir or None)
        objective = get_objective(cfg, tokenizer)
        torch.manual_seed(0)
        model = build_model(cfg.model, tokenizer.vocab_size, causal=objective.causal).to(rt.device).eval()
        mask_id, length = tokenizer.mask_id, cfg.data.length
        source = f"preset {cfg.name} (random weights, vocab {tokenizer.vocab_size})"
    if compile:
        if not hasattr(model, "trunk"):
            raise MdlmError(f"--compile captures the DiT's trunk; {model.describe()} has none")
        model.trunk = torch.compile(model.trunk, mode="reduce-overhead" if rt.device.type == "cuda" else None)
    return objective, model, mask_id, length, source, rt
