"""The samplers registry, `SAMPLERS`: what each sampler is and what it reads.

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

from collections.abc import Callable
from dataclasses import dataclass, fields

from torch import Tensor

from .ancestral import AncestralOptions, ancestral, ancestral_cache
from .autoregressive import autoregressive, autoregressive_recompute
from .confidence import ConfidenceOptions, ThresholdOptions, confidence, threshold
from .context import SamplerContext
from .d3pm import d3pm_ancestral
from .errors import EngineError
from .first_hitting import FirstHittingOptions, first_hitting
from .remdm import RemdmOptions, remdm
from .sedd import analytic, euler

# the samplers that pass each draw's positions to `SamplerContext.draw` (fp64 precision)
RECORDS_REVEALS = frozenset({"ancestral", "ancestral-cache", "first-hitting",
                             "autoregressive-kv-cache", "autoregressive-recompute"})


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
    guided: bool = True  # its calls go through the context, so classifier-free guidance applies

    @property
    def records_reveals(self) -> bool:
        """Its draws tell `ctx.recorder` each position they reveal (reveals.py: serve's
        logprobs)."""
        return self.name in RECORDS_REVEALS

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
                help="ancestral with per-sequence caching: a call only for sequences that "
                     "changed (models without time conditioning); same draws as ancestral"),
    SamplerSpec("first-hitting", first_hitting, exact=True, options=FirstHittingOptions,
                help="Zheng et al.: one call and one draw per revealed token, exact; "
                     "--tokens-per-step k > 1 reveals k per call (approximate)"),
    SamplerSpec("analytic", analytic, exact=True, uses_steps=True,
                help="SEDD's Tweedie tau-leaping on the model's scores (a SUBS model's "
                     "converted), one call per step and a final denoising draw; exact as "
                     "steps grow"),
    SamplerSpec("euler", euler, exact=True, uses_steps=True,
                help="SEDD's Euler step of the reverse rate, one call per step and a final "
                     "denoising draw; exact as steps grow"),
    SamplerSpec("d3pm-ancestral", d3pm_ancestral, exact=True, uses_steps=True,
                options=AncestralOptions,
                help="D3PM's ancestral chain from t = 1 to 0 (eq. 9's posterior, the mask's "
                     "mass included), one call per step; exact at steps = T"),
    SamplerSpec("autoregressive-kv-cache", autoregressive, exact=True, guided=False,
                help="left to right with a key/value cache, one call per new token; exact"),
    SamplerSpec("autoregressive-recompute", autoregressive_recompute, exact=True, guided=False,
                help="left to right without a cache, as the reference's AR sampler: each new "
                     "token's call re-reads the whole prefix; exact, the kv-cache sampler's "
                     "draws"),
    SamplerSpec("confidence", confidence, exact=False, uses_steps=True, default_steps=128,
                options=ConfidenceOptions,
                help="MaskGIT / LLaDA low-confidence remasking: each step draws a token at "
                     "every masked position and keeps the k most confident draws (k from "
                     "--k-schedule over the steps, confidence by --order, in blocks of "
                     "--block-length); LLaDA's generate and Dream's diffusion_generate token "
                     "for token; inexact: parallel, biased to likely tokens"),
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
