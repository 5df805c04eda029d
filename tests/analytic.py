"""An exact denoiser for a small, enumerable joint distribution over V^L.

Its conditionals p(x_l | unmasked part of z) are exact, so the continuous-time
NELBO equals -log p(x) (up to the eps truncation) and exact samplers reproduce
the joint distribution: the ground truth for statistical tests.
"""

from __future__ import annotations

import itertools
import math

import torch


class AnalyticDenoiser:
    time_agnostic = True  # exact conditionals do not depend on t

    def __init__(self, probs: torch.Tensor, length: int, vocab: int):
        self.length, self.vocab = length, vocab
        self.mask_id = vocab  # model vocabulary V + 1, mask last
        self.configs = torch.tensor(list(itertools.product(range(vocab), repeat=length)))  # (N, L)
        self.probs = probs / probs.sum()  # (N,)
        self.onehot = torch.nn.functional.one_hot(self.configs, vocab).double()  # (N, L, V)
        self.calls = 0

    @classmethod
    def random(cls, length: int = 3, vocab: int = 3, seed: int = 0, concentration: float = 0.3):
        """A strongly dependent joint: Dirichlet(concentration) weights over all V^L configs."""
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            probs = torch.distributions.Dirichlet(torch.full((vocab**length,), concentration)).sample()
        return cls(probs.double().clamp_min(1e-6), length, vocab)

    def index(self, x: torch.Tensor) -> torch.Tensor:
        """Config index of each row of x (B, L)."""
        weights = self.vocab ** torch.arange(self.length - 1, -1, -1)
        return (x * weights).sum(-1)

    def log_prob(self, x: torch.Tensor) -> torch.Tensor:
        return self.probs[self.index(x)].log()

    def conditionals(self, z: torch.Tensor) -> torch.Tensor:
        """p(x_l = v | z) for every position: (B, L, V)."""
        visible = z[:, None, :] != self.mask_id  # (B, 1, L)
        agree = (self.configs[None] == z[:, None, :]) | ~visible  # (B, N, L)
        w = agree.all(-1).double() * self.probs[None]  # (B, N)
        marg = torch.einsum("bn,nlv->blv", w, self.onehot)
        return marg / marg.sum(-1, keepdim=True).clamp_min(1e-300)

    def __call__(self, z_t: torch.Tensor, t: torch.Tensor, **_) -> torch.Tensor:
        self.calls += 1
        logits = self.conditionals(z_t).clamp_min(1e-300).log()
        mask_col = torch.zeros(*logits.shape[:2], 1, dtype=logits.dtype)
        return torch.cat([logits, mask_col], dim=-1).float()  # (B, L, V + 1)


class AnalyticScore:
    """The exact model of an AnalyticDenoiser under SEDD's parameterisation: the raw logits are
    log p + log(V - 1), so that `log_score` (SEDD's scale and scatter) gives the exact
    concrete score log k(t) + log p(x_l = y | z) at masked positions."""

    def __init__(self, den: AnalyticDenoiser, schedule):
        self.den, self.schedule = den, schedule
        self.length, self.mask_id, self.vocab = den.length, den.mask_id, den.vocab

    def __call__(self, z_t, t, output_mask=None, **_):
        logits = self.den(z_t, t) + math.log(self.den.vocab)  # V - 1 = the real tokens
        return logits if output_mask is None else logits[output_mask]

    def log_score(self, z_t, t, *, output_mask, **_):
        from mdlm_cli.engine.sedd import sedd_log_score

        log_k = self.schedule.log_odds(t.double())[:, None].expand(output_mask.shape)[output_mask]
        return sedd_log_score(self(z_t, t, output_mask=output_mask), z_t[output_mask], log_k)


class AnalyticPosterior:
    """An AnalyticDenoiser as a D3PM model (softmax over all V): the exact x_theta with no mass on
    the mask (`mask_logit` -inf), or with some (a finite mask logit)."""

    time_agnostic = True

    def __init__(self, den: AnalyticDenoiser, mask_logit: float = -math.inf):
        self.den, self.mask_logit = den, mask_logit
        self.length, self.mask_id, self.vocab = den.length, den.mask_id, den.vocab

    def __call__(self, z_t, t, output_mask=None, **_):
        logits = self.den(z_t, t).clone()
        logits[..., self.mask_id] = self.mask_logit
        return logits if output_mask is None else logits[output_mask]
