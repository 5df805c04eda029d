"""BD3-LM's exact block KV cache against recomputing the finished blocks (issue 43, item 7).

Samples a bd3lm run block by block twice under the same seed, with the cache of the finished
blocks (what `mdlm sample` does) and recomputing them at every call under the block-causal mask
(`BD3LM.sample(cache=False)`), checks the tokens are the same and prints the seconds per
sample of each, the speed-up and how many rows stopped at EOS, at each length asked for.

    PYTHONPATH=. python benchmarks/bd3lm_cache.py -c runs/demo-bd3lm --lengths 256,1024
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-c", "--checkpoint", required=True)
    p.add_argument("--lengths", default="256,1024")
    p.add_argument("-n", "--num-samples", type=int, default=4)
    p.add_argument("--sampler", default="first-hitting")
    p.add_argument("--steps", type=int, default=16, help="per block (ancestral, confidence)")
    p.add_argument("--precision", default="auto", choices=["auto", "fp32"],
                   help="the network's: auto (bf16 autocast where the CPU runs it fast) or fp32,"
                        " where the two paths must draw the same tokens (bf16 rounds the "
                        "cached and the recomputed attention differently)")
    p.add_argument("--json")
    a = p.parse_args()
    from mdlm_cli.checkpoints.load import load_on_device
    from mdlm_cli.engine.block_sampling import BlockRows
    from mdlm_cli.engine.settings import SamplingSettings

    loaded, rt = load_on_device(a.checkpoint, precision=a.precision)
    rows = []
    for length in (int(x) for x in a.lengths.split(",")):
        row = {"length": length}
        outs = {}
        for cache in (True, False):
            start = time.perf_counter()
            with torch.no_grad():
                rows = BlockRows(a.num_samples, length, eos_id=loaded.tokenizer.eos_id)
                outs[cache] = loaded.objective.sample(
                    loaded.model, SamplingSettings(a.sampler, a.steps), rows,
                    generator=torch.Generator().manual_seed(0), cache=cache,
                    autocast_dtype=rt.dtype)
            row["cached_s" if cache else "recomputed_s"] = \
                (time.perf_counter() - start) / a.num_samples
        same = torch.equal(outs[True].tokens, outs[False].tokens)
        row.update(same_tokens=same, speedup=row["recomputed_s"] / row["cached_s"],
                   nfe=outs[True].stats.nfe, lengths=outs[True].lengths.tolist(),
                   ended=outs[True].ended.tolist())
        rows.append(row)
        print(f"L={length}: cached {row['cached_s']:.3f} s/sample, recomputed "
              f"{row['recomputed_s']:.3f} ({row['speedup']:.1f}x), same tokens: {same}, "
              f"lengths {row['lengths']}, ended {sum(row['ended'])}/{a.num_samples}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "device": rt.describe(),
                                            "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
