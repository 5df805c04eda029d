"""1 against 2 CPU threads on an idle machine: training, evaluation and sampling of a demo model
(issue 27; BENCHMARKS.md, table 6's re-measure).

    python benchmarks/threads.py --checkpoint runs/demo --repeats 2 --out threads.json

Each measurement is one fresh `mdlm` process with `--threads T`, alternated 1, 2, 1, 2 so a
change of load hits both alike, holding /tmp/cpu.lock; the load average is recorded before
each. Training: tokens/s of the log windows after the first (`--max-steps 40`); evaluation:
the wall time of `eval-ppl` on 64 test rows; sampling: the s/sample `mdlm sample` reports for
first-hitting at the checkpoint's length.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_sweep import MDLM, cpu_lock, run  # noqa: E402


def train(preset: str, threads: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        run([*MDLM, "train", "--preset", preset, "--out", tmp, "--max-steps", "40",
             "--threads", str(threads), "--no-print-config", "--set", "train.log_every=10",
             "--set", "train.eval_every=1000", "--set", "train.save_every=1000"])
        records = [json.loads(line) for line in open(Path(tmp) / "metrics.jsonl")]
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r][1:]
    return sum(speeds) / len(speeds)


def evaluate(checkpoint: str, threads: int) -> float:
    t0 = time.perf_counter()
    run([*MDLM, "eval-ppl", "-c", checkpoint, "--rows", "64", "--threads", str(threads)])
    return time.perf_counter() - t0


def sample(checkpoint: str, threads: int) -> float:
    proc = run([*MDLM, "sample", "-c", checkpoint, "-n", "2", "--sampler", "first-hitting",
                "--seed", "0", "--threads", str(threads), "--quiet"])
    match = re.search(r"([0-9.]+) s/sample", proc.stderr + proc.stdout)
    if match is None:
        raise SystemExit(f"no s/sample in mdlm sample's output:\n{proc.stderr[-1000:]}")
    return float(match.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--checkpoint", default="runs/demo")
    ap.add_argument("--preset", default="demo")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for repeat in range(args.repeats):
        for threads in (1, 2):
            for task, fn, arg in (("train tokens/s", train, args.preset),
                                  ("eval-ppl 64 rows, wall s", evaluate, args.checkpoint),
                                  ("first-hitting s/sample", sample, args.checkpoint)):
                with cpu_lock():
                    load = os.getloadavg()[0]
                    value = fn(arg, threads)
                row = {"task": task, "threads": threads, "repeat": repeat, "value": value,
                       "load_before": load}
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
