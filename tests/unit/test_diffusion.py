import math

import pytest
import torch

from mdlm_cli.engine import diffusion as D
from mdlm_cli.engine.schedules import LogLinear

from ..analytic import AnalyticDenoiser

MASK = 5


def test_subs_never_predicts_mask_and_carries_over():
    logits = torch.randn(2, 4, 6)
    z = torch.tensor([[MASK, 1, MASK, 3], [0, MASK, MASK, MASK]])
    before = logits.clone()
    logp = D.subs_log_probs(logits, z, MASK)
    assert torch.equal(logits, before)  # out of place
    probs = logp.exp()
    assert torch.all(probs[..., MASK] == 0)
    assert torch.allclose(probs.sum(-1), torch.ones(2, 4))
    carried = z != MASK
    assert torch.all(probs[carried].gather(-1, z[carried][:, None]) == 1)
    assert torch.isneginf(logp[..., MASK]).all()


def test_masked_nll_equals_subs_gather():
    logits = torch.randn(3, 5, 6)
    x0 = torch.randint(0, MASK, (3, 5))
    z = torch.where(torch.rand(3, 5) < 0.5, MASK, x0)
    masked = z == MASK
    ref = -D.subs_log_probs(logits, z, MASK).gather(-1, x0[..., None])[..., 0][masked]
    assert torch.allclose(D.masked_nll(logits[masked], x0[masked], MASK), ref, atol=1e-6)


def test_mask_tokens_rate_and_padding():
    x0 = torch.zeros(4, 20000, dtype=torch.long)
    rate = torch.tensor([0.0, 0.25, 0.75, 1.0])
    am = torch.ones_like(x0, dtype=torch.bool)
    am[:, -100:] = False
    z = D.mask_tokens(x0, rate, MASK, generator=torch.Generator().manual_seed(0), attention_mask=am)
    frac = (z[:, :-100] == MASK).float().mean(1)
    assert torch.allclose(frac, rate, atol=0.02)
    assert not (z[:, -100:] == MASK).any()


def test_antithetic_times_cover_every_stratum():
    n = 512
    u = D.sample_times(n, generator=torch.Generator().manual_seed(1), antithetic=True)
    strata = torch.floor(u * n).long()
    assert torch.equal(torch.sort(strata).values, torch.arange(n))
    # shuffled: a micro-batch slice spreads over [0, 1) rather than one corner of it
    for chunk in u.view(16, 32):
        assert chunk.min() < 0.2 and chunk.max() > 0.8


def test_discrete_times_lie_on_grid():
    T = 10
    u = torch.rand(1000)
    t = D.times_from_uniform(u, LogLinear(), T)
    assert torch.allclose(t * T, torch.round(t * T))
    assert t.min() >= 1 / T - 1e-7 and t.max() <= 1 + 1e-7


def test_loss_zero_when_nothing_masked():
    x0 = torch.randint(0, MASK, (2, 6))
    den = lambda z, t: torch.randn(*z.shape, MASK + 1)  # noqa: E731
    terms = D.nelbo_terms(den, x0, torch.full((2,), 1e-9), mask_id=MASK, schedule=LogLinear(eps=0.0))
    assert torch.equal(terms, torch.zeros(2))


def test_loss_equals_weighted_cross_entropy_by_hand():
    torch.manual_seed(3)
    x0 = torch.randint(0, MASK, (2, 6))
    fixed = torch.randn(2, 6, MASK + 1)
    den = lambda z, t: fixed  # noqa: E731
    t = torch.tensor([0.3, 0.8])
    sched = LogLinear()
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    terms = D.nelbo_terms(den, x0, t, mask_id=MASK, schedule=sched, masking=D.Masking(generator=g1))
    z = D.mask_tokens(x0, sched.mask_rate(t), MASK, generator=g2)
    expected = torch.zeros(2)
    for b in range(2):
        for pos in range(6):
            if z[b, pos] == MASK:
                logits = fixed[b, pos].clone()
                logits[MASK] = -math.inf
                expected[b] += -torch.log_softmax(logits, -1)[x0[b, pos]] / t[b]
    assert torch.allclose(terms, expected, atol=1e-5)


def test_padding_is_excluded_from_the_loss():
    x0 = torch.randint(0, MASK, (1, 8))
    am = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    seen = {}

    def den(z, t, attention_mask=None):
        seen["am"] = attention_mask
        return torch.zeros(*z.shape, MASK + 1)

    t = torch.tensor([1.0])
    terms = D.nelbo_terms(den, x0, t, mask_id=MASK, schedule=LogLinear(eps=0.0),
                          masking=D.Masking(attention_mask=am))
    # every real token is masked at t = 1; each costs log(5) nats under uniform logits
    assert terms.item() == pytest.approx(5 * math.log(5), rel=1e-5)
    assert torch.equal(seen["am"], am)


