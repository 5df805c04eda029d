"""The fine-tuning memory model (mdlm_cli/train/memory_model.py) against measured peaks on the
CPU: a LLaDA-shaped folder of >= 1 GB (random weights, float32), one process per setting,
training steps of the native backbone with mdlm's loss, the peak RSS (sampled every 2 ms)
minus the RSS after the imports. glibc's malloc is told to map every allocation over 64 KB
and to trim at once (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_): by default it keeps freed
tensors' pages (1-2 GB more here), so RSS would measure its heap's high-water mark, not the
tensors alive at the peak, which is what the model counts (and what CUDA's
max_memory_allocated reports on a GPU). Settings: full fine-tuning and LoRA, each with and without
gradient checkpointing. Writes a JSON record; BENCHMARKS.md quotes it.

    python benchmarks/memory_model.py --out benchmarks/memory-model-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"d_model": 1536, "n_layers": 10, "n_heads": 12, "mlp_hidden": 4096, "window": 512,
         "rows": 32000}
SETTINGS = {"full": (0, False), "full+ckpt": (0, True), "lora": (16, False),
            "lora+ckpt": (16, True)}
ROWS, LENGTH, STEPS = 2, 512, 2
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def child(folder: str, setting: str) -> dict:
    import psutil
    import torch

    from mdlm_cli.checkpoints.load import load_checkpoint
    from mdlm_cli.config import LoraConfig
    from mdlm_cli.models.lora import add_lora, trainable
    from mdlm_cli.models.open_weights import NLL_CHUNK
    from mdlm_cli.train.memory_model import Plan, estimate, shape_of

    process = psutil.Process()
    baseline, peak, done = process.memory_info().rss, [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.002)

    threading.Thread(target=sample, daemon=True).start()
    rank, ckpt = SETTINGS[setting]
    model = load_checkpoint(folder).model.float()
    model.checkpointing = ckpt
    if rank:
        model = add_lora(model, LoraConfig(rank=rank), folder)
    else:
        model.requires_grad_(True)
    params = [p for _, p in trainable(model)] if rank else list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-5)
    g = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(STEPS):
        tokens = torch.randint(0, 80, (ROWS, LENGTH), generator=g)
        masked = torch.rand(ROWS, LENGTH, generator=g) < 0.5
        z = tokens.masked_fill(masked, 85)
        # -log p at the masked positions, their logits NLL_CHUNK at a time (as training's loss)
        loss = model(z, None, output_mask=masked, nll_of=(tokens[masked], 85)).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    done.set()
    plan = Plan(ROWS, LENGTH, LENGTH // 2, lora_rank=rank,
                lora_parameters=sum(p.numel() for p in params) if rank else 0,
                checkpointing=ckpt, chunk=NLL_CHUNK)
    e = estimate(shape_of(model), plan)
    return {"setting": setting, "measured_gb": (peak[0] - baseline) / 1e9,
            "modelled_gb": e.total / 1e9,
            "parts_gb": {k: getattr(e, k) / 1e9 for k in
                         ("weights", "trainable", "activations", "logits")}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/memory-model-cpu.json")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    sys.path.insert(0, str(ROOT))
    from tests.open_model_folders import write_llada

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_llada(Path(tmp) / "llada", **SIZES)
        for setting in SETTINGS:
            out = subprocess.run([sys.executable, __file__, "--child", str(folder), setting],
                                 capture_output=True, text=True, check=True, cwd=ROOT,
                                 env={**os.environ, **MALLOC})
            row = json.loads(out.stdout.strip().splitlines()[-1])
            row["error"] = row["modelled_gb"] / row["measured_gb"] - 1
            rows.append(row)
            print(f"{setting:10s} measured {row['measured_gb']:.3f} GB, modelled "
                  f"{row['modelled_gb']:.3f} GB ({100 * row['error']:+.1f}%)")
    import torch

    record = {"sizes": SIZES, "malloc": MALLOC, "rows": ROWS, "length": LENGTH, "steps": STEPS,
              "cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
              "command": "python benchmarks/memory_model.py", "results": rows}
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
