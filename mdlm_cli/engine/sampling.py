"""The samplers registry and the two entry points, `sample` and `semi_ar` (§4.2).

Every sampler is a `SamplerSpec`: the function (`run(z, ctx) -> z`, filling the masked
positions of z in place), whether it reads `steps` or needs a time-agnostic denoiser, its
help text, and its options: a frozen dataclass declared next to the function (fields made
with `engine.options.option`: default, help, valid values), of which the run's context
carries one checked instance (`ctx.options`). The objectives say which samplers serve
their models (`Objective.sampler_names`); the engine knows no objective. CLI choices,
flags and help, `bench-sampler`'s rows and the parametrised tests all come from `SAMPLERS`.

Adding a sampler: its module (the function and its options dataclass), an entry here, and
its name in the objectives that it serves.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from torch import Tensor

from .ancestral import AncestralOptions, ancestral, ancestral_cache
from .autoregressive import autoregressive
from .categorical import PRECISIONS
from .confidence import ConfidenceOptions, ThresholdOptions, confidence, threshold
from .context import SamplerContext, SampleStats
from .d3pm import d3pm_ancestral
from .errors import EngineError, ProbabilityError
from .first_hitting import FirstHittingOptions, first_hitting
from .options import build_options, convert_options
from .protocols import Denoiser, is_time_agnostic
from .remdm import RemdmOptions, remdm
from .schedules import Schedule, get_schedule
from .sedd import analytic, euler


@dataclass(frozen=True)
class SamplerSpec:
    name: str
    run: Callable[[Tensor, SamplerContext], Tensor]
    help: str  # one line, exactness included: what `--help` and `mdlm bench-sampler` show
    exact: bool  # draws from the model's distribution (given enough steps where it takes steps)
    uses_steps: bool = False  # reads `steps` (the number of sampling steps)
    needs_time_agnostic: bool = False  # reuses outputs across steps: the denoiser must ignore t
    fallback: str | None = None  # what runs instead when the denoiser is not time-agnostic
    options: type | None = None  # its options dataclass (engine/options.py), None for none
    default_steps: int = 1000

    @property
    def option_names(self) -> frozenset[str]:
        """The names of the options it reads."""
        return frozenset(f.name for f in fields(self.options)) if self.options else frozenset()


SAMPLERS: dict[str, SamplerSpec] = {spec.name: spec for spec in (
    SamplerSpec("ancestral", ancestral, exact=True, uses_steps=True, options=AncestralOptions,
                help="§4.1, one network call per step for every sequence with a mask left; "
                     "exact as steps grow"),
    SamplerSpec("ancestral-cache", ancestral_cache, exact=True, uses_steps=True,
                needs_time_agnostic=True, fallback="ancestral", options=AncestralOptions,
                help="ancestral with per-sequence caching: a call only for sequences that changed "
                     "(models without time conditioning); same draws as ancestral"),
    SamplerSpec("first-hitting", first_hitting, exact=True, options=FirstHittingOptions,
                help="Zheng et al.: one call and one draw per revealed token, exact; "
                     "--tokens-per-step k > 1 reveals k per call (approximate)"),
    SamplerSpec("analytic", analytic, exact=True, uses_steps=True,
                help="SEDD's Tweedie tau-leaping on the model's scores (a SUBS model's converted), "
                     "one call per step and a final denoising draw; exact as steps grow"),
    SamplerSpec("euler", euler, exact=True, uses_steps=True,
                help="SEDD's Euler step of the reverse rate, one call per step and a final "
                     "denoising draw; exact as steps grow"),
    SamplerSpec("d3pm-ancestral", d3pm_ancestral, exact=True, uses_steps=True,
                options=AncestralOptions,
                help="D3PM's ancestral chain from t = 1 to 0 (eq. 9's posterior, the mask's mass "
                     "included), one call per step; exact at steps = T"),
    SamplerSpec("autoregressive-kv-cache", autoregressive, exact=True,
                help="left to right with a key/value cache, one call per new token; exact"),
    SamplerSpec("confidence", confidence, exact=False, uses_steps=True, default_steps=128,
                options=ConfidenceOptions,
                help="MaskGIT / LLaDA low-confidence remasking: each step draws a token at every "
                     "masked position and keeps the k likeliest draws (k from --k-schedule over "
                     "the steps); inexact: parallel, biased to likely tokens"),
    SamplerSpec("threshold", threshold, exact=False, options=ThresholdOptions,
                help="Fast-dLLM parallel decoding: each call keeps every drawn token whose "
                     "probability exceeds --threshold (at least one); inexact: parallel, biased "
                     "to likely tokens"),
    SamplerSpec("remdm", remdm, exact=False, uses_steps=True, options=RemdmOptions,
                help="ReMDM (Wang et al. 2025): ancestral steps that may remask revealed tokens "
                     "(--remdm-schedule cap|rescale, --eta); eta 0 is ancestral; inexact at "
                     "finite steps"),
)}


def option_names() -> list[str]:
    """Every sampler option's name, sorted: the keywords `sample` accepts for them."""
    return sorted(set().union(*(spec.option_names for spec in SAMPLERS.values())))


