"""The core engine: pure functions over tensors with explicit generators.

    from mdlm_cli import engine
    nats = engine.nelbo(denoiser, x0, mask_id=50257)              # (B,) bound per sequence
    how = engine.SamplingSettings(sampler="first-hitting", temperature=0.9)
    tokens = engine.sample(denoiser, how, engine.Canvas(num_samples=4, length=128, mask_id=50257))

The models it calls are written contracts (protocols.py): a `Denoiser` is any callable
`denoiser(z_t (B, L) long, t (B,) float) -> logits (B, L, V)` with V including the mask
token (the engine applies SUBS itself); it declares `time_agnostic = True` when its output
ignores t (caching samplers need it). A `CausalLM` serves the autoregressive sampler.
How to draw is a `SamplingSettings` (settings.py: sampler, steps, precision, temperature,
top_p, top_k, the sampler's options, one `validate()`); what to fill a `Canvas` (rows, their
length, the mask id, the prompt; canvas.py), watched by `SampleHooks`; or the fields of both
as keywords (`engine.sample(d, sampler="remdm", steps=100, eta=0.02, num_samples=4,
length=128, mask_id=m)`). Sampler options are
dataclasses (`SAMPLERS[name].options`), given by name or as the settings' `instance`.
Bad arguments raise `EngineError` (a ValueError).
"""

from .ancestral import ancestral_times
from .canvas import Canvas, SampleHooks, SemiArPlan
from .categorical import PRECISIONS, sample_tokens
from .context import SamplerContext, SampleStats
from .diffusion import (
    Masking,
    mask_tokens,
    masked_nll,
    nelbo,
    nelbo_terms,
    sample_times,
    subs_log_probs,
    times_from_uniform,
)
from .errors import EngineError
from .options import check_options, option
from .protocols import CausalLM, Denoiser
from .sampling import (
    SAMPLERS,
    SamplerSpec,
    SemiARResult,
    get_sampler,
    option_names,
    sample,
    semi_ar,
)
from .schedules import SCHEDULES, Schedule, get_schedule
from .settings import SamplingSettings, SettingsError

__all__ = [
    "PRECISIONS", "SAMPLERS", "SCHEDULES", "Canvas", "CausalLM", "Denoiser", "EngineError",
    "Masking", "SampleHooks", "SampleStats", "SemiArPlan",
    "SamplerContext", "SamplerSpec", "SamplingSettings", "Schedule", "SemiARResult",
    "SettingsError", "ancestral_times", "check_options", "get_sampler", "get_schedule",
    "mask_tokens", "masked_nll", "nelbo", "nelbo_terms", "option", "option_names", "sample",
    "sample_times", "sample_tokens", "semi_ar", "subs_log_probs", "times_from_uniform",
]
