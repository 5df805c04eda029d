"""Table 9's claim, exactly: for a denoiser that ignores t, the expected continuous-time bound is
the same under every schedule (a change of variable from t to alpha), so `mdlm eval-ppl
--schedule` may evaluate one model under all four; only the per-datapoint variance differs.

No Monte Carlo: the expectation over z_t is enumerated (every mask pattern of every
configuration of the analytic toy), the one over t is Gauss-Legendre quadrature, and the
alpha side is the exact integral of a polynomial. Per masked-count k, the expected per-sequence
nll at alpha is c_k alpha^(L-k) (1-alpha)^k, so the bound's integrand in alpha,
G(alpha) / (1 - alpha), is a polynomial of degree L - 1.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from mdlm_cli.engine.diffusion import call_denoiser, loss_weight, masked_nll
from mdlm_cli.engine.schedules import get_schedule

from ..analytic import AnalyticDenoiser

SCHEDULES = ("loglinear", "cosine", "cosine-squared", "linear")


@pytest.fixture(scope="module")
def den():
    return AnalyticDenoiser.random(length=3, vocab=3, seed=0)


@pytest.fixture(scope="module")
def coefficients(den) -> np.ndarray:
    """c_k = E_x sum over the masks with k masked positions of the summed -log p(x_l | z), through
    the engine's own call and nll (what nelbo_terms sums)."""
    c = np.zeros(den.length + 1)
    for pattern in itertools.product((False, True), repeat=den.length):
        masked = torch.tensor(pattern)[None].expand(len(den.configs), -1)
        if not masked.any():
            continue
        z = den.configs.masked_fill(masked, den.mask_id)
        logits = call_denoiser(den, z, torch.ones(len(z)), output_mask=masked)
        nll = masked_nll(logits, den.configs[masked], den.mask_id).double()
        per_seq = torch.zeros(masked.shape, dtype=torch.float64).masked_scatter_(masked, nll).sum(1)
        c[sum(pattern)] += float((den.probs * per_seq).sum())
    return c


def expected_nll(c: np.ndarray, alpha: torch.Tensor) -> torch.Tensor:
    """G(alpha): the expected summed nll of the masked positions of z_t ~ q(. | x) at alpha."""
    L = len(c) - 1
    return sum(c[k] * alpha ** (L - k) * (1 - alpha) ** k for k in range(1, L + 1))


def bound_in_t(c: np.ndarray, name: str, t_lo: float, t_hi: float, nodes: int = 200) -> float:
    """integral over t in [t_lo, t_hi] of the engine's weight w(t) times G(alpha(t))."""
    schedule = get_schedule(name)
    x, w = np.polynomial.legendre.leggauss(nodes)
    t = torch.tensor(t_lo + (t_hi - t_lo) * (x + 1) / 2, dtype=torch.float64)
    integrand = loss_weight(t, schedule) * expected_nll(c, schedule.alpha(t))
    return float((torch.tensor(w) * integrand).sum()) * (t_hi - t_lo) / 2


def bound_in_alpha(c: np.ndarray, a_lo: float, a_hi: float) -> float:
    """integral over alpha in [a_lo, a_hi] of G(alpha) / (1 - alpha), a polynomial, exactly."""
    L = len(c) - 1
    P = np.polynomial.Polynomial([0.0])
    one_minus = np.polynomial.Polynomial([1.0, -1.0])
    alpha = np.polynomial.Polynomial([0.0, 1.0])
    for k in range(1, L + 1):
        P = P + c[k] * alpha ** (L - k) * one_minus ** (k - 1)
    antiderivative = P.integ()
    return float(antiderivative(a_hi) - antiderivative(a_lo))


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_bound_over_one_alpha_range_is_the_same_under_every_schedule(den, coefficients, name):
    """Over the t range that covers alpha in [0.02, 0.98] under each schedule, the expected bound
    is one number: the alpha integral, whatever the schedule."""
    schedule = get_schedule(name)
    a_lo, a_hi = 0.02, 0.98
    t_lo = float(schedule.inverse(torch.tensor(a_hi, dtype=torch.float64)))
    t_hi = float(schedule.inverse(torch.tensor(a_lo, dtype=torch.float64)))
    assert 0 < t_lo < t_hi < 1
    assert bound_in_t(coefficients, name, t_lo, t_hi) == pytest.approx(
        bound_in_alpha(coefficients, a_lo, a_hi), rel=1e-10)


