"""Per-token log-probabilities of a completion under a masked diffusion policy, the quantity
GRPO's ratio and KL are built from (an AR model reads it off one causal pass; a diffusion
model has no exact one, so each estimator here is one way to estimate it).

Every estimator takes the same inputs:
- `logits_fn(tokens (B, L) long) -> logits (B, L, V)` float, position i's logits predicting
  token i (a shifted model, Dream's, is read one to the left inside it, as its `Denoiser`
  does); it closes over whatever else the model needs (the attention mask, the adapter on or
  off), so the policy, the old policy and the reference are three `logits_fn`s;
- `tokens` (B, L): rows laid out prompt + completion (padding where the caller puts it);
- `completion` (B, L) bool: the positions the estimator masks and scores; every other
  position is context;
- `mask_id` and a `torch.Generator` that draws every mask. The same seed gives the same masks
  for the same rows: what d1's "one seed per inner iteration, the same for the policy, the old
  policy and the reference" needs (`iteration_seeds`).

Each returns an `Estimate`: `logp` (B, L) float32, log p_theta of each completion token (its
estimate), exactly 0 off the completion, differentiable through `logits_fn`; and `passes`,
the calls of `logits_fn` it made (each over all B rows). Which completion positions the loss
counts (d1's rule: up to the first EOS) is the loss's `scored` mask (grpo.py), not theirs.

Log-probabilities are SUBS's (engine/diffusion.py `masked_nll`: the mask token's logit
removed before the softmax), as everywhere in mdlm; d1 and DiffuCoder take the softmax over
all V, the mask included. For a model trained with SUBS the difference is log(1 - p(mask)),
about 0, and it cancels in new - old.

The registry `ESTIMATORS` is the samplers' pattern (engine/registry.py): a name, a function
`run(logits_fn, tokens, completion, mask_id, generator, options) -> Estimate`, an options
dataclass (fields made with `engine.options.option`), help, and the source. Adding an
estimator is its function and options (here or in a module beside it) and an entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

from ..engine.diffusion import (
    call_denoiser,
    loss_weight,
    mask_tokens,
    masked_nll,
    times_from_uniform,
)
from ..engine.errors import EngineError
from ..engine.options import check_options, option
from ..engine.protocols import Denoiser, is_time_agnostic
from ..engine.schedules import SCHEDULES, get_schedule
from ..errors import MdlmError

LogitsFn = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Estimate:
    # (B, L) float32: each completion token's estimated log-probability, 0 elsewhere
    logp: Tensor
    passes: int  # calls of logits_fn, each over the B rows


def denoiser_logits(denoiser: Denoiser, attention_mask: Tensor | None = None) -> LogitsFn:
    """A `Denoiser` (engine/protocols.py) as a `logits_fn`, with the rows' `attention_mask`
    (B, L) if given. The estimators draw no time for the model (d1's pass is at "t = 1",
    coupled's and elbo's masks at rates of their own), so, as LLaDA's counted estimator
    (engine/counted.py), they need a denoiser that ignores t: LLaDA, Dream, a DiT trained
    with `model.time_conditioning=false`."""
    if not is_time_agnostic(denoiser):
        raise MdlmError("the RL likelihood estimators give the model no time: they need a "
                        "denoiser that ignores t (LLaDA, Dream, or a DiT trained with "
                        "model.time_conditioning=false)")

    def logits_fn(z: Tensor) -> Tensor:
        t = torch.ones(z.shape[0], device=z.device)  # ignored by a time-agnostic denoiser
        return call_denoiser(denoiser, z, t, attention_mask=attention_mask)
    return logits_fn


def token_logp(logits: Tensor, tokens: Tensor, positions: Tensor, mask_id: int) -> Tensor:
    """(B, L) float32: log p(tokens[i] | ...) from `logits` (B, L, V) at `positions` (B, L)
    bool, SUBS's distribution (mask excluded); exactly 0 at every other position."""
    values = -masked_nll(logits[positions], tokens[positions], mask_id)  # (N,)
    return torch.zeros(tokens.shape, device=values.device, dtype=values.dtype).masked_scatter(
        positions, values)


def _masked(tokens: Tensor, positions: Tensor, mask_id: int) -> Tensor:
    return torch.where(positions, torch.full_like(tokens, mask_id), tokens)


# ---------------------------------------------------------------------------- d1 (diffu-GRPO)

@dataclass(frozen=True)
class D1Options:
    p_mask_prompt: float = option(0.15, "probability that each context (prompt) token is masked "
                                        "(d1's p_mask_prompt; its GSM8K runs: 0.15)",
                                  low=0.0, high=1.0)


