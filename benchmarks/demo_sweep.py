"""The demo recipe chosen by measurement (issue 32; BENCHMARKS.md, "The demo recipe").

    python benchmarks/demo_sweep.py --budget 150 --out demo-sweep.json

Every row is one setting of the `demo` preset (`--set` overrides) trained for the same
wall-clock budget on this machine: a short probe run measures the setting's tokens/s, and the
row trains for as many steps as the budget holds at that speed. Each row then reports its
final validation bound (256 rows, EMA weights), 8 first-hitting samples (seed 0), the share
of their words found in the corpus vocabulary (`demo_words.py`), and their gen PPL under the
AR twin (`demo-ar` trained for the same budget, itself a row), next to real text's gen PPL
under the same judge. The judge scores any text in nats per character, so character and BPE
rows compare. Rows run one after the other, each holding /tmp/cpu.lock (other CPU work on the
machine waits) with the load average recorded before it.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from demo_words import corpus_vocabulary, sample_texts, word_share  # noqa: E402

MDLM = [sys.executable, "-m", "mdlm_cli.cli"]
BATCH = lambda b: [f"train.global_batch_size={b}", f"train.micro_batch_size={b}"]  # noqa: E731
ROWS = {
    "ar": ("demo-ar", []),
    "base": ("demo", []),
    "batch 32": ("demo", BATCH(32)),
    "lr 2e-3": ("demo", ["optim.lr=2e-3"]),
    "4x192": ("demo", ["model.hidden_size=192", "model.n_heads=3"]),
    "4x128": ("demo", ["model.hidden_size=128", "model.n_heads=2", "model.cond_dim=64"]),
    "6x128": ("demo", ["model.hidden_size=128", "model.n_heads=2", "model.cond_dim=64",
                       "model.n_blocks=6"]),
    "4x192 batch 8": ("demo", ["model.hidden_size=192", "model.n_heads=3", *BATCH(8)]),
    "4x192 L 128 batch 32": ("demo", ["model.hidden_size=192", "model.n_heads=3",
                                      "data.length=128", *BATCH(32)]),
    "L 128, batch 32": ("demo", ["data.length=128", *BATCH(32)]),
    "BPE (demo-bpe)": ("demo-bpe", []),
}


@contextmanager
def cpu_lock():
    with open("/tmp/cpu.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def run(cmd: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return proc


def sets(overrides: list[str]) -> list[str]:
    return [arg for o in overrides for arg in ("--set", o)]


def train(preset: str, overrides: list[str], out: Path, steps: int, final_eval: bool) -> list[dict]:
    every = steps if final_eval else 10 * steps
    run([*MDLM, "train", "--preset", preset, "--out", str(out), "--max-steps", str(steps),
         "--threads", "2", "--no-print-config", "--set", "train.log_every=10",
         *sets(overrides), "--set", f"train.eval_every={every}",
         "--set", f"train.save_every={every}"])
    return [json.loads(line) for line in open(out / "metrics.jsonl")]


def tokens_per_step(preset: str, overrides: list[str]) -> int:
    from mdlm_cli.build import resolve_config

    cfg = resolve_config(preset, overrides)
    return cfg.train.global_batch_size * cfg.data.length


def probe_speed(preset: str, overrides: list[str]) -> float:
    """Tokens/s of 20 steps, the first window (warm-up) left out."""
    with tempfile.TemporaryDirectory() as tmp:
        records = train(preset, overrides, Path(tmp), 20, final_eval=False)
    speeds = [r["tokens_per_s"] for r in records if "tokens_per_s" in r][1:]
    return sum(speeds) / len(speeds)


def gen_ppl(samples: Path, judge: Path) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        run([*MDLM, "gen-ppl", "--samples", str(samples), "--judge", str(judge), "--threads", "2",
             "--json", out.name])
        return json.loads(Path(out.name).read_text())


def real_text(run_dir: Path, out: Path, count: int = 16) -> Path:
    """`count` test rows of the character data, as a samples file (text per line)."""
    from mdlm_cli.sample.frontier import mauve_reference_texts

    texts = mauve_reference_texts("test", checkpoint=str(run_dir), count=count, length=256)
    out.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return out


def measure_row(name: str, preset: str, overrides: list[str], budget: float, root: Path,
                judge: Path | None, vocab: set[str]) -> dict:
    load = os.getloadavg()[0]
    speed = probe_speed(preset, overrides)
    steps = max(20, round(budget * speed / tokens_per_step(preset, overrides)))
    out = root / name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "")
    t0 = time.perf_counter()
    records = train(preset, overrides, out, steps, final_eval=True)
    wall = time.perf_counter() - t0
    windows = [r for r in records if "tokens_per_s" in r][1:]
    final = [r for r in records if r.get("final")][-1]
    row = {"row": name, "preset": preset, "overrides": overrides, "load_before": load,
           "probe_tokens_per_s": speed, "steps": steps,
           "tokens_per_s": sum(r["tokens_per_s"] for r in windows) / len(windows),
           "mfu": windows[-1].get("mfu"), "tokens": final.get("tokens") or records[-2]["tokens"],
           "train_wall_s": wall, "valid_nats": final["valid_nats"], "run": str(out)}
    if preset != "demo-ar":
        samples = out / "samples.jsonl"
        run([*MDLM, "sample", "-c", str(out), "-n", "8", "--sampler", "first-hitting",
             "--seed", "0", "--threads", "2", "--out", str(samples)])
        texts = sample_texts(str(samples))
        row["word_share"], row["words"], _ = word_share(texts, vocab)
        row["first_sample"] = texts[0][:160]
        if judge is not None:
            row["gen_ppl"] = gen_ppl(samples, judge)["gen_ppl"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=150.0, help="training seconds per row")
    ap.add_argument("--rows", default="all", help="row names separated by ; (default: all)")
    ap.add_argument("--root", default="runs/sweep")
    ap.add_argument("--out", default="demo-sweep.json")
    args = ap.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    vocab = corpus_vocabulary()
    names = list(ROWS) if args.rows == "all" else args.rows.split(";")
    rows = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else []
    done = {r["row"] for r in rows}
    judge = root / "ar"
    for name in names:
        if name in done:
            continue
        preset, overrides = ROWS[name]
        with cpu_lock():
            row = measure_row(name, preset, overrides, args.budget, root,
                              judge if (judge / "config.yaml").exists() else None, vocab)
            if name == "ar":
                real = real_text(judge, root / "real.jsonl")
                row["gen_ppl_real_text"] = gen_ppl(real, judge)["gen_ppl"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
