"""Per-call cost of Fast-dLLM's block caches as L grows, beside a FLOP model (issue 42).

One sampler call of each kind, timed on a loaded model (`mdlm_cli.models` `block_cache` /
`from_cache`, the calls `--cache` makes) at each length L, with blocks of B tokens:
- full: a pass over all L positions (every call of `--cache none`; the refresh that starts
  each block under a cache);
- prefix: the block and the suffix, [s, L), at the middle block (the average slice: over the
  L/B blocks the slices run from L down to B);
- dual: the block alone, [s, s + B), attending to the L cached keys.
Calls run on `--batch` rows at once. It then predicts a whole sample's time under each cache
for `steps` calls per block from those call times (none: NFE full calls; prefix/dual: one
full call per block, then cached calls), the model that `bench-sampler`'s measured s/sample
is compared with in BENCHMARKS.md.

FLOP model (multiply-adds x 2; P = the non-embedding parameters, d = the width, V = the
output rows, n = the positions a call runs, K = the keys it attends to, N layers):
  2 P n (projections and MLP) + 4 N n K d (q k^T and attention x v) + 2 V d n (the output).
A full call has n = K = L; a dual call n = B, K = L, so its cost is B/L of a full call's
linear part but attention keeps a K = L factor: past L ~ P / (2 N d) the attention term
dominates and the dual call's saving stops growing as L/B.

    PYTHONPATH=. python benchmarks/block_cache_calls.py -c runs/demo --lengths 256,512,1024
    PYTHONPATH=. python benchmarks/block_cache_calls.py --llada-1b --lengths 256,512,1024
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def flops(shape: dict, n: int, keys: int) -> float:
    """Model FLOPs of one call over n positions attending to `keys` keys (docstring)."""
    return (2 * shape["params"] * n + 4 * shape["layers"] * n * keys * shape["width"]
            + 2 * shape["vocab"] * shape["width"] * n)


def model_shape(model: torch.nn.Module, vocab: int) -> dict:
    """Non-embedding parameters, layers, width and output rows (`vocab`, the logits' last
    dimension) of a DiT, LLaDA or Dream: the (vocab, width) matrices are the embedding and
    the output projection, counted apart."""
    total = sum(p.numel() for p in model.parameters())
    emb = sum(p.numel() for p in model.parameters() if p.ndim == 2 and p.shape[0] == vocab)
    cfg = model.config
    layers = getattr(cfg, "n_blocks", None) or getattr(cfg, "n_layers", None)
    return {"params": total - emb, "layers": layers, "width": cfg.hidden_size, "vocab": vocab}


def timed(fn, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model, autocast, L: int, B: int, batch: int, repeats: int, vocab: int) -> dict:
    """Seconds of a full, a middle prefix and a dual call at length L (docstring)."""
    tokens = torch.randint(0, vocab - 1, (batch, L), generator=torch.Generator().manual_seed(0))
    s = (L // B // 2) * B  # the middle block's start
    with torch.no_grad(), autocast():
        cache = model.new_block_cache(batch, L)
        model.block_cache(tokens, cache)
        return {
            "full": timed(lambda: model.block_cache(tokens, cache), repeats),
            "prefix": timed(lambda: model.from_cache(tokens[:, s:], cache, s), repeats),
            "dual": timed(lambda: model.from_cache(tokens[:, s:s + B], cache, s), repeats),
        }


def predict(t: dict, L: int, B: int, steps: int, batch: int) -> dict:
    """A sample's seconds with `steps` calls per block, the calls timed on `batch` rows: none,
    prefix, dual (docstring)."""
    blocks = L // B
    none = blocks * steps * t["full"] / batch
    # prefix slices shrink from L to B; the measured middle one is their mean
    cached = {k: blocks * (t["full"] + (steps - 1) * t[k]) / batch for k in ("prefix", "dual")}
    return {"none": none, **cached}


def llada_folder(tmp: str) -> str:
    """The 1.2B LLaDA-layout folder of benchmarks/open_model_memory.py, random bf16 weights."""
    from benchmarks.open_model_memory import write_folder
    from tests.open_model_folders import llada_config

    c = llada_config("bfloat16", d_model=2048, n_layers=16, rows=126464, n_heads=16,
                     mlp_hidden=4096)
    write_folder(Path(tmp), c)
    return tmp


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-c", "--checkpoint")
    p.add_argument("--llada-1b", action="store_true", help="write and time the 1.2B folder")
    p.add_argument("--lengths", default="256,512,1024")
    p.add_argument("--block-length", type=int, default=32)
    p.add_argument("--steps-per-block", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()
    from mdlm_cli.checkpoints.load import load_on_device
    from mdlm_cli.distributed import unwrap
    from mdlm_cli.models import autocast_for

    with tempfile.TemporaryDirectory() as tmp:
        path = llada_folder(tmp) if a.llada_1b else a.checkpoint
        loaded, rt = load_on_device(path)
        model = unwrap(loaded.model)
        with torch.no_grad(), autocast_for(rt.device, rt.dtype):
            vocab = model.block_cache(torch.zeros(1, 8, dtype=torch.long),
                                      model.new_block_cache(1, 8))[0].shape[-1]
        shape = model_shape(model, vocab)
        rows = []
        for L in (int(x) for x in a.lengths.split(",")):
            t = measure(model, lambda: autocast_for(rt.device, rt.dtype), L, a.block_length,
                        a.batch, a.repeats, shape["vocab"])
            B, s = a.block_length, (L // a.block_length // 2) * a.block_length
            f = {"full": flops(shape, L, L), "prefix": flops(shape, L - s, L),
                 "dual": flops(shape, B, L)}
            attn = 4 * shape["layers"] * B * L * shape["width"] / f["dual"]
            row = {"L": L, "seconds": t, "flops": f, "dual_attention_share": round(attn, 3),
                   "predicted_sample_s": predict(t, L, B, a.steps_per_block, a.batch)}
            rows.append(row)
            print(f"L={L}: full {t['full'] * 1e3:.1f} ms ({f['full'] / t['full'] / 1e12:.2f} "
                  f"TFLOP/s), prefix {t['prefix'] * 1e3:.1f} ms, dual {t['dual'] * 1e3:.1f} ms "
                  f"(full/dual {t['full'] / t['dual']:.1f}x, FLOPs {f['full'] / f['dual']:.1f}x;"
                  f" attention {attn:.0%} of a dual call's FLOPs); predicted s/sample at "
                  f"{a.steps_per_block} steps/block: " + ", ".join(
                      f"{k} {v:.2f}" for k, v in row["predicted_sample_s"].items()), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"shape": shape, "args": vars(a), "rows": rows,
                                            "device": rt.describe()}, indent=1))


if __name__ == "__main__":
    main()
