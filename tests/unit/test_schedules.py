import pytest
import torch

from mdlm_cli.engine import EngineError
from mdlm_cli.engine.schedules import SCHEDULES, LogLinear, get_schedule

NAMES = list(SCHEDULES)


@pytest.mark.parametrize("name", NAMES)
def test_alpha_decreases_between_endpoints(name):
    s = get_schedule(name)
    t = torch.linspace(0, 1, 1001, dtype=torch.float64)
    a = s.alpha(t)
    assert torch.all(a[1:] < a[:-1])
    assert a[0] == pytest.approx(1.0, abs=2e-3)
    assert a[-1] == pytest.approx(0.0, abs=2e-3)
    assert torch.allclose(s.mask_rate(t), 1 - a, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_derivative_matches_finite_differences(name):
    s = get_schedule(name)
    t = torch.linspace(0.01, 0.99, 99, dtype=torch.float64)
    h = 1e-6
    numeric = (s.alpha(t + h) - s.alpha(t - h)) / (2 * h)
    assert torch.allclose(s.dalpha(t), numeric, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", NAMES)
def test_inverse_round_trip(name):
    s = get_schedule(name)
    t = torch.linspace(0.0, 1.0, 201, dtype=torch.float64)
    assert torch.allclose(s.inverse(s.alpha(t)), t, atol=1e-6)


def test_loglinear_weight_is_one_over_t():
    s = LogLinear(eps=1e-3)
    t = torch.linspace(1e-3, 1, 50, dtype=torch.float64)
    assert torch.allclose(s.loss_weight(t), 1 / t, rtol=1e-12)
    # the discrete-time weight reduces to 1/t on the grid too (REFERENCE §2)
    T = 100
    grid = torch.arange(1, T + 1, dtype=torch.float64) / T
    assert torch.allclose(s.discrete_loss_weight(grid, T), 1 / grid, rtol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_unmask_probability_composes(name):
    """Staying masked from t to s then s to r equals staying masked from t to r."""
    s = get_schedule(name)
    t, mid, r = (torch.tensor([x], dtype=torch.float64) for x in (0.9, 0.5, 0.1))
    stay = lambda a, b: 1 - s.unmask_prob(a, b)  # noqa: E731
    assert torch.allclose(stay(t, mid) * stay(mid, r), stay(t, r))


def test_unknown_schedule_is_a_user_error():
    with pytest.raises(EngineError, match="unknown schedule"):
        get_schedule("nope")
