"""Speed-ups at equal quality from `mdlm bench-sampler --judge --reference-text --json` output.

    python benchmarks/speedups.py benchmarks/frontier-demo.json             # the speed-ups
    python benchmarks/speedups.py benchmarks/frontier-demo.json --markdown  # the table, as in BENCHMARKS.md
    python benchmarks/speedups.py benchmarks/frontier-demo.json --plot out.png [nfe]  # the frontier plot again

For each sampler other than the anchor (first-hitting, one token per call, fp64) it finds
the fastest setting (fewest NFE) whose gen PPL and entropy stay within
  (a) the real-text band (the range over the reference's disjoint sets of real rows), and
  (b) the anchor's own noise: within 2 combined standard errors of its nats/token and entropy,
and prints its speed-up over the anchor in NFE (load-independent) and in wall time.
"""

from __future__ import annotations

import json
import math
import sys


def same_as(row: dict, anchor: dict) -> bool:
    q, a = row["quality"], anchor["quality"]
    d_nll = abs(q["nats_per_token"] - a["nats_per_token"])
    d_ent = abs(q["entropy"] - a["entropy"])
    return (d_nll <= 2 * math.hypot(q["nats_per_token_se"], a["nats_per_token_se"])
            and d_ent <= 2 * math.hypot(q["entropy_se"], a["entropy_se"]))


def in_band(row: dict, band: dict) -> bool:
    q = row["quality"]
    return all(band[k][0] <= q[k] <= band[k][1] for k in ("gen_ppl", "entropy"))


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
            print(f"  {sampler:16s} {setting(best):24s} NFE {best['nfe']:7.1f} ({anchor['nfe'] / best['nfe']:5.2f}x)"
                  f"  wall {wall:.3f} s ({wall_anchor / wall:5.2f}x)"
                  f"  gen PPL {best['quality']['gen_ppl']:.2f}  entropy {best['quality']['entropy']:.3f}")


def markdown(path: str) -> None:
    report = json.loads(open(path).read())
    print("| precision | sampler | setting | NFE | NCS | s/sample | gen PPL | nats/char | entropy |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for r in report["results"]:
        q = r["quality"]
        print(f"| {r['precision']} | {r['sampler']} | {setting(r)} | {r['nfe']:.1f} | {r['ncs']:,.0f} | "
              f"{r['seconds_per_sample']:.2f} | {q['gen_ppl']:.2f} | {q['nats_per_char']:.3f} | "
              f"{q['entropy']:.3f} ± {q['entropy_se']:.3f} |")
    ref = report.get("reference")
    if ref:
        q, band = ref["quality"], ref["band"]
        print(f"| | real text ({ref['split']}) | {ref['groups']} sets of {ref['per_group']} | | | | "
              f"{q['gen_ppl']:.2f} ({band['gen_ppl'][0]:.2f}-{band['gen_ppl'][1]:.2f}) | {q['nats_per_char']:.3f} | "
              f"{q['entropy']:.3f} ({band['entropy'][0]:.3f}-{band['entropy'][1]:.3f}) |")


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
