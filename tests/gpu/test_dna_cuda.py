"""The Mamba mixer's two implementations agree on a GPU: mamba-ssm's fused selective scan
(`cuda`) and mambapy's parallel scan (`torch`), forward and backward, and a Caduceus-PS
forward through each. Skipped without CUDA or without mamba-ssm (CI)."""

import pytest
import torch

from mdlm_cli.config import ModelConfig
from mdlm_cli.models import build_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_cuda_and_torch_mixers_agree():
    pytest.importorskip("mamba_ssm", reason="needs mamba-ssm (pip install mamba-ssm)")
    pytest.importorskip("mambapy", reason="needs mambapy")
    from mdlm_cli.models.mamba_mixer import MambaMixer

    torch.manual_seed(0)
    m = MambaMixer(64, impl="cuda").cuda()
    x = torch.randn(2, 1000, 64, device="cuda", requires_grad=True)
    fast = m(x)
    (g_fast,) = torch.autograd.grad(fast.square().sum(), [x])
    m.impl = "torch"
    ref = m(x)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), [x])
    assert torch.allclose(fast, ref, atol=1e-4, rtol=1e-3)
    assert torch.allclose(g_fast, g_ref, atol=1e-3, rtol=1e-2)


def test_caduceus_ps_forward_agrees_across_mixers():
    pytest.importorskip("mamba_ssm", reason="needs mamba-ssm (pip install mamba-ssm)")
    torch.manual_seed(0)
    cfg = ModelConfig(backbone="caduceus", hidden_size=64, n_blocks=2, dropout=0.0, rcps=True, mixer="cuda")
    model = build_model(cfg, 16).cuda().eval()
    x = torch.randint(7, 11, (2, 512), device="cuda")
    fast = model(x)
    for module in model.modules():
        if hasattr(module, "impl"):
            module.impl = "torch"
    assert torch.allclose(fast, model(x), atol=1e-3, rtol=1e-3)
