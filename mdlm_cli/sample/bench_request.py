"""The whole of `mdlm bench-sampler` as one call: the model to time (a checkpoint, or a randomly
initialised model of a preset's size), the samplers, the length, the judge and the real-text
reference, then every row of `bench.run_bench`. The command parses its flags into a
`BenchRequest`, calls `benchmark` and prints what `BenchHooks` hands it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MdlmError, MdlmWarning
from ..models.speed import compile_trunk, model_flops, model_width
from ..perf import device_peak
from .bench import BenchDraws, BenchReport, BenchRow, environment, run_bench, sweep


@dataclass
class SamplingSweep:
    """bench-sampler's sampling flags: lists to sweep (a row per value)."""

    samplers: list[str] | None  # None: the objective's exact samplers
    steps: list[int]
    steps_text: str | None  # --steps as given (None: the default)
    precisions: list[str]
    temperature: float
    top_p: float
    options: dict[str, list]  # option name -> its values, from the flags and --opt
    top_k: int | None = None  # vocabulary top-k (None: the model's default)

    def settings(self, samplers: list[str]) -> list:
        """The SamplingSettings of every row (bench.sweep), for these samplers."""
        return sweep(samplers, self.steps, self.precisions, self.options,
                     temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)

    def drawing(self) -> dict[str, float | int | None]:
        """The temperature, nucleus mass and vocabulary top-k every row draws with."""
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}


@dataclass
class BenchRequest:
    """What to benchmark: every flag of `mdlm bench-sampler`, parsed (None: its default)."""

    sampling: SamplingSweep
    batch_sizes: list[int]
    checkpoint: str | None = None  # default: runs/demo where it exists, else `preset`
    preset: str | None = None  # a randomly initialised model of this preset's size
    overrides: list[str] = field(default_factory=list)  # --set, for a preset only
    num_samples: int = 8
    length: int | None = None  # default: the model's L
    repeats: int = 3
    seed: int = 0
    device: str | None = None
    threads: int | None = None
    raw_weights: bool = False  # a checkpoint's raw weights instead of its EMA
    compile: bool = False
    net_precision: str = "auto"  # the network's: auto | bf16 | fp32 (runtime.autocast_dtype)
    adapter: str | None = None  # a LoRA adapter folder merged into the checkpoint's model
    allow_longer: bool = False
    judge: str | None = None  # score each row's samples with this judge
    reference_text: str | None = None  # with a judge: real text from this split
    save_samples: str | None = None  # with a judge: each row's samples as JSONL here
    featurizer: str | None = None  # MAUVE's feature model (default: the judge)
    mauve_seeds: str = "0,1,2,3,4"
    command: str = ""  # the command line, kept in the report's meta


def _ignore(*args: Any) -> None:
    return None


@dataclass
class BenchHooks:
    """What the caller is shown as the benchmark goes (each optional)."""

    on_note: Callable[[str], None] = _ignore  # a note of the loaded checkpoint
    on_start: Callable[[dict], None] = _ignore  # the report's meta, before the judge and rows
    on_row: Callable[[BenchRow], None] = _ignore  # each row as it is measured
    status: Callable[[str], AbstractContextManager] = lambda text: nullcontext()  # slow stages


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
    sampling_defaults: dict = field(default_factory=dict)  # LoadedModel.sampling_defaults


def benchmark(request: BenchRequest, hooks: BenchHooks | None = None) -> BenchReport:
    """Every row of the request, with its quality columns where a judge is given; the
    real-text reference (if asked for) is the report's `reference`."""
    hooks = hooks or BenchHooks()
    check_request(request)
    checkpoint, preset = model_source(request.checkpoint, request.preset, request.overrides)
    bm = load_bench_model(checkpoint, preset, request, hooks.on_note)
    sampling = request.sampling
    samplers = bench_samplers(bm.objective, sampling.samplers)
    warn_unread(samplers, sampling.steps_text, sampling.options)
    length = checked_length(bm, checkpoint, request, max(request.batch_sizes))
    meta = bench_meta(bm, request, length)
    hooks.on_start(meta)
    scorer, reference = quality(bm, request, length, hooks.status)
    denoiser = bm.objective.denoiser(bm.model, bm.rt.dtype)
    rows = [how.with_defaults(bm.sampling_defaults) for how in sampling.settings(samplers)]
    draws = BenchDraws(num_samples=request.num_samples, length=length, mask_id=bm.mask_id,
                       repeats=request.repeats, seed=request.seed, device=bm.rt.device,
                       schedule=bm.objective.schedule)
    report = run_bench(denoiser, rows, draws, batch_sizes=request.batch_sizes, meta=meta,
                       on_tokens=scorer, on_row=hooks.on_row,
                       speed=(model_flops(bm.model), device_peak(bm.rt.device, bm.rt.dtype)))
    report.reference = reference  # None without a reference text
    return report


