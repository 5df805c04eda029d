"""The CPU's bf16 detection, `precision: auto`, model FLOPs, the peak probe and its cache, MFU
in the training log, and the compiled trunk."""

from __future__ import annotations

import json

import pytest
import torch

from mdlm_cli import perf, runtime
from mdlm_cli.config import ModelConfig
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import DiT, Mamba
from mdlm_cli.models.speed import compile_trunk, model_flops, model_width
from mdlm_cli.perf import Peak

CPU = torch.device("cpu")


def fake_cpuinfo(monkeypatch, tmp_path, flags: str) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 {flags}\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda f, *a, **k: real_open(
        info if f == "/proc/cpuinfo" else f, *a, **k))


@pytest.mark.parametrize("flags, fast", [("avx512f amx_bf16 amx_tile", True), ("avx512_bf16", True),
                                         ("avx2 avx512f", False)])
def test_auto_precision_is_bf16_exactly_on_cpus_with_bf16_units(monkeypatch, tmp_path, flags, fast):
    monkeypatch.delenv("MDLM_CPU_BF16", raising=False)
    fake_cpuinfo(monkeypatch, tmp_path, flags)
    assert runtime.cpu_has_fast_bf16() is fast
    assert runtime.autocast_dtype(CPU, "auto") == (torch.bfloat16 if fast else None)
    assert runtime.autocast_dtype(CPU, "fp32") is None  # asked for: fp32 whatever the CPU
    assert runtime.autocast_dtype(CPU, "bf16") == torch.bfloat16


def test_auto_keeps_narrow_models_in_fp32_on_the_cpu(monkeypatch):
    monkeypatch.setenv("MDLM_CPU_BF16", "1")
    assert runtime.autocast_dtype(CPU, "auto", width=64) is None  # measured 2.2x slower in bf16
    assert runtime.autocast_dtype(CPU, "auto", width=128) is None  # measured no faster
    assert runtime.autocast_dtype(CPU, "auto", width=192) == torch.bfloat16  # the demo: 1.26x
    assert runtime.autocast_dtype(CPU, "auto", width=256) == torch.bfloat16
    assert runtime.autocast_dtype(CPU, "bf16", width=64) == torch.bfloat16  # asked for: given
    rt = runtime.Runtime(CPU, None)
    assert rt.for_model("auto", 512).dtype == torch.bfloat16 and rt.for_model("fp32", 512).dtype is None
    assert model_width(tiny_dit()) == 32


def test_the_environment_overrides_the_detection(monkeypatch, tmp_path):
    fake_cpuinfo(monkeypatch, tmp_path, "amx_bf16")
    monkeypatch.setenv("MDLM_CPU_BF16", "0")
    assert runtime.autocast_dtype(CPU, "auto") is None
    fake_cpuinfo(monkeypatch, tmp_path, "avx2")
    monkeypatch.setenv("MDLM_CPU_BF16", "1")
    assert runtime.autocast_dtype(CPU, "auto") == torch.bfloat16


def tiny_dit(causal: bool = False) -> DiT:
    cfg = ModelConfig(hidden_size=32, n_blocks=2, n_heads=2, cond_dim=16, dropout=0.0)
    return DiT(cfg, 40, causal=causal)


def test_model_flops_of_the_dit_count_every_weight_but_the_embedding_table_and_the_attention():
    m = tiny_dit()
    counts = model_flops(m)
    total = sum(p.numel() for p in m.parameters())
    assert counts.matmul_params == total - m.vocab_embed.embedding.numel()
    assert (counts.attention_layers, counts.attention_width) == (2, 32)
    n = counts.matmul_params
    assert counts.per_token(64) == 6 * n + 12 * 2 * 64 * 32
    assert counts.per_token(64, training=False) == 2 * n + 4 * 2 * 64 * 32


def test_a_table_tied_to_the_output_layer_counts_once_and_mamba_has_no_attention():
    cfg = ModelConfig(backbone="mamba", hidden_size=32, n_blocks=2)
    m = Mamba(cfg, 40)
    counts = model_flops(m)
    assert counts.matmul_params == sum(p.numel() for p in m.parameters())  # the table is the head
    assert counts.attention_layers == 0


