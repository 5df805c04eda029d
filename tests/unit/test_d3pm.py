"""D3PM's eq. 9 (the full posterior KL), its T-step bound and its sampler against an enumerable toy."""

import itertools
import math

import pytest
import torch

from mdlm_cli.engine import diffusion as D
from mdlm_cli.engine.d3pm import d3pm_terms, posterior_kl
from mdlm_cli.engine.schedules import LogLinear, get_schedule

from ..analytic import AnalyticDenoiser, AnalyticPosterior
from .test_sampling import chi2_pvalue, draw, empirical


@pytest.fixture(scope="module")
def den():
    return AnalyticDenoiser.random(length=3, vocab=3, seed=0, concentration=0.3)


def brute_force_kl(x_theta: torch.Tensor, x0: int, t: float, s: float, schedule, mask: int) -> float:
    """KL(q(z_s | z_t = m, x0) || p(z_s | z_t = m)) from the forward process written out:
    p(z_s) proportional to sum_x' x_theta(x') q(z_s | x') q(z_t = m | z_s), the mask a state
    that stays masked."""
    a_t, a_s = (schedule.alpha(torch.tensor(v, dtype=torch.float64)).item() for v in (t, s))
    V = len(x_theta)

    def q_s_given(x: int) -> torch.Tensor:  # q(z_s | x0 = x)
        out = torch.zeros(V, dtype=torch.float64)
        if x == mask:
            out[mask] = 1.0
        else:
            out[x], out[mask] = a_s, 1 - a_s
        return out

    to_mask = torch.full((V,), 1 - a_t / a_s, dtype=torch.float64)  # q(z_t = m | z_s)
    to_mask[mask] = 1.0
    p = sum(x_theta[x] * q_s_given(x) for x in range(V)) * to_mask
    q = q_s_given(x0) * to_mask
    p, q = p / p.sum(), q / q.sum()
    keep = q > 0
    return float((q[keep] * (q[keep] / p[keep]).log()).sum())


@pytest.mark.parametrize("schedule_name", ["loglinear", "cosine"])
def test_posterior_kl_is_the_kl_of_the_written_out_process(schedule_name):
    schedule = get_schedule(schedule_name)
    g = torch.Generator().manual_seed(0)
    log_probs = torch.randn(6, 5, generator=g).log_softmax(-1)  # the mask (4) gets mass
    x0 = torch.tensor([0, 1, 2, 3, 0, 2])
    t = torch.tensor([0.9, 0.5, 0.3, 0.02, 0.25, 0.7], dtype=torch.float64)
    s = torch.tensor([0.8, 0.0, 0.1, 0.01, 0.0, 0.69], dtype=torch.float64)
    got = posterior_kl(log_probs, x0, t, s, schedule, 4)
    expected = [brute_force_kl(log_probs[i].double().exp(), int(x0[i]), float(t[i]), float(s[i]), schedule, 4)
                for i in range(6)]
    assert torch.allclose(got.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-4, atol=1e-6)
    assert (got >= 0).all()


def test_with_subs_eq9_is_mdlms_discrete_term():
    """Zero masking and carry-over: eq. 9 reduces to eq. 8 on the same masks and t (§3.3)."""
    torch.manual_seed(3)
    mask, T = 5, 10
    fixed = torch.randn(4, 7, mask + 1)
    fixed[..., mask] = -math.inf  # zero masking
    den = lambda z, t, output_mask=None, **_: fixed if output_mask is None else fixed[output_mask]  # noqa: E731
    x0 = torch.randint(0, mask, (4, 7))
    schedule = LogLinear()
    t = D.times_from_uniform(torch.rand(4), schedule, T)
    d3pm = d3pm_terms(den, x0, t, mask_id=mask, schedule=schedule, T=T, carry_over=True,
                      masking=D.Masking(generator=torch.Generator().manual_seed(1)))
    mdlm = D.nelbo_terms(den, x0, t, mask_id=mask, schedule=schedule, T=T,
                         masking=D.Masking(generator=torch.Generator().manual_seed(1)))
    assert torch.allclose(d3pm, mdlm, rtol=1e-5)


