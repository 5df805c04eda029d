"""`mdlm sample` and `mdlm semi-ar`."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ..errors import MdlmError
from .common import (
    AR_SAMPLER,
    CheckpointOpt,
    SamplerOpt,
    app,
    check_sampler,
    console,
    err_console,
    load_for_command,
    user_errors,
)


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

    from ..generate import generate, template, write_jsonl

    with user_errors():
        check_sampler(sampler, precision)
        if num_samples < 1 or batch_size < 1:
            raise MdlmError("--num-samples and --batch-size must be positive")
        loaded, rt = load_for_command(checkpoint, device, raw_weights)
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

    from .. import engine
    from ..generate import template, write_jsonl

    with user_errors():
        check_sampler(sampler, precision)
        loaded, rt = load_for_command(checkpoint, device, raw_weights)
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
