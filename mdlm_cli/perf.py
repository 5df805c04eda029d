"""How far from the machine's limit a run is: model FLOPs, the device's peak, and MFU.

Model FLOP utilisation (MFU) = achieved model FLOP/s / the device's peak at the run's precision.
Model FLOPs follow the usual count (Kaplan et al. 2020; PaLM, appendix B): per token, a forward
pass costs 2 N + 4 n_layers L d and a training step three forwards, 6 N + 12 n_layers L d,
where N is the parameters used once per token (every weight but embedding tables: a lookup
costs no multiply) and the L-dependent term the attention scores and values. A training step
counts what the model asks for, not what the kernels did, so a recomputation or the output
layer evaluated only at masked positions does not change it. A sampling call counts the output
layer at the positions the sampler asks for (`ModelFlops.sampling_call`): first-hitting asks
for one, and a GPT-2-vocabulary output layer counted at every position read as MFU over 100%.

The peak: on a CUDA GPU its datasheet figure (dense, no sparsity); on a CPU the speed of a
2,048 x 2,048 matrix product at the run's precision and thread count, measured once and cached
(`peak.json` in the mdlm cache folder), so MFU says how close the run comes to the best
this CPU does on the operation a transformer spends its time in.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import MdlmError
from .runtime import busy_cores

# datasheet dense peaks in TFLOP/s (bf16, tf32), matched on the CUDA device name; the first
# entry whose words all occur in the name wins; (0, 0) = not known (MFU omitted)
GPU_PEAKS_TFLOPS: list[tuple[tuple[str, ...], str, float, float]] = [
    (("H100", "PCIe"), "H100 PCIe", 756.0, 378.0),
    (("H100", "NVL"), "", 0.0, 0.0),
    (("H100",), "H100 SXM", 989.4, 494.7),
    (("H200", "NVL"), "", 0.0, 0.0),
    (("H200",), "H200 SXM", 989.4, 494.7),
    (("A100",), "A100", 312.0, 156.0),
    (("A5000",), "RTX A5000", 111.1, 55.6),
    (("L40S",), "L40S", 362.05, 183.0),
    # with fp32 accumulation (what torch's bf16 matmuls use)
    (("4090",), "RTX 4090", 165.2, 82.6),
]

PROBE_SIZE = 2048


@dataclass(frozen=True)
class Peak:
    """A device's peak FLOP/s at one precision and where the figure comes from."""

    flops: float
    source: str  # "H100 SXM datasheet", "matmul probe (2 threads, bf16)"


def gpu_peak(device_name: str, dtype: torch.dtype | None) -> Peak | None:
    """The datasheet peak of a CUDA device name (bf16, or tf32 for fp32 runs); None if
    unknown."""
    for words, name, bf16, tf32 in GPU_PEAKS_TFLOPS:
        if all(w.lower() in device_name.lower() for w in words):
            peak = bf16 if dtype == torch.bfloat16 else tf32
            kind = "bf16" if dtype == torch.bfloat16 else "tf32"
            return Peak(peak * 1e12, f"{name} datasheet, {kind} dense") if peak > 0 else None
    return None


