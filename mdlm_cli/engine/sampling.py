"""Samplers: ancestral (§4.1), ancestral with per-sequence caching, first-hitting
(Zheng et al. 2024), and semi-autoregressive generation (§4.2).

All samplers take the engine's denoiser contract, `denoiser(z_t, t) -> logits`,
and draw "whether a position unmasks" before "which token", so the model's
distribution is needed (and a categorical draw is made) only at positions that
unmask. Denoisers that accept `output_mask=` (the DiT) compute their output
layer only there.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from ..errors import MdlmError
from .categorical import PRECISIONS, reference_draw, sample_tokens, token_weights
from .diffusion import Denoiser, call_denoiser
from .schedules import Schedule, get_schedule


@dataclass
class SampleStats:
    """Work counters. NFE and NCS are per sequence (means over the samples)."""

    num_sequences: int = 0
    calls: int = 0  # batched denoiser invocations
    sequence_evals: int = 0  # sequences evaluated, summed over calls
    draws: int = 0  # categorical draws over the vocabulary (one per drawn position)
    whole_batch_calls: int = 0  # ancestral-cache: calls if any change invalidated the whole batch

    @property
    def nfe(self) -> float:
        return self.sequence_evals / max(self.num_sequences, 1)

    @property
    def ncs(self) -> float:
        return self.draws / max(self.num_sequences, 1)

    def add(self, other: SampleStats) -> None:
        for key, value in asdict(other).items():
            setattr(self, key, getattr(self, key) + value)

    def to_dict(self) -> dict:
        return {**asdict(self), "nfe": self.nfe, "ncs": self.ncs}


@dataclass
class SamplerContext:
    denoiser: Denoiser
    schedule: Schedule
    mask_id: int
    generator: torch.Generator | None
    stats: SampleStats
    steps: int = 1000
    precision: str = "fp64"
    temperature: float = 1.0
    top_p: float = 1.0
    final_denoise: bool = True
    tokens_per_step: int = 1
    eps: float = 1e-5  # last time of the ancestral grid, as the reference

    def logits(self, z: Tensor, t: Tensor, positions: Tensor | None, rows: Tensor | None = None) -> Tensor:
        """Logits (N, V) at the True entries of `positions[rows]` (all positions if None) for
        the sequences `rows` (all if None); t is one time for all or one per sequence."""
        if rows is not None and len(rows) == len(z):
            rows = None
        n = len(z) if rows is None else len(rows)
        self.stats.calls += 1
        self.stats.sequence_evals += n
        t = t.expand(len(z)) if t.dim() == 0 else t
        if rows is not None:
            z, t = z[rows], t[rows]
            positions = None if positions is None else positions[rows]
        with torch.no_grad():
            return call_denoiser(self.denoiser, z, t.float(), output_mask=positions)

    def draw(self, logits: Tensor) -> Tensor:
        self.stats.draws += logits.shape[0]
        return sample_tokens(logits, self.mask_id, generator=self.generator, precision=self.precision,
                             temperature=self.temperature, top_p=self.top_p)

    def rand(self, shape, device) -> Tensor:
        return torch.rand(shape, generator=self.generator, device=device, dtype=torch.float64)


def _finish(z: Tensor, ctx: SamplerContext, t_last: Tensor) -> Tensor:
    """Remaining masks: argmax (final denoising step) or one last draw."""
    masked = z == ctx.mask_id
    rows = masked.any(1).nonzero()[:, 0]
    if len(rows):
        logits = ctx.logits(z, t_last, masked, rows)
        if ctx.final_denoise:
            logits[:, ctx.mask_id] = float("-inf")
            z[masked] = logits.argmax(-1)
        else:
            z[masked] = ctx.draw(logits)
    return z


def _rows_active(span: Tensor, span_host: list[int], i: int) -> Tensor | None:
    """The rows b with i < span[b] (B,), None when all are. `span_host` (the same values,
    read once) gives their number, so the device is not waited for at each step."""
    count = sum(i < s for s in span_host)
    return None if count == len(span_host) else torch.nonzero_static(span > i, size=count)[:, 0]


def _unmask_steps(masked: Tensor, times: Tensor, ctx: SamplerContext) -> Tensor:
    """The step at which each masked position unmasks, drawn up front (len(times) - 1 where
    it does not unmask before the last time, and at unmasked positions).

    Between t and s a masked position unmasks with probability (alpha_s - alpha_t) /
    (1 - alpha_t), independently of the network and of the other positions, so it is
    still masked after step i with probability S_i = (1 - alpha(t_i+1)) / (1 - alpha(t_0))
    (the product over steps telescopes). One uniform per position searched in S is the
    law of one Bernoulli per position per step, without the per-step draws.
    """
    steps = len(times) - 1
    survival = ctx.schedule.mask_rate(times[1:]) / ctx.schedule.mask_rate(times[:1])  # decreasing
    u = ctx.rand(masked.shape, masked.device)
    # still masked after step i iff u < S_i, so it unmasks at step #{i : S_i > u}
    at = steps - torch.searchsorted(survival.flip(0).contiguous(), u, right=True)
    return at.masked_fill_(~masked, steps)


def _ancestral(z: Tensor, ctx: SamplerContext, *, cache: bool) -> Tensor:
    """Ancestral sampling from t = 1 to eps in `steps` steps (§4.1).

    A masked position unmasks between t and s with probability
    (alpha_s - alpha_t) / (1 - alpha_t) (from the schedule), taking a token from
    p_theta(. | z_t). fp64: which step unmasks each position is drawn first (it does not
    depend on the network), then a token at the positions unmasking in each step.
    fp32: the reference's single float32 draw over V + 1 classes (mask included).
    With `cache`, only sequences that need a fresh output are evaluated: a
    sequence whose tokens did not change keeps its previous output.
    """
    times = torch.linspace(1.0, ctx.eps, ctx.steps + 1, dtype=torch.float64, device=z.device)
    if ctx.precision == "fp32":
        _ancestral_reference(z, ctx, times, cache=cache)
        return _finish(z, ctx, times[-1])
    masked = z == ctx.mask_id
    at = _unmask_steps(masked, times, ctx)
    # Which rows to evaluate at which step is known now, so it is read to the host once:
    # the loop then synchronises with the device only where the network's output size
    # (the number of positions unmasking) is data-dependent, once per call.
    span = at.masked_fill(~masked, -1).amax(1) + 1  # a row holds a mask at the start of step i iff i < span
    span_host = span.tolist()
    n_steps = min(max(span_host), ctx.steps)  # steps with a mask left: the loop's length
    if cache:  # a call only where a row changes
        B = len(z)
        pairs = torch.unique((at * B + torch.arange(B, device=z.device)[:, None])[at < ctx.steps])  # by step, row
        change_steps, counts = torch.unique_consecutive(pairs // B, return_counts=True)
        change_steps = change_steps.tolist()
        if n_steps:  # the reference's cache: a whole-batch call after every step with any change
            ctx.stats.whole_batch_calls += 1 + sum(i < n_steps - 1 for i in change_steps)
        for i, rows in zip(change_steps, (pairs % B).split(counts.tolist()), strict=True):
            unmask = at == i
            z.masked_scatter_(unmask, ctx.draw(ctx.logits(z, times[i], unmask, rows)))
    else:  # a call at every step for every row with a mask left, as the reference
        for i in range(n_steps):
            unmask = at == i
            logits = ctx.logits(z, times[i], unmask, _rows_active(span, span_host, i))
            if logits.shape[0]:
                z.masked_scatter_(unmask, ctx.draw(logits))
    return _finish(z, ctx, times[-1])


def _ancestral_reference(z: Tensor, ctx: SamplerContext, times: Tensor, *, cache: bool) -> None:
    """fp32: the reference's joint float32 draw over V real tokens + "stay masked", in place."""
    B, L = z.shape
    unmask_probs = ctx.schedule.unmask_prob(times[:-1], times[1:]).float()  # (steps,), once for the run
    cached = None  # last full logits per sequence
    valid = torch.zeros(B, dtype=torch.bool, device=z.device)  # cache still matches z
    batch_changed = True
    for i in range(ctx.steps):
        masked = z == ctx.mask_id
        if not masked.any():
            break
        need = masked.any(1)
        if cache:
            stale = need & ~valid
            ctx.stats.whole_batch_calls += int(batch_changed)
            rows = stale.nonzero()[:, 0]
            if len(rows):
                fresh = ctx.logits(z, times[i], None, rows)
                if cached is None:
                    cached = torch.empty(B, L, fresh.shape[-1], dtype=fresh.dtype, device=z.device)
                cached[rows] = fresh
                valid[rows] = True
            logits = cached[masked]
        else:
            logits = ctx.logits(z, times[i], masked, need.nonzero()[:, 0])
        q = token_weights(logits, ctx.mask_id, temperature=ctx.temperature, top_p=ctx.top_p)
        q.mul_(unmask_probs[i] / q.sum(-1, keepdim=True))
        q[:, ctx.mask_id] = 1.0 - unmask_probs[i]
        ctx.stats.draws += q.shape[0]
        new = reference_draw(q, generator=ctx.generator)
        changed_pos = torch.zeros_like(masked)
        changed_pos[masked] = new != ctx.mask_id
        z[masked] = new
        changed = changed_pos.any(1)
        valid &= ~changed
        batch_changed = bool(changed.any())