def bench_meta(bm: BenchModel, request: BenchRequest, length: int) -> dict:
    """The report's meta: the machine, the model and the request."""
    return {
        **environment(bm.rt.device, bm.rt.dtype),
        "model": bm.source,
        "objective": bm.objective.name,
        "length": length,
        "seed": request.seed,
        "num_samples": request.num_samples,
        "repeats": request.repeats,
        "compile": request.compile,
        **request.sampling.drawing(),
        "vocab_size": bm.model.vocab_size,
        "judge": request.judge,
        "command": request.command,
    }


def check_request(request: BenchRequest) -> None:
    """The checks of the flags that need no model."""
    if request.length is not None and request.length < 1:
        raise MdlmError(f"--length must be at least 1 (got {request.length})")
    if request.repeats < 1 or request.num_samples < 1:
        raise MdlmError("--repeats and --num-samples must be positive")
    flags = (("--reference-text", request.reference_text),
             ("--save-samples", request.save_samples))
    for flag, value in flags:
        if value is not None and request.judge is None:
            raise MdlmError(f"{flag} needs --judge (the samples and the real text are scored "
                            "by the judge)")


def model_source(checkpoint: str | None, preset: str | None, overrides: list[str] | None
                 ) -> tuple[str | None, str | None]:
    """(checkpoint, preset): runs/demo where it exists and neither is given, else the demo
    preset."""
    if checkpoint is None and preset is None:
        checkpoint = "runs/demo" if Path("runs/demo/latest").is_file() else None
        preset = None if checkpoint else "demo"
    if checkpoint is not None and overrides:
        raise MdlmError("--set applies to --preset models; a checkpoint carries its own config")
    return checkpoint, preset


def checked_length(bm: BenchModel, checkpoint: str | None, request: BenchRequest,
                   batch: int) -> int:
    """The length (default: the model's L), refused past a checkpoint's trained L without
    --allow-longer (a preset's random weights have none), or where a batch cannot fit."""
    from ..checkpoints.load import check_length
    from ..memory import Workload, check_memory

    length = request.length or bm.length
    if checkpoint is not None:
        check_length(bm, length, request.allow_longer)
    work = Workload(batch, length, what=f"benchmarking {batch} x {length} tokens",
                    fix="lower --length or --batch-size")
    check_memory(bm.model, bm.model_cfg, bm.tokenizer.vocab_size, work, device=bm.rt.device)
    return length


def warn_unread(sampler_list: list[str], steps: str | None, options: dict[str, list]) -> None:
    """A warning for --steps or an option list that none of the chosen samplers reads."""
    from ..engine import get_sampler

    def warn(message: str) -> None:
        warnings.warn(message, MdlmWarning, stacklevel=3)

    names = ", ".join(sampler_list)
    if steps is not None and not any(get_sampler(name).uses_steps for name in sampler_list):
        warn(f"none of {names} takes steps; --steps {steps} is ignored")
    for name in options:
        if not any(name in get_sampler(s).option_names for s in sampler_list):
            warn(f"--{name.replace('_', '-')} does not apply to {names}; ignored")


def bench_samplers(objective, names: list[str] | None) -> list[str]:
    """The samplers to benchmark: the objective's exact ones by default (the inexact ones are
    frontier points, worth their time with --judge: name them); any other is refused."""
    from ..engine import get_sampler

    served = [spec.name for spec in objective.samplers]
    exact = [spec.name for spec in objective.samplers if spec.exact]
    chosen = names or exact
    for name in chosen:
        if get_sampler(name).name not in served:
            raise MdlmError(f"sampler {name} does not serve {objective.name} models; choose "
                            f"from: {', '.join(served)}")
    return chosen


