"""Speed-ups at equal quality from `mdlm bench-sampler --judge --reference-text --json` output.

    python benchmarks/speedups.py benchmarks/frontier-demo.json             # the speed-ups
    python benchmarks/speedups.py benchmarks/frontier-demo.json --markdown  # the table, as in BENCHMARKS.md
    python benchmarks/speedups.py benchmarks/frontier-demo.json --plot out.png [nfe]  # the frontier plot again
    python benchmarks/speedups.py benchmarks/frontier-demo.json --no-mauve  # quality without MAUVE

For each sampler other than the anchor (first-hitting, one token per call, fp64) it finds
the fastest setting (fewest NFE) whose gen PPL and entropy stay within
  (a) the real-text band (the range over the reference's disjoint sets of real rows), and
  (b) the anchor's own noise: within 2 combined standard errors of its nats/token and entropy,
and prints its speed-up over the anchor in NFE (load-independent) and in wall time. Where the
run measured MAUVE (`--reference-text`), equal quality also asks MAUVE to lie in the band in (a)
and within 2 combined seed standard deviations of the anchor's in (b); `--no-mauve` drops it.
"""

from __future__ import annotations

import json
import math
import sys

USE_MAUVE = "--no-mauve" not in sys.argv


def has_mauve(q: dict) -> bool:
    return USE_MAUVE and q.get("mauve") is not None


def same_as(row: dict, anchor: dict) -> bool:
    q, a = row["quality"], anchor["quality"]
    d_nll = abs(q["nats_per_token"] - a["nats_per_token"])
    d_ent = abs(q["entropy"] - a["entropy"])
    same_mauve = not (has_mauve(q) and has_mauve(a)) or abs(q["mauve"] - a["mauve"]) <= (
        2 * math.hypot(q["mauve_sd"] or 0.0, a["mauve_sd"] or 0.0))
    return (d_nll <= 2 * math.hypot(q["nats_per_token_se"], a["nats_per_token_se"])
            and d_ent <= 2 * math.hypot(q["entropy_se"], a["entropy_se"]) and same_mauve)


def in_band(row: dict, band: dict) -> bool:
    q = row["quality"]
    names = ("gen_ppl", "entropy") + (("mauve",) if has_mauve(q) and "mauve" in band else ())
    return all(band[k][0] <= q[k] <= band[k][1] for k in names)


def setting(row: dict) -> str:
    parts = [] if row["steps"] is None else [f"steps={row['steps']}"]
    return " ".join(parts + [f"{k}={v}" for k, v in sorted(row["options"].items())]) or "-"


def main(path: str) -> None:
    report = json.loads(open(path).read())
    rows = [r for r in report["results"] if r["precision"] == "fp64"]
    anchor = next(r for r in rows if r["sampler"] == "first-hitting" and r["options"].get("tokens_per_step", 1) == 1)
    band = report["reference"]["band"]
    print(f"anchor: first-hitting k=1, NFE {anchor['nfe']:.0f}, {anchor['seconds_per_sample']:.3f} s/sample, "
          f"gen PPL {anchor['quality']['gen_ppl']:.2f}, entropy {anchor['quality']['entropy']:.3f}; "
          f"real-text band gen PPL {band['gen_ppl'][0]:.2f}-{band['gen_ppl'][1]:.2f}, "
          f"entropy {band['entropy'][0]:.3f}-{band['entropy'][1]:.3f}")
    for criterion, ok in (("real-text band", lambda r: in_band(r, band)),
                          ("anchor's 2 SE", lambda r: same_as(r, anchor))):
        print(f"\n{criterion}:")
        for sampler in dict.fromkeys(r["sampler"] for r in rows):
            candidates = [r for r in rows if r["sampler"] == sampler and r is not anchor and ok(r)]
            if not candidates:
                print(f"  {sampler:16s} none")
                continue
            best = min(candidates, key=lambda r: r["nfe"])
            wall, wall_anchor = best["seconds_per_sample"], anchor["seconds_per_sample"]
            mauve = f"  MAUVE {best['quality']['mauve']:.3f}" if has_mauve(best["quality"]) else ""
            print(f"  {sampler:16s} {setting(best):24s} NFE {best['nfe']:7.1f} ({anchor['nfe'] / best['nfe']:5.2f}x)"
                  f"  wall {wall:.3f} s ({wall_anchor / wall:5.2f}x)"
                  f"  gen PPL {best['quality']['gen_ppl']:.2f}"
                  f"  entropy {best['quality']['entropy']:.3f}{mauve}")


