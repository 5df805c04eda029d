"""Part 4 of the GPU check: `mdlm bench-sampler` rows on DiT small (random weights, GPT-2
vocabulary) at L = 1024, and the cost of one categorical draw over V = 50,258 next to one
network call. The rows come from `mdlm_cli.sample.bench.run_bench`, the function behind
`mdlm bench-sampler` (the command's table, without its CLI: typer need not be installed)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch
from gpu_common import PartFile, Sizes, preset_config, random_dit, timed

SAMPLERS = ("ancestral", "ancestral-cache", "first-hitting")
PRECISIONS = ("fp64", "fp32")


def bench_rows(part: PartFile, denoiser, sz: Sizes) -> None:
    """One row per (precision, sampler, batch): one batch of samples, timed once after the
    bench's warm-up; network calls per second from the row's batched calls."""
    from mdlm_cli.sample.bench import BenchDraws, run_bench, sweep

    def on_row(row) -> None:
        d = asdict(row)
        d["calls_per_s"] = row.calls / (row.seconds_per_sample * row.num_samples)
        part.append("rows", d)

    draws = BenchDraws(num_samples=1, length=sz.length, mask_id=sz.mask_id, repeats=1, seed=0,
                       device=sz.device)
    run_bench(
        denoiser,
        sweep(list(SAMPLERS), [sz.sample_steps], list(PRECISIONS)),
        draws,
        batch_sizes=list(sz.sample_batches),
        meta={},
        on_row=on_row,
    )


def draw_costs(part: PartFile, denoiser, sz: Sizes) -> None:
    """Seconds of one `sample_tokens` call over N rows of V = 50,258 logits (N = 1: a
    first-hitting call; 4 and 64: the tokens an ancestral step reveals at L = 1024, 256 steps,
    batch 1 and 16; 8192: every masked position of a half-masked batch of 16, what the
    reference draws at every step), and of one network call at batch 1 and the largest batch."""
    from mdlm_cli.engine import sample_tokens

    gen = torch.Generator(device=sz.device).manual_seed(0)
    for rows in sz.draw_rows:
        logits = torch.randn(rows, sz.vocab, device=sz.device, generator=gen).to(torch.bfloat16)
        for precision in PRECISIONS:
            seconds = timed(
                lambda lg=logits, p=precision: sample_tokens(
                    lg, sz.mask_id, generator=gen, precision=p
                ),
                sz.device,
                sz.draw_repeats,
            )
            part.append("draws", {"rows": rows, "precision": precision, "ms": 1e3 * seconds})
        del logits
    for batch in (1, max(sz.sample_batches)):
        z = torch.full((batch, sz.length), sz.mask_id, device=sz.device)
        z[:, ::2] = 7  # half masked
        t = torch.full((batch,), 0.5, device=sz.device)
        with torch.no_grad():
            seconds = timed(
                lambda z=z, t=t: denoiser(z, t), sz.device, max(sz.draw_repeats // 2, 1)
            )
        part.append("network", {"batch": batch, "length": sz.length, "ms": 1e3 * seconds})


def headline(data: dict) -> str:
    rows = data.get("rows", [])
    fh = [r for r in rows if r["sampler"] == "first-hitting" and r["precision"] == "fp64"]
    draw = next(
        (d for d in data.get("draws", []) if d["rows"] == 1 and d["precision"] == "fp64"), None
    )
    net = next((n for n in data.get("network", []) if n["batch"] == 1), None)
    parts = [f"{len(rows)} bench rows"]
    if fh:
        parts.append(
            f"first-hitting batch {fh[0]['batch_size']}: "
            f"{fh[0]['seconds_per_sample']:.2f} s/sample, "
            f"{fh[0]['calls_per_s']:.0f} calls/s"
        )
    if draw and net:
        parts.append(f"fp64 draw (1 row) {draw['ms']:.3f} ms vs network call {net['ms']:.2f} ms")
    return "; ".join(parts)


def part_sampling(out: Path, sz: Sizes) -> None:
    from mdlm_cli.objectives import get_objective
    from mdlm_cli.runtime import autocast_dtype

    cfg = preset_config(sz)
    model = random_dit(cfg, sz.vocab).to(sz.device)
    denoiser = get_objective(cfg, sz.ids).denoiser(model, autocast_dtype(sz.device))
    part = PartFile(
        out,
        "sampling",
        model=model.describe(),
        length=sz.length,
        steps=sz.sample_steps,
        vocab=sz.vocab,
        dtype="bf16 autocast" if denoiser.autocast_dtype == torch.bfloat16 else "fp32",
    )
    draw_costs(part, denoiser, sz)  # first: seconds, where the rows take a minute or more
    bench_rows(part, denoiser, sz)
    part.update(status="ok", headline=headline(part.data))