def load_bench_model(checkpoint: str | None, preset: str | None, request: BenchRequest,
                     on_note: Callable[[str], None] = _ignore) -> BenchModel:
    """A checkpoint, or a randomly initialised model of a preset's size and vocabulary;
    torch.compile'd trunk with `request.compile`."""

    if checkpoint is not None:
        bm = _checkpoint_model(checkpoint, request, on_note)
    else:
        bm = _preset_model(preset, request)
    mode = "reduce-overhead" if bm.rt.device.type == "cuda" else None
    if request.compile and not compile_trunk(bm.model, mode):
        raise MdlmError(f"--compile captures the DiT's trunk; {bm.model.describe()} has none")
    return bm


def _checkpoint_model(checkpoint: str, request: BenchRequest,
                      on_note: Callable[[str], None]) -> BenchModel:
    from ..checkpoints.load import load_on_device

    loaded, rt = load_on_device(checkpoint, device=request.device,
                                raw_weights=request.raw_weights,
                                threads=request.threads, precision=request.net_precision,
                                adapter=request.adapter)
    for note in loaded.state.get("notes") or []:  # e.g. an encoder's fresh MLM head
        on_note(note)
    return BenchModel(loaded.objective, loaded.model, loaded.mask_id, loaded.length,
                      str(loaded.path), rt, loaded.tokenizer, loaded.config.data,
                      loaded.config.model, loaded.sampling_defaults)


def _preset_model(preset: str | None, request: BenchRequest) -> BenchModel:
    import torch

    from ..build import resolve_config
    from ..data.tokenizers import load_tokenizer
    from ..models import build_model
    from ..objectives import get_objective
    from ..runtime import Runtime

    if request.raw_weights or request.adapter:
        flag = "--raw-weights" if request.raw_weights else "--adapter"
        raise MdlmError(f"{flag} applies to a checkpoint; a --preset model has random weights")
    cfg = resolve_config(preset, request.overrides)
    rt = Runtime.create(request.device or "auto", threads=request.threads or 0)
    tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.data.cache_dir or None)
    objective = get_objective(cfg, tokenizer)
    torch.manual_seed(0)
    model = build_model(cfg.model, tokenizer.vocab_size, causal=objective.causal)
    rt = rt.for_model(request.net_precision, model_width(model))  # as a checkpoint's would
    source = f"preset {cfg.name} (random weights, vocab {tokenizer.vocab_size})"
    return BenchModel(objective, model.to(rt.device).eval(), tokenizer.mask_id, cfg.data.length,
                      source, rt, tokenizer, cfg.data, cfg.model)


def quality(bm: BenchModel, request: BenchRequest, length: int,
            status: Callable[[str], AbstractContextManager]):
    """The row scorer (judge loaded once) and the real-text reference, or (None, None)."""
    from ..eval.genppl import load_judge
    from ..eval.mauve import parse_seeds
    from .frontier import RowScorer

    judge, featurizer = request.judge, request.featurizer
    if judge is None:
        if featurizer is not None:
            raise MdlmError("--featurizer needs --judge and --reference-text (MAUVE against "
                            "real text)")
        return None, None
    seeds = parse_seeds(request.mauve_seeds)
    with status(f"loading judge {judge}"):
        scorer = load_judge(judge, device=bm.rt.device)
    reference, mauve_set = None, None
    if request.reference_text is not None:
        reference, mauve_set = _reference(bm, request, scorer, length, seeds)
    elif featurizer is not None:
        raise MdlmError("--featurizer needs --reference-text (MAUVE compares the samples with "
                        "real text)")
    row_scorer = RowScorer(scorer, bm.tokenizer, save_dir=request.save_samples, source=bm.source,
                           seed=request.seed, mauve_set=mauve_set)
    return row_scorer, reference


def _reference(bm: BenchModel, request: BenchRequest, scorer, length: int, seeds):
    """Real text of the model's data scored by the judge, and MAUVE's reference set."""
    from ..eval.features import load_featurizer
    from ..eval.mauve import size_warning
    from .frontier import ReferenceSets, reference_quality, reference_split

    n = request.num_samples
    features = None
    if n >= 2:
        features = load_featurizer(request.featurizer, device=bm.rt.device, judge=scorer)
        if (message := size_warning(n, n)) is not None:
            warnings.warn(message, MdlmWarning, stacklevel=2)
    else:
        warnings.warn("MAUVE needs at least 2 samples per row: -n 1 rows get no MAUVE",
                      MdlmWarning, stacklevel=2)
    split, name = reference_split(bm.data_cfg, bm.tokenizer, request.reference_text)
    sets = ReferenceSets(split, split_name=name, length=length, per_group=n)
    return reference_quality(scorer, bm.tokenizer, sets, featurizer=features, seeds=seeds)
