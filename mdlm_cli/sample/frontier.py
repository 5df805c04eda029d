"""Speed at equal quality: `mdlm bench-sampler --judge`'s quality columns, the real-text
reference and the frontier plot.

A sampler can be fast because it lowers the effective temperature (Zheng et al. 2024:
float32 draws truncate rare tokens; confidence-ordered decoding keeps likely draws), and
then its generative perplexity drops together with its entropy. So each benchmark row's
samples are scored as `mdlm gen-ppl` scores them (`genppl.score_samples`, the same
defaults: every token, chunks of the judge's context, 8 chunks per pass), and put next
to real text of the same length scored the same way.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import MdlmError
from ..eval.genppl import GenPplResult, Judge, score_samples


@dataclass
class Quality:
    """The judge's figures of one set of samples, with standard errors over the samples."""

    num_samples: int
    gen_ppl: float
    nats_per_token: float
    nats_per_token_se: float | None  # ratio estimator: sd of (nll_i - r tokens_i) * sqrt(n) / total tokens
    nats_per_char: float
    entropy: float  # mean per-sample unigram entropy (nats)
    entropy_se: float | None

    @classmethod
    def of(cls, result: GenPplResult) -> Quality:
        nll = np.array([s.nll for s in result.samples], dtype=np.float64)
        tokens = np.array([s.scored for s in result.samples], dtype=np.float64)
        entropy = np.array([s.entropy for s in result.samples], dtype=np.float64)
        n = len(nll)
        r = result.nats_per_token
        se = math.sqrt(((nll - r * tokens) ** 2).sum() / (n - 1) * n) / max(tokens.sum(), 1) if n > 1 else None
        return cls(n, result.gen_ppl, r, se, result.nats_per_char, result.entropy,
                   float(entropy.std(ddof=1) / math.sqrt(n)) if n > 1 else None)


def score_tokens(judge: Judge, tokenizer, tokens: torch.Tensor) -> GenPplResult:
    """Score sampled token rows (B, L) as `mdlm gen-ppl --samples` scores `mdlm sample --out`:
    the decoded text under the judge, the unigram entropy over the sample's own ids."""
    rows = tokens.cpu().tolist()
    return score_samples(judge, [tokenizer.decode(row) for row in rows], sample_tokens=rows)


@dataclass
class Reference:
    """Real text of the benchmark's length from a prepared split, scored like the samples:
    pooled over `groups` disjoint sets of `per_group` rows, and the band (min, max) of each
    figure over those sets, where a set of real rows of the samples' size lands."""

    split: str
    length: int
    per_group: int
    groups: int
    quality: Quality
    band: dict[str, tuple[float, float]]

    def contains(self, quality: Quality) -> bool:
        """Whether gen PPL and entropy both lie in the band."""
        return all(lo <= getattr(quality, name) <= hi for name, (lo, hi) in self.band.items()
                   if name in ("gen_ppl", "entropy"))


def reference_rows(split, *, length: int, count: int) -> torch.Tensor:
    """`count` rows of the split evenly spread over it, among those with at least `length`
    real tokens, cut to `length` (LongTensor (count, length))."""
    if length > split.tokens.shape[1]:
        raise MdlmError(f"--reference-text: the data's rows hold {split.tokens.shape[1]} tokens; "
                        f"the benchmark's length is {length}")
    full = np.nonzero(split.lengths >= length)[0]
    if len(full) < count:
        raise MdlmError(f"--reference-text: the split has {len(full)} rows of {length} tokens; lower -n")
    pick = full[np.linspace(0, len(full) - 1, count).round().astype(np.int64)]
    return torch.from_numpy(np.asarray(split.tokens[pick, :length]).astype(np.int64))


