"""Device, precision and seeding: chosen once, passed explicitly."""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import torch

from .errors import MdlmError


def pick_device(name: str = "auto") -> torch.device:
    """`auto` picks cuda > mps > cpu; anything else must be available."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if (getattr(torch.backends, "mps", None) is not None
                and torch.backends.mps.is_available()):
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise MdlmError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MdlmError(f"device {name!r} asked for but CUDA is not available; use --device cpu")
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise MdlmError(f"device {name!r} does not exist: {count} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise MdlmError("device 'mps' asked for but MPS is not available; use --device cpu")
    return device


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware: AMX-BF16 (Sapphire Rapids and
    later) or AVX512-BF16 (Cooper Lake, Zen 4 and later), from /proc/cpuinfo's flags. On such a
    CPU a matrix product runs 2-7x faster in bf16 than in fp32 (BENCHMARKS.md, table 13);
    elsewhere bf16 is emulated and slower. MDLM_CPU_BF16=1 or 0 overrides the answer."""
    forced = os.environ.get("MDLM_CPU_BF16", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        with open("/proc/cpuinfo") as f:
            flag_lines = (line for line in f if line.startswith("flags"))
            flags = next((line.split(":", 1)[1].split() for line in flag_lines), [])
    except OSError:  # not Linux: no detection, fp32
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


# the narrowest model `auto` runs in bf16 on a CPU: measured on 2 cores with AMX (BENCHMARKS.md,
# table 13), a 4 x 256 DiT trains 1.65x faster in bf16, a 4 x 192 one 1.26x, a 4 x 128 one no
# faster and a 2 x 64 one 2.2x slower (its matrix products are too small for the bf16 units to
# pay for the conversions around them)
CPU_BF16_MIN_WIDTH = 192


def autocast_dtype(device: torch.device, precision: str = "auto",
                   width: int | None = None) -> torch.dtype | None:
    """The autocast dtype of a precision: `auto` is bf16 on CUDA GPUs that have it and on CPUs
    with bf16 matrix units (`cpu_has_fast_bf16`) for models at least `CPU_BF16_MIN_WIDTH` wide
    (`width`: the hidden size; None = wide enough), fp32 (no autocast) elsewhere. Under bf16
    autocast the weights, optimizer state, loss reduction and log-probabilities stay fp32 and
    the categorical draws fp64; only the network's matrix products run in bf16."""
    if precision == "fp32":
        return None
    if precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise MdlmError("this GPU does not support bf16; use --set train.precision=fp32")
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    wide = width is None or width >= CPU_BF16_MIN_WIDTH
    return torch.bfloat16 if device.type == "cpu" and wide and cpu_has_fast_bf16() else None


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from several parts (run seed, step, purpose): stateless RNG streams
    make a resumed run draw exactly what the uninterrupted run would have drawn."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


# torch's default (physical cores), before anything changes it
TORCH_THREADS = torch.get_num_threads()


def busy_cores(window: float = 0.2) -> float | None:
    """How many cores other processes keep busy now: the non-idle share of /proc/stat's CPU time
    over `window` seconds, while this process sleeps. Unlike the load average (a one-minute
    mean), it does not count a job that has just ended (`make test` before `make demo`), so an
    idle machine gets all its cores. None where /proc/stat is unreadable."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        # all, idle + iowait
        return sum(fields), fields[3] + (fields[4] if len(fields) > 4 else 0)

    try:
        total0, idle0 = sample()
        time.sleep(window)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    spent = total1 - total0
    return (1 - (idle1 - idle0) / spent) * (os.cpu_count() or 1) if spent > 0 else 0.0


def default_threads() -> int | None:
    """CPU threads when none are asked for: None (torch's own) where OMP_NUM_THREADS or
    MKL_NUM_THREADS says, else torch's default less the cores other processes keep busy now
    (`busy_cores`; the load average where /proc/stat is missing), at least 1. Measured on a
    shared 2-core machine at load 11-15 (BENCHMARKS.md, table 6): 2 threads sampled 10.8x and
    trained 3.4x slower than 1, each parallel region waiting at its barrier for a thread that is
    not running."""
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        return None
    cores = TORCH_THREADS
    busy = busy_cores()
    if busy is None:
        try:
            busy = os.getloadavg()[0]
        except (OSError, AttributeError):  # no load average on this platform
            return None
    return max(1, min(cores, round(cores - busy)))


@dataclass
class Runtime:
    device: torch.device
    dtype: torch.dtype | None  # autocast dtype, None = fp32

    @classmethod
    def create(cls, device: str = "auto", precision: str = "auto", threads: int = 0) -> Runtime:
        """`threads` > 0 sets torch's CPU threads; 0 takes `default_threads()`."""
        threads = threads if threads > 0 else default_threads()
        if threads:
            torch.set_num_threads(threads)
        dev = pick_device(device)
        if dev.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        return cls(dev, autocast_dtype(dev, precision))

    def for_model(self, precision: str, width: int | None) -> Runtime:
        """This runtime with the autocast dtype `precision` gives a model `width` wide."""
        return Runtime(self.device, autocast_dtype(self.device, precision, width))

    def describe(self) -> str:
        dtype = "bf16 autocast" if self.dtype == torch.bfloat16 else "fp32"
        on_cuda = self.device.type == "cuda"
        name = torch.cuda.get_device_name(self.device) if on_cuda else self.device.type
        threads = f", {torch.get_num_threads()} threads" if self.device.type == "cpu" else ""
        return f"{name} ({dtype}{threads}, torch {torch.__version__})"
