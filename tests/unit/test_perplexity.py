"""`eval-ppl`'s estimator: unbiased, with a standard error that falls with K."""

import math

import numpy as np
import pytest
import torch

from mdlm_cli.data.store import TokenSplit
from mdlm_cli.engine.schedules import LogLinear
from mdlm_cli.eval.ppl import PplResult

from ..analytic import AnalyticDenoiser
from ..nelbo_passes import nelbo_passes

CPU = torch.device("cpu")


def rows_from(den: AnalyticDenoiser, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return den.configs[torch.multinomial(den.probs, n, replacement=True, generator=g)]


def split_of(x: torch.Tensor) -> TokenSplit:
    return TokenSplit(x.numpy().astype(np.int64), np.full(len(x), x.shape[1], dtype=np.int32))


def result(passes, **kw) -> PplResult:
    return PplResult("d", "test", 600, 200, [p.nats_per_token for p in passes], exact=False, **kw)


@pytest.fixture(scope="module")
def den():
    return AnalyticDenoiser.random(length=3, vocab=3, seed=0)


def test_bound_of_the_exact_denoiser_is_unbiased_within_its_standard_error(den):
    """With exact conditionals the continuous bound equals -log p(x) (up to the eps
    truncation), so the K-pass mean must sit within a few standard errors of the exact NLL."""
    x = rows_from(den, 200)
    truth = (-den.log_prob(x).sum() / x.numel()).item()  # nats per token of these rows
    passes = nelbo_passes(den, split_of(x), schedule=LogLinear(eps=1e-5), mask_id=den.mask_id,
                          mc_samples=128, batch_size=200, device=CPU, seed=1)
    r = result(passes)
    assert all(p.tokens == x.numel() and p.sequences == 200 for p in passes)  # every token, every pass
    assert r.standard_error > 0
    assert abs(r.nats_per_token - truth) < 4 * r.standard_error + 1e-3, (r.nats_per_token, truth,
                                                                          r.standard_error)


def test_standard_error_falls_with_the_number_of_passes(den):
    """Repeat whole K-pass evaluations: the spread of their means falls like 1/sqrt(K), and the
    reported standard error describes that spread. (One pass is heavy-tailed because of the
    1/t weight, so spreads are compared with the median absolute deviation.)"""
    x = rows_from(den, 200, seed=1)
    split, sched = split_of(x), LogLinear()

    def runs(k: int, reps: int, base: int) -> list[PplResult]:
        return [result(nelbo_passes(den, split, schedule=sched, mask_id=den.mask_id, mc_samples=k,
                                    batch_size=200, device=CPU, seed=base + r)) for r in range(reps)]

    def mad(values: list[float]) -> float:
        m = float(np.median(values))
        return float(np.median([abs(v - m) for v in values]))

    small, large = runs(4, 24, 0), runs(64, 24, 1000)
    # expected ratio sqrt(4 / 64) = 0.25
    assert mad([r.nats_per_token for r in large]) < 0.5 * mad([r.nats_per_token for r in small])
    reported = float(np.median([r.standard_error for r in large]))
    empirical = float(np.std([r.nats_per_token for r in large], ddof=1))
    assert 0.4 < reported / empirical < 2.5


def test_discrete_bound_is_not_below_the_continuous_one(den):
    x = rows_from(den, 3000, seed=4)
    split, sched = split_of(x), LogLinear(eps=1e-5)
    cont = result(nelbo_passes(den, split, schedule=sched, mask_id=den.mask_id, mc_samples=4, batch_size=3000,
                               device=CPU, seed=5))
    disc = result(nelbo_passes(den, split, schedule=sched, mask_id=den.mask_id, mc_samples=4, batch_size=3000,
                               device=CPU, seed=6, T=2))
    gap_se = math.hypot(cont.standard_error, disc.standard_error)
    assert disc.nats_per_token - cont.nats_per_token > 3 * gap_se


def test_result_reports_bits_per_character_and_exactness():
    r = PplResult("text8", "test", 100, 1, [1.0, 1.2], exact=False, char_level=True)
    assert r.nats_per_token == pytest.approx(1.1)
    assert r.bits_per_char == pytest.approx(1.1 / math.log(2))
    assert r.pass_std == pytest.approx(math.sqrt(0.02))
    assert r.standard_error == pytest.approx(math.sqrt(0.02) / math.sqrt(2))
    assert PplResult("x", "test", 1, 1, [1.0], exact=False).standard_error is None  # K = 1: unknown
    exact = PplResult("x", "test", 1, 1, [1.0], exact=True)
    assert exact.standard_error == 0.0 and exact.bits_per_char is None
    assert exact.to_dict()["kind"] == "exact" and r.to_dict()["mc_samples"] == 2


def test_per_sequence_values_give_the_per_datapoint_spread_of_table_9(den):
    """Each pass keeps every row's bound; their spread over the passes, per sequence and per
    token, averaged over sequences, is the per-datapoint sd (variance) of a one-sample estimate."""
    from mdlm_cli.engine.diffusion import Masking, nelbo_terms
    from mdlm_cli.eval.ppl import sequence_spread
    from mdlm_cli.objectives.bound import SplitSweep, diffusion_times, sharded_sum

    x = rows_from(den, 60)
    split = split_of(x)
    schedule = LogLinear()

    def terms(x0, t, gen, attention_mask):
        return nelbo_terms(den, x0, t, mask_id=den.mask_id, schedule=schedule, masking=Masking(generator=gen))

    passes = [sharded_sum(terms, split, SplitSweep(7, CPU, per_sequence=True), seed=k,
                          draw_times=diffusion_times(schedule)) for k in range(5)]
    for p in passes:
        assert p.per_sequence.shape == (60,) and p.per_sequence.sum() == pytest.approx(p.nats, rel=1e-6)
    per_token = np.stack([p.per_sequence for p in passes]) / 3
    sd, var = sequence_spread(passes, split.lengths)
    assert sd == pytest.approx(np.mean([np.std(per_token[:, i], ddof=1) for i in range(60)]))
    assert var == pytest.approx(per_token.var(axis=0, ddof=1).mean()) and sd > 0
    assert sequence_spread(passes[:1], split.lengths) == (None, None)  # one pass: no spread
    plain = sharded_sum(terms, split, SplitSweep(7, CPU), seed=0, draw_times=diffusion_times(schedule))
    assert plain.per_sequence is None and plain.nats == passes[0].nats  # the total is unchanged
