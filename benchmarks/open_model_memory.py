"""Peak resident memory of loading a LLaDA-layout folder through mdlm's loader (issue 41, item 5).

Writes a random folder in the release's layout (config.json, bf16 safetensors shards with
model.safetensors.index.json, tokenizer files: tests/open_model_folders.py) to a temporary
directory, then loads it with `mdlm_cli.checkpoints.load.load_checkpoint` in a fresh process
and prints that process's peak RSS (resource.getrusage ru_maxrss) beside the weights' size.
The default is about 1.2B parameters: 16 blocks of d_model 2048, LLaDA's vocabulary of 126464
rows (2.4 GB of bf16 weights); `--tiny` checks the script in seconds.

    PYTHONPATH=. python benchmarks/open_model_memory.py            # ~1.2B, needs ~6 GB of disk+RAM
    PYTHONPATH=. python benchmarks/open_model_memory.py --tiny
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
# Both steps run in their own processes, started from this one, which imports no torch: Linux
# carries a process's peak RSS across fork and exec, so the loader's figure must not inherit
# the writer's (nor this process's). VmHWM (/proc/self/status) is printed beside it.

CHILD = """
import json, resource, sys, time
import torch
from mdlm_cli.checkpoints.load import load_checkpoint
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.perf_counter()
loaded = load_checkpoint(sys.argv[1])
seconds = time.perf_counter() - start
with torch.no_grad():
    loaded.model(torch.tensor([[1, 2, 3, 4]]))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
hwm = [int(line.split()[1]) * 1024 for line in open("/proc/self/status")
       if line.startswith("VmHWM")]
params = sum(p.numel() for p in loaded.model.parameters())
dtypes = sorted({str(p.dtype) for p in loaded.model.parameters()})
print(json.dumps({"peak_rss": peak, "vm_hwm": hwm[0] if hwm else None,
                  "rss_before_load": before, "params": params,
                  "dtypes": dtypes, "load_seconds": round(seconds, 2)}))
"""


def block_tensors(c: dict, i: int) -> dict[str, tuple[int, ...]]:
    d, hidden = c["d_model"], c["mlp_hidden_size"]
    b = f"model.transformer.blocks.{i}."
    return {b + "attn_norm.weight": (d,), b + "q_proj.weight": (d, d), b + "k_proj.weight": (d, d),
            b + "v_proj.weight": (d, d), b + "attn_out.weight": (d, d), b + "ff_norm.weight": (d,),
            b + "ff_proj.weight": (hidden, d), b + "up_proj.weight": (hidden, d),
            b + "ff_out.weight": (d, hidden)}


def write_folder(folder: Path, c: dict, blocks_per_shard: int = 4) -> int:
    """The weights shard by shard (never all in memory): returns their bytes."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT))
    from tests.open_model_folders import LLADA_SPECIALS, write_tokenizer
    d, rows = c["d_model"], c["embedding_size"]
    groups = [{"model.transformer.wte.weight": (rows, d)}]
    groups += [{k: v for i in range(s, min(s + blocks_per_shard, c["n_layers"]))
                for k, v in block_tensors(c, i).items()}
               for s in range(0, c["n_layers"], blocks_per_shard)]
    groups.append({"model.transformer.ln_f.weight": (d,), "model.transformer.ff_out.weight": (rows, d)})
    weight_map, total = {}, 0
    for n, shapes in enumerate(groups):
        file = f"model-{n + 1:05d}-of-{len(groups):05d}.safetensors"
        part = {k: (torch.randn(s) * 0.02).to(torch.bfloat16) for k, s in shapes.items()}
        save_file(part, folder / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
        total += sum(t.numel() * t.element_size() for t in part.values())
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(c, indent=2))
    write_tokenizer(folder, LLADA_SPECIALS, {"bos_token": "<|startoftext|>",
                                             "eos_token": "<|endoftext|>"})
    return total


def run(args: list[str]) -> str:
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT,
                         env=ENV)
    if out.returncode:
        sys.exit(out.stderr[-3000:])
    return out.stdout.strip().splitlines()[-1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--d-model", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=126464)
    p.add_argument("--mlp-ratio", type=float, default=2.0)
    p.add_argument("--tiny", action="store_true", help="2 blocks of 64, 1024 rows")
    p.add_argument("--write-to", help=argparse.SUPPRESS)  # the writer's own process
    a = p.parse_args()
    blocks, d, vocab = (2, 64, 1024) if a.tiny else (a.blocks, a.d_model, a.vocab)
    if a.write_to:
        sys.path.insert(0, str(ROOT))
        from tests.open_model_folders import llada_config

        c = llada_config("bfloat16", d_model=d, n_layers=blocks, rows=vocab,
                         n_heads=max(1, d // 128), mlp_hidden=int(a.mlp_ratio * d))
        print(write_folder(Path(a.write_to), c))
        return
    with tempfile.TemporaryDirectory() as tmp:
        weights = int(run([__file__, *sys.argv[1:], "--write-to", tmp]))
        r = json.loads(run(["-c", CHILD, tmp]))
    gib = 1024**3
    r.update(weights_bytes=weights, blocks=blocks, d_model=d, vocab=vocab,
             peak_over_weights=round(r["peak_rss"] / weights, 3),
             load_added_over_weights=round((r["peak_rss"] - r["rss_before_load"]) / weights, 3))
    print(json.dumps(r))
    print(f"{r['params'] / 1e9:.2f}B parameters ({', '.join(r['dtypes'])}): weights "
          f"{weights / gib:.2f} GiB, peak RSS {r['peak_rss'] / gib:.2f} GiB "
          f"({r['peak_over_weights']}x; {r['rss_before_load'] / gib:.2f} GiB before loading, "
          f"the load added {r['load_added_over_weights']}x the weights)")


if __name__ == "__main__":
    main()
