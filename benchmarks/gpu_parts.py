"""Parts of the GPU check that run in one Python process each (`gpu_check.py` starts them):

    python benchmarks/gpu_parts.py env|parity|throughput|sampling --out DIR [--dry-run]

Each writes DIR/<part>.json (as it goes) with a one-line `headline`; `--dry-run` runs the
same code on the CPU with the test preset's model and tiny sizes.
"""

from __future__ import annotations

import argparse
import gc
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

import torch
from gpu_common import (
    PartFile,
    Sizes,
    peak_tflops,
    preset_config,
    random_dit,
    sizes,
    sync,
)


def version_of(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def nvidia_smi() -> dict:
    query = "--query-gpu=name,driver_version,memory.total"
    try:
        line = (
            subprocess.run(
                ["nvidia-smi", query, "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except (OSError, subprocess.SubprocessError, IndexError):
        return {}
    name, driver, memory = (x.strip() for x in line.split(","))
    return {"smi_name": name, "driver": driver, "memory_total": memory}


def git_commit() -> str | None:
    """The checkout's commit; None where git or the repository's .git is missing (a copied tree)."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def part_env(out: Path, sz: Sizes) -> None:
    """The machine: GPU name, driver, torch, CUDA, cuDNN, optional packages, the commit."""
    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else (platform.processor() or "cpu")
    info = {
        "commit": git_commit(),
        "device_name": name,
        "cuda_available": cuda,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "python": platform.python_version(),
        "dry_run": sz.dry,
        "bf16_supported": cuda and torch.cuda.is_bf16_supported(),
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "packages": {p: version_of(p) for p in ("flash-attn", "mamba-ssm", "mambapy", "pytest")},
        **nvidia_smi(),
    }
    if cuda:
        props = torch.cuda.get_device_properties(0)
        info.update(
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
        )
    peak = peak_tflops(name)
    info["peak"] = None if peak is None else {"name": peak[0], "bf16_tflops": peak[1]}
    driver = info.get("driver", "-")
    PartFile(
        out,
        "env",
        status="ok",
        **info,
        headline=f"{name}, driver {driver}, torch {torch.__version__}, CUDA {torch.version.cuda}",
    )


# ---------------------------------------------------------------------- 3. training throughput


FLOPS_FORMULA = "6 x 12 H^2 x blocks + 6 x H x V / 2 + 12 x blocks x L x H"


def flops_per_token(cfg, length: int, vocab: int, masked_fraction: float = 0.5) -> float:
    """Training FLOPs per token (forward + backward = 3 x forward): 6 x the blocks' matmul
    weights (12 H^2 each; adaLN acts once per sequence), 6 x H x V for the output layer at the
    masked positions only (the loss evaluates it there: half of them on average over t), and
    12 x L x H per block for the attention scores and values (PaLM's appendix B count)."""
    h, n = cfg.model.hidden_size, cfg.model.n_blocks
    return 6 * 12 * h * h * n + 6 * h * vocab * masked_fraction + 12 * n * length * h


class Trainer:
    """One DiT, its AdamW and a fixed random batch; `step(batch)` is one optimisation step
    of the MDLM loss, as the training loop computes it (bf16 autocast on CUDA)."""

    def __init__(self, cfg, sz: Sizes, compiled: bool):
        from mdlm_cli.objectives import get_objective
        from mdlm_cli.runtime import autocast_dtype

        self.sz, self.device = sz, sz.device
        self.model = random_dit(cfg, sz.vocab).train().to(self.device)
        self.objective = get_objective(cfg, sz.ids)
        net = self.model
        if compiled:  # the training loop's torch.compile(net); the dry run skips inductor
            # the rotary cache filled first: a guard on its emptiness would recompile the trunk
            # at the second step (only the masked count's dynamic shape is then left)
            self.model.rotary_emb(sz.length, self.device)
            net = torch.compile(net, backend="eager") if sz.dry else torch.compile(net)
        self.dtype = autocast_dtype(self.device)
        self.denoiser = self.objective.denoiser(net, self.dtype)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=3e-4, fused=(self.device.type == "cuda") or None
        )
        self.draw = self.objective.draw_times(0, True)
        self.gen = torch.Generator(device=self.device).manual_seed(0)

    def step(self, batch: int) -> float:
        x0 = torch.randint(
            0, self.sz.mask_id, (batch, self.sz.length), device=self.device, generator=self.gen
        )
        t = self.draw(batch, self.gen)
        loss = (
            self.objective.loss_terms(
                self.denoiser, x0, t, generator=self.gen, attention_mask=None
            ).sum()
            / x0.numel()
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()

    def measure(self, batch: int, steps: int, warmup: int) -> dict:
        """tokens/s over `steps` after `warmup` steps (compilation included in the warm-up)."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        for _ in range(warmup):
            self.step(batch)
        sync(self.device)
        t1 = time.perf_counter()
        losses = [self.step(batch) for _ in range(steps)]
        sync(self.device)
        seconds = time.perf_counter() - t1
        peak = (
            torch.cuda.max_memory_allocated(self.device) / 2**30
            if self.device.type == "cuda"
            else None
        )
        return {
            "micro_batch": batch,
            "steps": steps,
            "warmup_s": t1 - t0,
            "seconds": seconds,
            "tokens_per_s": steps * batch * self.sz.length / seconds,
            "peak_memory_gib": peak,
            "loss_first": losses[0],
            "loss_last": losses[-1],
        }


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def try_measure(trainer: Trainer, batch: int, steps: int, warmup: int) -> dict:
    """`Trainer.measure`, or {"oom": True} when the batch does not fit (memory freed after)."""
    try:
        row = trainer.measure(batch, steps, warmup)
    except Exception as e:  # noqa: BLE001 - out of memory is an answer; anything else is raised
        if not is_oom(e):
            raise
        row = {"micro_batch": batch, "oom": True}
    trainer.optimizer.zero_grad(set_to_none=True)
    gc.collect()
    if trainer.device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def largest_batch(trainer: Trainer, sz: Sizes, on_try) -> int | None:
    """Double the micro-batch from `search_start` until a step runs out of memory (or the
    cap); each size that fits is measured over one step after one warm-up."""
    batch, fits = sz.search_start, None
    while batch <= sz.search_cap:
        row = try_measure(trainer, batch, steps=1, warmup=1)
        on_try(row)
        if row.get("oom"):
            break
        fits, batch = batch, batch * 2
    return fits


def with_mfu(row: dict, flops: float, peak: tuple[str, float] | None) -> dict:
    if peak is not None and "tokens_per_s" in row:
        row["tflops"] = row["tokens_per_s"] * flops / 1e12
        row["mfu"] = row["tflops"] / peak[1]
    return row


def throughput_headline(data: dict, cap: int) -> str:
    def one(r: dict) -> str:
        kind = "compiled" if r["compiled"] else "eager"
        if r.get("oom"):
            return f"{kind}: out of memory"
        mfu = f" (MFU {100 * r['mfu']:.1f}%)" if "mfu" in r else ""
        return f"{kind} {r['tokens_per_s']:,.0f} tok/s{mfu}"

    fits = data.get("largest_micro_batch")
    return (
        f"micro-batch {data['micro_batch']}: "
        + ", ".join(one(r) for r in data["rows"])
        + f"; largest micro-batch {fits}{'+' if fits == cap else ''}"
    )


def part_throughput(out: Path, sz: Sizes) -> None:
    cfg = preset_config(sz)
    name = torch.cuda.get_device_name(0) if sz.device.type == "cuda" else "cpu"
    peak = peak_tflops(name)
    flops = flops_per_token(cfg, sz.length, sz.vocab)
    micro = min(cfg.train.micro_batch_size, sz.search_cap)
    part = PartFile(
        out,
        "throughput",
        preset=cfg.name,
        length=sz.length,
        micro_batch=micro,
        flops_per_token=flops,
        peak=None if peak is None else list(peak),
        flops_formula=FLOPS_FORMULA,
    )
    for compiled in (False, True):
        trainer = Trainer(cfg, sz, compiled)
        row = try_measure(trainer, micro, sz.train_steps, sz.train_warmup)
        part.append("rows", with_mfu({"compiled": compiled, **row}, flops, peak))
        del trainer
        gc.collect()
    trainer = Trainer(cfg, sz, compiled=False)
    fits = largest_batch(trainer, sz, lambda r: part.append("search", with_mfu(r, flops, peak)))
    part.update(largest_micro_batch=fits, search_capped=fits == sz.search_cap)
    part.update(status="ok", headline=throughput_headline(part.data, sz.search_cap))


def main() -> None:
    from gpu_parity import part_parity
    from gpu_sampling import part_sampling

    parts = {
        "env": part_env,
        "parity": part_parity,
        "throughput": part_throughput,
        "sampling": part_sampling,
    }
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=list(parts))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    sz = sizes(args.dry_run)
    from mdlm_cli.runtime import default_threads

    threads = default_threads()  # as mdlm's commands: a busy CPU is not oversubscribed
    if threads:
        torch.set_num_threads(threads)
    if not sz.dry and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run on a CPU")
    parts[args.part](args.out, sz)


if __name__ == "__main__":
    main()
