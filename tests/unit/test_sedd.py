"""SEDD's score entropy, its parameterisation and its samplers against an enumerable toy."""

import math

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.engine import diffusion as D
from mdlm_cli.engine.schedules import LogLinear, get_schedule
from mdlm_cli.engine.sedd import score_entropy, score_entropy_terms, sedd_log_score

from ..analytic import AnalyticDenoiser, AnalyticScore
from .test_sampling import chi2_pvalue, draw, empirical

N = 6000


@pytest.fixture(scope="module")
def den():
    return AnalyticDenoiser.random(length=3, vocab=3, seed=0, concentration=0.3)


def test_parameterisation_scales_by_sigma_and_zeroes_the_observed_token():
    logits = torch.randn(4, 6)
    z = torch.tensor([5, 5, 2, 0])
    sigma = torch.tensor([0.01, 0.3, 1.0, 4.0], dtype=torch.float64)
    log_k = -torch.log(torch.expm1(sigma))  # the reference's log(expm1(sigma))
    got = sedd_log_score(logits, z, log_k)
    expected = logits - torch.log(torch.expm1(sigma)).float()[:, None] - math.log(5)
    expected[torch.arange(4), z] = 0.0
    assert torch.allclose(got, expected, atol=1e-6)


def test_score_entropy_is_zero_at_the_true_score_and_positive_elsewhere():
    mask, k = 3, torch.tensor([2.0, 0.5], dtype=torch.float64)
    x0 = torch.tensor([1, 0])
    true = torch.full((2, 4), -math.inf)
    true[torch.arange(2), x0] = k.log().float()
    true[:, mask] = 0.0
    assert torch.allclose(score_entropy(true, x0, k.log(), mask), torch.zeros(2, dtype=torch.float64), atol=1e-6)
    # the reference's form: sum_{y != m} s_y - k log s_x0 + k (log k - 1)
    other = torch.randn(2, 4)
    s = other.double().exp()
    by_hand = s[:, :mask].sum(1) - k * other.double()[torch.arange(2), x0] + k * (k.log() - 1)
    got = score_entropy(other, x0, k.log(), mask)
    assert torch.allclose(got, by_hand, atol=1e-6) and (got > 0).all()


def test_score_entropy_with_the_exact_score_is_mdlms_term(den):
    """dsigma * k = -alpha' / (1 - alpha): with exact scores SEDD's term is MDLM's, mask for mask."""
    x0 = den.configs[torch.randint(0, 27, (64,), generator=torch.Generator().manual_seed(0))]
    for name in ("loglinear", "geometric", "cosine"):
        schedule = get_schedule(name)
        t = D.times_from_uniform(torch.rand(64, generator=torch.Generator().manual_seed(1)), schedule)
        sedd = score_entropy_terms(AnalyticScore(den, schedule), x0, t, mask_id=den.mask_id, schedule=schedule,
                                   masking=D.Masking(generator=torch.Generator().manual_seed(2)))
        mdlm = D.nelbo_terms(den, x0, t, mask_id=den.mask_id, schedule=schedule,
                             masking=D.Masking(generator=torch.Generator().manual_seed(2)))
        assert torch.allclose(sedd, mdlm, rtol=1e-4, atol=1e-4), name


def test_sedd_bound_of_the_exact_score_is_unbiased_for_the_nll(den):
    """Monte-Carlo over t and masks, the bound equals -log p(x) up to the t-truncation."""
    schedule = LogLinear(eps=1e-5)
    model = AnalyticScore(den, schedule)
    x0 = den.configs[torch.tensor([0, 13, 26])].repeat_interleave(3000, 0)
    g = torch.Generator().manual_seed(0)
    t = D.times_from_uniform(D.sample_times(len(x0), generator=g), schedule)
    est = score_entropy_terms(model, x0, t, mask_id=den.mask_id, schedule=schedule,
                              masking=D.Masking(generator=g)).view(3, -1).double()
    mean, se = est.mean(1), est.std(1) / math.sqrt(est.shape[1])
    truth = -den.log_prob(x0.view(3, -1, 3)[:, 0])
    assert torch.all((mean - truth).abs() < 4 * se + 1e-3), (mean, truth, se)


def test_only_target_positions_are_noised(den):
    x0 = den.configs[torch.tensor([5])].repeat(200, 1)
    targets = torch.tensor([[True, False, True]]).expand(200, -1)
    seen = []

    class Spy(AnalyticScore):
        def log_score(self, z_t, t, *, output_mask, **kw):
            seen.append(z_t.clone())
            return super().log_score(z_t, t, output_mask=output_mask, **kw)

    schedule = LogLinear(eps=0.0)  # everything but the context is masked at t = 1
    score_entropy_terms(Spy(den, schedule), x0, torch.ones(200), mask_id=den.mask_id, schedule=schedule,
                        masking=D.Masking(generator=torch.Generator().manual_seed(0), targets=targets))
    assert (seen[0][:, 1] == x0[:, 1]).all() and (seen[0][:, [0, 2]] == den.mask_id).all()


@pytest.mark.parametrize("sampler", ["analytic", "euler"])
def test_score_samplers_reproduce_the_joint(den, sampler):
    schedule = LogLinear()
    tokens, stats = draw(AnalyticScore(den, schedule), sampler, steps=200, schedule=schedule)
    assert chi2_pvalue(empirical(den, tokens), den.probs) > 1e-3
    assert stats.ncs <= den.length and stats.nfe <= 201


def test_analytic_serves_a_subs_model_through_the_score_conversion(den):
    tokens, _ = draw(den, "analytic", steps=200)
    assert chi2_pvalue(empirical(den, tokens), den.probs) > 1e-3


def test_one_analytic_step_does_not_reproduce_the_joint(den):
    """One step unmasks (almost) every position independently: the test must reject it (power)."""
    tokens, _ = draw(AnalyticScore(den, LogLinear()), "analytic", steps=1)
    assert chi2_pvalue(empirical(den, tokens), den.probs) < 1e-6


def test_analytic_unmasks_with_the_ancestral_probability_for_subs(den):
    """For a SUBS model, expm1(dsigma) * k = (alpha_s - alpha_t) / (1 - alpha_t)."""
    schedule = get_schedule("cosine")
    t, s = torch.tensor([0.7], dtype=torch.float64), torch.tensor([0.4], dtype=torch.float64)
    rate = torch.expm1(schedule.sigma(t) - schedule.sigma(s)) * schedule.log_odds(t).exp()
    assert torch.allclose(rate, schedule.unmask_prob(t, s))


def test_fp32_score_sampler_is_seeded_and_leaves_no_mask(den):
    model = AnalyticScore(den, LogLinear())
    a = engine.sample(model, sampler="analytic", num_samples=32, length=3, mask_id=den.mask_id, steps=20,
                      precision="fp32", generator=torch.Generator().manual_seed(3))
    b = engine.sample(model, sampler="analytic", num_samples=32, length=3, mask_id=den.mask_id, steps=20,
                      precision="fp32", generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and not (a == den.mask_id).any()