def reference_quality(judge: Judge, tokenizer, split, *, split_name: str, length: int, per_group: int,
                      max_groups: int = 8) -> Reference:
    """Score up to `max_groups` sets of `per_group` real rows (as many as the split holds)."""
    available = int((split.lengths >= length).sum())
    groups = max(min(max_groups, available // per_group), 1)
    result = score_tokens(judge, tokenizer, reference_rows(split, length=length, count=groups * per_group))
    band = {}
    for name in ("gen_ppl", "entropy", "nats_per_char"):
        values = [getattr(Quality.of(_subset(result, g * per_group, (g + 1) * per_group)), name)
                  for g in range(groups)]
        band[name] = (min(values), max(values))
    return Reference(split_name, length, per_group, groups, Quality.of(result), band)


def _subset(result: GenPplResult, start: int, end: int) -> GenPplResult:
    return dataclasses.replace(result, samples=result.samples[start:end])


def reference_split(data_cfg, tokenizer, split: str):
    """The prepared split (prepared now if missing) of the model's own data, and its name."""
    from ..data.store import prepare
    from ..eval.ppl import pick_split

    prepared = prepare(data_cfg)
    tok = prepared.meta["tokenizer"]
    if (tok["vocab_size"], tok["mask_id"]) != (tokenizer.vocab_size, tokenizer.mask_id):
        raise MdlmError(f"{prepared.folder.name} uses tokenizer {tok['name']}; the model's has vocab "
                        f"{tokenizer.vocab_size}")
    name, _ = pick_split(prepared, split)
    return prepared.split(name), name


X_AXES = {"seconds": ("seconds_per_sample", "seconds per sample"),
          "nfe": ("nfe", "network evaluations per sample (NFE)")}


def plot_frontier(report, path: str, x: str = "seconds") -> None:
    """Gen PPL (left) and entropy (right) against seconds per sample or NFE: one line per
    sampler (and precision, batch size, options other than steps), points labelled by their
    steps or options, with one standard error over the samples; real text as a horizontal
    line with its band shaded."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .. import engine

    field, xlabel = X_AXES[x]
    rows = [r for r in report.results if r.quality is not None]
    fig, (ax_ppl, ax_ent) = plt.subplots(1, 2, figsize=(12, 4.6))

    def line_key(r):  # a line runs over the steps of a stepped sampler, over the options of the others
        stepped = engine.get_sampler(r.sampler).uses_steps
        return r.sampler, r.precision, r.batch_size, tuple(sorted(r.options.items())) if stepped else ()

    for key in sorted({line_key(r) for r in rows}, key=str):
        sampler, precision, batch, opts = key
        points = sorted((r for r in rows if line_key(r) == key), key=lambda r: getattr(r, field))
        label = f"{sampler}{''.join(f' {k}={v}' for k, v in opts)} ({precision}, batch {batch})"
        xs = [getattr(r, field) for r in points]
        for ax, name in ((ax_ppl, "gen_ppl"), (ax_ent, "entropy")):
            ys = [getattr(r.quality, name) for r in points]
            (handle,) = ax.plot(xs, ys, "o-" if len(xs) > 1 else "o", label=label, markersize=4)
            ax.errorbar(xs, ys, yerr=_error_bars(points, name), fmt="none", ecolor=handle.get_color(),
                        elinewidth=0.8, capsize=2)
            for r, xv, yv in zip(points, xs, ys, strict=True):
                text = str(r.steps) if r.steps is not None else " ".join(f"{v}" for _, v in sorted(r.options.items()))
                ax.annotate(text, (xv, yv), fontsize=6, xytext=(3, 3), textcoords="offset points",
                            color=handle.get_color())
    ref = report.reference
    for ax, name, ylabel in ((ax_ppl, "gen_ppl", "generative perplexity"), (ax_ent, "entropy", "entropy (nats)")):
        if ref is not None:
            ax.axhline(getattr(ref.quality, name), color="black", linestyle="--", linewidth=1,
                       label=f"real text ({ref.split})")
            ax.axhspan(*ref.band[name], color="grey", alpha=0.2, label=f"real-text band ({ref.groups} sets)")
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
    ax_ppl.set_yscale("log")
    ax_ppl.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax_ppl.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    judge = report.meta.get("judge", "")
    fig.suptitle(f"{report.meta.get('model')}, L={report.meta.get('length')}, judge {judge}", fontsize=9)
    ax_ppl.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _error_bars(rows, name: str) -> list[list[float]]:
    """One standard error below and above: of the entropy, or of nats/token mapped to gen PPL."""
    lo, hi = [], []
    for r in rows:
        q = r.quality
        if name == "entropy":
            se = q.entropy_se or 0.0
            lo.append(se)
            hi.append(se)
        else:
            se = q.nats_per_token_se or 0.0
            lo.append(q.gen_ppl * (1 - math.exp(-se)))
            hi.append(q.gen_ppl * (math.exp(se) - 1))
    return [lo, hi]


class RowScorer:
    """`run_bench`'s `on_tokens`: scores each row's samples with one judge (loaded once for
    the table) and, with `save_dir`, writes them as `mdlm sample --out` JSONL, so that
    `mdlm gen-ppl --samples FILE --judge J` gives the row's numbers."""

    def __init__(self, judge: Judge, tokenizer, *, save_dir: str | None = None, source: str = "", seed: int = 0):
        self.judge, self.tokenizer, self.save_dir, self.source, self.seed = judge, tokenizer, save_dir, source, seed

    def __call__(self, row, tokens: torch.Tensor) -> None:
        row.quality = Quality.of(score_tokens(self.judge, self.tokenizer, tokens))
        if self.save_dir is not None:
            self._save(row, tokens)

    def _save(self, row, tokens: torch.Tensor) -> None:
        from pathlib import Path

        from .generate import SampleRecord, write_jsonl

        setting = row.setting.replace(" ", "-").replace("=", "") or "default"
        path = Path(self.save_dir) / f"{row.precision}-{row.sampler}-{setting}-b{row.batch_size}.jsonl"
        extra = {"sampler": row.sampler, "steps": row.steps, "nfe": row.nfe, "ncs": row.ncs, "seed": self.seed,
                 "precision": row.precision, "checkpoint": self.source, "seconds": row.seconds_per_sample,
                 **row.options}
        write_jsonl(path, [SampleRecord(i, self.tokenizer.decode(ids), ids).to_json(**extra)
                           for i, ids in enumerate(tokens.cpu().tolist())])
