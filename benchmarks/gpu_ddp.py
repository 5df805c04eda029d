"""Part 5 of the GPU check: `mdlm train` under torchrun, through DDP and FSDP2 on NCCL.

    python -m torch.distributed.run --standalone --nproc-per-node 1 benchmarks/gpu_ddp.py \
        --out DIR [--dry-run]

With one process `mdlm_cli.distributed.session()` skips the process group (every helper is a
no-op), so `torchrun --nproc-per-node 1 mdlm train` would not touch NCCL, and one GPU cannot
hold two NCCL ranks. This worker therefore joins a one-rank process group itself (NCCL on
CUDA, gloo in the dry run) and hands the training loop a `Dist` that counts as distributed:
`Dist.wrap` builds DDP with its SUM all-reduce hook (or FSDP2's `fully_shard`), the loop
runs its per-step `all_sum`, gradient accumulation toggles DDP's sync, and the checkpoint
is gathered the distributed way. The data is a local text file written from this
repository's Markdown (character tokeniser), so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from pathlib import Path

import torch
import torch.distributed as tdist
from gpu_common import ROOT, PartFile, sizes

from mdlm_cli.distributed import Dist
from mdlm_cli.runtime import pick_device

WRAPPED: list[
    tuple[str, str]
] = []  # (class of the module Dist.wrap returned, process group backend)


class OneRankGroup(Dist):
    """A joined process group of one rank: distributed code paths on, world size 1."""

    @property
    def enabled(self) -> bool:
        return True

    def wrap(self, model, ema_model, parallel="ddp", dtype=None):
        net = super().wrap(model, ema_model, parallel, dtype)
        WRAPPED.append((type(net).__name__, self.backend))
        return net


@contextlib.contextmanager
def one_rank_session(device_name: str = "auto"):
    """`distributed.session` for torchrun's one process, with the process group joined."""
    device = pick_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    tdist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    try:
        yield OneRankGroup(
            rank=tdist.get_rank(),
            world_size=tdist.get_world_size(),
            local_rank=0,
            device=device,
            backend=tdist.get_backend(),
        )
    finally:
        tdist.destroy_process_group()


def corpus(out: Path) -> Path:
    """This repository's Markdown as one local text file (documents: its paragraphs)."""
    path = out / "corpus.txt"
    texts = [p.read_text(encoding="utf-8") for p in sorted(ROOT.glob("*.md"))]
    path.write_text("\n\n".join(texts), encoding="utf-8")
    return path


def overrides(
    data: Path, run: Path, device: str, parallel: str, steps: int, dry: bool
) -> list[str]:
    """The test preset; on the GPU a 4x256 DiT at L = 256, global batch 32 = 16 x 2
    accumulation (DDP's no_sync on the first micro-batch)."""
    sets = [
        f"data.dataset={data}",
        f"train.out_dir={run}",
        f"train.device={device}",
        f"train.parallel={parallel}",
        f"train.max_steps={steps}",
        "train.log_every=1",
        f"train.save_every={steps}",
        f"train.eval_every={steps + 1}",
        "train.eval_rows=64",
        "train.keep_last=1",
    ]
    if not dry:
        sets += [
            "data.length=256",
            "model.hidden_size=256",
            "model.n_blocks=4",
            "model.n_heads=4",
            "train.global_batch_size=32",
            "train.micro_batch_size=16",
        ]
    return sets


def train_once(out: Path, data: Path, parallel: str, steps: int, dry: bool) -> dict:
    from rich.console import Console

    from mdlm_cli.build import resolve_config
    from mdlm_cli.train import loop

    run = out / f"run-{parallel}"
    cfg = resolve_config(
        "test", overrides(data, run, "cpu" if dry else "cuda", parallel, steps, dry)
    )
    saved, loop.session = loop.session, one_rank_session
    t0 = time.perf_counter()
    try:
        result = loop.train(cfg, console=Console(stderr=True))
    finally:
        loop.session = saved
    files = sorted(p.name for p in result.checkpoint.iterdir())
    wrapped_as, backend = WRAPPED[-1]
    return {
        "parallel": parallel,
        "backend": backend,
        "wrapped_as": wrapped_as,
        "steps": result.step,
        "seconds": time.perf_counter() - t0,
        "tokens_per_s": result.tokens_per_second,
        "loss_first": result.losses[0],
        "loss_last": result.losses[-1],
        "finite": all(math.isfinite(x) for x in result.losses),
        "checkpoint_files": files,
        "final_valid_nats": None
        if result.final_valid is None
        else result.final_valid.nats_per_token,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    sz = sizes(args.dry_run)
    work = args.out / "ddp"
    work.mkdir(parents=True, exist_ok=True)
    os.environ["MDLM_CACHE"] = str(work / "cache")  # the prepared corpus stays in the output folder
    part = PartFile(
        args.out,
        "ddp",
        world_size=int(os.environ.get("WORLD_SIZE", "1")),
        launcher="torchrun" if "TORCHELASTIC_RUN_ID" in os.environ else None,
    )
    data = corpus(work)
    for parallel in ("ddp", "fsdp"):
        try:
            row = train_once(work, data, parallel, sz.ddp_steps, sz.dry)
        except Exception as e:  # noqa: BLE001 - FSDP2 may be missing from this torch: go on, say why
            row = {"parallel": parallel, "error": f"{type(e).__name__}: {str(e)[:300]}"}
        part.append("rows", row)
    rows = part.data["rows"]
    ok = [r for r in rows if "error" not in r and r["finite"]]
    if len(ok) == 2:  # the same seeds and batches: DDP and FSDP2 train alike (to float rounding)
        part.update(fsdp_minus_ddp_last_loss=ok[1]["loss_last"] - ok[0]["loss_last"])
    part.update(
        status="ok" if len(ok) == len(rows) else "failed",
        headline="; ".join(
            f"{r['parallel']}: "
            + (
                f"{r['steps']} steps on {r['backend']}, {r['tokens_per_s']:,.0f} tok/s, "
                f"as {r['wrapped_as']}"
                if "error" not in r
                else r["error"][:120]
            )
            for r in rows
        ),
    )


if __name__ == "__main__":
    main()
