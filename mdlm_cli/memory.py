"""Peak memory, estimated before a command allocates it, and refused when it cannot fit.

The estimate is the network's: weights, the activations of a forward pass at the length
(all blocks' saved activations when training), the logits B x L x V, and for training the
gradients, AdamW's two moments and the EMA copy. Attention is counted as the rest of a
block's activations, O(L): SDPA's flash / memory-efficient kernels (CUDA and CPU) never hold
the L x L scores. The per-token factors were measured on the DiT with `ru_maxrss` (CPU,
L = 16384, H = 64: 120 MB for a forward pass, 330 MB for a forward and backward, 2 blocks),
so the estimate is of the right size, not exact; it errs on neither side by much more than 2x.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .errors import MdlmError

FLOAT = 4  # bytes of a float32 activation (bf16 autocast keeps float32 weights and logits)


@dataclass(frozen=True)
class Footprint:
    """Bytes of each part of a command's peak."""

    weights: int
    activations: int
    logits: int
    optimizer: int = 0  # gradients, AdamW moments, EMA
    token_ids: int = 0  # every sample's ids, held until the end (int64)

    @property
    def total(self) -> int:
        return self.weights + self.activations + self.logits + self.optimizer + self.token_ids


def footprint(
    *,
    params: int,
    hidden: int,
    n_blocks: int,
    mlp_ratio: int,
    vocab: int,
    batch: int,
    length: int,
    training: bool = False,
) -> Footprint:
    """The estimated peak of one forward pass (and backward and step, with `training`) of
    `batch` rows of `length` tokens through a network of `params` parameters."""
    tokens = batch * length
    if training:  # every block keeps its activations for the backward pass
        activations = tokens * hidden * FLOAT * n_blocks * (6 * mlp_ratio + 16)
        logits = tokens * vocab * FLOAT * 4  # logits, log-softmax, and their gradients
        optimizer = params * FLOAT * 4  # gradient, AdamW's two moments, the EMA copy
    else:  # one block's activations live at a time
        activations = tokens * hidden * FLOAT * (4 * mlp_ratio + 12)
        logits, optimizer = tokens * vocab * FLOAT * 2, 0  # logits and their softmax
    return Footprint(params * FLOAT, activations, logits, optimizer)


def available(device: torch.device) -> tuple[int | None, str]:
    """(free bytes, where the figure comes from) of the device; None where it cannot be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free, f"free on {torch.cuda.get_device_name(device)}"
    try:
        import psutil  # type: ignore[import-not-found]

        return psutil.virtual_memory().available, "available RAM"
    except ImportError:
        pass
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "available RAM (MemAvailable)"
    return None, ""


def size_text(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def check_fits(what: str, need: Footprint, device: torch.device, fix: str) -> None:
    """Refuse (one line, MdlmError) a footprint above what the device has free."""
    free, source = available(device)
    if free is None or need.total <= free:
        return
    parts = ", ".join(
        f"{name} {size_text(value)}"
        for name, value in (
            ("activations", need.activations),
            ("logits", need.logits),
            ("weights", need.weights),
            ("gradients and optimizer state", need.optimizer),
            ("token ids", need.token_ids),
        )
        if value
    )
    raise MdlmError(
        f"{what} needs about {size_text(need.total)} of memory ({parts}); this machine has "
        f"{size_text(free)} {source}; {fix}"
    )


@dataclass(frozen=True)
class Workload:
    """The forward pass a command asks for: `batch` rows of `length` tokens, and `rows`
    sequences whose ids are all held (int64) until the end; `what` names it in a refusal and
    `fix` says how to shrink it."""

    batch: int
    length: int
    what: str
    fix: str
    rows: int = 0


def check_memory(model, model_cfg, vocab: int, work: Workload, *, device) -> None:
    """Refuse, before anything large is allocated, the `work` through `model` (its
    ModelConfig `model_cfg`, `vocab` output rows) that the device cannot hold: one line with
    the estimate and the memory available."""
    params = sum(p.numel() for p in model.parameters())
    need = footprint(params=params, **_shape_of(model, model_cfg), vocab=vocab, batch=work.batch,
                     length=work.length)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # bf16: 2 bytes
    check_fits(work.what, replace(need, weights=weights, token_ids=8 * work.rows * work.length),
               device, work.fix)


def _shape_of(model, model_cfg) -> dict:
    """The shape `footprint` reads: a released backbone's own (LLaDA, Dream), else model.*'s."""
    own = model.config if model.family else None
    return {"hidden": getattr(own, "hidden_size", model_cfg.hidden_size),
            "n_blocks": getattr(own, "n_layers", model_cfg.n_blocks),
            "mlp_ratio": getattr(own, "mlp_ratio", model_cfg.mlp_ratio)}


@dataclass(frozen=True)
class ForwardCost:
    """The memory of one inference forward pass per row position beyond the weights (one
    block's activations, the logits and their softmax): what a server admits requests by,
    the weights being held once for all of them."""

    per_position: int  # bytes

    @classmethod
    def of(cls, model, model_cfg, vocab: int) -> ForwardCost:
        need = footprint(params=0, **_shape_of(model, model_cfg), vocab=vocab, batch=1, length=1)
        return cls(need.activations + need.logits)

    def bytes(self, rows: int, length: int) -> int:
        return self.per_position * rows * length

    def rows_within(self, budget: int | None, length: int, most: int) -> int:
        """The most rows (1 to `most`) of `length` positions whose pass fits in `budget` bytes
        (`most` where there is no budget; 0 where not even one row fits)."""
        if budget is None:
            return most
        return max(0, min(most, budget // max(1, self.bytes(1, length))))


GIB = 1024**3


def check_weights_fit(what: str, weight_bytes: int, device: torch.device) -> None:
    """Refuse (one line, MdlmError) weights larger than the memory the device has free, before
    any of them is read."""
    free, source = available(torch.device(device))
    if free is None or weight_bytes <= free:
        return
    raise MdlmError(
        f"{what} needs {weight_bytes / GIB:.1f} GiB for its weights; this machine has "
        f"{free / GIB:.1f} GiB {source}; use a device with more memory (--device)"
    )