def exact_bound(model: AnalyticPosterior, x0: torch.Tensor, schedule, T: int) -> float:
    """The T-step bound of one sequence, enumerated: every grid time, every masking, the KL at
    each masked position written out, and the reconstruction term (alpha(0) = 1: z_0 = x0)."""
    mask, L = model.mask_id, len(x0)
    total = 0.0
    for j in range(1, T + 1):
        t, s = j / T, (j - 1) / T
        rate = float(schedule.mask_rate(torch.tensor(t, dtype=torch.float64)))
        for pattern in itertools.product([False, True], repeat=L):
            masked = torch.tensor(pattern)
            prob = math.prod(rate if m else 1 - rate for m in pattern)
            z = torch.where(masked, mask, x0)
            x_theta = model(z[None], torch.tensor([t]))[0].double().softmax(-1)  # (L, V)
            kl = sum(brute_force_kl(x_theta[i], int(x0[i]), t, s, schedule, mask) for i in range(L) if pattern[i])
            total += prob * T * kl / T  # the grid time is uniform over the T steps
    clean = model(x0[None], torch.zeros(1))[0].double().log_softmax(-1)
    return total - float(clean.gather(-1, x0[:, None]).sum())


@pytest.mark.parametrize("mask_logit", [-math.inf, math.log(0.25)])
def test_t_step_bound_is_unbiased_for_its_enumerated_value(den, mask_logit):
    """The exact x_theta (no mass on the mask), and one that gives the mask mass (then the
    reconstruction term is not 0 either)."""
    model, schedule, T, n = AnalyticPosterior(den, mask_logit), LogLinear(), 4, 6000
    x0 = den.configs[torch.tensor([4, 21])]
    g = torch.Generator().manual_seed(0)
    rows = x0.repeat_interleave(n, 0)
    t = D.times_from_uniform(D.sample_times(len(rows), generator=g), schedule, T)
    est = d3pm_terms(model, rows, t, mask_id=den.mask_id, schedule=schedule, T=T, carry_over=False,
                     masking=D.Masking(generator=g)).view(2, n).double()
    mean, se = est.mean(1), est.std(1) / math.sqrt(n)
    truth = torch.tensor([exact_bound(model, x, schedule, T) for x in x0], dtype=torch.float64)
    assert torch.all((mean - truth).abs() < 4 * se + 1e-5), (mean, truth, se)


def test_only_target_positions_are_noised_and_scored(den):
    model = AnalyticPosterior(den, math.log(0.25))
    x0 = den.configs[torch.tensor([5])].repeat(50, 1)
    targets = torch.tensor([[False, True, True]]).expand(50, -1)
    schedule = LogLinear(eps=0.0)
    seen = []

    def spy(z, t, output_mask=None, **kw):
        seen.append(z.clone())
        return model(z, t, output_mask=output_mask)

    terms = d3pm_terms(spy, x0, torch.ones(50), mask_id=den.mask_id, schedule=schedule, T=4, carry_over=False,
                       masking=D.Masking(generator=torch.Generator().manual_seed(0), targets=targets))
    assert (seen[0][:, 0] == x0[:, 0]).all() and (seen[0][:, 1:] == den.mask_id).all()
    # the reconstruction term covers the two target tokens only
    clean = model(x0[:1], torch.zeros(1))[0].log_softmax(-1).gather(-1, x0[0][:, None])[:, 0]
    kl_part = terms - (-clean[1:].sum())
    assert torch.allclose(kl_part, kl_part[:1].expand(50))


def test_d3pm_sampler_reproduces_the_joint(den):
    tokens, stats = draw(AnalyticPosterior(den), "d3pm-ancestral", steps=200)
    assert chi2_pvalue(empirical(den, tokens), den.probs) > 1e-3
    assert stats.ncs <= den.length
