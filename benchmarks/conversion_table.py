"""Issue 54's conversion table on the CPU: what starting a masked diffusion model from the demo's
AR twin buys against training it from scratch, at fixed step counts (not time budgets, so the
figures do not depend on the machine's load). From the AR twin (preset demo-ar, --ar-steps
steps), rows fine-tuned for the same --steps steps on the demo's data with the demo's recipe:

    mdlm scratch          preset demo, from random weights
    mdlm scratch 2x       the same for twice the steps (does conversion reach it in half?)
    init_from, no shift   train.init_from of the AR run: position i predicts itself (today's path)
    convert, shift        mdlm convert of the AR run (the shift on), then train.init_from of it

each row's validation bound in nats/char from `mdlm eval-ppl` (and the AR twin's exact NLL), in
benchmarks/conversion-table.json. `make conversion-table` runs it (outside CI); a smoke run:

    python benchmarks/conversion_table.py --ar-steps 3 --steps 3 --rows 16 --eager \
        --work /tmp/conversion-smoke --out /tmp/conversion-smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from cli_runs import ROOT, mdlm


def trained(preset: str, out: Path, steps: int, extra: list[str]) -> float:
    """`mdlm train --preset PRESET` for exactly `steps` steps into `out` (a finished run is kept:
    --resume); the wall seconds of the call (its start-up and final validation included)."""
    start = time.perf_counter()
    mdlm("train", "--preset", preset, "--out", out, "--no-print-config", "--resume",
         "--max-steps", steps, "--set", "train.time_budget=0", *extra)
    return time.perf_counter() - start


def bound(checkpoint: Path, rows: int, work: Path) -> dict:
    """`mdlm eval-ppl` on the demo's validation split (its first `rows` rows, seed 0)."""
    result = work / f"{checkpoint.name}-ppl.json"
    mdlm("eval-ppl", "--checkpoint", checkpoint, "--split", "valid", "--rows", rows,
         "--seed", 0, "--json", result)
    (r,) = json.loads(result.read_text())["results"]
    return {"nats_per_char": r["nats_per_token"], "kind": r["kind"],
            "standard_error": r["standard_error"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ar-steps", type=int, default=650)  # the demo's 8 minutes on 2 cores
    parser.add_argument("--steps", type=int, default=650)  # each row's fine-tuning steps
    parser.add_argument("--rows", type=int, default=256)  # validation rows of each bound
    parser.add_argument("--eager", action="store_true", help="train.compile=false everywhere")
    parser.add_argument("--work", default="runs/conversion-table")
    parser.add_argument("--out", default="benchmarks/conversion-table.json")
    args = parser.parse_args()
    work = (ROOT / args.work).resolve()
    load = os.getloadavg()[0]
    work.mkdir(parents=True, exist_ok=True)
    extra = ["--set", "train.compile=false"] if args.eager else []

    ar = work / "ar"
    seconds = {"ar twin": trained("demo-ar", ar, args.ar_steps, extra)}
    converted = work / "ar-converted"
    if not (converted / "latest").is_file():
        mdlm("convert", ar, "--out", converted)  # the shift on (mdlm convert's default)
    anneal = ["--set", f"train.attention_anneal_steps={max(args.steps // 2, 1)}"]
    plans = {  # name -> (run folder, steps, train.init_from or None, more --set)
        "mdlm scratch": ("scratch", args.steps, None, []),
        "mdlm scratch 2x": ("scratch-2x", 2 * args.steps, None, []),
        "init_from, no shift": ("init-no-shift", args.steps, ar, []),
        "convert, shift": ("convert-shift", args.steps, converted, []),  # model.shift adopted
        # DiffuLLaMA's annealing: causal to full attention over the first half of the steps
        "convert, shift, annealed": ("convert-anneal", args.steps, converted, anneal),
    }
    rows = {"ar twin": {"steps": args.ar_steps, **bound(ar, args.rows, work),
                        "train_call_seconds": round(seconds["ar twin"], 1)}}
    for name, (folder, steps, init, more) in plans.items():
        out = work / folder
        start = [] if init is None else ["--set", f"train.init_from={init}"]
        took = trained("demo", out, steps, [*extra, *start, *more])
        rows[name] = {"steps": steps, **bound(out, args.rows, work),
                      "train_call_seconds": round(took, 1)}
    import torch

    from mdlm_cli.perf import machine_name

    record = {"command": " ".join(sys.argv), "cpu": machine_name(), "load_at_start": load,
              "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
              "ar_steps": args.ar_steps, "steps": args.steps, "eval_rows": args.rows,
              "compile": not args.eager, "rows": rows}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    for name, row in rows.items():
        print(f"{name:20s} {row['steps']:6d} steps  {row['nats_per_char']:.4f} nats/char "
              f"({row['kind']})")


if __name__ == "__main__":
    main()
