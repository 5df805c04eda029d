"""`mdlm sample` and `mdlm semi-ar`."""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer
from rich.text import Text

from ..errors import MdlmError
from .common import (
    AllowLongerOpt,
    CheckpointOpt,
    DeviceOpt,
    NumSamplesOpt,
    OutOpt,
    PromptOpt,
    RawWeightsOpt,
    SeedOpt,
    ThreadsOpt,
    app,
    check_length,
    check_memory,
    check_positive,
    console,
    err_console,
    load_for_command,
    user_errors,
)
from .sampling_args import Sampling, sampling_arguments

InfillOpt = Annotated[
    str | None, typer.Option(help="Text with <mask> (one token) or <mask:N> spans to fill in.")
]
LengthOpt = Annotated[int | None, typer.Option(help="Tokens per sample (default: the model's L).")]
QuietOpt = Annotated[bool, typer.Option(help="Do not print the samples.")]
MaxNewTokensOpt = Annotated[int | None, typer.Option(
    help="Tokens after the prompt at most (instead of --length).")]
StopAtEosOpt = Annotated[bool | None, typer.Option(
    help="Cut each sample at its first EOS and report its length (default: on for a model "
         "fine-tuned with data.pad_as_eos).")]


@app.command("sample")
@sampling_arguments()
def sample_cmd(
    *,
    checkpoint: CheckpointOpt = "runs/demo",
    sampling: Sampling,
    num_samples: NumSamplesOpt = 4,
    batch_size: Annotated[int, typer.Option(help="Sequences per batch.")] = 4,
    seed: SeedOpt = 0,
    prompt: PromptOpt = None,
    infill: InfillOpt = None,
    length: LengthOpt = None,
    out: OutOpt = None,
    device: DeviceOpt = None,
    raw_weights: RawWeightsOpt = False,
    quiet: QuietOpt = False,
    threads: ThreadsOpt = None,
    allow_longer: AllowLongerOpt = False,
    max_new_tokens: MaxNewTokensOpt = None,
    stop_at_eos: StopAtEosOpt = None,
) -> None:
    """Draw samples from a trained model and print them.

    [dim]Examples:[/]
      mdlm sample                                     # 4 samples from runs/demo, first-hitting
      mdlm sample --steps 1000                        # a step-based sampler (ancestral-cache here), 1000 steps
      mdlm sample --sampler ancestral-cache --steps 1000 -n 16 --out samples.jsonl
      mdlm sample --prompt "It was a dark night" --seed 3
      mdlm sample --infill "Holmes <mask:6> Watson <mask:12> the door."
      mdlm sample --sampler threshold --threshold 0.7 # fast, inexact: several tokens per network call
      mdlm sample --sampler remdm --steps 1000 --eta 0.02
      mdlm sample --checkpoint runs/demo-ar -n 8     # an AR checkpoint: left to right, KV cache
    """
    from rich.progress import Progress

    from ..io.files import check_writable
    from ..sample.generate import generate, template, window_for

    with user_errors():
        check_positive(num_samples=num_samples, batch_size=batch_size, length=length)
        if out:
            check_writable(out)  # before the sampling, not after it
        loaded, rt = load_for_command(checkpoint, device, raw_weights, threads)
        spec, steps = sampling.resolve(loaded.objective)
        length = window_for(loaded, length, prompt, max_new_tokens)
        length = _checked_length(loaded, length, batch_size, num_samples, rt.device, allow_longer)
        fixed = template(loaded, length, prompt=prompt, infill=infill)
        with Progress(console=err_console, transient=True) as progress:
            task = progress.add_task(f"sampling ({spec.name})", total=num_samples)
            records, stats, seconds = generate(
                loaded,
                sampler=spec.name,
                num_samples=num_samples,
                batch_size=batch_size,
                steps=steps,
                seed=seed,
                device=rt.device,
                dtype=rt.dtype,
                length=length,
                prompt=fixed,
                stop_at_eos=stop_at_eos,
                on_batch=lambda n: progress.advance(task, n),
                **sampling.engine_kwargs(spec),
            )
        extra = {**sampling.record(spec, steps), "nfe": stats.nfe, "ncs": stats.ncs, "seed": seed,
                 "checkpoint": str(loaded.path), "seconds": seconds / num_samples,
                 "prompt": prompt, "infill": infill}
        _write_and_show(records, extra, out, quiet, f"{spec.name}: {seconds / num_samples:.2f} "
                        f"s/sample, NFE {stats.nfe:.1f}, NCS {stats.ncs:.1f} per sample "
                        f"({sampling.precision})")


def _write_and_show(records, extra: dict, out: str | None, quiet: bool, summary: str) -> None:
    """The JSONL file first (the samples are on disk whatever the terminal makes of them), then
    the samples and the summary line."""
    from ..sample.generate import write_jsonl

    if out:
        write_jsonl(out, [r.to_json(**extra) for r in records])
    if not quiet:
        _panels(records)
    console.print(summary)
    if out:
        console.print(f"Wrote {len(records)} samples to {out}", markup=False)