def test_nelbo_of_exact_denoiser_is_unbiased_for_the_nll():
    """With exact conditionals the continuous bound equals -log p(x) (REFERENCE §2)."""
    den = AnalyticDenoiser.random(length=3, vocab=3, seed=0)
    x0 = den.configs[torch.tensor([0, 5, 13, 26])]
    x0 = x0.repeat_interleave(2000, 0)
    sched = LogLinear(eps=1e-5)
    est = D.nelbo(den, x0, mask_id=den.mask_id, schedule=sched, num_samples=2,
                  masking=D.Masking(generator=torch.Generator().manual_seed(0)))
    est = est.view(4, 2000).double()
    mean, se = est.mean(1), est.std(1) / math.sqrt(2000)
    truth = -den.log_prob(x0.view(4, 2000, 3)[:, 0])
    assert torch.all((mean - truth).abs() < 4 * se + 1e-3), (mean, truth, se)


def test_nelbo_num_samples_reduces_variance():
    den = AnalyticDenoiser.random(length=3, vocab=3, seed=1)
    x0 = den.configs[torch.tensor([7])].repeat(3000, 1)
    var = []
    for k in (1, 8):
        est = D.nelbo(den, x0, mask_id=den.mask_id, num_samples=k,
                      masking=D.Masking(generator=torch.Generator().manual_seed(k)))
        var.append(est.var().item())
    assert var[1] < var[0] / 4


def test_discrete_bound_is_not_below_continuous():
    """In expectation over the data (pointwise it need not hold), the T-step bound is
    looser than the continuous one, which is tight (the entropy) for the exact denoiser."""
    den = AnalyticDenoiser.random(length=3, vocab=3, seed=2)
    g = torch.Generator().manual_seed(0)
    x0 = den.configs[torch.multinomial(den.probs, 20000, replacement=True, generator=g)]
    entropy = -(den.probs * den.probs.log()).sum().item()
    cont = D.nelbo(den, x0, mask_id=den.mask_id, num_samples=2, masking=D.Masking(generator=g))
    disc = D.nelbo(den, x0, mask_id=den.mask_id, num_samples=2, T=2, masking=D.Masking(generator=g))
    se = (disc - cont).double().std().item() / math.sqrt(len(x0))
    assert cont.double().mean().item() == pytest.approx(entropy, abs=4 * cont.double().std().item() / 140)
    assert (disc - cont).double().mean().item() > 3 * se


def test_targets_mask_only_target_positions_and_none_is_unchanged():
    x0 = torch.randint(0, MASK, (4, 10), generator=torch.Generator().manual_seed(0))
    rate = torch.full((4,), 0.9)
    targets = torch.zeros(4, 10, dtype=torch.bool)
    targets[:, 6:] = True
    z = D.mask_tokens(x0, rate, MASK, generator=torch.Generator().manual_seed(1), targets=targets)
    assert torch.equal(z[~targets], x0[~targets]) and (z[targets] == MASK).any()
    z_none = D.mask_tokens(x0, rate, MASK, generator=torch.Generator().manual_seed(1))
    z_all = D.mask_tokens(x0, rate, MASK, generator=torch.Generator().manual_seed(1),
                          targets=torch.ones_like(targets))
    assert torch.equal(z_none, z_all) and torch.equal(z[targets], z_none[targets])  # same draws
    fixed = torch.randn(4, 10, MASK + 1)
    t = torch.tensor([0.2, 0.5, 0.7, 1.0])

    def terms(targets):
        return D.nelbo_terms(lambda z, t: fixed, x0, t, mask_id=MASK, schedule=LogLinear(),
                             masking=D.Masking(generator=torch.Generator().manual_seed(2), targets=targets))

    assert torch.equal(terms(None), terms(torch.ones_like(targets)))  # bit for bit
    assert torch.equal(terms(torch.zeros_like(targets)), torch.zeros(4))


@pytest.mark.parametrize("pattern", [(0, 0, 1, 1), (1, 0, 1, 0), (0, 1, 1, 1)])
def test_conditional_bound_of_exact_denoiser_is_unbiased_for_the_conditional_nll(pattern):
    """Only the targets noised, the rest clean context: the bound's expectation is
    -log p(x[targets] | x[context]) = -log p(x) + log p(x[context]), whether the context
    precedes the targets or surrounds them."""
    den = AnalyticDenoiser.random(length=4, vocab=3, seed=4)
    targets = torch.tensor(pattern, dtype=torch.bool)
    sched, n = LogLinear(eps=1e-5), 4000
    for index in (5, 40, 77):
        x = den.configs[index]
        t = D.times_from_uniform(D.sample_times(n, generator=torch.Generator().manual_seed(index)), sched)
        masking = D.Masking(generator=torch.Generator().manual_seed(index + 1), targets=targets.expand(n, -1))
        est = D.nelbo_terms(den, x.repeat(n, 1), t, mask_id=den.mask_id, schedule=sched, masking=masking)
        est = est.double()
        context = ~targets
        marginal = den.probs[(den.configs[:, context] == x[context]).all(1)].sum()
        truth = -den.log_prob(x[None])[0] + marginal.log()
        mean, se = est.mean(), est.std() / math.sqrt(n)
        assert abs(mean - truth) < 4 * se + 1e-3, (index, mean, truth, se)
        assert truth < -den.log_prob(x[None])[0] - 0.05  # the context carries information here
