"""Training speed on the CPU in fp32 and bf16, eager and compiled (BENCHMARKS.md, table 13).

    python benchmarks/cpu_speed.py --presets demo,demo-bpe,test --steps 40 --repeats 2 --out cpu-speed.json

Each measurement is one `mdlm train` process (a fresh process: no compiled graph or cache
carried between settings) of `--steps` steps; its speed is the mean tokens/s of the log
windows after the first (the first holds the warm-up, and the compilation when compiled).
The settings run alternated (fp32, bf16, fp32 compiled, bf16 compiled, then again) so a
change of load hits all of them alike; the load average is recorded before each run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = (("fp32", False), ("bf16", False), ("fp32", True), ("bf16", True))


def train_once(preset: str, precision: str, compiled: bool, steps: int, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "mdlm_cli.cli", "train", "--preset", preset, "--out", tmp,
               "--max-steps", str(steps), "--threads", str(threads), "--no-print-config",
               "--set", f"train.precision={precision}", "--set", f"train.compile={str(compiled).lower()}",
               "--set", "train.log_every=10", "--set", f"train.eval_every={10 * steps}",
               "--set", f"train.save_every={10 * steps}", "--set", "train.eval_rows=16"]
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        records = [json.loads(line) for line in open(Path(tmp) / "metrics.jsonl")]
        windows = [r for r in records if "tokens_per_s" in r]
        speeds = [r["tokens_per_s"] for r in windows[1:]]
        mfu = [r["mfu"] for r in windows[1:] if r.get("mfu") is not None]
    return {"preset": preset, "precision": precision, "compiled": compiled, "threads": threads,
            "steps": steps, "tokens_per_s": sum(speeds) / len(speeds),
            "mfu": sum(mfu) / len(mfu) if mfu else None, "first_window_tokens_per_s":
            windows[0]["tokens_per_s"], "wall_s": wall, "load_before": load}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="demo,demo-bpe,test")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--settings", default="all", help="all, or e.g. fp32:eager,bf16:eager")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    settings = SETTINGS if args.settings == "all" else [
        (p, c == "compiled") for p, c in (s.split(":") for s in args.settings.split(","))]
    rows = []
    for preset in args.presets.split(","):
        for _ in range(args.repeats):
            for precision, compiled in settings:
                row = train_once(preset, precision, compiled, args.steps, args.threads)
                rows.append(row)
                print(json.dumps(row), flush=True)
                if args.out:
                    Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
