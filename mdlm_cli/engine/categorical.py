"""Categorical sampling: an exact float64 inverse CDF by default.

Zheng et al. (2024): Gumbel-max in float32 draws uniforms on a 2^-24 grid, so the
exponential noise E = -log u is never below ~6e-8 and a class whose probability
is below ~6e-8 of the leading class can never win. In an ancestral step the
leading class is "stay masked", so rare tokens vanish: a lower effective
temperature, a flattering generative perplexity.

`fp64` (default) draws by inverse CDF: one float64 uniform per row, searched in the
float64 running sum of the class probabilities. Nothing is truncated: a class keeps
its probability down to float32's smallest normal number, ~1e-38 of the leading class.
The probabilities themselves are the float32 softmax of the network's float32 (or
bf16) logits: their relative error (~1e-7) is below the logits' own rounding, and the
float64 exponential would cost twice the time at V = 50k for no change a sampler
could show. Float64 logits are normalised in float64 (a cast first would lose
what float32 cannot hold, e.g. logits offset by 2^24). The running sum is where
float32 would fail (a class below ~6e-8 of the total adds nothing to it), so it is
float64.
`fp32` reproduces exactly the reference draw (probabilities / (-log(u + 1e-10)) in
float32) for comparison.

Temperature 0 is greedy: the most likely real token (argmax of the logits, the mask
excluded), no uniform drawn; its probability is that of the untempered softmax, what
LLaDA's and Dream's generation code read as its confidence (Dream's after its top-p and
vocabulary top-k filters, which it applies before the softmax whatever the temperature).
Where a draw mixes the token's weights with another class ("stay masked"), the weights are
the one-hot limit of softmax(logits / T) as T -> 0.

Vocabulary `top_k` (keep the k likeliest tokens; 0 = all) is not the positional top-k of the
confidence samplers (`confident_draws.most_confident`: which positions to reveal).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .errors import EngineError, ProbabilityError

PRECISIONS = ("fp64", "fp32")


def filter_logits(logits: Tensor, *, temperature: float = 1.0, top_p: float = 1.0,
                  top_k: int = 0) -> Tensor:
    """Temperature, then nucleus filtering (keep the smallest set of classes whose
    probability reaches top_p; the most likely class is always kept), then vocabulary top-k
    (keep the k most likely classes; 0 keeps all): Dream's `sample_tokens` order."""
    if temperature != 1.0:
        logits = logits / temperature
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = (
            cum - sorted_logits.softmax(-1) >= top_p
        )  # mass before this class already enough
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if 0 < top_k < logits.shape[-1]:  # ties at the k-th value are kept, as Dream's top_k_logits
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def token_weights(
    logits: Tensor, mask_id: int, *, temperature: float = 1.0, top_p: float = 1.0,
    top_k: int = 0,
) -> Tensor:
    """Weights (N, V) proportional to p_theta under SUBS, the mask's weight 0: float32, or
    float64 for float64 logits (normalised in the logits' own precision, so nothing of a
    float64 logit is lost to a cast first). Not normalised after the mask is dropped: both
    draws are scale-free, and skipping the pass matters at V = 50k. Temperature 0: one-hot
    at the greedy token. `top_k` counts real tokens (the mask is never one of the k)."""
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    if temperature == 0:
        one_hot = torch.zeros(logits.shape, dtype=dtype, device=logits.device)
        return one_hot.scatter_(-1, greedy_tokens(logits, mask_id)[:, None], 1.0)
    if temperature == 1.0 and top_p == 1.0 and top_k <= 0:  # one fused softmax, mask dropped
        weights = torch.softmax(logits, dim=-1, dtype=dtype)
        weights[:, mask_id] = 0.0
        return weights
    logits = logits.to(dtype, copy=True)
    logits[:, mask_id] = float("-inf")
    return filter_logits(logits, temperature=temperature, top_p=top_p, top_k=top_k).softmax(-1)


def greedy_tokens(logits: Tensor, mask_id: int) -> Tensor:
    """The most likely real token of each row (N,): the temperature-0 draw (first index of a
    tie, as torch.argmax)."""
    logits = logits.clone()
    logits[:, mask_id] = float("-inf")
    check_logits(logits)
    return logits.argmax(-1)


def check_rows(peak: Tensor, *, logits: bool = False) -> None:
    """Refuse a draw whose rows cannot be drawn from (ProbabilityError). `peak` (N,): each row's
    total or largest weight, non-finite where a nan or inf entered the row and not above 0
    where nothing is left to draw; with `logits`, each row's largest logit (-inf: nothing
    left). One reduction and one read to the host per draw: without it a nan row gives an id
    past the vocabulary (the inverse CDF) or the mask (argmax)."""
    if logits:
        nonfinite, empty = peak.isnan() | (peak == float("inf")), peak == float("-inf")
    else:
        nonfinite, empty = ~torch.isfinite(peak), peak <= 0
    if bool((nonfinite | empty).any()):
        bad_nonfinite, bad_empty, n = int(nonfinite.sum()), int(empty.sum()), peak.shape[0]
        what = (f"non-finite probabilities in {bad_nonfinite} of {n} rows (a nan or inf logit, "
                "or a temperature that overflows them)" if bad_nonfinite else
                f"all-zero probabilities in {bad_empty} of {n} rows (every class but the "
                "mask has probability 0)")
        raise ProbabilityError(what)


def check_logits(logits: Tensor) -> None:
    """`check_rows` for logits (N, V) read by an argmax: each row's largest must be finite."""
    if logits.shape[0]:
        check_rows(logits.amax(-1), logits=True)


