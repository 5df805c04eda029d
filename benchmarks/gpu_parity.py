"""Part 2 of the GPU check: the same random weights and tokens through every attention path
of the DiT on the GPU (SDPA with each of its backends, flash-attn when installed; fp32, TF32
and bf16 autocast), against the CPU fp32 forward: differences of the logits."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from gpu_common import PartFile, Sizes, preset_config, random_dit


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
