"""The CUDA path: bf16 autocast, SDPA / flash attention, compiled trunk, device generators.

Skipped where no CUDA device exists (CI); run on a GPU machine with `pytest tests/gpu`.
"""

import warnings

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.config import ModelConfig
from mdlm_cli.engine.schedules import LogLinear
from mdlm_cli.models import DiffusionDenoiser, DiT
from mdlm_cli.objectives import OBJECTIVES

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

V, L = 101, 64


def model(device="cuda"):
    torch.manual_seed(0)
    m = DiT(ModelConfig(hidden_size=128, n_blocks=2, n_heads=4, cond_dim=32, dropout=0.0), V)
    with torch.no_grad():
        for p in m.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.05)
    return m.to(device).eval()


def test_bf16_matches_fp32_on_cuda():
    m = model()
    x = torch.randint(0, V - 1, (4, L), device="cuda")
    ref = DiffusionDenoiser(m, LogLinear())(x, torch.rand(4, device="cuda")).float()
    bf16 = DiffusionDenoiser(m, LogLinear(), autocast_dtype=torch.bfloat16)(x, torch.rand(4, device="cuda")).float()
    assert (bf16 - ref).abs().max() < 0.1 * ref.abs().max() + 0.05


def test_cuda_matches_cpu():
    m = model()
    x = torch.randint(0, V - 1, (2, L))
    cpu = model("cpu")(x)
    gpu = m(x.cuda()).cpu()
    assert torch.allclose(cpu, gpu, atol=1e-3, rtol=1e-3)


def test_nelbo_and_samplers_on_cuda():
    den = DiffusionDenoiser(model(), LogLinear(), autocast_dtype=torch.bfloat16)
    x0 = torch.randint(0, V - 1, (8, L), device="cuda")
    g = torch.Generator(device="cuda").manual_seed(0)
    assert torch.isfinite(engine.nelbo(den, x0, mask_id=V - 1, masking=engine.Masking(generator=g))).all()
    for sampler in OBJECTIVES["mdlm"].sampler_names:
        tokens = engine.sample(den, sampler=sampler, num_samples=4, length=L, mask_id=V - 1, steps=20,
                               generator=g, device="cuda")
        assert tokens.is_cuda and not (tokens == V - 1).any()


def test_compiled_trunk_matches_eager():
    m = model()
    x = torch.randint(0, V - 1, (2, L), device="cuda")
    eager = m(x)
    m.trunk = torch.compile(m.trunk, mode="reduce-overhead")
    for _ in range(3):  # warm-up and capture
        compiled = m(x)
    assert torch.allclose(eager, compiled, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("sampler", ["ancestral", "ancestral-cache", "first-hitting"])
def test_fp64_samplers_synchronise_once_per_network_call(sampler):
    """The one host synchronisation a network call needs is the DiT's output gather (how
    many positions unmask is data-dependent); the rows to evaluate, the step lists and
    the token writes stay on the device. A few more per batch set the loop up. The rows
    hold different numbers of masks, so they finish at different steps."""
    den = DiffusionDenoiser(model(), LogLinear())
    g = torch.Generator(device="cuda").manual_seed(0)
    prompt = torch.full((4, L), V - 1, device="cuda")
    for r in range(4):
        prompt[r, :8 * r] = r  # r x 8 fixed tokens
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            _, stats = engine.sample(den, sampler=sampler, num_samples=4, length=L, mask_id=V - 1, steps=50,
                                     prompt=prompt, generator=g, device="cuda", return_stats=True)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = sum("synchroniz" in str(w.message) for w in caught)
    assert 0 < syncs <= stats.calls + 10, (syncs, stats.calls)