EXTRA = (("dist_2", "Dist-2"), ("self_bleu", "self-BLEU"), ("repetition_4", "rep-4"),
         ("mauve", "MAUVE"))


def extra_cells(q: dict, band: dict | None = None) -> str:
    """Diversity and MAUVE cells (with the band's range on the real-text row)."""
    cells = []
    for name, _ in EXTRA:
        value = q.get(name)
        text = "-" if value is None else f"{value:.3f}"
        if value is not None and band and name in band:
            text += f" ({band[name][0]:.3f}-{band[name][1]:.3f})"
        elif name == "mauve" and value is not None and q.get("mauve_sd") is not None:
            text += f" ± {q['mauve_sd']:.3f}"
        cells.append(text)
    return " | ".join(cells) + " |"


def markdown(path: str) -> None:
    report = json.loads(open(path).read())
    extra = any(r["quality"].get("dist_2") is not None for r in report["results"])
    print("| precision | sampler | setting | NFE | NCS | s/sample | gen PPL | nats/char | entropy |"
          + ("".join(f" {title} |" for _, title in EXTRA) if extra else ""))
    print("|---|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" * len(EXTRA) if extra else ""))
    for r in report["results"]:
        q = r["quality"]
        print(f"| {r['precision']} | {r['sampler']} | {setting(r)} | {r['nfe']:.1f} | {r['ncs']:,.0f} | "
              f"{r['seconds_per_sample']:.2f} | {q['gen_ppl']:.2f} | {q['nats_per_char']:.3f} | "
              f"{q['entropy']:.3f} ± {q['entropy_se']:.3f} |"
              + (" " + extra_cells(q) if extra else ""))
    ref = report.get("reference")
    if ref:
        q, band = ref["quality"], ref["band"]
        print(f"| | real text ({ref['split']}) | {ref['groups']} sets of {ref['per_group']} | | | | "
              f"{q['gen_ppl']:.2f} ({band['gen_ppl'][0]:.2f}-{band['gen_ppl'][1]:.2f}) | {q['nats_per_char']:.3f} | "
              f"{q['entropy']:.3f} ({band['entropy'][0]:.3f}-{band['entropy'][1]:.3f}) |"
              + (" " + extra_cells(q, band) if extra else ""))


def replot(path: str, out: str, x: str = "seconds") -> None:
    """The frontier plot of a saved JSON (what `--plot` draws), e.g. after the plot changed."""
    from mdlm_cli.sample.bench import BenchReport, BenchRow
    from mdlm_cli.sample.frontier import Quality, Reference, plot_frontier

    report = json.loads(open(path).read())
    rows = [BenchRow(**{**r, "quality": Quality(**r["quality"])}) for r in report["results"]]
    ref = report.get("reference")
    if ref is not None:
        ref = Reference(**{**ref, "quality": Quality(**ref["quality"]),
                           "band": {k: tuple(v) for k, v in ref["band"].items()}})
    plot_frontier(BenchReport(report["meta"], rows, ref), out, x=x)


if __name__ == "__main__":
    if "--plot" in sys.argv[2:]:
        replot(sys.argv[1], *sys.argv[sys.argv.index("--plot") + 1:])
    else:
        (markdown if "--markdown" in sys.argv[2:] else main)(sys.argv[1])
