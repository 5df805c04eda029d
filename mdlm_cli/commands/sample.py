"""`mdlm sample` and `mdlm semi-ar`: the flags and the printing; the sampling is
`sample.draw` (`sample_window`, `semi_ar_blocks`)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.text import Text

from .app import app
from .console import console, err_console, user_errors
from .flag_checks import check_positive, id_list
from .loading import loading_command, loading_from
from .options import (
    AllowLongerOpt,
    LengthOpt,
    NumSamplesOpt,
    OutOpt,
    PromptOpt,
    SeedOpt,
)
from .sampling_args import SamplingCommand, sampling_from
from .sampling_parse import resolved

InfillOpt = Annotated[
    str | None, typer.Option(help="Text with <mask> (one token) or <mask:N> spans to fill in.")
]
PromptIdsOpt = Annotated[str | None, typer.Option(
    help="Token ids the samples start with, comma-separated (e.g. 5,17,3), nothing added "
         "before or after them (no BOS); instead of --prompt or --infill.")]
ChatOpt = Annotated[str | None, typer.Option(
    help="A question put through the tokenizer's chat template (with the generation prompt); "
         "the answer stops at the model's end-of-turn token or EOS. Instead of --prompt, "
         "--prompt-ids or --infill.")]
QuietOpt = Annotated[bool, typer.Option(help="Do not print the samples.")]
MaxNewTokensOpt = Annotated[int | None, typer.Option(
    help="Tokens after the prompt at most (instead of --length).")]
StopAtEosOpt = Annotated[bool | None, typer.Option(
    help="Cut each sample at its first EOS and report its length (default: on for a model "
         "fine-tuned with data.pad_as_eos).")]
SampleBatchSizeOpt = Annotated[int, typer.Option(help="Sequences per batch.")]
TotalLengthOpt = Annotated[
    int | None, typer.Option(help="Total tokens per sample (default: 2 windows).")
]
SampleStrideOpt = Annotated[
    int | None, typer.Option(help="New tokens per block L' (default: half the window).")
]
FirstWindowOpt = Annotated[str | None, typer.Option(help="Text the first window starts with.")]
StreamOpt = Annotated[bool, typer.Option(help="Print each block as it completes.")]
SAMPLE_HELP = """Draw samples from a trained model and print them.

    [dim]Examples:[/]
      mdlm sample                                     # 4 samples from runs/demo, first-hitting
      mdlm sample --steps 1000                        # a step-based sampler (ancestral-cache
                                                      # here), 1000 steps
      mdlm sample --sampler ancestral-cache --steps 1000 -n 16 --out samples.jsonl
      mdlm sample --prompt "It was a dark night" --seed 3
      mdlm sample --infill "Holmes <mask:6> Watson <mask:12> the door."
      mdlm sample --sampler threshold --threshold 0.7 # fast, inexact: several tokens per
                                                      # network call
      mdlm sample --sampler remdm --steps 1000 --eta 0.02
      mdlm sample --checkpoint runs/demo-ar -n 8     # an AR checkpoint: left to right, KV cache
      mdlm sample -c LLADA --prompt-ids 5,17,3 --max-new-tokens 64 --steps 64
        --sampler confidence --block-length 16 --temperature 0   # LLaDA's generate()
      mdlm sample -c DREAM --prompt-ids 5,17,3 --max-new-tokens 24 --steps 12
        --sampler confidence --order entropy --temperature 0     # Dream's alg="entropy"
      mdlm sample -c LLADA --chat "What is 2 + 2?" --max-new-tokens 32 --steps 32 -n 1
        --sampler confidence --block-length 32 --temperature 0   # the chat template; stops at
                                                                 # <|eot_id|> or EOS
      (each folder's own --k-schedule is its default: llada, dream; docs/sampling.md
      maps their generate arguments to these flags)
    """
SEMI_AR_HELP = """Generate text longer than the model's window, block by block (MDLM §4.2).

    Each round keeps the last L - L' tokens as a clean prefix and samples L' new ones.

    [dim]Examples:[/]
      mdlm semi-ar --length 512 --stride 64
      mdlm semi-ar --checkpoint runs/owt --length 2048 --stride 512 --sampler ancestral-cache
    """


@app.command("sample", help=SAMPLE_HELP, cls=loading_command(SamplingCommand))
def sample_cmd(
    *,
    ctx: typer.Context,
    num_samples: NumSamplesOpt = 4,
    batch_size: SampleBatchSizeOpt = 4,
    seed: SeedOpt = 0,
    prompt: PromptOpt = None,
    prompt_ids: PromptIdsOpt = None,
    chat: ChatOpt = None,
    infill: InfillOpt = None,
    length: LengthOpt = None,
    out: OutOpt = None,
    quiet: QuietOpt = False,
    allow_longer: AllowLongerOpt = False,
    max_new_tokens: MaxNewTokensOpt = None,
    stop_at_eos: StopAtEosOpt = None,
) -> None:
    sampling = sampling_from(ctx)
    from ..generation.request import GenerationRequest
    from ..io.files import check_all_writable
    from ..sample.draw import sample_window

    with user_errors():
        check_positive(num_samples=num_samples, batch_size=batch_size, length=length)
        ids = id_list(prompt_ids, "--prompt-ids")
        check_all_writable(out)  # before the sampling, not after it
        loaded, rt = loading_from(ctx).load()
        how = resolved(sampling, loaded)
        with sampling_progress(how.sampler, num_samples) as advance:
            request = GenerationRequest(
                how, num_samples=num_samples, batch_size=batch_size, seed=seed, prompt=prompt,
                prompt_ids=None if ids is None else tuple(ids), chat=chat, infill=infill,
                max_new_tokens=max_new_tokens, length=length, stop_at_eos=stop_at_eos,
                allow_longer=allow_longer)
            drawn = sample_window(loaded, rt, request, on_batch=advance)
        _write_and_show(drawn, out, quiet, _summary(how.sampler, drawn, sampling.precision))


def _summary(sampler: str, drawn, precision: str) -> str:
    return (f"{sampler}: {drawn.per_sample:.2f} s/sample, NFE {drawn.stats.nfe:.1f}, "
            f"NCS {drawn.stats.ncs:.1f} per sample ({precision})")


@contextmanager
def sampling_progress(sampler: str, num_samples: int):
    """A transient progress bar of the samples drawn; yields its `advance(n)`."""
    from rich.progress import Progress

    with Progress(console=err_console, transient=True) as progress:
        task = progress.add_task(f"sampling ({sampler})", total=num_samples)
        yield lambda n: progress.advance(task, n)


def _write_and_show(drawn, out: str | None, quiet: bool, summary: str) -> None:
    """The JSONL file first (the samples are on disk whatever the terminal makes of them), then
    the samples and the summary line."""
    from ..sample.draw import write_samples

    if out:
        write_samples(out, drawn)
    if not quiet:
        _panels(drawn.records)
    console.print(summary)
    if out:
        console.print(f"Wrote {len(drawn.records)} samples to {out}", markup=False)


@app.command("semi-ar", help=SEMI_AR_HELP, cls=loading_command(SamplingCommand))
def semi_ar_cmd(
    *,
    length: TotalLengthOpt = None,
    stride: SampleStrideOpt = None,
    ctx: typer.Context,
    num_samples: NumSamplesOpt = 1,
    seed: SeedOpt = 0,
    prompt: FirstWindowOpt = None,
    stream: StreamOpt = True,
    out: OutOpt = None,
    max_new_tokens: MaxNewTokensOpt = None,
    stop_at_eos: StopAtEosOpt = None,
) -> None:
    sampling = sampling_from(ctx)
    from ..generation.request import GenerationRequest
    from ..io.files import check_all_writable
    from ..sample.draw import semi_ar_blocks, write_samples

    with user_errors():
        check_positive(length=length, stride=stride, num_samples=num_samples)
        check_all_writable(out)
        loading = loading_from(ctx)
        loaded, rt = loading.load()
        request = GenerationRequest(resolved(sampling, loaded), num_samples=num_samples,
                                    seed=seed, prompt=prompt, length=length,
                                    max_new_tokens=max_new_tokens, stop_at_eos=stop_at_eos)
        drawn = semi_ar_blocks(loaded, rt, request, stride=stride, source=loading.checkpoint,
                               on_text=_write if stream else None)
        if out:  # before anything is printed
            write_samples(out, drawn)
        _show(drawn.records, streamed=drawn.streamed)
        err_console.print(f"{drawn.length} tokens per sample (window {drawn.window}, stride "
                          f"{drawn.stride}), {drawn.per_sample:.2f} s/sample, NFE "
                          f"{drawn.stats.nfe:.1f}")


def _panels(records) -> None:
    """Each sample in a panel (model text is never rich markup), titled with its answer's length
    when it was cut at EOS."""
    from rich.panel import Panel

    for r in records:
        title = f"sample {r.index}" + ("" if r.length is None else
                                       f" ({r.length} tokens{'' if r.ended else ', no EOS'})")
        console.print(Panel(Text(r.text), title=title, title_align="left"), highlight=False)


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
