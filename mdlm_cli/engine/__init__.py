"""The core engine: pure functions over tensors with explicit generators.

    from mdlm_cli import engine
    nats = engine.nelbo(denoiser, x0, mask_id=50257)              # (B,) bound per sequence
    tokens = engine.sample(denoiser, sampler="first-hitting", num_samples=4, length=128,
                           mask_id=50257)

The models it calls are written contracts (protocols.py): a `Denoiser` is any callable
`denoiser(z_t (B, L) long, t (B,) float) -> logits (B, L, V)` with V including the mask
token (the engine applies SUBS itself); it declares `time_agnostic = True` when its output
ignores t (caching samplers need it). A `CausalLM` serves the autoregressive sampler.
Sampler options are dataclasses (`SAMPLERS[name].options`), given as `options=` or as
keywords (`engine.sample(..., sampler="remdm", steps=100, eta=0.02)`).
Bad arguments raise `EngineError` (a ValueError).
"""

from .ancestral import ancestral_times
from .categorical import PRECISIONS, sample_tokens
from .context import SamplerContext, SampleStats
from .diffusion import (
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

__all__ = [
    "PRECISIONS", "SAMPLERS", "SCHEDULES", "CausalLM", "Denoiser", "EngineError", "SampleStats",
    "SamplerContext", "SamplerSpec", "Schedule", "SemiARResult", "ancestral_times", "check_options",
    "get_sampler", "get_schedule", "mask_tokens", "masked_nll", "nelbo", "nelbo_terms", "option",
    "option_names", "sample", "sample_times", "sample_tokens", "semi_ar", "subs_log_probs",
    "times_from_uniform",
]
