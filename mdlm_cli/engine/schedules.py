"""Noise schedules: the single source of alpha(t), its derivative and its inverse.

alpha(t) is the probability that a token is still clean at time t (eq. 4): it
decreases from about 1 at t = 0 to about 0 at t = 1. Every other quantity (the
mask rate, the NELBO weight, the sampler transition probabilities, the DiT's
noise level sigma) is derived here, so training and sampling cannot disagree.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor

from .errors import EngineError


class Schedule(ABC):
    """A masking schedule. Subclasses define alpha, dalpha and inverse."""

    name: str = ""

    def __init__(self, eps: float = 1e-3):
        self.eps = eps
        # Training and evaluation draw t in [t_min, 1], as the reference code.
        self.t_min = eps

    @abstractmethod
    def alpha(self, t: Tensor) -> Tensor:
        """Probability that a token is unmasked at time t."""

    @abstractmethod
    def dalpha(self, t: Tensor) -> Tensor:
        """d alpha / dt (negative)."""

    @abstractmethod
    def inverse(self, alpha: Tensor) -> Tensor:
        """The time t at which alpha(t) equals `alpha` (first-hitting sampler)."""

    def mask_rate(self, t: Tensor) -> Tensor:
        """1 - alpha(t), the masking probability; overridden where 1 - alpha cancels badly."""
        return 1.0 - self.alpha(t)

    def loss_weight(self, t: Tensor) -> Tensor:
        """Continuous-time NELBO weight -alpha'(t) / (1 - alpha(t)) (eq. 10)."""
        return -self.dalpha(t) / self.mask_rate(t)

    def discrete_loss_weight(self, t: Tensor, T: int) -> Tensor:
        """Weight of the T-step discrete-time bound at t in {1/T, ..., 1}.

        With SUBS the D3PM term at step t -> s = t - 1/T is
        (alpha_s - alpha_t) / (1 - alpha_t) * (-log p), and averaging over the T
        steps gives the factor T.
        """
        s = (t - 1.0 / T).clamp_min(0.0)
        return T * self.unmask_prob(t, s)

    def unmask_prob(self, t: Tensor, s: Tensor) -> Tensor:
        """P(a token masked at t is clean at s < t) = (alpha_s - alpha_t) / (1 - alpha_t)."""
        return (self.alpha(s) - self.alpha(t)) / self.mask_rate(t)

    def sigma(self, t: Tensor) -> Tensor:
        """Noise level -log alpha(t), the DiT's time input (as the reference code)."""
        return -torch.log(self.alpha(t))

    def dsigma(self, t: Tensor) -> Tensor:
        """d sigma / dt = -alpha'(t) / alpha(t): the rate of SEDD's score entropy and Euler
        step."""
        return -self.dalpha(t) / self.alpha(t)

    def log_odds(self, t: Tensor) -> Tensor:
        """log k(t) = log(alpha / (1 - alpha)) = -log expm1(sigma): the concrete score of a
        masked position's clean token is k(t) p(token | unmasked rest) (Lou et al. 2024,
        absorbing graph)."""
        return torch.log(self.alpha(t)) - torch.log(self.mask_rate(t))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(eps={self.eps})"


class LogLinear(Schedule):
    """Mask rate (1 - eps) t: alpha(t) = 1 - (1 - eps) t; the loss weight is 1/t."""

    name = "loglinear"

    def alpha(self, t):
        return 1.0 - (1.0 - self.eps) * t

    def dalpha(self, t):
        return torch.full_like(t, -(1.0 - self.eps))

    def mask_rate(self, t):
        return (1.0 - self.eps) * t

    def inverse(self, alpha):
        return (1.0 - alpha) / (1.0 - self.eps)


