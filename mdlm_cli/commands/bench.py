"""`mdlm bench-sampler`."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ..config import resolve_config
from ..errors import MdlmError
from .common import SetOpt, app, console, err_console, int_list, load_for_command, user_errors


@app.command("bench-sampler")
def bench_sampler_cmd(
    checkpoint: Annotated[str | None, typer.Option(
        "--checkpoint", "-c", help="A trained model (default: runs/demo if present, else --preset).")] = None,
    preset: Annotated[str | None, typer.Option(
        "--preset", "-p", help="Benchmark a randomly initialised model of this preset's size and vocabulary.")] = None,
    overrides: SetOpt = None,
    samplers: Annotated[str, typer.Option(
        help="Comma-separated samplers.")] = "ancestral,ancestral-cache,first-hitting",
    steps: Annotated[str, typer.Option(help="Comma-separated ancestral step counts.")] = "100,1000",
    num_samples: Annotated[int, typer.Option("--num-samples", "-n", help="Samples per configuration.")] = 8,
    batch_size: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1,8",
    length: Annotated[int | None, typer.Option(help="Tokens per sample (default: the model's L).")] = None,
    precision: Annotated[str, typer.Option(
        help="Comma-separated: fp64 (default), fp32 (the reference's draw).")] = "fp64",
    repeats: Annotated[int, typer.Option(help="Timed repeats after the warm-up.")] = 3,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | mps.")] = None,
    compile: Annotated[bool, typer.Option(
        "--compile", help="torch.compile the network trunk (CUDA: reduce-overhead / CUDA graphs).")] = False,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    plot_out: Annotated[str | None, typer.Option(
        "--plot", help="Plot seconds/sample vs steps (needs matplotlib).")] = None,
) -> None:
    """Time the samplers: seconds per sample, tokens/s, NFE, categorical draws, sampler overhead.

    [dim]Examples:[/]
      mdlm bench-sampler                                   # the demo model, steps 100 and 1000
      mdlm bench-sampler --preset test --set data.tokenizer=gpt2 --length 1024 --steps 100 -n 1 --batch-size 1
      mdlm bench-sampler -c runs/owt --steps 100,1000,10000 -n 64 --batch-size 1,8 --json b.json --plot b.png
    """
    from pathlib import Path

    from ..bench import environment, plot, run_bench
    from ..engine import PRECISIONS, SAMPLERS

    with user_errors():
        sampler_list = [x.strip() for x in samplers.split(",") if x.strip()]
        for name in sampler_list:
            if name not in SAMPLERS:
                raise MdlmError(f"unknown sampler {name!r}; choose from: {', '.join(SAMPLERS)}")
        precisions = [x.strip() for x in precision.split(",") if x.strip()]
        for p in precisions:
            if p not in PRECISIONS:
                raise MdlmError(f"--precision must be among: {', '.join(PRECISIONS)} (got {p!r})")
        steps_list, batch_list = int_list(steps, "--steps"), int_list(batch_size, "--batch-size")
        if repeats < 1 or num_samples < 1:
            raise MdlmError("--repeats and --num-samples must be positive")
        if plot_out:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise MdlmError("--plot needs matplotlib: pip install 'mdlm[plot]'") from None
        if checkpoint is None and preset is None:
            checkpoint = "runs/demo" if Path("runs/demo/latest").is_file() else None
            preset = None if checkpoint else "demo"
        if checkpoint is not None and overrides:
            raise MdlmError("--set applies to --preset models; a checkpoint carries its own config")
        denoiser, mask_id, model_length, source, rt = _bench_model(checkpoint, preset, overrides or [], device,
                                                                   compile)
        length = length or model_length
        meta = {**environment(rt.device, rt.dtype), "model": source, "length": length, "seed": seed,
                "num_samples": num_samples, "repeats": repeats, "compile": compile,
                "vocab_size": denoiser.model.config.vocab_size,
                "command": "mdlm " + " ".join(sys.argv[1:])}
        table = Table("precision", "sampler", "steps", "batch", "s/sample", "min-max", "tok/s", "NFE",
                      "NFE whole-batch", "NCS", "overhead", title=f"{source}, L={length}, {meta['device_name']}")
        err_console.print(f"Benchmarking {source} at L={length} on {meta['device_name']} ({meta['dtype']}, "
                          f"{meta['threads']} threads, torch {meta['torch']})")

        def on_row(r) -> None:
            row = (r.precision, r.sampler, str(r.steps or "-"), str(r.batch_size), f"{r.seconds_per_sample:.3f}",
                   f"{r.seconds_per_sample_min:.3f}-{r.seconds_per_sample_max:.3f}", f"{r.tokens_per_second:,.0f}",
                   f"{r.nfe:.1f}", "-" if r.nfe_whole_batch is None else f"{r.nfe_whole_batch:.1f}", f"{r.ncs:.1f}",
                   f"{100 * r.overhead_share:.1f}%")
            table.add_row(*row)
            err_console.print("  " + "  ".join(row), highlight=False)

        report = run_bench(denoiser, samplers=sampler_list, steps=steps_list, batch_sizes=batch_list,
                           precisions=precisions, num_samples=num_samples, length=length, mask_id=mask_id,
                           repeats=repeats, seed=seed, device=rt.device, meta=meta, on_row=on_row)
        (console if console.is_terminal else Console(width=140)).print(table)
        if json_out:
            Path(json_out).write_text(json.dumps(report.to_dict(), indent=2))
            console.print(f"Wrote {json_out}")
        if plot_out:
            plot(report, plot_out)
            console.print(f"Wrote {plot_out}")


def _bench_model(checkpoint: str | None, preset: str | None, overrides: list[str], device: str | None,
                 compile: bool):
    import torch

    from ..engine import get_schedule
    from ..models import DiffusionDenoiser
    from ..runtime import Runtime

    if checkpoint is not None:
        loaded, rt = load_for_command(checkpoint, device, raw_weights=False)
        model, cfg, mask_id, length, source = (loaded.model, loaded.config, loaded.mask_id, loaded.length,
                                               str(loaded.path))
    else:
        from ..data.tokenizers import load_tokenizer
        from ..train import build_model

        cfg = resolve_config(preset, overrides)
        rt = Runtime.create(device or "auto")
        tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.data.cache_dir or None)
        torch.manual_seed(0)
        model = build_model(cfg, tokenizer.vocab_size).to(rt.device).eval()
        mask_id, length = tokenizer.mask_id, cfg.data.length
        source = f"preset {cfg.name} (random weights, vocab {tokenizer.vocab_size})"
    if compile:
        model.trunk = torch.compile(model.trunk, mode="reduce-overhead" if rt.device.type == "cuda" else None)
    schedule = get_schedule(cfg.diffusion.schedule, cfg.diffusion.eps)
    denoiser = DiffusionDenoiser(model, schedule, time_conditioning=cfg.model.time_conditioning,
                                 autocast_dtype=rt.dtype)
    return denoiser, mask_id, length, source, rt
