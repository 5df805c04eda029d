"""MAUVE (Pillutla et al. 2021): the gap between model text and human text, from the
divergence frontier of their quantised feature distributions.

Implemented from the paper (the `mauve-text` package is GPL-3.0; nothing of it is used):

1. every text is a feature vector (a language model's last hidden state: `features.py`);
   the vectors are L2-normalised, and a joint PCA of both sets keeps the leading
   components that hold `explained_variance` (90%) of the union's variance;
2. k-means over the union of both sets (k-means++ seeding, Lloyd iterations) quantises
   them into k clusters, k = n / 10 for n texts per set; p and q are the histograms of the
   samples and of the reference over the clusters;
3. the divergence curve (eq. 3) is C(P, Q) = {(exp(-c KL(Q || R_l)), exp(-c KL(P || R_l)))}
   over the mixtures R_l = l P + (1 - l) Q, l in (0, 1), closed by (0, 1) and (1, 0);
4. MAUVE(P, Q) is the area under C (1 for P = Q, towards 0 as they separate), with the
   scaling constant c = 5 (the paper's default; it changes the scale, not the ranking).

The quantisation is random: MAUVE is computed for several k-means seeds and reported
as their mean and standard deviation. With few texts the histograms are coarse (k = n/10)
and MAUVE is biased upward: figures below a few thousand texts per set compare only
with each other at the same n (docs/evaluation.md gives the numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import MdlmError

MAUVE_MIN_SAMPLES = 1000  # below this the CLI warns: the estimate is far above its large-n value
SCALE = 5.0  # c of the paper
GRID = 25  # mixture weights l on the frontier


@dataclass
class MauveResult:
    mauve: float  # mean over the k-means seeds
    mauve_sd: float | None  # their standard deviation (None with one seed)
    per_seed: list[float]
    buckets: int  # k of the k-means
    pca_dims: int  # components kept by the joint PCA
    num_p: int  # samples
    num_q: int  # reference texts
    scale: float
    frontier: list[tuple[float, float]] = field(default_factory=list)  # of the first seed

    def to_dict(self) -> dict:
        return {
            "mauve": self.mauve,
            "mauve_sd": self.mauve_sd,
            "mauve_per_seed": self.per_seed,
            "mauve_buckets": self.buckets,
            "mauve_pca_dims": self.pca_dims,
            "mauve_num_samples": self.num_p,
            "mauve_num_reference": self.num_q,
            "mauve_scale": self.scale,
        }


def joint_pca(x: Tensor, explained_variance: float = 0.9) -> Tensor:
    """x (N, d) projected on the fewest principal components of x whose share of the
    variance reaches `explained_variance` (all of them with 1.0)."""
    centred = x - x.mean(0, keepdim=True)
    _, s, vh = torch.linalg.svd(centred, full_matrices=False)
    share = (s**2).cumsum(0) / max(float((s**2).sum()), 1e-300)
    dims = int((share < explained_variance - 1e-12).sum()) + 1
    return centred @ vh[: min(dims, vh.shape[0])].T


def kmeans(x: Tensor, k: int, *, seed: int, max_iter: int = 300) -> Tensor:
    """Cluster labels (N,) of x (N, d): k-means++ seeding from `seed`, then Lloyd iterations
    until no label changes (or `max_iter`). Equal points always share a cluster."""
    gen = torch.Generator().manual_seed(seed)
    n = x.shape[0]
    centres = x[torch.randint(n, (1,), generator=gen)]
    d2 = ((x - centres[0]) ** 2).sum(1)
    for _ in range(1, k):  # k-means++: the next centre with probability ~ squared distance
        pick = (
            torch.multinomial(d2 / d2.sum(), 1, generator=gen)
            if float(d2.sum()) > 0
            else torch.randint(n, (1,), generator=gen)
        )
        centres = torch.cat([centres, x[pick]])
        d2 = torch.minimum(d2, ((x - x[pick]) ** 2).sum(1))
    labels = torch.full((n,), -1, dtype=torch.long)
    x2 = (x**2).sum(1, keepdim=True)  # (N, 1)
    for _ in range(max_iter):
        dist = x2 - 2 * x @ centres.T + (centres**2).sum(1)  # squared distances (N, k)
        new = dist.argmin(1)
        if torch.equal(new, labels):
            break
        labels = new
        sizes = torch.bincount(labels, minlength=k).to(x.dtype)[:, None]
        sums = torch.zeros_like(centres).index_add_(0, labels, x)
        centres = torch.where(
            sizes > 0, sums / sizes.clamp_min(1), centres
        )  # an empty cluster stays put
    return labels


def kl(p: Tensor, r: Tensor) -> float:
    """KL(p || r) in nats (0 log 0 = 0; r > 0 wherever p > 0)."""
    keep = p > 0
    return float((p[keep] * (p[keep] / r[keep]).log()).sum())


def divergence_frontier(
    p: Tensor, q: Tensor, *, scale: float = SCALE, grid: int = GRID
) -> list[tuple[float, float]]:
    """The points (exp(-c KL(q||r)), exp(-c KL(p||r))) of r = l p + (1 - l) q for l on a
    grid in (0, 1), with the end points (0, 1) and (1, 0), in order along the curve: by the
    first coordinate, and on ties by the second, falling (the curve falls from (0, 1) to (1,
    0))."""
    points = [(0.0, 1.0), (1.0, 0.0)]
    for lam in torch.linspace(0, 1, grid + 2, dtype=torch.float64)[1:-1].tolist():
        r = lam * p + (1 - lam) * q
        points.append((math.exp(-scale * kl(q, r)), math.exp(-scale * kl(p, r))))
    return sorted(points, key=lambda xy: (xy[0], -xy[1]))


def area_under(points: list[tuple[float, float]]) -> float:
    """Trapezoidal area under a curve given as (x, y) points sorted by x."""
    return sum(
        (x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False)
    )


def histograms(labels: Tensor, n_p: int, k: int) -> tuple[Tensor, Tensor]:
    """Normalised cluster counts of the first n_p labels (p) and of the rest (q)."""
    p = torch.bincount(labels[:n_p], minlength=k).double()
    q = torch.bincount(labels[n_p:], minlength=k).double()
    return p / p.sum(), q / q.sum()


def mauve(
    p_features: Tensor,
    q_features: Tensor,
    *,
    seeds: tuple[int, ...] | list[int] = (0, 1, 2, 3, 4),
    buckets: int | None = None,
    scale: float = SCALE,
    explained_variance: float = 0.9,
    grid: int = GRID,
) -> MauveResult:
    """MAUVE of samples (p_features (n_p, d)) against reference text (q_features (n_q, d)),
    mean and standard deviation over the k-means `seeds`; `buckets` default: n / 10 of the
    smaller set (at least 2)."""
    if (p_features.ndim != 2 or q_features.ndim != 2
            or p_features.shape[1] != q_features.shape[1]):
        raise MdlmError(
            f"MAUVE needs two (n, d) feature sets of one width (got {tuple(p_features.shape)} "
            f"and {tuple(q_features.shape)})"
        )
    n_p, n_q = len(p_features), len(q_features)
    if min(n_p, n_q) < 2:
        raise MdlmError(
            f"MAUVE needs at least 2 texts in each set (got {n_p} samples, {n_q} reference "
            "texts)"
        )
    if not seeds:
        raise MdlmError("MAUVE needs at least one k-means seed")
    k = buckets or max(2, round(min(n_p, n_q) / 10))
    if not 2 <= k <= n_p + n_q:
        raise MdlmError(f"MAUVE's buckets must lie in 2..{n_p + n_q} (got {k})")
    x = torch.cat([p_features, q_features]).double().cpu()
    x = x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    x = joint_pca(x, explained_variance)
    values, first = [], []
    for seed in seeds:
        p, q = histograms(kmeans(x, k, seed=seed), n_p, k)
        curve = divergence_frontier(p, q, scale=scale, grid=grid)
        values.append(area_under(curve))
        first = first or curve
    mean = sum(values) / len(values)
    sd = (
        math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        if len(values) > 1
        else None
    )
    return MauveResult(mean, sd, values, k, x.shape[1], n_p, n_q, scale, first)


def parse_seeds(text: str) -> tuple[int, ...]:
    """--mauve-seeds: comma-separated k-means seeds, at least one."""
    try:
        seeds = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise MdlmError("--mauve-seeds expects comma-separated integers "
                        f"(got {text!r})") from None
    if not seeds:
        raise MdlmError("--mauve-seeds needs at least one seed")
    return seeds


def size_warning(n_p: int, n_q: int) -> str | None:
    """The CLI's warning where either set is under MAUVE_MIN_SAMPLES texts."""
    if min(n_p, n_q) >= MAUVE_MIN_SAMPLES:
        return None
    return (
        f"MAUVE of {n_p} samples against {n_q} reference texts: below {MAUVE_MIN_SAMPLES:,} "
        "per set the estimate is biased upward (coarser clusters); compare it only with MAUVE "
        "at the same size (docs/evaluation.md)"
    )
