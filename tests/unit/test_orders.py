"""The random orders of the confidence sampler follow their laws: `random` (LLaDA's
remasking="random") keeps k masked positions uniformly at random, `origin` (Dream's
alg="origin") reveals each masked position with probability 1 - s/t on Dream's grid; both
refuse what they cannot run, at parse time."""

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.engine.settings import SettingsError
from mdlm_cli.engine.transfer import DREAM_EPS
from mdlm_cli.generation.decode import Revealed, decode

L, V, ROWS = 32, 9, 2000  # V: 8 tokens and the mask (id 8)
MASK = V - 1
BASE = torch.randn(L, V, generator=torch.Generator().manual_seed(0))


def fixed(z, t):
    """A model whose logits are the same at every step: position-dependent, not uniform."""
    return BASE.expand(len(z), L, V)


fixed.time_agnostic = True


def first_step(order: str, steps: int = 4, **options) -> torch.Tensor:
    """(ROWS, L) bool: the positions the first network call revealed."""
    how = engine.SamplingSettings("confidence", steps, temperature=0.0,
                                  options={"order": order, **options})
    events = decode(fixed, how, engine.Canvas(ROWS, L, MASK),
                    generator=torch.Generator().manual_seed(1))
    first = next(e for e in events if isinstance(e, Revealed))
    events.close()
    return first.revealed


def test_random_keeps_k_positions_uniformly_at_random():
    revealed = first_step("random")
    assert (revealed.sum(1) == 8).all()  # linear: 32 - floor(32 * 3/4) at the first of 4 steps
    frequency = revealed.double().mean(0)  # each position's share of the rows: 8 / 32
    assert (frequency - 0.25).abs().max() < 0.05  # 5 standard errors of 0.0097
    ranked = first_step("maskgit_plus")  # the likeliest: the same positions in every row
    assert set(ranked.double().mean(0).tolist()) == {0.0, 1.0}


def test_origin_reveals_each_position_with_probability_one_minus_s_over_t():
    t = torch.linspace(1, DREAM_EPS, 5, dtype=torch.float64)
    p = float(1 - t[1] / t[0])
    counts = first_step("origin", k_schedule="dream").sum(1).double()
    assert abs(counts.mean() - L * p) < 0.3  # Binomial(32, p): mean 7.99, se 0.055
    assert abs(counts.var() / (L * p * (1 - p)) - 1) < 0.15
    assert len(set(counts.tolist())) > 5  # a count drawn per row, not a plan's k


def test_origin_fills_every_position_by_the_last_step():
    how = engine.SamplingSettings("confidence", 3, options={"order": "origin"})
    tokens = engine.sample(fixed, how, engine.Canvas(16, L, MASK),
                           generator=torch.Generator().manual_seed(2))
    assert not (tokens == MASK).any()


@pytest.mark.parametrize("options", [{"block_length": 4}, {"block_length": 4, "cache": "dual"}])
def test_origin_refuses_blocks_and_caches_with_the_settings(options):
    how = engine.SamplingSettings("confidence", 4, options={"order": "origin", **options})
    with pytest.raises(SettingsError, match="order origin is Dream's one-window loop"):
        how.validate()