def d1(logits_fn: LogitsFn, tokens: Tensor, completion: Tensor, mask_id: int,
       generator: torch.Generator, options: D1Options) -> Estimate:
    """diffu-GRPO's one-step estimate (Zhao et al. 2025, dllm-reasoning/d1,
    diffu-grpo/diffu_grpo_trainer.py, `DiffuGRPOTrainer.forward_process` and
    `_get_per_token_logps`): one pass with every completion token masked and each other token
    masked i.i.d. with probability p; log p of each completion token at its own position, read
    from that pass (the mean-field approximation: every completion token is predicted from the
    prompt alone). One uniform draw (B, L) from `generator` decides the context's masks
    (u < p), as d1's `torch.rand((b, l))` after `set_seed(seed)`. One pass."""
    u = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    masked = completion | (~completion & (u < options.p_mask_prompt))
    logits = logits_fn(_masked(tokens, masked, mask_id))
    return Estimate(token_logp(logits, tokens, completion, mask_id), passes=1)


# ----------------------------------------------------------------- coupled (DiffuCoder's GRPO)

@dataclass(frozen=True)
class CoupledOptions:
    t_low: float = option(0.2, "lowest mask ratio t of the pair (DiffuCoder: 0.2)",
                          low=0.01, high=0.99)
    t_high: float = option(0.8, "highest mask ratio t of the pair (DiffuCoder: 0.8)",
                           low=0.01, high=0.99)
    full_pass: bool = option(False, "also run DiffuCoder's third pass (the completion fully "
                                    "masked) and average as its code does: (p0 + w log p) / 2")


def coupled(logits_fn: LogitsFn, tokens: Tensor, completion: Tensor, mask_id: int,
            generator: torch.Generator, options: CoupledOptions) -> Estimate:
    """Coupled-GRPO's complementary pair (Gong et al. 2025, apple/ml-diffucoder,
    src/open_r1/coupled_grpo.py, `DiffuGRPOTrainer.forward_process` and
    `selective_log_softmax`): a mask ratio t ~ U[t_low, t_high] (one for the call, as the
    source's `random.uniform(0.2, 0.8)`), a uniform u (B, L); pass A masks the completion
    tokens with u < t, pass B the rest of the completion (A's complement, so the two masks
    partition the completion and every completion token is masked, and scored, in exactly one
    pass; the context is never masked, DiffuCoder's p_mask_prompt 0). Each token's estimate is
    its log p in the pass that masked it, weighted as the source weights it: 1/t in pass A,
    1/(1 - t) in pass B (the ELBO's 1/t of a token masked at rate t). Two passes.

    With `full_pass` the source's exact three-pass estimate: a first pass with the whole
    completion masked gives p0 (d1's, without prompt masking), and each token's estimate is
    (p0 + w log p) / 2, as `selective_log_softmax` combines them. Three passes."""
    if options.t_low > options.t_high:
        raise EngineError(f"t_low ({options.t_low}) must not exceed t_high ({options.t_high})")
    draw = torch.rand((), generator=generator, device=tokens.device, dtype=torch.float64)
    t = options.t_low + (options.t_high - options.t_low) * float(draw)
    u = torch.rand(tokens.shape, generator=generator, device=tokens.device)
    first = completion & (u < t)
    second = completion & ~first
    logp_first = token_logp(logits_fn(_masked(tokens, first, mask_id)), tokens, first, mask_id)
    logp_second = token_logp(logits_fn(_masked(tokens, second, mask_id)), tokens, second,
                             mask_id)
    weighted = logp_first / t + logp_second / (1.0 - t)  # disjoint supports: a token has one
    if not options.full_pass:
        return Estimate(weighted, passes=2)
    full = token_logp(logits_fn(_masked(tokens, completion, mask_id)), tokens, completion,
                      mask_id)
    return Estimate((full + weighted) / 2, passes=3)


# ------------------------------------------------------------------- elbo (K-sample MC ELBO)

@dataclass(frozen=True)
class ElboOptions:
    samples: int = option(4, "Monte-Carlo samples K of the ELBO: one pass each", low=1)
    schedule: str = option("loglinear", "the masking schedule (alpha_t) whose weight "
                                        "-alpha'/(1 - alpha) the terms carry",
                           choices=tuple(SCHEDULES))
    antithetic: bool = option(True, "the K times of a row stratified over [0, 1) "
                                    "(engine.nelbo's antithetic draw)")