def get_sampler(name: str) -> SamplerSpec:
    try:
        return SAMPLERS[name]
    except KeyError:
        choices = ", ".join(SAMPLERS)
        raise EngineError(f"unknown sampler {name!r}; choose one of: {choices}") from None


def _initial_state(prompt: Tensor | None, num_samples: int, length: int, mask_id: int,
                   device: torch.device) -> Tensor:
    if prompt is None:
        return torch.full((num_samples, length), mask_id, dtype=torch.long, device=device)
    prompt = prompt.to(device=device, dtype=torch.long)
    if prompt.dim() == 1:
        prompt = prompt[None].expand(num_samples, -1)
    if prompt.shape != (num_samples, length):
        raise EngineError(f"prompt has shape {tuple(prompt.shape)}; expected ({length},) or "
                          f"({num_samples}, {length}) with mask_id at free positions")
    return prompt.clone()


def _resolve(spec: SamplerSpec, denoiser: Denoiser, time_agnostic: bool | None) -> SamplerSpec:
    """The sampler that will run: a caching sampler falls back where the denoiser may depend
    on t."""
    if not spec.needs_time_agnostic:
        return spec
    agnostic = is_time_agnostic(denoiser) if time_agnostic is None else time_agnostic
    if agnostic:
        return spec
    warnings.warn(
        f"{spec.name} needs a denoiser that ignores t (time_agnostic=True; a model without "
        f"time conditioning): falling back to {spec.fallback}",
        stacklevel=3,
    )
    return SAMPLERS[spec.fallback]


def _run_batch(spec: SamplerSpec, z: Tensor, ctx: SamplerContext) -> Tensor:
    """One batch through the sampler; a refused draw says which sampler and how far it got."""
    try:
        return spec.run(z, ctx)
    except ProbabilityError as e:
        where = f"{spec.name} sampler, at network call {ctx.stats.calls}"
        raise ProbabilityError(f"{where}: {e}") from None


def _check_arguments(spec: SamplerSpec,
                     steps: int | None,
                     precision: str,
                     temperature: float,
                     top_p: float,
                     num_samples: int,
                     length: int) -> None:
    if precision not in PRECISIONS:
        raise EngineError(f"precision must be one of: {', '.join(PRECISIONS)} (got {precision!r})")
    if spec.uses_steps and (steps is None or steps < 1):
        raise EngineError(f"sampler {spec.name} needs steps >= 1 (got {steps})")
    if not (math.isfinite(temperature) and temperature > 0) or not 0 < top_p <= 1:
        raise EngineError(f"temperature must be > 0 and top_p in (0, 1] "
                          f"(got {temperature}, {top_p})")
    if num_samples < 1 or length < 1:
        raise EngineError(f"num_samples and length must be positive (got {num_samples}, {length})")


def sample(denoiser: Denoiser,
           *,
           sampler: str,
           num_samples: int,
           length: int,
           mask_id: int,
           steps: int | None = None,
           schedule: str | Schedule = "loglinear",
           generator: torch.Generator | None = None,
           prompt: Tensor | None = None,
           batch_size: int | None = None,
           precision: str = "fp64",
           temperature: float = 1.0,
           top_p: float = 1.0,
           time_agnostic: bool | None = None,
           device: torch.device | str | None = None,
           return_stats: bool = False,
           on_batch: Callable[[int], None] | None = None,
           on_changes: Callable[[list[int], int], None] | None = None,
           options: Any = None,
           **option_values: Any):
    """Draw `num_samples` sequences of `length` tokens: LongTensor (num_samples, length).

    `prompt` (length,) or (num_samples, length) holds mask_id at free positions; every
    other position is kept fixed and conditions the rest (prefix, suffix, infilling).
    `time_agnostic` declares that the denoiser ignores t (default: its `time_agnostic`
    attribute, else False); caching samplers need it. The result holds no mask token.
    With `return_stats=True`, returns (tokens, SampleStats) with NFE (network
    evaluations per sequence) and NCS (categorical draws per sequence). `on_batch(n)` is
    called after each batch; `on_changes(steps, n_steps)` by caching samplers, per batch
    (the steps at which any sequence changed: what benchmarks need for a whole-batch cache).

    Sampler options: `options=` an instance of the sampler's dataclass (`SAMPLERS[name].options`,
    e.g. AncestralOptions(final_denoise=False)) and/or keywords replacing its fields (each
    sampler's fields: its options dataclass in `SAMPLERS`). Another sampler's option is not
    read; an unknown name, or a value out of its range or choices, is an EngineError naming it.
    """
    spec = get_sampler(sampler)
    _check_arguments(spec, steps, precision, temperature, top_p, num_samples, length)
    checked = build_options(spec.options, options, option_values, option_names(), spec.name)
    spec = _resolve(spec, denoiser, time_agnostic)
    device = torch.device(device) if device is not None else (
        prompt.device if prompt is not None else torch.device("cpu"))
    z_all = _initial_state(prompt, num_samples, length, mask_id, device)
    batch_size = batch_size or num_samples
    stats = SampleStats(num_sequences=num_samples)
    ctx = SamplerContext(denoiser, get_schedule(schedule), mask_id, generator, stats,
                         steps=steps or 0, precision=precision, temperature=temperature,
                         top_p=top_p, options=convert_options(checked, spec.options),
                         on_changes=on_changes)
    tokens = _run_batches(spec, z_all, ctx, batch_size, on_batch)
    assert not (tokens == mask_id).any(), "a sampler left a mask token"
    return (tokens, stats) if return_stats else tokens


