"""The frontier plot of `mdlm bench-sampler --plot`: generative perplexity, entropy and, where
measured, MAUVE of each sampler's rows against seconds per sample or NFE, the real-text
reference as a band (frontier.py scores the rows and the reference)."""

from __future__ import annotations

import math

from .frontier import Reference

X_AXES = {"seconds": ("seconds_per_sample", "seconds per sample"),
          "nfe": ("nfe", "network evaluations per sample (NFE)")}


PANELS = {"gen_ppl": "generative perplexity", "entropy": "entropy (nats)", "mauve": "MAUVE"}


def plot_frontier(report, path: str, x: str = "seconds") -> None:
    """Gen PPL (left), entropy and, where measured, MAUVE against seconds per sample or NFE:
    one line per sampler (and precision, batch size, options other than steps), points
    labelled by their steps or options, with one standard error over the samples (over the
    k-means seeds for MAUVE); real text as a horizontal line with its band shaded."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    field, xlabel = X_AXES[x]
    rows = [r for r in report.results if r.quality is not None]
    names = [n for n in PANELS if n != "mauve" or any(r.quality.mauve is not None for r in rows)]
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4.6))
    panels = dict(zip(names, axes, strict=True))
    for key, points in _lines(rows, field):
        _plot_line(panels, points, field, _line_label(key))
    _plot_reference(panels, report.reference, xlabel)
    ax_ppl = panels["gen_ppl"]
    ax_ppl.set_yscale("log")
    ax_ppl.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax_ppl.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    meta = report.meta
    title = f"{meta.get('model')}, L={meta.get('length')}, judge {meta.get('judge', '')}"
    fig.suptitle(title, fontsize=9)
    ax_ppl.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _line_label(key) -> str:
    """A line's legend entry: its sampler with the options it runs at, precision and batch."""
    sampler, precision, batch, opts = key
    options = "".join(f" {k}={v}" for k, v in opts)
    return f"{sampler}{options} ({precision}, batch {batch})"


def _point_label(row) -> str:
    """A point's annotation: its steps, else its options' values."""
    if row.steps is not None:
        return str(row.steps)
    return " ".join(f"{v}" for _, v in sorted(row.options.items()))


def _plot_line(panels: dict, points: list, field: str, label: str) -> None:
    """One line on every panel whose figure all its points have, with error bars and labels."""
    xs = [getattr(r, field) for r in points]
    for name, ax in panels.items():
        ys = [getattr(r.quality, name) for r in points]
        if any(y is None for y in ys):
            continue
        style = "o-" if len(xs) > 1 else "o"
        (handle,) = ax.plot(xs, ys, style, label=label, markersize=4)
        color = handle.get_color()
        bars = _error_bars(points, name)
        ax.errorbar(xs, ys, yerr=bars, fmt="none", ecolor=color, elinewidth=0.8, capsize=2)
        for r, xv, yv in zip(points, xs, ys, strict=True):
            ax.annotate(_point_label(r), (xv, yv), fontsize=6, xytext=(3, 3),
                        textcoords="offset points", color=color)


def _plot_reference(panels: dict, ref: Reference | None, xlabel: str) -> None:
    """Real text's figure (dashed) and band (shaded) where it has one; the axes' scale and
    labels."""
    for name, ax in panels.items():
        if ref is not None and name in ref.band:
            ax.axhline(getattr(ref.quality, name), color="black", linestyle="--", linewidth=1,
                       label=f"real text ({ref.split})")
            band_label = f"real-text band ({ref.groups} sets)"
            ax.axhspan(*ref.band[name], color="grey", alpha=0.2, label=band_label)
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(PANELS[name])


def _lines(rows, field: str):
    """(key, rows sorted by x) of each line: a line runs over the steps of a stepped sampler,
    over the options of the others."""
    from .. import engine

    def line_key(r):
        stepped = engine.get_sampler(r.sampler).uses_steps
        options = tuple(sorted(r.options.items())) if stepped else ()
        return r.sampler, r.precision, r.batch_size, options

    for key in sorted({line_key(r) for r in rows}, key=str):
        yield key, sorted((r for r in rows if line_key(r) == key),
                          key=lambda r: getattr(r, field))


def _error_bars(rows, name: str) -> list[list[float]]:
    """One standard error below and above: of the entropy, or of nats/token mapped to gen PPL."""
    lo, hi = [], []
    for r in rows:
        q = r.quality
        if name in ("entropy", "mauve"):
            se = (q.entropy_se if name == "entropy" else q.mauve_sd) or 0.0
            lo.append(se)
            hi.append(se)
        else:
            se = q.nats_per_token_se or 0.0
            lo.append(q.gen_ppl * (1 - math.exp(-se)))
            hi.append(q.gen_ppl * (math.exp(se) - 1))
    return [lo, hi]
