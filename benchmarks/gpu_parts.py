"""Parts of the GPU check that run in one Python process each (`gpu_check.py` starts them):

    python benchmarks/gpu_parts.py env|parity|throughput|sampling --out DIR [--dry-run]

Each writes DIR/<part>.json (as it goes) with a one-line `headline`; `--dry-run` runs the
same code on the CPU with the test preset's model and tiny sizes.
"""

from __future__ import annotations

import argparse
import contextlib
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


def part_env(out: Path, sz: Sizes) -> None:
    """The machine: GPU name, driver, torch, CUDA, cuDNN, optional packages, the commit."""
    cuda = torch.cuda.is_available()
    name = torch.cuda.get_device_name(0) if cuda else (platform.processor() or "cpu")
    commit = (
        subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
        ).stdout.strip()
        or None
    )
    info = {
        "device_name": name,
        "cuda_available": cuda,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "python": platform.python_version(),
        "commit": commit,
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


# ---------------------------------------------------------------------- 2. logits parity


@contextlib.contextmanager
def attention_path(kind: str):
    """Force one attention path of the DiT: 'flash-attn' (the package), or SDPA with one
    backend ('sdpa' lets torch choose). mdlm calls flash-attn whenever it is installed
    (bf16 on CUDA, no padding), so every SDPA path switches it off."""
    from mdlm_cli.models import dit

    saved = dit.flash_attn_func
    backend = {
        "sdpa-flash": "FLASH_ATTENTION",
        "sdpa-efficient": "EFFICIENT_ATTENTION",
        "sdpa-cudnn": "CUDNN_ATTENTION",
        "sdpa-math": "MATH",
    }.get(kind)
    try:
        if kind != "flash-attn":
            dit.flash_attn_func = None
        if backend is None:
            yield
        else:
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([getattr(SDPBackend, backend)]):
                yield
    finally:
        dit.flash_attn_func = saved


def parity_cases(sz: Sizes) -> list[tuple[str, str, torch.dtype | None, bool]]:
    """(label, attention path, autocast dtype, TF32) of each comparison with the CPU fp32 logits."""
    if sz.dry:  # the CPU has SDPA only; bf16 autocast on the CPU runs the same code
        return [("sdpa fp32", "sdpa", None, False), ("sdpa bf16", "sdpa", torch.bfloat16, False)]
    cases = [
        ("sdpa fp32", "sdpa", None, False),
        ("sdpa fp32 tf32", "sdpa", None, True),
        ("sdpa-math fp32", "sdpa-math", None, False),
    ]
    cases += [
        (f"{k} bf16", k, torch.bfloat16, True)
        for k in ("sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn")
    ]
    from mdlm_cli.models import dit

    if dit.flash_attn_func is not None:
        cases.append(("flash-attn bf16", "flash-attn", torch.bfloat16, True))
    return cases


def compare(logits: torch.Tensor, ref: torch.Tensor) -> dict:
    diff = (logits.float() - ref).abs()
    return {
        "max_abs_diff": diff.max().item(),
        "mean_abs_diff": diff.mean().item(),
        "max_rel_diff": (diff.max() / ref.abs().max()).item(),
        "argmax_agreement": (logits.argmax(-1) == ref.argmax(-1)).float().mean().item(),
    }


def part_parity(out: Path, sz: Sizes) -> None:
    """The same random weights and tokens through every attention path on the device,
    against the CPU fp32 forward: max |difference| of the logits."""
    from mdlm_cli.models import autocast_for

    cfg = preset_config(sz)
    model = random_dit(cfg, sz.vocab)
    x = torch.randint(
        0, sz.mask_id, (sz.parity_batch, sz.length), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        ref = model(x)  # (B, L, V) on the CPU in fp32
    part = PartFile(out, "parity", model=model.describe(), length=sz.length, batch=sz.parity_batch)
    device_model = model.to(sz.device)
    xd = x.to(sz.device)
    from mdlm_cli.models import dit

    part.update(flash_attn_installed=dit.flash_attn_func is not None)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    for label, path, dtype, allow_tf32 in parity_cases(sz):
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = allow_tf32
        row = {"path": label}
        try:
            with torch.no_grad(), attention_path(path), autocast_for(sz.device, dtype):
                row.update(compare(device_model(xd).cpu(), ref))
        except Exception as e:  # noqa: BLE001 - a backend this GPU or torch lacks: say which
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        part.append("rows", row)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    rows = part.data["rows"]
    worst = ", ".join(f"{r['path']} {r['max_abs_diff']:.2g}" for r in rows if "max_abs_diff" in r)
    failed = [r["path"] for r in rows if "error" in r]
    part.update(
        status="ok",
        headline=f"max abs logit difference vs CPU fp32: {worst}"
        + (f"; failed: {', '.join(failed)}" if failed else "")
        + ("" if part.data["flash_attn_installed"] or sz.dry else "; flash-attn not installed"),
    )


# ---------------------------------------------------------------------- 3. training throughput


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
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def largest_batch(trainer: Trainer, sz: Sizes, on_try) -> int | None:
    """Double the micro-batch from `search_start` until a step runs out of memory (or the
    cap); each size that fits is measured over one step after one warm-up."""
    batch, fits = sz.search_start, None
    while batch <= sz.search_cap:
        oom = False
        try:
            row = trainer.measure(batch, steps=1, warmup=1)
        except Exception as e:  # noqa: BLE001 - out of memory is the answer; anything else is raised
            if not is_oom(e):
                raise
            oom, row = True, {"micro_batch": batch, "oom": True}
        trainer.optimizer.zero_grad(set_to_none=True)
        gc.collect()
        if sz.device.type == "cuda":
            torch.cuda.empty_cache()
        on_try(row)
        if oom:
            break
        fits, batch = batch, batch * 2
    return fits


def with_mfu(row: dict, flops: float, peak: tuple[str, float] | None) -> dict:
    if peak is not None:
        row["tflops"] = row["tokens_per_s"] * flops / 1e12
        row["mfu"] = row["tflops"] / peak[1]
    return row


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
        flops_formula=flops_per_token.__doc__.split(":")[0].strip(),
    )
    for compiled in (False, True):
        trainer = Trainer(cfg, sz, compiled)
        row = trainer.measure(micro, sz.train_steps, sz.train_warmup)
        part.append("rows", with_mfu({"compiled": compiled, **row}, flops, peak))
        del trainer
        gc.collect()
    trainer = Trainer(cfg, sz, compiled=False)
    fits = largest_batch(
        trainer,
        sz,
        lambda r: part.append("search", with_mfu(r, flops, peak) if "tokens_per_s" in r else r),
    )
    part.update(largest_micro_batch=fits, search_capped=fits == sz.search_cap)
    rows = part.data["rows"]
    mfu = "" if peak is None else ", MFU " + " / ".join(f"{100 * r['mfu']:.1f}%" for r in rows)
    part.update(
        status="ok",
        headline=f"{rows[0]['tokens_per_s']:,.0f} tok/s eager, "
        f"{rows[1]['tokens_per_s']:,.0f} compiled (micro-batch {micro}){mfu}; "
        f"largest micro-batch {fits}{'+' if fits == sz.search_cap else ''}",
    )


def main() -> None:
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
