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

from .canvas import Canvas, SampleHooks, SemiArPlan, split_keywords
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


def _resolve(spec: SamplerSpec, denoiser: Denoiser) -> SamplerSpec:
    """The sampler that will run: a caching sampler falls back where the denoiser may depend
    on t."""
    if not spec.needs_time_agnostic:
        return spec
    if is_time_agnostic(denoiser):
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


def _check_denoiser(denoiser) -> None:
    """A block diffusion model's denoiser reads [z_t, x0] under the block mask: it is sampled
    block by block (engine/block_sampling.py), not by these whole-sequence samplers."""
    if getattr(denoiser, "samples_by_blocks", False):
        raise EngineError("a bd3lm (block diffusion) model samples block by block: use mdlm "
                          "sample or gen-ppl --sample-first; this command does not run it")


def _settings(settings: SamplingSettings | None, keywords: dict[str, Any]) -> SamplingSettings:
    """The settings given, or those the keywords make (the keyword form of the Python API)."""
    if settings is None:
        return settings_of(keywords)
    if keywords:
        raise EngineError(f"give the settings or their keywords, not both (got settings and "
                          f"{', '.join(sorted(keywords))})")
    return settings


def sample(denoiser: Denoiser, settings: SamplingSettings | None = None,
           canvas: Canvas | None = None, *, schedule: str | Schedule = "loglinear",
           generator: torch.Generator | None = None, hooks: SampleHooks | None = None,
           return_stats: bool = False, **keywords: Any):
    """Fill the `canvas` (canvas.py: `num_samples` rows of `length` tokens, the `prompt`'s
    fixed tokens kept): LongTensor (num_samples, length), no mask token left.

    `settings` (a `SamplingSettings`: sampler, steps, precision, temperature, top_p, top_k and
    the sampler's options) says how to draw. The keyword form gives the fields of both as
    keywords instead: `sample(d, sampler="remdm", steps=100, eta=0.02, num_samples=4,
    length=128, mask_id=m)`, with `options=` an instance of the sampler's dataclass
    (`SAMPLERS[name].options`, e.g. AncestralOptions(final_denoise=False)) and/or keywords
    replacing its fields: `final_denoise` (ancestral, ancestral-cache, d3pm-ancestral, remdm),
    `tokens_per_step` (first-hitting), `k_schedule`, `block_length`, `order`,
    `order_temperature` and `cache` (confidence), `threshold` (threshold), `eta` and
    `remdm_schedule` (remdm). Another sampler's option is not read; an unknown name, or a
    value out of its range or choices, is an EngineError.

    A caching sampler needs a denoiser that declares `time_agnostic = True` (engine/
    protocols.py; a plain function may carry the attribute); elsewhere it falls back. With
    `return_stats=True`, returns (tokens, SampleStats) with NFE (network evaluations per
    sequence) and NCS (categorical draws per sequence). `hooks` (or their fields as keywords):
    `on_batch`, `on_changes`, `recorder` (canvas.py).
    """
    _check_denoiser(denoiser)
    canvas, hooks, keywords = split_keywords(Canvas, canvas, hooks, keywords)
    settings = _settings(settings, keywords).validate()
    spec = _named_sampler(settings)
    canvas.validate()
    checked = settings.options_for(spec)
    spec = _resolve(spec, denoiser)
    z_all = _initial_state(canvas.prompt, canvas.num_samples, canvas.length, canvas.mask_id,
                           canvas.where)
    stats = SampleStats(num_sequences=canvas.num_samples)
    ctx = SamplerContext(denoiser, get_schedule(schedule), canvas.mask_id, generator, stats,
                         steps=settings.steps or 0, precision=settings.precision,
                         temperature=settings.temperature, top_p=settings.top_p,
                         top_k=settings.top_k or 0, cfg_scale=settings.cfg_scale,
                         options=convert_options(checked, spec.options),
                         on_changes=hooks.on_changes, recorder=hooks.recorder,
                         on_step=hooks.on_step)
    tokens = _run_batches(spec, z_all, ctx, canvas.batch_size or canvas.num_samples,
                          hooks.on_batch)
    assert not (tokens == canvas.mask_id).any(), "a sampler left a mask token"
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
        ctx.prompt = z != ctx.mask_id  # the batch's fixed positions: what guidance masks
        outputs.append(_run_batch(spec, z.clone(), ctx))
        if ctx.on_step is not None:  # the batch's state after its last call
            ctx.on_step(outputs[-1])
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
        raise EngineError(f"stride must be between 1 and window - 1 = {window - 1} "
                          f"(got {stride})")
    if rounds is None:
        if target_length is None:
            raise EngineError("give either rounds or target_length")
        rounds = max(math.ceil((target_length - window) / stride), 0)
    return rounds


@dataclass
class SemiARResult:
    tokens: Tensor  # (num_samples, total_length)
    stats: SampleStats = field(default_factory=SampleStats)


def semi_ar(denoiser: Denoiser, settings: SamplingSettings | None = None,
            plan: SemiArPlan | None = None, *, schedule: str | Schedule = "loglinear",
            generator: torch.Generator | None = None, hooks: SampleHooks | None = None,
            **keywords: Any) -> SemiARResult:
    """Semi-autoregressive generation (§4.2): text longer than the window L (`plan`,
    canvas.py, or its fields as keywords, as `sample`'s keyword form).

    A first window of L tokens is sampled (starting with the plan's optional `prompt`); then
    each round keeps the last L - L' tokens as a clean prefix, fills L' fresh masks with the
    inner sampler and appends them. Output length L + R * L' (or `target_length`, rounded up
    to whole blocks then cut). `hooks.on_block(round, new_tokens)` is called as each block
    completes (for streaming). Every block is drawn with `settings` (or the keywords that
    make them). With the plan's `stop_token` (EOS) no block is started once every sample
    holds it after the prompt.
    """
    _check_denoiser(denoiser)
    plan, hooks, keywords = split_keywords(SemiArPlan, plan, hooks, keywords)
    settings = _settings(settings, keywords)
    p = plan
    rounds = _rounds(p.window, p.stride, p.rounds, p.target_length)
    stats = SampleStats(num_sequences=p.num_samples)
    keep = p.window - p.stride

    def run(block_prompt: Tensor) -> Tensor:
        canvas = Canvas(p.num_samples, p.window, p.mask_id, block_prompt, p.batch_size, p.device)
        tokens, s = sample(denoiser, settings, canvas, schedule=schedule, generator=generator,
                           hooks=SampleHooks(on_step=hooks.on_step), return_stats=True)
        stats.merge(s)
        return tokens

    device = p.device or (p.prompt.device if p.prompt is not None else "cpu")
    first, n_prompt = _first_window(p.prompt, p.num_samples, p.window, p.mask_id, device)
    output = run(first)
    if hooks.on_block is not None:
        hooks.on_block(0, output[:, n_prompt:])
    for r in range(1, rounds + 1):
        if p.stop_token is not None and bool(
                (output[:, n_prompt:] == p.stop_token).any(dim=1).all()):
            break
        block = torch.full((p.num_samples, p.window), p.mask_id, dtype=torch.long,
                           device=output.device)
        block[:, :keep] = output[:, -keep:]
        new = run(block)[:, keep:]
        output = torch.cat([output, new], dim=1)
        if hooks.on_block is not None:
            hooks.on_block(r, new)
    if p.target_length is not None:
        output = output[:, :p.target_length]
    return SemiARResult(output, stats)