def elbo(logits_fn: LogitsFn, tokens: Tensor, completion: Tensor, mask_id: int,
         generator: torch.Generator, options: ElboOptions) -> Estimate:
    """The K-sample Monte-Carlo ELBO of the completion given the context (MDLM eq. 10 over
    the completion's tokens, as `engine.nelbo` with `targets`), kept per token:

        logp_i = 1/K sum_k w(t_k) 1[i masked in z_k] log p_theta(x_i | z_k),

    t_k one time per row and sample, z_k masking each completion token with probability
    1 - alpha(t_k) (`engine.mask_tokens`), w = -alpha'/(1 - alpha) (`engine.loss_weight`:
    1/t for the log-linear schedule); the context is never masked. Summed over a row's
    completion it is an unbiased estimate of the ELBO <= log p(completion | prompt).
    Draws from `generator`, in order: u0 (B,) for the times (u_k = u0 + k/K mod 1 when
    antithetic, else a fresh (B,) draw per sample after the first), then per sample the
    (B, L) mask draw. K passes."""
    schedule = get_schedule(options.schedule)
    B, K, device = tokens.shape[0], options.samples, tokens.device
    u0 = torch.rand(B, generator=generator, device=device)
    total = torch.zeros(tokens.shape, device=device)
    for k in range(K):
        if options.antithetic:
            u = (u0 + k / K) % 1.0
        else:
            u = u0 if k == 0 else torch.rand(B, generator=generator, device=device)
        t = times_from_uniform(u, schedule)  # (B,) in [t_min, 1]
        z = mask_tokens(tokens, schedule.mask_rate(t), mask_id, generator=generator,
                        targets=completion)
        masked = completion & (z == mask_id)
        logp = token_logp(logits_fn(z), tokens, masked, mask_id)
        total = total + loss_weight(t, schedule)[:, None].to(logp.dtype) * logp
    return Estimate(total / K, passes=K)


# ------------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    run: Callable[..., Estimate]  # (logits_fn, tokens, completion, mask_id, generator, options)
    options: type
    help: str  # one line: what it masks, its passes
    source: str  # where its definition comes from


ESTIMATORS: dict[str, EstimatorSpec] = {spec.name: spec for spec in (
    EstimatorSpec("d1", d1, D1Options,
                  help="one pass: the completion fully masked, the prompt masked i.i.d. with "
                       "p_mask_prompt; log p of each completion token at its position",
                  source="dllm-reasoning/d1 diffu-grpo/diffu_grpo_trainer.py"),
    EstimatorSpec("coupled", coupled, CoupledOptions,
                  help="two passes: a random mask of the completion at ratio t and its "
                       "complement, each token scored once, weighted 1/t or 1/(1 - t)",
                  source="apple/ml-diffucoder src/open_r1/coupled_grpo.py"),
    EstimatorSpec("elbo", elbo, ElboOptions,
                  help="K passes: the Monte-Carlo ELBO of the completion, per token "
                       "(t ~ U, each completion token masked with 1 - alpha_t, weight 1/t)",
                  source="MDLM eq. 10 (engine/diffusion.py nelbo_terms)"),
)}


def get_estimator(name: str) -> EstimatorSpec:
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise MdlmError(f"unknown likelihood estimator {name!r}; choose one of: "
                        f"{', '.join(ESTIMATORS)}") from None


def estimator_options(name: str, **values: Any) -> Any:
    """The checked options of estimator `name` from keyword values (the rest at their
    defaults); an unknown or invalid one is a one-line MdlmError naming it."""
    spec = get_estimator(name)
    known = {f.name for f in fields(spec.options)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise MdlmError(f"estimator {name} has no option {unknown[0]!r}; its options are: "
                        f"{', '.join(sorted(known))}")
    options = replace(spec.options(), **values)
    try:
        check_options(options)
    except EngineError as e:
        raise MdlmError(f"estimator {name}: {e}") from None
    return options


def estimate(name: str, logits_fn: LogitsFn, tokens: Tensor, completion: Tensor, *,
             mask_id: int, seed: int | None = None, generator: torch.Generator | None = None,
             **options: Any) -> Estimate:
    """Estimator `name`'s per-token log-probabilities of each row's completion (see the
    module's docstring for the inputs). Its masks come from `seed` (a fresh generator on the
    tokens' device: the same seed, the same masks, for the policy, the old policy and the
    reference of one inner iteration) or from `generator`; exactly one must be given, since a
    draw from torch's global state could not be repeated for the three."""
    if (seed is None) == (generator is None):
        raise MdlmError("estimate takes exactly one of seed= or generator= (the masks must be "
                        "repeatable for the policy, the old policy and the reference)")
    if tokens.shape != completion.shape or tokens.dim() != 2:
        raise MdlmError(f"tokens {tuple(tokens.shape)} and completion {tuple(completion.shape)} "
                        "must both be (B, L)")
    spec = get_estimator(name)
    checked = estimator_options(name, **options)
    if generator is None:
        generator = torch.Generator(device=tokens.device).manual_seed(int(seed))
    try:
        return spec.run(logits_fn, tokens, completion.bool(), mask_id, generator, checked)
    except EngineError as e:
        raise MdlmError(f"estimator {name}: {e}") from None


def iteration_seeds(iterations: int, generator: torch.Generator | None = None) -> list[int]:
    """One mask seed per inner iteration (GRPO's mu): d1 draws them as
    `torch.randint(0, 2**12, (num_iterations,))` per batch of rollouts, fresh with
    `random_masking` (its runs), so each iteration sees other masks and the three policies of
    one iteration see the same ones. The range here is wider (2**31): a narrow one only adds
    collisions."""
    return torch.randint(0, 2**31 - 1, (iterations,), generator=generator).tolist()
