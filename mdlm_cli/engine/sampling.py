"""The two entry points, `sample` and `semi_ar` (§4.2), over the samplers of `SAMPLERS`
(registry.py, re-exported here) with a `SamplingSettings` (settings.py).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .context import SamplerContext, SampleStats
from .errors import EngineError, ProbabilityError
from .options import convert_options
from .protocols import Denoiser, is_time_agnostic
from .registry import SAMPLERS, SamplerSpec, get_sampler, option_names
from .schedules import Schedule, get_schedule
from .settings import SamplingSettings, settings_of

__all__ = ["SAMPLERS", "SamplerSpec", "SemiARResult", "get_sampler", "option_names", "sample",
           "semi_ar"]


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


CALL_KEYWORDS = ("schedule", "generator", "device", "batch_size", "time_agnostic")  # semi_ar's


def _check_denoiser(denoiser) -> None:
    """A block diffusion model's denoiser reads [z_t, x0] under the block mask: it is sampled
    block by block (engine/block_sampling.py), not by these whole-sequence samplers."""
    if getattr(denoiser, "samples_by_blocks", False):
        raise EngineError("a bd3lm (block diffusion) model samples block by block: use mdlm "
                          "sample or gen-ppl --sample-first; this command does not run it")


def _check_sizes(num_samples: int, length: int) -> None:
    if num_samples < 1 or length < 1:
        raise EngineError(f"num_samples and length must be positive (got {num_samples}, {length})")


def _settings(settings: SamplingSettings | None, keywords: dict[str, Any]) -> SamplingSettings:
    """The settings given, or those the keywords make (the keyword form of the Python API)."""
    if settings is None:
        return settings_of(keywords)
    if keywords:
        raise EngineError(f"give the settings or their keywords, not both (got settings and "
                          f"{', '.join(sorted(keywords))})")
    return settings


def sample(denoiser: Denoiser,
           settings: SamplingSettings | None = None,
           *,
           num_samples: int,
           length: int,
           mask_id: int,
           schedule: str | Schedule = "loglinear",
           generator: torch.Generator | None = None,
           prompt: Tensor | None = None,
           batch_size: int | None = None,
           time_agnostic: bool | None = None,
           device: torch.device | str | None = None,
           return_stats: bool = False,
           on_batch: Callable[[int], None] | None = None,
           on_changes: Callable[[list[int], int], None] | None = None,
           recorder: Any = None,
           **keywords: Any):
    """Draw `num_samples` sequences of `length` tokens: LongTensor (num_samples, length).

    `settings` (a `SamplingSettings`: sampler, steps, precision, temperature, top_p and the
    sampler's options) says how to draw; or give its fields as keywords instead:
    `sample(d, sampler="remdm", steps=100, eta=0.02, ...)`, with `options=` an instance of the
    sampler's dataclass (`SAMPLERS[name].options`, e.g. AncestralOptions(final_denoise=False))
    and/or keywords replacing its fields: `final_denoise` (ancestral, ancestral-cache,
    d3pm-ancestral, remdm), `tokens_per_step` (first-hitting), `k_schedule`, `block_length`,
    `order` and `order_temperature` (confidence), `threshold` (threshold), `eta` and
    `remdm_schedule` (remdm). Another sampler's option is
    not read; an unknown name, or a value out of its range or choices, is an EngineError.

    `prompt` (length,) or (num_samples, length) holds mask_id at free positions; every
    other position is kept fixed and conditions the rest (prefix, suffix, infilling).
    `time_agnostic` declares that the denoiser ignores t (default: its `time_agnostic`
    attribute, else False); caching samplers need it. The result holds no mask token.
    With `return_stats=True`, returns (tokens, SampleStats) with NFE (network
    evaluations per sequence) and NCS (categorical draws per sequence). `on_batch(n)` is
    called after each batch; `on_changes(steps, n_steps)` by caching samplers, per batch
    (the steps at which any sequence changed: what benchmarks need for a whole-batch cache).
    `recorder`: a `RevealRecorder` (num_samples, length) for `records_reveals` samplers.
    """
    _check_denoiser(denoiser)
    settings = _settings(settings, keywords).validate()
    spec = _named_sampler(settings)
    _check_sizes(num_samples, length)
    checked = settings.options_for(spec)
    spec = _resolve(spec, denoiser, time_agnostic)
    device = torch.device(device) if device is not None else (
        prompt.device if prompt is not None else torch.device("cpu"))
    z_all = _initial_state(prompt, num_samples, length, mask_id, device)
    batch_size = batch_size or num_samples
    stats = SampleStats(num_sequences=num_samples)
    ctx = SamplerContext(denoiser, get_schedule(schedule), mask_id, generator, stats,
                         steps=settings.steps or 0, precision=settings.precision,
                         temperature=settings.temperature, top_p=settings.top_p,
                         top_k=settings.top_k or 0,
                         options=convert_options(checked, spec.options), on_changes=on_changes,
                         recorder=recorder)
    tokens = _run_batches(spec, z_all, ctx, batch_size, on_batch)
    assert not (tokens == mask_id).any(), "a sampler left a mask token"
    return (tokens, stats) if return_stats else tokens


def _named_sampler(settings: SamplingSettings) -> SamplerSpec:
    """The sampler the settings name, which must be given (and given steps if it takes them)."""
    if settings.sampler is None:
        raise EngineError(f"sample needs a sampler; choose one of: {', '.join(SAMPLERS)}")
    spec = get_sampler(settings.sampler)
    if spec.uses_steps and settings.steps is None:
        raise EngineError(f"sampler {spec.name} needs steps >= 1 (got None)")
    return spec


def _run_batches(spec: SamplerSpec, z_all: Tensor, ctx: SamplerContext, batch_size: int,
                 on_batch: Callable[[int], None] | None) -> Tensor:
    """Every batch of `z_all` through the sampler, in order; `on_batch(n)` after each."""
    if ctx.recorder is not None and batch_size < len(z_all):  # its grids index one batch's rows
        raise EngineError("a recorder sees one batch: leave batch_size at num_samples")
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


def _rounds(window: int, stride: int, rounds: int | None, target_length: int | None) -> int:
    """Semi-AR's rounds after the first window: `rounds`, or enough for `target_length`."""
    if not 0 < stride < window:
        raise EngineError(f"stride must be between 1 and window - 1 = {window - 1} (got {stride})")
    if rounds is None:
        if target_length is None:
            raise EngineError("give either rounds or target_length")
        rounds = max(math.ceil((target_length - window) / stride), 0)
    return rounds


@dataclass
class SemiARResult:
    tokens: Tensor  # (num_samples, total_length)
    stats: SampleStats = field(default_factory=SampleStats)


def semi_ar(denoiser: Denoiser,
            settings: SamplingSettings | None = None,
            *,
            num_samples: int,
            window: int,
            stride: int,
            mask_id: int,
            rounds: int | None = None,
            target_length: int | None = None,
            prompt: Tensor | None = None,
            on_block: Callable[[int, Tensor], None] | None = None,
            stop_token: int | None = None,
            **sample_kwargs) -> SemiARResult:
    """Semi-autoregressive generation (§4.2): text longer than the window L.

    A first window of L tokens is sampled (starting with the optional `prompt`, (P,) or
    (num_samples, P) tokens, P < L); then each round keeps the last L - L' tokens as a clean
    prefix, fills L' fresh masks with the inner sampler and appends them. Output
    length L + R * L' (or `target_length`, rounded up to whole blocks then cut).
    `on_block(round, new_tokens)` is called as each block completes (for streaming).
    Every block is drawn with `settings` (or `sample`'s keywords that make them) and
    `sample_kwargs`' schedule, generator, device, batch_size and time_agnostic.
    With `stop_token` (EOS) no block is started once every sample holds it after the prompt.
    """
    calls = {k: sample_kwargs.pop(k) for k in CALL_KEYWORDS if k in sample_kwargs}
    _check_denoiser(denoiser)
    settings = _settings(settings, sample_kwargs)
    rounds = _rounds(window, stride, rounds, target_length)
    stats = SampleStats(num_sequences=num_samples)
    keep = window - stride

    def run(block_prompt: Tensor) -> Tensor:
        tokens, s = sample(denoiser, settings, num_samples=num_samples, length=window,
                           mask_id=mask_id, prompt=block_prompt, return_stats=True, **calls)
        stats.merge(s)
        return tokens

    device = calls.get("device") or (prompt.device if prompt is not None else "cpu")
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