def check_finite(values: Tensor) -> None:
    """`check_rows` for a per-row quantity read before a draw (a rate, the mask's probability):
    only a non-finite one is refused (a nan "whether" would leave the row masked silently)."""
    if values.shape[0]:
        check_rows(torch.where(values.isfinite(), torch.ones_like(values), values))


def reference_draw(weights: Tensor, *, generator: torch.Generator | None) -> Tensor:
    """The reference implementation's float32 draw: argmax(p / (1e-10 - log(u + 1e-10)))."""
    weights = weights.float()
    if weights.shape[0]:
        check_rows(weights.amax(-1))
    u = torch.rand(weights.shape, generator=generator, device=weights.device,
                   dtype=torch.float32)
    return (weights / (1e-10 - (u + 1e-10).log_())).argmax(dim=-1)


def inverse_cdf_draw(
    weights: Tensor, *, generator: torch.Generator | None, never: int | None = None
) -> Tensor:
    """One draw per row from unnormalised weights (N, V): the first class whose float64
    running sum (the CDF, unnormalised) reaches v times the row total, v = 1 - u ~ U(0, 1]
    in float64. As v > 0 and the search is left-closed, a class whose running sum does not
    grow (weight 0) is never drawn, not even at the extremes of v. `never` names a class
    of weight 0 whose running sum is pinned to its predecessor's, because a parallel scan
    (CUDA) may round it an ulp apart. One uniform per row, no division pass."""
    cdf = weights.double().cumsum_(-1)
    if never is not None:
        cdf[:, never] = cdf[:, never - 1] if never else 0.0
    if cdf.shape[0]:
        check_rows(cdf[:, -1])  # a nan or inf weight makes the total one
    u = torch.rand((cdf.shape[0], 1), generator=generator, device=cdf.device,
                   dtype=torch.float64)
    target = u.neg_().add_(1.0).mul_(cdf[:, -1:])  # in (0, total]: cdf[j - 1] < target <= cdf[j]
    return torch.searchsorted(cdf, target)[:, 0]


def sample_tokens(logits: Tensor, mask_id: int, *, generator: torch.Generator | None,
                  precision: str = "fp64", temperature: float = 1.0, top_p: float = 1.0,
                  top_k: int = 0) -> Tensor:
    """Tokens from p_theta (SUBS: the mask is never drawn) at N positions: logits (N, V) -> (N,).

    fp64: inverse CDF with a float64 running sum (exact, one uniform per row). fp32: the
    reference's float32 race, truncation included. Temperature 0: argmax, no uniform.
    """
    if temperature == 0:
        return greedy_tokens(logits, mask_id)
    weights = token_weights(logits, mask_id, temperature=temperature, top_p=top_p, top_k=top_k)
    return _draw(weights, mask_id, generator=generator, precision=precision)


def sample_tokens_with_probs(logits: Tensor, mask_id: int, *, generator: torch.Generator | None,
                             precision: str = "fp64", temperature: float = 1.0,
                             top_p: float = 1.0, top_k: int = 0) -> tuple[Tensor, Tensor]:
    """`sample_tokens` (the same draws), and the probability of each drawn token (N,) float64
    under the distribution it was drawn from: the confidence of the confidence-ordered samplers.
    Temperature 0: the argmax and its probability under the untempered softmax (renormalised
    over the top-p / top-k classes where those filters are on, as Dream's `sample_tokens`)."""
    tokens, weights = sample_tokens_with_weights(
        logits, mask_id, generator=generator, precision=precision, temperature=temperature,
        top_p=top_p, top_k=top_k)
    return tokens, drawn_probs(weights, tokens)


def drawn_probs(weights: Tensor, tokens: Tensor) -> Tensor:
    """The probability (N,) float64 of each token under its row of unnormalised `weights`."""
    return weights.gather(-1, tokens[:, None])[:, 0].double() / weights.double().sum(-1)


def sample_tokens_with_weights(logits: Tensor, mask_id: int, *,
                               generator: torch.Generator | None, precision: str = "fp64",
                               temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                               untempered: bool = False) -> tuple[Tensor, Tensor]:
    """`sample_tokens` (the same draws), and the unnormalised weights (N, V) they were drawn
    from; with `untempered` the untempered, unfiltered softmax's instead, the mask's weight 0:
    what LLaDA reads its confidence from (it draws at temperature T by Gumbel-max, the
    softmax(logits / T) law, but ranks by softmax(logits)). At temperature 0: the argmax, and
    the untempered softmax after the top-p / top-k filters, which is Dream's confidence (its
    `sample_tokens` filters the logits before any softmax; with top_k 50, its release's
    default, every order ranks by probabilities renormalised over the 50 likeliest tokens)."""
    if temperature == 0:
        filtered = {} if untempered else {"top_p": top_p, "top_k": top_k}
        return greedy_tokens(logits, mask_id), token_weights(logits, mask_id, **filtered)
    weights = token_weights(logits, mask_id, temperature=temperature, top_p=top_p, top_k=top_k)
    tokens = _draw(weights, mask_id, generator=generator, precision=precision)
    if untempered and (temperature != 1.0 or top_p != 1.0 or top_k > 0):
        weights = token_weights(logits, mask_id)
    return tokens, weights


def _draw(
    weights: Tensor, mask_id: int, *, generator: torch.Generator | None, precision: str
) -> Tensor:
    if precision not in PRECISIONS:
        raise EngineError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp64":
        return inverse_cdf_draw(weights, generator=generator, never=mask_id)
    return reference_draw(weights, generator=generator)
