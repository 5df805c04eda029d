import pytest
import torch

from mdlm_cli.config import ModelConfig
from mdlm_cli.engine.schedules import LogLinear
from mdlm_cli.models import DiffusionDenoiser, DiT

V = 11
SMALL = ModelConfig(hidden_size=768, n_blocks=12, n_heads=12, cond_dim=128)  # the paper's DiT small


def tiny(causal: bool = False) -> DiT:
    cfg = ModelConfig(hidden_size=32, n_blocks=2, n_heads=4, cond_dim=16, dropout=0.0)
    model = DiT(cfg, V, causal=causal)
    # break adaLN-zero / zero output init so outputs depend on inputs
    with torch.no_grad():
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.1)
    return model.eval()


def test_reference_module_tree_and_shapes():
    m = DiT(SMALL, 50258)
    sd = m.state_dict()
    expected = {
        "vocab_embed.embedding": (50258, 768),
        "sigma_map.mlp.0.weight": (128, 256),
        "sigma_map.mlp.2.weight": (128, 128),
        "blocks.0.norm1.weight": (768,),
        "blocks.0.attn_qkv.weight": (2304, 768),
        "blocks.0.attn_out.weight": (768, 768),
        "blocks.0.norm2.weight": (768,),
        "blocks.0.mlp.0.weight": (3072, 768),
        "blocks.0.mlp.2.bias": (768,),
        "blocks.11.adaLN_modulation.weight": (4608, 128),
        "output_layer.norm_final.weight": (768,),
        "output_layer.linear.weight": (50258, 768),
        "output_layer.adaLN_modulation.weight": (1536, 128),
    }
    for key, shape in expected.items():
        assert tuple(sd[key].shape) == shape, key
    assert "blocks.0.attn_qkv.bias" not in sd and "blocks.0.norm1.bias" not in sd
    assert round(m.num_parameters() / 1e6, 1) == 169.6  # REFERENCE §6


def test_zero_initialised_output():
    m = DiT(ModelConfig(hidden_size=32, n_blocks=1, n_heads=2, cond_dim=8), V)
    out = m(torch.randint(0, V, (2, 5)))
    assert out.shape == (2, 5, V) and torch.all(out == 0)


def test_output_mask_selects_rows():
    m = tiny()
    x = torch.randint(0, V, (3, 7))
    om = torch.rand(3, 7) < 0.5
    full = m(x)
    assert torch.allclose(m(x, output_mask=om), full[om], atol=1e-5)


def test_padding_mask_invariance():
    """Real positions must not see what sits in the padding."""
    m = tiny()
    x = torch.randint(0, V, (1, 8))
    am = torch.tensor([[1, 1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    y = x.clone()
    y[0, 5:] = torch.randint(0, V, (3,))
    a, b = m(x, attention_mask=am), m(y, attention_mask=am)
    assert torch.allclose(a[0, :5], b[0, :5], atol=1e-5)
    assert not torch.allclose(m(x)[0, :5], m(y)[0, :5], atol=1e-5)  # without the mask they would


def test_bidirectional_and_causal():
    x = torch.randint(0, V, (1, 6))
    y = x.clone()
    y[0, -1] = (y[0, -1] + 1) % V
    bi, causal = tiny(), tiny(causal=True)
    assert not torch.allclose(bi(x)[0, 0], bi(y)[0, 0])  # the first position sees the last
    assert torch.allclose(causal(x)[0, :-1], causal(y)[0, :-1], atol=1e-6)


def test_deterministic_in_eval_and_dropout_in_train():
    m = DiT(ModelConfig(hidden_size=32, n_blocks=2, n_heads=4, cond_dim=16, dropout=0.5), V)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.1)
    x = torch.randint(0, V, (2, 6))
    m.eval()
    assert torch.equal(m(x), m(x))
    m.train()
    assert not torch.equal(m(x), m(x))


def test_time_conditioning_on_and_off():
    m = tiny()
    sched = LogLinear()
    x = torch.randint(0, V, (2, 6))
    off = DiffusionDenoiser(m, sched, time_conditioning=False)
    on = DiffusionDenoiser(m, sched, time_conditioning=True)
    t1, t2 = torch.full((2,), 0.2), torch.full((2,), 0.9)
    assert torch.equal(off(x, t1), off(x, t2))  # time is ignored, not fed as noise
    assert not torch.allclose(on(x, t1), on(x, t2))


def test_bad_head_count():
    with pytest.raises(ValueError):
        DiT(ModelConfig(hidden_size=30, n_heads=4), V)