def ancestral(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Plain ancestral sampling: one network call for the batch at every step."""
    return _ancestral(z, ctx, cache=False)


def ancestral_cache(z: Tensor, ctx: SamplerContext) -> Tensor:
    """Ancestral sampling with per-sequence caching (time-agnostic models only)."""
    if getattr(ctx.denoiser, "time_conditioning", True):
        warnings.warn("ancestral-cache needs a model without time conditioning (its output must depend "
                      "on z_t alone); falling back to plain ancestral sampling", stacklevel=3)
        return _ancestral(z, ctx, cache=False)
    return _ancestral(z, ctx, cache=True)


def first_hitting(z: Tensor, ctx: SamplerContext) -> Tensor:
    """First-hitting sampler (Zheng et al. 2024): simulate the reverse process event
    by event. With n positions masked at time tau, the next unmasking happens at
    tau' = alpha^-1(1 - u^(1/n) (1 - alpha(tau))); one uniformly chosen masked
    position is revealed with a token from p_theta(. | z, tau'). Exact, one network
    call per revealed token. `tokens_per_step` k > 1 reveals k positions per call
    (the model evaluated at the first of the k event times): faster, approximate.

    Neither the event times nor the positions depend on the model, so both are drawn
    up front: the times as a running product of u^(1/n) (in log space), the positions
    as a uniformly random order of the masked positions (choosing uniformly among the
    remaining ones at every event is the same law). The loop is then one network call
    and one draw per event.
    """
    B, L = z.shape
    k = max(int(ctx.tokens_per_step), 1)
    masked = z == ctx.mask_id
    n0 = masked.sum(1)  # (B,)
    n_host = n0.tolist()
    N = max(n_host)
    if N == 0:
        return z
    order = ctx.rand((B, L), z.device).masked_fill(~masked, 2.0).argsort(dim=1)[:, :N]  # (B, N)
    j = torch.arange(N, device=z.device)
    valid = j[None, :] < n0[:, None]  # (B, N): event j happens in sequence b
    remaining = (n0[:, None] - j[None, :]).clamp_min(1).to(torch.float64)  # masked before event j
    log_u = ctx.rand((B, N), z.device).clamp_min(torch.finfo(torch.float64).tiny).log()
    start = ctx.schedule.mask_rate(torch.ones(B, 1, dtype=torch.float64, device=z.device)).log()
    tau = ctx.schedule.inverse(1.0 - (start + (log_u / remaining).cumsum(1)).exp())  # (B, N)
    for first in range(0, N, k):
        cols = slice(first, first + k)
        take = valid[:, cols]  # (B, <=k); order's positions are distinct within a row
        chosen = torch.zeros_like(masked).scatter_(1, order[:, cols], take)
        rows = _rows_active(n0, n_host, first)  # sequences with an event left
        z.masked_scatter_(chosen, ctx.draw(ctx.logits(z, tau[:, first], chosen, rows)))
    return z


SAMPLERS: dict[str, Callable[[Tensor, SamplerContext], Tensor]] = {
    "ancestral": ancestral,
    "ancestral-cache": ancestral_cache,
    "first-hitting": first_hitting,
}


def _initial_state(prompt: Tensor | None, num_samples: int, length: int, mask_id: int,
                   device: torch.device) -> Tensor:
    if prompt is None:
        return torch.full((num_samples, length), mask_id, dtype=torch.long, device=device)
    prompt = prompt.to(device=device, dtype=torch.long)
    if prompt.dim() == 1:
        prompt = prompt[None].expand(num_samples, -1)
    if prompt.shape != (num_samples, length):
        raise MdlmError(f"prompt has shape {tuple(prompt.shape)}; expected ({length},) or "
                        f"({num_samples}, {length}) with mask_id at free positions")
    return prompt.clone()


def sample(denoiser: Denoiser, *, sampler: str, num_samples: int, length: int, mask_id: int,
           steps: int | None = None, schedule: str | Schedule = "loglinear",
           generator: torch.Generator | None = None, prompt: Tensor | None = None,
           batch_size: int | None = None, precision: str = "fp64", temperature: float = 1.0,
           top_p: float = 1.0, final_denoise: bool = True, tokens_per_step: int = 1,
           device: torch.device | str | None = None, return_stats: bool = False,
           on_batch: Callable[[int], None] | None = None):
    """Draw `num_samples` sequences of `length` tokens: LongTensor (num_samples, length).

    `prompt` (length,) or (num_samples, length) holds mask_id at free positions; every
    other position is kept fixed and conditions the rest (prefix, suffix, infilling).
    The result holds no mask token. With `return_stats=True`, returns
    (tokens, SampleStats) with NFE (network evaluations per sequence) and NCS
    (categorical draws per sequence).
    """
    if sampler not in SAMPLERS:
        raise MdlmError(f"unknown sampler {sampler!r}; choose one of: {', '.join(SAMPLERS)}")
    if precision not in PRECISIONS:
        raise MdlmError(f"precision must be one of: {', '.join(PRECISIONS)} (got {precision!r})")
    if sampler.startswith("ancestral") and (steps is None or steps < 1):
        raise MdlmError(f"sampler {sampler} needs steps >= 1 (got {steps})")
    if temperature <= 0 or not 0 < top_p <= 1:
        raise MdlmError(f"temperature must be > 0 and top_p in (0, 1] (got {temperature}, {top_p})")
    if num_samples < 1 or length < 1:
        raise MdlmError(f"num_samples and length must be positive (got {num_samples}, {length})")
    device = torch.device(device) if device is not None else (
        prompt.device if prompt is not None else torch.device("cpu"))
    z_all = _initial_state(prompt, num_samples, length, mask_id, device)
    batch_size = batch_size or num_samples
    stats = SampleStats(num_sequences=num_samples)
    ctx = SamplerContext(denoiser, get_schedule(schedule), mask_id, generator, stats, steps=steps or 0,
                         precision=precision, temperature=temperature, top_p=top_p,
                         final_denoise=final_denoise, tokens_per_step=tokens_per_step)
    outputs = []
    for start in range(0, num_samples, batch_size):
        z = z_all[start:start + batch_size].clone()
        outputs.append(SAMPLERS[sampler](z, ctx))
        if on_batch is not None:
            on_batch(len(z))
    tokens = torch.cat(outputs)
    assert not (tokens == mask_id).any(), "a sampler left a mask token"
    return (tokens, stats) if return_stats else tokens


@dataclass
class SemiARResult:
    tokens: Tensor  # (num_samples, total_length)
    stats: SampleStats = field(default_factory=SampleStats)


def semi_ar(denoiser: Denoiser, *, sampler: str, num_samples: int, window: int, stride: int,
            mask_id: int, rounds: int | None = None, target_length: int | None = None,
            prompt: Tensor | None = None, on_block: Callable[[int, Tensor], None] | None = None,
            **sample_kwargs) -> SemiARResult:
    """Semi-autoregressive generation (§4.2): text longer than the window L.

    A first window of L tokens is sampled (starting with the optional `prompt`, (P,) or
    (num_samples, P) tokens, P < L); then each round keeps the last L - L' tokens as a clean
    prefix, fills L' fresh masks with the inner sampler and appends them. Output
    length L + R * L' (or `target_length`, rounded up to whole blocks then cut).
    `on_block(round, new_tokens)` is called as each block completes (for streaming).
    """
    if not 0 < stride < window:
        raise MdlmError(f"stride must be between 1 and window - 1 = {window - 1} (got {stride})")
    if rounds is None:
        if target_length is None:
            raise MdlmError("give either rounds or target_length")
        rounds = max(math.ceil((target_length - window) / stride), 0)
    stats = SampleStats(num_sequences=num_samples)
    keep = window - stride

    def run(block_prompt: Tensor) -> Tensor:
        tokens, s = sample(denoiser, sampler=sampler, num_samples=num_samples, length=window, mask_id=mask_id,
                           prompt=block_prompt, return_stats=True, **sample_kwargs)
        for key in ("calls", "sequence_evals", "draws", "whole_batch_calls"):
            setattr(stats, key, getattr(stats, key) + getattr(s, key))
        return tokens

    device = sample_kwargs.get("device") or (prompt.device if prompt is not None else "cpu")
    first = torch.full((num_samples, window), mask_id, dtype=torch.long, device=device)
    n_prompt = 0
    if prompt is not None:
        prompt = prompt.to(first.device).long()
        prompt = prompt[None].expand(num_samples, -1) if prompt.dim() == 1 else prompt
        n_prompt = prompt.shape[1]
        if n_prompt >= window:
            raise MdlmError(f"the prompt ({n_prompt} tokens) must be shorter than the window ({window})")
        first[:, :n_prompt] = prompt
    output = run(first)
    if on_block is not None:
        on_block(0, output[:, n_prompt:])
    for r in range(1, rounds + 1):
        block = torch.full((num_samples, window), mask_id, dtype=torch.long, device=output.device)
        block[:, :keep] = output[:, -keep:]
        new = run(block)[:, keep:]
        output = torch.cat([output, new], dim=1)
        if on_block is not None:
            on_block(r, new)
    if target_length is not None:
        output = output[:, :target_length]
    return SemiARResult(output, stats)