@app.command("semi-ar")
@sampling_arguments()
def semi_ar_cmd(
    *,
    checkpoint: CheckpointOpt = "runs/demo",
    length: Annotated[
        int | None, typer.Option(help="Total tokens per sample (default: 2 windows).")
    ] = None,
    stride: Annotated[
        int | None, typer.Option(help="New tokens per block L' (default: half the window).")
    ] = None,
    sampling: Sampling,
    num_samples: NumSamplesOpt = 1,
    seed: SeedOpt = 0,
    prompt: Annotated[str | None, typer.Option(help="Text the first window starts with.")] = None,
    stream: Annotated[bool, typer.Option(help="Print each block as it completes.")] = True,
    out: OutOpt = None,
    device: DeviceOpt = None,
    raw_weights: RawWeightsOpt = False,
    threads: ThreadsOpt = None,
    max_new_tokens: MaxNewTokensOpt = None,
    stop_at_eos: StopAtEosOpt = None,
) -> None:
    """Generate text longer than the model's window, block by block (MDLM §4.2).

    Each round keeps the last L - L' tokens as a clean prefix and samples L' new ones.

    [dim]Examples:[/]
      mdlm semi-ar --length 512 --stride 64
      mdlm semi-ar --checkpoint runs/owt --length 2048 --stride 512 --sampler ancestral-cache
    """
    import torch

    from .. import engine
    from ..io.files import check_all_writable
    from ..sample.generate import semi_ar_plan, semi_ar_records, write_jsonl

    with user_errors():
        check_positive(length=length, stride=stride, num_samples=num_samples)
        check_all_writable(out)
        loaded, rt = load_for_command(checkpoint, device, raw_weights, threads)
        spec, steps = sampling.resolve(loaded.objective)
        window, tok = loaded.length, loaded.tokenizer
        stop, limit, length = semi_ar_plan(loaded, length, prompt, max_new_tokens, stop_at_eos)
        stride, length = _semi_ar_lengths(
            loaded, checkpoint, stride, length, num_samples, rt.device
        )
        start = _prefix(loaded, prompt)
        streaming = stream and num_samples == 1 and not stop
        streaming and start is not None and _write(tok.decode(start.tolist()))
        t0 = time.perf_counter()
        result = engine.semi_ar(
            loaded.denoiser(rt.dtype),
            sampler=spec.name,
            num_samples=num_samples,
            window=window,
            stride=stride,
            target_length=length,
            mask_id=loaded.mask_id,
            prompt=start,
            steps=steps,
            on_block=lambda r, new: streaming and _write(tok.decode(new[0].tolist())),
            schedule=loaded.objective.schedule,
            generator=torch.Generator(device=rt.device).manual_seed(seed),
            device=rt.device,
            stop_token=tok.eos_id if stop else None,
            **sampling.engine_kwargs(spec),
        )
        seconds = time.perf_counter() - t0
        result.tokens = result.tokens[:, :limit]
        records = semi_ar_records(loaded, result.tokens, start, stop)
        if out:  # before anything is printed
            write_jsonl(
                out,
                [
                    r.to_json(
                        **sampling.record(spec, steps),
                        window=window,
                        stride=stride,
                        seed=seed,
                        checkpoint=str(loaded.path),
                        nfe=result.stats.nfe,
                        ncs=result.stats.ncs,
                        seconds=seconds / num_samples,
                    )
                    for r in records
                ],
            )
        _show(records, streamed=streaming)
        err_console.print(
            f"{result.tokens.shape[1]} tokens per sample (window {window}, stride {stride}), "
            f"{seconds / num_samples:.2f} s/sample, NFE {result.stats.nfe:.1f}"
        )


def _panels(records) -> None:
    """Each sample in a panel (model text is never rich markup), titled with its answer's length
    when it was cut at EOS."""
    from rich.panel import Panel

    for r in records:
        title = f"sample {r.index}" + ("" if r.length is None else
                                       f" ({r.length} tokens{'' if r.ended else ', no EOS'})")
        console.print(Panel(Text(r.text), title=title, title_align="left"), highlight=False)


def _prefix(loaded, prompt: str | None):
    """The prompt's tokens (the first window's clean prefix), or None."""
    from ..sample.generate import template

    if not prompt:
        return None
    start = template(loaded, loaded.length, prompt=prompt)
    return start[start != loaded.mask_id]


def _checked_length(
    loaded,
    length: int | None,
    batch: int,
    num_samples: int,
    device,
    allow_longer: bool,
) -> int:
    """The length to sample (default: the model's L), refused past L without --allow-longer, or
    where a batch of it cannot fit in memory."""
    length, batch = length if length is not None else loaded.length, min(batch, num_samples)
    check_length(loaded, length, allow_longer)
    check_memory(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size, batch=batch,
                 length=length, device=device,
                 what=f"sampling {num_samples} x {length} tokens ({batch} per batch)",
                 fix="lower --length, --num-samples or --batch-size", rows=num_samples)
    return length


def _semi_ar_lengths(
    loaded,
    checkpoint: str,
    stride: int | None,
    length: int | None,
    num_samples: int,
    device,
) -> tuple[int, int]:
    """(stride, total length) for a diffusion model's window; left-to-right models are refused,
    and windows that cannot fit in memory."""
    check_memory(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size, batch=num_samples,
                 length=loaded.length, device=device,
                 what=f"sampling {num_samples} windows of {loaded.length} tokens",
                 fix="lower --num-samples")
    if loaded.objective.causal:
        raise MdlmError(
            f"{checkpoint} is a left-to-right ({loaded.objective.name}) model; it generates up to "
            "its length with mdlm sample (semi-ar is for diffusion models)"
        )
    window = loaded.length
    stride, length = (
        window // 2 if stride is None else stride,
        2 * window if length is None else length,
    )
    if length < window:
        raise MdlmError(f"--length must be at least the window ({window})")
    return stride, length


def _show(records, *, streamed: bool) -> None:
    """The samples as plain text (never markup); a streamed one only needs its last newline.
    Samples cut at EOS are followed by their answers' lengths."""
    if streamed:
        sys.stdout.write("\n")
        return
    for r in records:
        console.rule(f"sample {r.index}")
        console.print(r.text, highlight=False, markup=False)
    if records and records[0].length is not None:
        err_console.print("answer lengths (tokens before EOS): " + ", ".join(
            f"{r.length}{'' if r.ended else ' (no EOS)'}" for r in records))


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