def test_the_probe_is_cached_per_thread_count_and_precision_and_not_when_the_machine_is_busy(
        monkeypatch, tmp_path):
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(perf, "matmul_flops", lambda dtype: calls.append(dtype) or 1e12)
    monkeypatch.setattr(perf, "busy_cores", lambda: 1.0)  # busy: measured, not kept
    assert perf.cpu_peak(None).flops == 1e12
    assert not (tmp_path / "peak.json").exists()
    monkeypatch.setattr(perf, "busy_cores", lambda: 0.0)
    first = perf.cpu_peak(torch.bfloat16)
    assert "bf16" in first.source and len(calls) == 2
    assert perf.cpu_peak(torch.bfloat16) == first and len(calls) == 2  # from the cache
    perf.cpu_peak(None)
    assert len(calls) == 3 and len(json.loads((tmp_path / "peak.json").read_text())) == 2


def test_the_probe_measures_a_real_product():
    assert 1e8 < perf.matmul_flops(torch.float32, size=256, seconds=0.05) < 1e15


def test_a_given_peak_wins_and_a_bad_one_is_refused(monkeypatch):
    monkeypatch.setenv("MDLM_PEAK_TFLOPS", "2.5")
    assert perf.device_peak(CPU, None) == Peak(2.5e12, "MDLM_PEAK_TFLOPS")
    monkeypatch.setenv("MDLM_PEAK_TFLOPS", "fast")
    with pytest.raises(MdlmError, match="MDLM_PEAK_TFLOPS must be a number"):
        perf.device_peak(CPU, None)


def test_gpu_datasheet_peaks_by_name_and_precision():
    assert perf.gpu_peak("NVIDIA H100 80GB HBM3", torch.bfloat16).flops == pytest.approx(989.4e12)
    assert perf.gpu_peak("NVIDIA H100 PCIe", None).flops == pytest.approx(378e12)
    assert perf.gpu_peak("NVIDIA H100 NVL", torch.bfloat16) is None
    assert perf.gpu_peak("Some GPU", torch.bfloat16) is None
    assert perf.mfu(5e11, Peak(1e12, "x")) == 0.5 and perf.mfu(5e11, None) is None


def test_the_compiled_trunk_keeps_the_weights_names_and_the_outputs():
    m = tiny_dit().eval()
    names = list(m.state_dict())
    tokens, sigma = torch.randint(0, 39, (2, 16)), torch.zeros(2)
    with torch.no_grad():
        eager = m(tokens, sigma)
    assert compile_trunk(m)
    assert list(m.state_dict()) == names
    with torch.no_grad():
        compiled = m(tokens, sigma)
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
    assert not compile_trunk(torch.nn.Linear(2, 2))  # no trunk: the caller compiles it whole


def test_training_logs_tokens_per_second_and_mfu(tmp_path):
    from mdlm_cli.build import resolve_config
    from mdlm_cli.checkpoints.load import load_checkpoint
    from mdlm_cli.train.loop import train

    cfg = resolve_config("test", [f"train.out_dir={tmp_path / 'run'}", "train.max_steps=10"])
    result = train(cfg)
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    logged = [r for r in records if "tokens_per_s" in r]
    # MDLM_PEAK_TFLOPS=1 (conftest): MFU = tokens/s x model FLOPs per token / 1e12
    per_token = model_flops(load_checkpoint(result.checkpoint).model).per_token(cfg.data.length)
    assert len(logged) == 2
    for r in logged:
        assert r["tokens_per_s"] > 0
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * per_token / 1e12)
    assert result.mfu == pytest.approx(result.tokens_per_second * per_token / 1e12)


def test_compiling_on_a_cpu_without_a_cpp_compiler_is_refused_with_the_reason(monkeypatch):
    from mdlm_cli.models import speed

    monkeypatch.setattr(speed.shutil, "which", lambda name: None)
    assert "C++ compiler" in speed.compile_unavailable(torch.device("cpu"))
    assert speed.compile_unavailable(torch.device("cuda")) is None  # not a CPU's question
    monkeypatch.setattr(speed.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert speed.compile_unavailable(torch.device("cpu")) is None
