"""`mdlm bench-sampler`: wall-clock cost of each sampler, with the work counters.

For every (precision, sampler, steps, batch size, sampler options): seconds per sample
(median and range over repeats after a warm-up), tokens/s, NFE, categorical draws, and
the share of wall time spent outside the network forward (sampler overhead). The
network is timed by wrapping the denoiser (with CUDA synchronisation on CUDA).
For caching samplers it also gives the calls the reference's whole-batch cache
would have made (`WholeBatchCount`, from the steps at which the batch changed).
The tokens of each row's first timed run are handed to `on_tokens` (the judge's
quality columns, sample/frontier.py).
"""

from __future__ import annotations

import itertools
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch

from .. import engine
from ..perf import ModelFlops, Peak, mfu


class TimedDenoiser:
    """Wraps the model callable a sampler takes (a denoiser or a causal LM) and accumulates
    the seconds spent inside it; every other attribute is the inner one's."""

    def __init__(self, inner, device: torch.device):
        self.inner, self.device = inner, device
        self.seconds = 0.0
        self.input_tokens = 0  # positions the calls ran the network over
        self.output_rows = 0  # positions the calls asked the output layer for (perf.py)

    # supports_output_mask, time_agnostic, schedule, bos_id, new_cache, ...
    def __getattr__(self, name: str):
        attribute = getattr(self.inner, name)
        if name in ("log_score", "block_cache", "from_cache"):  # network calls: a score
            return self._timed(attribute)  # model's, a block cache's full pass and sliced call
        return attribute

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _timed(self, fn):
        def timed(*args, **kwargs):
            self._sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            self._sync()
            self.seconds += time.perf_counter() - t0
            if args and isinstance(args[0], torch.Tensor):  # the positions: z_t, or the ids
                self._count(args[0], kwargs.get("output_mask"))
            return out

        return timed

    def _count(self, tokens: torch.Tensor, output_mask: torch.Tensor | None) -> None:
        """The positions a call runs (a cached AR call: only its new ones) and those it asks the
        output layer for (all of them without an output mask)."""
        self.input_tokens += tokens.numel()
        self.output_rows += tokens.numel() if output_mask is None else int(output_mask.sum())

    def __call__(self, *args, **kwargs):
        return self._timed(self.inner)(*args, **kwargs)


class WholeBatchCount:
    """Batched calls the reference's cache would make: it recomputes the whole batch after
    every step in which any sequence changed (and at the first step), while mdlm's
    per-sequence cache calls only for the sequences that changed."""

    def __init__(self):
        self.calls = 0

    def __call__(self, change_steps: list[int], n_steps: int) -> None:
        if n_steps:
            self.calls += 1 + sum(i < n_steps - 1 for i in change_steps)


@dataclass
class BenchRow:
    sampler: str
    steps: int | None
    batch_size: int
    precision: str
    num_samples: int
    repeats: int
    seconds_per_sample: float  # median over repeats
    seconds_per_sample_min: float
    seconds_per_sample_max: float
    tokens_per_second: float
    nfe: float  # network evaluations per sequence
    ncs: float  # categorical draws per sequence
    calls: int  # batched network calls per repeat
    # ancestral-cache: batched calls if any change invalidated the whole batch
    whole_batch_calls: int | None
    # the same as network evaluations per sequence (the reference's cache)
    nfe_whole_batch: float | None
    network_share: float
    overhead_share: float  # 1 - network_share: sampler work outside the forward
    # the sampler options of the row (engine.sample's)
    options: dict[str, Any] = field(default_factory=dict)
    quality: Any = None  # frontier.Quality of the first timed run's samples, with --judge
    calls_per_second: float = 0.0  # batched network calls per second of the timed runs
    input_tokens: float = 0.0  # positions per sequence the network calls ran over
    output_rows: float = 0.0  # positions per sequence the calls asked the output layer for
    mfu: float | None = None  # model FLOP utilisation of the network calls (None: no peak known)

    @property
    def setting(self) -> str:
        """What distinguishes the row within its sampler: steps and options, e.g. `100` or
        `threshold=0.9`."""
        parts = [] if self.steps is None else [str(self.steps)]
        return " ".join(parts + [f"{k}={v}" for k, v in sorted(self.options.items())])


@dataclass
class BenchReport:
    meta: dict
    results: list[BenchRow] = field(default_factory=list)
    reference: Any = None  # frontier.Reference: real text scored by the judge

    def to_dict(self) -> dict:
        out = {"meta": self.meta, "results": [asdict(r) for r in self.results]}
        if self.reference is not None:
            out["reference"] = asdict(self.reference)
        return out


