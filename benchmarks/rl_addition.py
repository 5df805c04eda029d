"""Issue 53's RL table on the CPU: a tiny DiT trained by SFT on digit addition (the preset
rl-addition, data the code generates), then, from that start and for the same time, `mdlm rl`
(estimators d1 and coupled) against SFT continued; held-out exact match of each, one
completion per prompt with the same sampler and seed. `make rl-table` runs it (outside CI).

    python benchmarks/rl_addition.py --minutes-sft 4 --minutes 3 --out benchmarks/rl-addition.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from cli_runs import ROOT, mdlm

SAMPLING = ["--sampler", "ancestral", "--steps", "4", "--answer-tokens", "4"]


def held_out_exact(checkpoint: Path, held: Path, adapter: Path | None, rows: int) -> float:
    """Exact match of one completion per held-out prompt (4 sampler steps, seed 0)."""
    from mdlm_cli.checkpoints.load import load_on_device
    from mdlm_cli.engine.settings import SamplingSettings
    from mdlm_cli.rl.loop import Policy, RLSettings, held_out_reward, read_prompts
    from mdlm_cli.rl.rewards import load_reward

    loaded, rt = load_on_device(checkpoint, device="cpu", adapter=adapter)
    settings = RLSettings(data=str(held), out=Path("."), answer_tokens=4, eval_rows=rows)
    policy = Policy(loaded, rt, SamplingSettings(sampler="ancestral", steps=4))
    return held_out_reward(policy, read_prompts(str(held), loaded.tokenizer),
                           load_reward(["exact"]), settings)


def rl_summary(out: Path) -> dict:
    """An RL row's steps, seconds and its KL: the mean of the last 50 steps, and the largest."""
    summary = json.loads((out / "rl.json").read_text())
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    kl = [r["kl"] for r in steps if "kl" in r]
    return {"steps": summary["steps"], "seconds": round(summary["seconds"], 1),
            "kl_last_50": sum(kl[-50:]) / max(len(kl[-50:]), 1), "kl_max": max(kl, default=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes-sft", type=float, default=4.0)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--work", default="runs/rl-table")
    parser.add_argument("--rows", type=int, default=200)
    # the adapter's learning rate: 3e-3 made the KL explode within 3 steps (65, then 1836)
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--out", default="benchmarks/rl-addition.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from mdlm_cli.perf import machine_name
    from mdlm_cli.rl.tasks import AdditionTask, write_addition_task

    work = ROOT / args.work
    load, runs = os.getloadavg()[0], {}
    files = write_addition_task(AdditionTask(max_digits=2, train=2000, held_out=args.rows,
                                             seed=0), work / "data")
    train = ["train", "--preset", "rl-addition", "--no-print-config",
             "--set", f"data.dataset={files['train']}"]
    sft = work / "sft"
    mdlm(*train, "--out", sft, "--set", f"train.time_budget={args.minutes_sft}", "--resume")
    rows = {"sft start": held_out_exact(sft, files["held_out"], None, args.rows)}
    more = work / "sft-more"
    mdlm(*train, "--out", more, "--set", f"train.init_from={sft}",
         "--set", f"train.time_budget={args.minutes}", "--set", "optim.warmup_steps=1",
         "--resume")  # a finished run is kept: the RL rows can be re-run alone
    rows["sft continued"] = held_out_exact(more, files["held_out"], None, args.rows)
    # d1 as its paper (the prompt masked with p 0.15), d1 with a clean prompt (the SFT model
    # never saw a masked prompt), DiffuCoder's coupled pair
    for name, estimator, options in (("d1", "d1", []),
                                     ("d1-p0", "d1", ["--estimator-option", "p_mask_prompt=0"]),
                                     ("coupled", "coupled", [])):
        out = work / f"rl-{name}"
        shutil.rmtree(out, ignore_errors=True)  # an RL row is always run again
        mdlm("rl", "-c", sft, "--data", files["train"], "--held-out", files["held_out"],
             "--out", out, "--estimator", estimator, *options, "--minutes", args.minutes,
             "--max-steps", 100000, "--eval-every", 100000, "--eval-rows", 32, "--lr", args.lr,
             "--group", 6, "--prompts", 4, "--iterations", 2, "--seed", 0, *SAMPLING)
        rows[f"rl {name}"] = held_out_exact(sft, files["held_out"], out / "adapter",
                                                 args.rows)
        runs[f"rl {name}"] = rl_summary(out)
    import torch

    record = {"command": " ".join(sys.argv), "cpu": machine_name(), "load_at_start": load,
              "torch": torch.__version__, "minutes_sft": args.minutes_sft,
              "minutes": args.minutes, "held_out_rows": args.rows, "rl_lr": args.lr,
              "exact_match": rows, "rl_runs": runs}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    for name, value in rows.items():
        print(f"{name:14s} {100 * value:5.1f}%")


if __name__ == "__main__":
    main()