def _run_batches(spec: SamplerSpec, z_all: Tensor, ctx: SamplerContext, batch_size: int,
                 on_batch: Callable[[int], None] | None) -> Tensor:
    """Every batch of `z_all` through the sampler, in order; `on_batch(n)` after each."""
    outputs = []
    for z in z_all.split(batch_size):
        outputs.append(_run_batch(spec, z.clone(), ctx))
        if on_batch is not None:
            on_batch(len(z))
    return torch.cat(outputs)


def _first_window(prompt: Tensor | None, num_samples: int, window: int, mask_id: int,
                  device: torch.device | str) -> tuple[Tensor, int]:
    """Semi-AR's first window (num_samples, window): the prompt, then masks; and the prompt's
    length."""
    first = torch.full((num_samples, window), mask_id, dtype=torch.long, device=device)
    if prompt is None:
        return first, 0
    prompt = prompt.to(first.device).long()
    prompt = prompt[None].expand(num_samples, -1) if prompt.dim() == 1 else prompt
    n_prompt = prompt.shape[1]
    if n_prompt >= window:
        raise EngineError(
            f"the prompt ({n_prompt} tokens) must be shorter than the window ({window})"
        )
    first[:, :n_prompt] = prompt
    return first, n_prompt


@dataclass
class SemiARResult:
    tokens: Tensor  # (num_samples, total_length)
    stats: SampleStats = field(default_factory=SampleStats)


def semi_ar(denoiser: Denoiser, *, sampler: str, num_samples: int, window: int, stride: int,
            mask_id: int, rounds: int | None = None, target_length: int | None = None,
            prompt: Tensor | None = None, on_block: Callable[[int, Tensor], None] | None = None,
            stop_token: int | None = None, **sample_kwargs) -> SemiARResult:
    """Semi-autoregressive generation (§4.2): text longer than the window L.

    A first window of L tokens is sampled (starting with the optional `prompt`, (P,) or
    (num_samples, P) tokens, P < L); then each round keeps the last L - L' tokens as a clean
    prefix, fills L' fresh masks with the inner sampler and appends them. Output
    length L + R * L' (or `target_length`, rounded up to whole blocks then cut).
    `on_block(round, new_tokens)` is called as each block completes (for streaming).
    `sample_kwargs` go to every block's `sample` call (steps, schedule, generator, precision,
    temperature, top_p, device, `options=` and the option keywords).
    With `stop_token` (EOS) no block is started once every sample holds it after the prompt.
    """
    if not 0 < stride < window:
        raise EngineError(f"stride must be between 1 and window - 1 = {window - 1} (got {stride})")
    if rounds is None:
        if target_length is None:
            raise EngineError("give either rounds or target_length")
        rounds = max(math.ceil((target_length - window) / stride), 0)
    stats = SampleStats(num_sequences=num_samples)
    keep = window - stride

    def run(block_prompt: Tensor) -> Tensor:
        tokens, s = sample(
            denoiser,
            sampler=sampler,
            num_samples=num_samples,
            length=window,
            mask_id=mask_id,
            prompt=block_prompt,
            return_stats=True,
            **sample_kwargs,
        )
        stats.merge(s)
        return tokens

    device = sample_kwargs.get("device") or (prompt.device if prompt is not None else "cpu")
    first, n_prompt = _first_window(prompt, num_samples, window, mask_id, device)
    output = run(first)
    if on_block is not None:
        on_block(0, output[:, n_prompt:])
    for r in range(1, rounds + 1):
        if stop_token is not None and bool((output[:, n_prompt:] == stop_token).any(dim=1).all()):
            break
        block = torch.full((num_samples, window), mask_id, dtype=torch.long, device=output.device)
        block[:, :keep] = output[:, -keep:]
        new = run(block)[:, keep:]
        output = torch.cat([output, new], dim=1)
        if on_block is not None:
            on_block(r, new)
    if target_length is not None:
        output = output[:, :target_length]
    return SemiARResult(output, stats)