def environment(device: torch.device, dtype: torch.dtype | None) -> dict:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or "cpu"
    return {
        "device": str(device),
        "device_name": name,
        "dtype": "bf16 autocast" if dtype == torch.bfloat16 else "fp32",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class BenchDraws:
    """What every row draws: `num_samples` samples of `length` tokens (mask id `mask_id`, the
    `schedule`; None: the denoiser's, else log-linear) on `device`, in `repeats` timed runs
    seeded `seed`, `seed` + 1, ..., after a warm-up at the same shapes (`warmup`)."""

    num_samples: int
    length: int
    mask_id: int
    repeats: int
    seed: int
    device: torch.device
    schedule: Any = None
    warmup: bool = True

    def drawing(self, denoiser) -> dict:
        """`engine.sample`'s keywords of the canvas and the schedule."""
        schedule = self.schedule if self.schedule is not None else getattr(
            denoiser, "schedule", "loglinear")
        return {"length": self.length, "mask_id": self.mask_id, "schedule": schedule,
                "device": self.device}


def run_config(denoiser,
               how: engine.SamplingSettings,
               draws: BenchDraws,
               *,
               batch_size: int,
               on_tokens: Callable[[torch.Tensor], None] | None = None) -> BenchRow:
    """One row: `draws.repeats` timed runs of `draws.num_samples` samples drawn `how`, in
    batches (after a warm-up); `on_tokens` gets the tokens of the first timed run (seed
    `draws.seed`: what `mdlm sample --seed` draws with the same flags)."""
    spec = engine.get_sampler(how.sampler)
    steps, options = how.steps, dict(how.options)
    num_samples, device = draws.num_samples, draws.device
    timed = TimedDenoiser(denoiser, device)
    drawing = draws.drawing(denoiser)
    if draws.warmup:
        _warm_up(denoiser, how, draws, batch_size=batch_size, drawing=drawing)
    walls, shares, last, whole = [], [], None, None
    for r in range(draws.repeats):
        timed.input_tokens = timed.output_rows = 0  # the last repeat's counts are the row's
        wall, network, last, whole, tokens = _timed_run(
            timed, how, num_samples, draws.seed + r, batch_size=batch_size,
            count_whole_batch=spec.needs_time_agnostic, device=device, drawing=drawing)
        walls.append(wall)
        shares.append(network / wall if wall > 0 else 0.0)
        if r == 0 and on_tokens is not None:
            on_tokens(tokens)
    per_sample = [w / num_samples for w in walls]
    median = statistics.median(per_sample)
    share = statistics.median(shares)
    return BenchRow(
        sampler=how.sampler, steps=steps if spec.uses_steps else None, batch_size=batch_size,
        precision=how.precision, num_samples=num_samples, repeats=draws.repeats,
        seconds_per_sample=median,
        seconds_per_sample_min=min(per_sample),
        seconds_per_sample_max=max(per_sample),
        tokens_per_second=draws.length / median if median > 0 else float("inf"),
        nfe=last.nfe, ncs=last.ncs, calls=last.calls,
        whole_batch_calls=None if whole is None else whole.calls,
        nfe_whole_batch=None if whole is None else whole.calls * batch_size / num_samples,
        network_share=share, overhead_share=1.0 - share, options=options,
        input_tokens=timed.input_tokens / num_samples,
        output_rows=timed.output_rows / num_samples,
    )


def _warm_up(denoiser, how: engine.SamplingSettings, draws: BenchDraws, *,
             batch_size: int,
             drawing: dict) -> None:
    """Allocator, kernels, compilation: one batch at the same shapes, a few calls."""
    length, mask_id = draws.length, draws.mask_id
    few = torch.full((batch_size, length), mask_id, dtype=torch.long, device=draws.device)
    # a real token everywhere but the last 4 positions: first-hitting makes 4 calls, not L, and
    # a left-to-right model has a prefix to continue
    few[:, :length - 4] = int(mask_id == 0)
    gen = torch.Generator(device=draws.device).manual_seed(draws.seed)
    few_steps = how.with_(steps=min(how.steps or 1, 4))
    engine.sample(denoiser, few_steps, num_samples=batch_size, prompt=few,
                  generator=gen, **drawing)


def _timed_run(timed: TimedDenoiser, how: engine.SamplingSettings, n: int, seed: int, *,
               batch_size: int,
               count_whole_batch: bool,
               device: torch.device,
               drawing: dict) -> tuple:
    """One timed `engine.sample` of n samples: (wall seconds, network seconds, the sampler's
    stats, the whole-batch cache's count or None, the tokens)."""
    timed.seconds = 0.0
    whole = WholeBatchCount() if count_whole_batch else None
    _sync(device)
    t0 = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(seed)
    tokens, stats = engine.sample(timed, how, num_samples=n,
                                  batch_size=batch_size, return_stats=True, on_changes=whole,
                                  generator=gen, **drawing)
    _sync(device)
    return time.perf_counter() - t0, timed.seconds, stats, whole, tokens


def option_grid(sampler: str, options: dict[str, list] | None) -> list[dict]:
    """Every combination of the option values given (name -> values) that the sampler reads."""
    reads = engine.get_sampler(sampler).option_names
    read = sorted(name for name in (options or {}) if name in reads)
    combinations = itertools.product(*(options[n] for n in read))
    return [dict(zip(read, values, strict=True)) for values in combinations]


def sweep(samplers: list[str], steps: list[int], precisions: list[str],
          options: dict[str, list] | None = None, *, temperature: float = 1.0,
          top_p: float = 1.0, top_k: int | None = None) -> list[engine.SamplingSettings]:
    """The settings to benchmark: for each precision and sampler, every combination of the
    option values it reads, and every step count if it takes steps (one row else)."""
    out = []
    for precision in precisions:
        for sampler in samplers:
            for opts in option_grid(sampler, options):
                for s in (steps if engine.get_sampler(sampler).uses_steps else [None]):
                    out.append(engine.SamplingSettings(sampler, s, precision, temperature, top_p,
                                                       opts, top_k=top_k))
    return out


def grid(settings: list[engine.SamplingSettings],
         batch_sizes: list[int]) -> list[tuple[engine.SamplingSettings, int]]:
    """The rows to run: each (precision, sampler) group of `settings` at every batch size."""
    out = []
    groups = itertools.groupby(settings, key=lambda how: (how.precision, how.sampler))
    for _, group in groups:
        group = list(group)
        out += [(how, b) for b in batch_sizes for how in group]
    return out


def run_bench(denoiser,
              settings: list[engine.SamplingSettings],
              draws: BenchDraws,
              *,
              batch_sizes: list[int],
              meta: dict,
              on_tokens: Callable[[BenchRow, torch.Tensor], None] | None = None,
              on_row: Callable[[BenchRow], None] | None = None,
              speed: tuple[ModelFlops, Peak | None] | None = None) -> BenchReport:
    """Every row of `grid(settings, batch_sizes)`, each drawing `draws` (its samples rounded
    down to whole batches, at least one); `on_tokens(row, tokens)` sees each row's first timed
    samples before `on_row(row)` (the judge fills `row.quality` there). With `speed` (the
    model's FLOP counts, the device's peak) the rows get their MFU; `meta` is the report's."""
    report = BenchReport(meta=meta)
    for how, b in grid(settings, batch_sizes):
        n = max(draws.num_samples - draws.num_samples % b, b)  # whole batches only
        kept = []
        row = run_config(denoiser, how, replace(draws, num_samples=n), batch_size=b,
                         on_tokens=kept.append)
        row.calls_per_second = row.calls / max(row.seconds_per_sample * n, 1e-12)
        if speed is not None:  # the positions the calls ran, and those given an output
            flops = speed[0].sampling_call(row.input_tokens, draws.length, row.output_rows)
            row.mfu = mfu(flops / max(row.seconds_per_sample, 1e-12), speed[1])
        if on_tokens is not None:
            on_tokens(row, kept[0])
        report.results.append(row)
        if on_row is not None:
            on_row(row)
    return report


def plot(report: BenchReport, path: str) -> None:
    """Seconds per sample vs steps, one line per (sampler, batch size, precision)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    steps = sorted({r.steps for r in report.results if r.steps is not None}) or [1]

    def key(r: BenchRow):
        return r.sampler, r.batch_size, r.precision, tuple(sorted(r.options.items()))

    for sampler, b, precision, opts in sorted({key(r) for r in report.results}, key=str):
        rows = [r for r in report.results if key(r) == (sampler, b, precision, opts)]
        options = "".join(f" {k}={v}" for k, v in opts)
        label = f"{sampler}{options} (batch {b}, {precision})"
        if not engine.get_sampler(sampler).uses_steps:
            ax.plot(steps, [rows[0].seconds_per_sample] * len(steps), "--", label=label)
        else:
            rows.sort(key=lambda r: r.steps)
            seconds = [r.seconds_per_sample for r in rows]
            ax.plot([r.steps for r in rows], seconds, "o-", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sampling steps")
    ax.set_ylabel("seconds per sample")
    ax.set_title(f"L={report.meta.get('length')}, {report.meta.get('device_name')}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