def matmul_flops(dtype: torch.dtype, size: int = PROBE_SIZE, seconds: float = 0.5) -> float:
    """FLOP/s of the fastest size x size product on the CPU at the current threads, timed for
    `seconds` after as long again of warm-up. The warm-up is by time, not by count: a single
    warm-up product left the cores below their clock and the kernel unpacked, and a probe of
    5 products read 200 GFLOP/s on a CPU that does 340 (training then showed MFU over 100%)."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    best, start = float("inf"), time.perf_counter()
    while best == float("inf") or time.perf_counter() - start < 2 * seconds:
        t0 = time.perf_counter()
        a @ b
        if t0 - start >= seconds:  # past the warm-up
            best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def _cache_file() -> Path:
    return Path(os.environ.get("MDLM_CACHE") or Path.home() / ".cache" / "mdlm") / "peak.json"


def cpu_peak(dtype: torch.dtype | None) -> Peak:
    """The CPU's matmul-probe peak at `dtype` (None = fp32) and torch's current thread count,
    cached per processor, thread count, precision and torch version. A probe taken while other
    processes keep half a core busy or more (`runtime.busy_cores`) is used but not cached: it
    would understate the peak of every later run."""
    dtype = dtype or torch.float32
    threads = torch.get_num_threads()
    kind = "bf16" if dtype == torch.bfloat16 else "fp32"
    processor = platform.processor() or platform.machine()
    key = f"{processor}|{_cpu_model()}|{threads}|{kind}|{torch.__version__}"
    path = _cache_file()
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    source = f"matmul probe, {threads} thread{'s' if threads > 1 else ''}, {kind}"
    if isinstance(cached.get(key), (int, float)):
        return Peak(float(cached[key]), source)
    busy = busy_cores()
    flops = matmul_flops(dtype)
    if busy is not None and busy < 0.5:
        _write_cache(path, {**cached, key: flops})
    return Peak(flops, source)


def _write_cache(path: Path, data: dict) -> None:
    """Best effort (a read-only home only loses the cache), atomic (no half-written file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)
    except OSError:
        pass


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def machine_name() -> str:
    """The CPU as benchmark records name it: its model, its bf16 extensions (AMX, AVX512-BF16:
    what bf16 autocast's speed depends on) and its cores, e.g. "AMD EPYC (avx512_bf16), 2
    cores"."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    flags = [f for f in ("amx_bf16", "avx512_bf16") if f in info]
    return (f"{_cpu_model() or 'unknown CPU'} ({', '.join(flags) or 'no bf16 extensions'}), "
            f"{os.cpu_count()} cores")


def device_peak(device: torch.device, dtype: torch.dtype | None) -> Peak | None:
    """The peak MFU is measured against: MDLM_PEAK_TFLOPS where set (a figure you know), else a
    GPU's datasheet or a CPU's probe; None elsewhere (MPS, an unknown GPU: MFU omitted)."""
    given = os.environ.get("MDLM_PEAK_TFLOPS", "").strip()
    if given:
        try:
            return Peak(float(given) * 1e12, "MDLM_PEAK_TFLOPS")
        except ValueError:
            raise MdlmError(
                f"MDLM_PEAK_TFLOPS must be a number of TFLOP/s (got {given!r})"
            ) from None
    if device.type == "cuda":
        return gpu_peak(torch.cuda.get_device_name(device), dtype)
    if device.type == "cpu":
        return cpu_peak(dtype)
    return None


@dataclass(frozen=True)
class ModelFlops:
    """What the FLOP count needs of a model: weights used per token and its attention's shape."""

    matmul_params: int  # every parameter but embedding lookups
    attention_layers: int = 0
    attention_width: int = 0  # the width of queries and keys (all heads together)
    output_params: int = 0  # the output layer's weights (vocabulary x width), in matmul_params

    def per_token(self, length: int, training: bool = True) -> float:
        """Model FLOPs per token at sequence length `length`: 6 N + 12 n L d for a training step
        (forward + backward), 2 N + 4 n L d for one forward."""
        forward = (2 * self.matmul_params
                   + 4 * self.attention_layers * length * self.attention_width)
        return 3 * forward if training else forward

    def sampling_call(self, tokens: float, length: int, output_rows: float) -> float:
        """Model FLOPs of network calls over `tokens` positions of rows `length` long that ask
        for the output layer at `output_rows` of them (a sampler asks only where it draws: one
        row per call for first-hitting). Counting the output layer everywhere would credit a
        GPT-2-vocabulary model with work it never does (MFU over 100%)."""
        trunk = self.per_token(length, training=False) - 2 * self.output_params
        return trunk * tokens + 2 * self.output_params * output_rows


def mfu(flops_per_s: float, peak: Peak | None) -> float | None:
    return None if peak is None or peak.flops <= 0 else flops_per_s / peak.flops


def mfu_text(value: float | None) -> str:
    return "" if value is None else f"MFU {100 * value:.1f}%"
