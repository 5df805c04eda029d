"""What the parts of `gpu_check.py` share: sizes (full or dry), the random-weight DiT of a
preset, timing with CUDA synchronisation, datasheet peaks, and the part's JSON file.

The GPT-2 ids of the owt preset (REFERENCE §1: vocabulary 50,258 with the mask at 50,257)
are used without loading the tokeniser, so the check needs neither transformers nor the
Hugging Face Hub on the GPU machine.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: mdlm_cli of this checkout
    sys.path.insert(0, str(ROOT))

GPT2_VOCAB = 50258  # GPT-2 (50,257) + the mask

def peak_tflops(device_name: str) -> tuple[str, float] | None:
    """(datasheet name, bf16 dense TFLOP/s) of a CUDA device name; None when not known
    (the table is `mdlm_cli.perf.GPU_PEAKS_TFLOPS`, what training's MFU uses too)."""
    from mdlm_cli.perf import gpu_peak

    peak = gpu_peak(device_name, torch.bfloat16)
    return None if peak is None else (peak.source.split(" datasheet")[0], peak.flops / 1e12)


@dataclass(frozen=True)
class Sizes:
    """Every size the parts use: the GPU run's, or the dry run's (CPU, the test preset)."""

    dry: bool
    preset: str
    vocab: int  # the mask is its last id
    length: int
    parity_batch: int
    train_steps: int
    train_warmup: int
    search_start: int
    search_cap: int
    sample_steps: int
    sample_batches: tuple[int, ...]
    draw_rows: tuple[int, ...]
    draw_repeats: int
    ddp_steps: int

    @property
    def device(self) -> torch.device:
        return torch.device("cpu" if self.dry else "cuda")

    @property
    def mask_id(self) -> int:
        return self.vocab - 1

    @property
    def ids(self) -> SimpleNamespace:
        """All an objective reads of a tokeniser (GPT-2's BOS = EOS is the id before the mask)."""
        return SimpleNamespace(mask_id=self.mask_id, bos_id=self.vocab - 2)


FULL = Sizes(
    dry=False,
    preset="owt",
    vocab=GPT2_VOCAB,
    length=1024,
    parity_batch=2,
    train_steps=10,
    train_warmup=3,
    search_start=16,
    search_cap=1024,
    sample_steps=256,
    sample_batches=(1, 16),
    draw_rows=(1, 4, 64, 8192),
    draw_repeats=20,
    ddp_steps=20,
)
# the dry run: the test preset's 2x64 DiT with a small vocabulary, a few steps of everything;
# a compiled model recompiles once at its second step (the count of masked positions, which the
# output layer sees, becomes dynamic), so the warm-up is at least 2 steps
DRY = Sizes(
    dry=True,
    preset="test",
    vocab=101,
    length=16,
    parity_batch=2,
    train_steps=2,
    train_warmup=2,
    search_start=2,
    search_cap=4,
    sample_steps=4,
    sample_batches=(1, 2),
    draw_rows=(1, 4),
    draw_repeats=2,
    ddp_steps=2,
)


def sizes(dry: bool) -> Sizes:
    return DRY if dry else FULL


def preset_config(sz: Sizes):
    """The preset's resolved config at the check's length (owt: DiT small, 12x768)."""
    from mdlm_cli.build import resolve_config

    return resolve_config(sz.preset, [f"data.length={sz.length}"])


def random_dit(cfg, vocab: int, seed: int = 0) -> torch.nn.Module:
    """The preset's DiT with random weights, on the CPU in fp32, eval mode. The layers the
    reference initialises to zero (adaLN, output) get small noise too, or every logit is 0
    and any two attention paths would agree trivially."""
    from mdlm_cli.models import build_model

    torch.manual_seed(seed)
    model = build_model(cfg.model, vocab)
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.02)
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` calls after one warm-up call."""
    fn()
    seconds = []
    for _ in range(repeats):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


class PartFile:
    """A part's JSON, rewritten after every result so a part stopped at its time limit
    still leaves what it had measured."""

    def __init__(self, out: Path, part: str, **fields):
        self.path = Path(out) / f"{part}.json"
        self.data = {"part": part, "status": "running", **fields}
        self.write()

    def write(self) -> None:
        tmp = self.path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        os.replace(tmp, self.path)

    def update(self, **fields) -> None:
        self.data.update(fields)
        self.write()

    def append(self, key: str, row: dict) -> None:
        self.data.setdefault(key, []).append(row)
        self.write()