@pytest.mark.parametrize("name", SCHEDULES)
def test_over_the_whole_alpha_range_every_schedule_gives_the_exact_nll(den, coefficients, name):
    """alpha from 0 to 1 is the untruncated bound, which for exact conditionals is E[-log p(x)];
    each schedule's bound over the t range it evaluates on is that alpha integral between the
    schedule's own end points (so two schedules differ only by their truncation ends)."""
    entropy = float(-(den.probs * den.probs.log()).sum())
    # the toy's logits are float32
    assert bound_in_alpha(coefficients, 0.0, 1.0) == pytest.approx(entropy, rel=1e-6)
    schedule = get_schedule(name)
    ends = schedule.alpha(torch.tensor([1.0, schedule.t_min], dtype=torch.float64)).tolist()
    assert bound_in_t(coefficients, name, schedule.t_min, 1.0) == pytest.approx(
        bound_in_alpha(coefficients, *ends), rel=1e-10)


def test_the_truncation_ends_are_the_only_difference_at_the_default_eps(coefficients):
    """At eps = 1e-3 the bounds differ by the mass of their end intervals only: below 1% of the
    bound each, largest for linear, whose alpha(t_min) = exp(-(1e-3 + 1e-3 * 6.999)) = 0.992
    leaves out alpha in [0.992, 1] (the others leave out about [0.999, 1] and [0, 0.001])."""
    total = bound_in_alpha(coefficients, 0.0, 1.0)
    gap = {name: total - bound_in_t(coefficients, name, get_schedule(name).t_min, 1.0)
           for name in SCHEDULES}
    assert all(0 < g < 0.01 * total for g in gap.values()), gap
    assert math.isclose(gap["cosine"], gap["cosine-squared"], rel_tol=1e-2)
    assert gap["linear"] > 3 * max(gap["loglinear"], gap["cosine"]), gap


@pytest.mark.parametrize(("objective", "time_conditioning", "refusal"), [
    ("mdlm", "true", "needs a model without time conditioning"),
    ("sedd", "true", "needs a model without time conditioning"),
    ("ar", "false", "has no diffusion time"),
    ("mlm", "false", "has no diffusion time"),
])
def test_eval_ppl_schedule_is_refused_in_one_line_where_the_bound_would_change(
        objective,
        time_conditioning,
        refusal):
    from mdlm_cli.build import resolve_config
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.errors import MdlmError
    from mdlm_cli.eval.ppl import use_schedule
    from mdlm_cli.objectives import get_objective

    cfg = resolve_config("test", [f"diffusion.objective={objective}",
                                  f"model.time_conditioning={time_conditioning}"])
    obj = get_objective(cfg, load_tokenizer("char"))
    with pytest.raises(MdlmError, match=refusal) as e:
        use_schedule(obj, "cosine")
    assert "\n" not in str(e.value)


def test_eval_ppl_schedule_swaps_the_bound_and_its_time_draws():
    """A model without time conditioning: the objective's schedule is replaced (its bound and
    its t draws read it), eps kept; the trained schedule's name comes back for the record."""
    from mdlm_cli.build import resolve_config
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.eval.ppl import use_schedule
    from mdlm_cli.objectives import get_objective

    cfg = resolve_config("test", ["model.time_conditioning=false"])
    obj = get_objective(cfg, load_tokenizer("char"))
    eps = obj.schedule.eps
    assert use_schedule(obj, None) == "loglinear" and obj.schedule.name == "loglinear"
    assert use_schedule(obj, "linear") == "loglinear"
    assert obj.schedule.name == "linear" and obj.schedule.eps == eps
    den = obj.denoiser(torch.nn.Identity())
    assert den.schedule is obj.schedule