class Cosine(Schedule):
    """alpha(t) = eps + (1 - eps) cos(pi t / 2)."""

    name = "cosine"

    def alpha(self, t):
        return self.eps + (1.0 - self.eps) * torch.cos(math.pi / 2 * t)

    def dalpha(self, t):
        return -(1.0 - self.eps) * math.pi / 2 * torch.sin(math.pi / 2 * t)

    def mask_rate(self, t):  # 1 - cos x = 2 sin^2(x / 2), exact near t = 0
        return (1.0 - self.eps) * 2 * torch.sin(math.pi / 4 * t) ** 2

    def inverse(self, alpha):
        c = ((alpha - self.eps) / (1.0 - self.eps)).clamp(0.0, 1.0)
        return torch.arccos(c) * 2 / math.pi


class CosineSquared(Schedule):
    """alpha(t) = eps + (1 - eps) cos^2(pi t / 2)."""

    name = "cosine-squared"

    def alpha(self, t):
        return self.eps + (1.0 - self.eps) * torch.cos(math.pi / 2 * t) ** 2

    def dalpha(self, t):
        return -(1.0 - self.eps) * math.pi / 2 * torch.sin(math.pi * t)

    def mask_rate(self, t):  # 1 - cos^2 = sin^2
        return (1.0 - self.eps) * torch.sin(math.pi / 2 * t) ** 2

    def inverse(self, alpha):
        c = ((alpha - self.eps) / (1.0 - self.eps)).clamp(0.0, 1.0)
        return torch.arccos(torch.sqrt(c)) * 2 / math.pi


class Linear(Schedule):
    """Linear in sigma: sigma(t) = sigma_min + t (sigma_max - sigma_min), alpha = exp(-sigma)."""

    name = "linear"

    def __init__(self, eps: float = 1e-3, sigma_min: float = 1e-3, sigma_max: float = 7.0):
        super().__init__(eps)
        self.sigma_min, self.sigma_max = sigma_min, sigma_max

    def sigma(self, t):
        return self.sigma_min + t * (self.sigma_max - self.sigma_min)

    def alpha(self, t):
        return torch.exp(-self.sigma(t))

    def dalpha(self, t):
        return -(self.sigma_max - self.sigma_min) * self.alpha(t)

    def mask_rate(self, t):
        return -torch.expm1(-self.sigma(t))

    def inverse(self, alpha):
        t = (-torch.log(alpha) - self.sigma_min) / (self.sigma_max - self.sigma_min)
        return t.clamp(0.0, 1.0)


class Geometric(Schedule):
    """SEDD's geometric noise: sigma(t) = sigma_min^(1 - t) sigma_max^t, alpha = exp(-sigma)
    (Lou et al. 2024; their defaults 1e-4 and 20)."""

    name = "geometric"

    def __init__(self, eps: float = 1e-3, sigma_min: float = 1e-4, sigma_max: float = 20.0):
        super().__init__(eps)
        self.sigma_min, self.sigma_max = sigma_min, sigma_max
        self._log_ratio = math.log(sigma_max / sigma_min)

    def sigma(self, t):
        return self.sigma_min ** (1 - t) * self.sigma_max ** t

    def dsigma(self, t):
        return self.sigma(t) * self._log_ratio

    def alpha(self, t):
        return torch.exp(-self.sigma(t))

    def dalpha(self, t):
        return -self.dsigma(t) * self.alpha(t)

    def mask_rate(self, t):
        return -torch.expm1(-self.sigma(t))

    def inverse(self, alpha):
        sigma = -torch.log(alpha)
        return (torch.log(sigma / self.sigma_min) / self._log_ratio).clamp(0.0, 1.0)


SCHEDULES: dict[str, type[Schedule]] = {
    cls.name: cls for cls in (LogLinear, Cosine, CosineSquared, Linear, Geometric)
}


def get_schedule(schedule: str | Schedule, eps: float = 1e-3) -> Schedule:
    """A schedule object from a registry name (or pass one through)."""
    if isinstance(schedule, Schedule):
        return schedule
    try:
        return SCHEDULES[schedule](eps=eps)
    except KeyError:
        raise EngineError(
            f"unknown schedule {schedule!r}; choose one of: {', '.join(SCHEDULES)}"
        ) from None
