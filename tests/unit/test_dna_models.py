"""The DNA backbones: the Mamba mixer against a naive sequential scan, Caduceus-PS's exact
reverse-complement equivariance (both layouts) and its fused layout against an independent
naive implementation of Caduceus's code, tied tensors in safetensors, Mamba's recurrent cache."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from mdlm_cli import engine
from mdlm_cli.config import ModelConfig
from mdlm_cli.models import build_model
from mdlm_cli.models.tied import canonical_state
from mdlm_cli.objectives.ar import CausalLMAdapter

pytest.importorskip("mambapy", reason="the torch Mamba mixer needs mambapy (pip install mambapy)")

COMP = [0, 1, 2, 3, 4, 5, 6, 10, 9, 8, 7, 11, 12, 13, 14, 15]  # A7<->T10, C8<->G9


def caduceus(**kw) -> torch.nn.Module:
    """float64, except with time conditioning (the DiT's sigma embedding computes in float32)."""
    torch.manual_seed(0)
    cfg = ModelConfig(backbone="caduceus", hidden_size=kw.pop("d", 8), n_blocks=2, dropout=0.0, **kw)
    model = build_model(cfg, 16).eval()
    model = model if cfg.time_conditioning else model.double()
    with torch.no_grad():  # give every parameter (the zero-initialised time modulation too) a generic value
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def dna(B: int = 2, L: int = 13, seed: int = 1) -> torch.Tensor:
    return torch.randint(7, 12, (B, L), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------- naive reference code

def naive_mixer(m, x: torch.Tensor) -> torch.Tensor:
    """mamba-ssm's Mamba forward written out position by position (selective_scan_ref's recurrence)."""
    B, L, _ = x.shape
    xz = x @ m.in_proj.weight.T
    xs, z = xz[..., :m.d_inner], xz[..., m.d_inner:]
    w = m.conv1d.weight[:, 0]  # (E, K)
    K = w.shape[1]
    padded = torch.cat([torch.zeros(B, K - 1, m.d_inner, dtype=x.dtype), xs], dim=1)
    conv = torch.stack([(padded[:, j:j + K] * w.T).sum(1) for j in range(L)], 1) + m.conv1d.bias
    u = conv * torch.sigmoid(conv)
    dbc = u @ m.x_proj.weight.T
    dt, Bm, Cm = dbc[..., :m.dt_rank], dbc[..., m.dt_rank:m.dt_rank + m.d_state], dbc[..., m.dt_rank + m.d_state:]
    delta = torch.log1p(torch.exp(dt @ m.dt_proj.weight.T + m.dt_proj.bias))
    A = -torch.exp(m.A_log)
    h = torch.zeros(B, m.d_inner, m.d_state, dtype=x.dtype)
    ys = []
    for j in range(L):
        h = torch.exp(delta[:, j, :, None] * A) * h + delta[:, j, :, None] * Bm[:, j, None, :] * u[:, j, :, None]
        ys.append((h * Cm[:, j, None, :]).sum(-1) + m.D * u[:, j])
    y = torch.stack(ys, 1) * (z * torch.sigmoid(z))
    return y @ m.out_proj.weight.T


def naive_rms(x, weight, eps=1e-5):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def naive_caduceus_ps_fused(model, tokens: torch.Tensor) -> torch.Tensor:
    """Caduceus-PS with fused_add_norm=True as Caduceus's modeling_rcps.py computes it (halves swapped)."""
    sd = {k: v for k, v in model.state_dict().items()}
    comp = torch.tensor(COMP)
    E = sd["caduceus.backbone.embeddings.word_embeddings.embedding.weight"]
    D = E.shape[1]
    rc_tokens = comp[tokens.flip(-1)]
    hs = torch.cat([E[tokens], E[rc_tokens].flip(-2, -1)], -1)  # RCPSEmbedding
    residual = None
    for i, layer in enumerate(model.caduceus.backbone.layers):
        w = sd[f"caduceus.backbone.layers.{i}.norm.weight"]
        r_f = hs[..., D:] + (residual[..., D:] if residual is not None else 0)
        r_r = hs[..., :D].flip(-2, -1) + (residual[..., :D].flip(-2, -1) if residual is not None else 0)
        hs = torch.cat([naive_rms(r_f, w), naive_rms(r_r, w).flip(-2, -1)], -1)
        residual = torch.cat([r_f, r_r.flip(-2, -1)], -1)
        bi = layer.mixer.submodule

        def bimamba(x, bi=bi):
            return naive_mixer(bi.mamba_fwd, x) + naive_mixer(bi.mamba_rev, x.flip(1)).flip(1)

        hs = torch.cat([bimamba(hs[..., :D]), bimamba(hs[..., D:].flip(-2, -1)).flip(-2, -1)], -1)  # RCPSWrapper
    w = sd["caduceus.backbone.norm_f.weight"]
    f = naive_rms(hs[..., :D] + residual[..., :D], w)
    r = naive_rms(hs[..., D:].flip(-2, -1) + residual[..., D:].flip(-2, -1), w)
    hs = torch.cat([f, r.flip(-2, -1)], -1)
    return hs[..., :D] @ E.T + hs[..., D:].flip(-1) @ E[comp].T  # RCPSLMHead, tied to the embedding


# ----------------------------------------------------------------------------- tests

def test_torch_mixer_matches_a_naive_sequential_scan_forward_and_backward():
    from mdlm_cli.models.mamba_mixer import MambaMixer

    torch.manual_seed(0)
    m = MambaMixer(8, impl="torch").double()
    x = torch.randn(2, 13, 8, dtype=torch.float64, requires_grad=True)  # 13: not a power of two (pscan pads)
    got, want = m(x), naive_mixer(m, x)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    g1 = torch.autograd.grad(got.square().sum(), [x, m.A_log, m.in_proj.weight])
    g2 = torch.autograd.grad(want.square().sum(), [x, m.A_log, m.in_proj.weight])
    assert all(torch.allclose(a, b, atol=1e-10, rtol=1e-8) for a, b in zip(g1, g2, strict=True))


def test_mixer_step_continues_the_parallel_scan():
    from mdlm_cli.models.mamba_mixer import MambaMixer

    torch.manual_seed(0)
    m = MambaMixer(8, impl="torch").double()
    x = torch.randn(2, 9, 8, dtype=torch.float64)
    state = m.new_state(2, x.device, torch.float64)
    prefix = m(x[:, :2], state)  # shorter than the conv window
    steps = [m.step(x[:, j:j + 1], state) for j in range(2, 9)]
    assert torch.allclose(torch.cat([prefix, *steps], 1), m(x), atol=1e-12, rtol=0)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("time", [False, True])
def test_caduceus_ps_is_exactly_reverse_complement_equivariant(fused, time):
    model = caduceus(rcps=True, fused_add_norm=fused, time_conditioning=time, cond_dim=8)
    x, sigma = dna(), (torch.tensor([0.3, 2.0]) if time else None)
    logits = model(x, sigma)
    logits_rc = model(torch.tensor(COMP)[x.flip(-1)], sigma)
    # p(rc x)_l = comp of p(x)_{L-1-l}: equal up to float64 rounding. Bit for bit on some CPUs; on an
    # AMD EPYC the unfused layout's kernels differ by one ulp (1.1e-16), while Ph differs by > 1e-3
    assert torch.allclose(logits_rc.flip(1)[..., COMP], logits, rtol=0, atol=1e-14)


def test_caduceus_ph_is_not_equivariant_and_layouts_differ():
    x = dna()
    ph = caduceus()
    assert (ph(torch.tensor(COMP)[x.flip(-1)]).flip(1)[..., COMP] - ph(x)).abs().max() > 1e-3
    assert (caduceus(rcps=True)(x) - caduceus(rcps=True, fused_add_norm=False)(x)).abs().max() > 1e-3


def test_caduceus_ps_fused_logits_match_an_independent_implementation():
    model = caduceus(rcps=True, fused_add_norm=True)
    x = dna(L=11)
    golden = naive_caduceus_ps_fused(model, x)
    assert torch.allclose(model(x), golden, atol=1e-10, rtol=0)
    mask = torch.rand(x.shape, generator=torch.Generator().manual_seed(3)) < 0.4  # the engine's output_mask
    assert torch.allclose(model(x, output_mask=mask), golden[mask], atol=1e-10, rtol=0)


@pytest.mark.parametrize("rcps", [False, True])
def test_safetensors_round_trip_stores_tied_tensors_once(rcps, tmp_path):
    model = caduceus(rcps=rcps)
    state = model.state_dict()
    assert not any("mamba_rev.in_proj" in k or "mamba_rev.out_proj" in k or "lm_head" in k for k in state)
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "w.safetensors")  # shared memory: refused
    fresh = caduceus(rcps=rcps, d=8)
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    fresh.load_state_dict(load_file(tmp_path / "w.safetensors"))
    x = dna()
    assert torch.equal(fresh(x), model(x))
    assert fresh.caduceus.backbone.layers[0].mixer.__dict__ is not None
    bi = (fresh.caduceus.backbone.layers[0].mixer.submodule if rcps else fresh.caduceus.backbone.layers[0].mixer)
    assert bi.mamba_rev.in_proj.weight is bi.mamba_fwd.in_proj.weight  # still tied after loading
    # a released file that keeps the head's name instead of the embedding's loads too
    emb = [k for k in state if k.endswith("embedding.weight") or k.endswith("word_embeddings.weight")][0]
    released = {("lm_head.lm_head.weight" if rcps else "lm_head.weight") if k == emb else k: v
                for k, v in state.items()}
    fresh.load_state_dict(canonical_state(fresh, released))
    assert torch.equal(fresh(x), model(x))


def test_released_caduceus_folder_loads_without_remote_code(tmp_path):
    """A Hugging Face folder as Caduceus publishes it: model_type caduceus, auto_map to its code,
    `caduceus.*`/`lm_head.*` keys with the complement_map buffers; loaded into mdlm's backbone."""
    from mdlm_cli.checkpoints.load import load_checkpoint

    model = caduceus(rcps=True, d=8).float()
    weights = {k: v.contiguous() for k, v in model.state_dict().items()}
    weights["caduceus.backbone.embeddings.word_embeddings.complement_map"] = torch.tensor(COMP)
    weights["lm_head.complement_map"] = torch.tensor(COMP)
    folder = tmp_path / "caduceus-ps_seqlen-1k_d_model-8_n_layer-2"
    folder.mkdir()
    save_file(weights, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "model_type": "caduceus", "auto_map": {"AutoModelForMaskedLM": "modeling_caduceus.CaduceusForMaskedLM"},
        "d_model": 8, "n_layer": 2, "vocab_size": 16, "rcps": True, "fused_add_norm": True, "rms_norm": True,
        "bidirectional": True, "bidirectional_strategy": "add", "bidirectional_weight_tie": True,
        "ssm_cfg": {"d_state": 16, "d_conv": 4, "expand": 2, "dt_rank": "auto", "conv_bias": True, "bias": False}}))
    loaded = load_checkpoint(str(folder))
    assert loaded.objective.name == "mlm" and loaded.length == 1024 and loaded.tokenizer.name == "dna"
    x = dna()
    assert torch.equal(loaded.model(x), model(x))


def test_mamba_recurrent_cache_matches_the_full_forward_and_samples_one_call_per_token():
    torch.manual_seed(0)
    cfg = ModelConfig(backbone="mamba", hidden_size=16, n_blocks=2, dropout=0.0)
    model = build_model(cfg, 16, causal=True).eval()
    x = dna(B=3, L=12)
    lm = CausalLMAdapter(model, bos_id=2, mask_id=3)
    cache = lm.new_cache(3, 12, torch.device("cpu"))
    pieces = [lm(x[:, :5], cache)] + [lm(x[:, j:j + 1], cache) for j in range(5, 12)]
    assert torch.allclose(torch.cat(pieces, 1), model(x), atol=1e-5, rtol=0)
    tokens, stats = engine.sample(lm, sampler="autoregressive-kv-cache", num_samples=2, length=10, mask_id=3,
                                  generator=torch.Generator().manual_seed(0), return_stats=True)
    assert tokens.shape == (2, 10) and stats.nfe == 10 and not (tokens == 3).any()


def test_zero_initialised_time_modulation_keeps_a_loaded_function():
    plain = caduceus(rcps=True).float()
    timed_cfg = ModelConfig(backbone="caduceus", hidden_size=8, n_blocks=2, dropout=0.0, rcps=True,
                            time_conditioning=True, cond_dim=8)
    timed = build_model(timed_cfg, 16).eval()
    missing, unexpected = timed.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all("time_" in k for k in missing)
    x = dna()
    for sigma in (0.0, 1.5, 6.0):
        assert torch.equal(timed(x, torch.full((2,), sigma)), plain(x))


def test_backbones_honour_the_denoiser_contract():
    from mdlm_cli.engine.schedules import get_schedule
    from mdlm_cli.models import DiffusionDenoiser

    model = caduceus(rcps=True).float()
    den = DiffusionDenoiser(model, get_schedule("loglinear"))
    x0 = dna(B=4, L=16)
    nats = engine.nelbo(den, x0, mask_id=3, masking=engine.Masking(generator=torch.Generator().manual_seed(0)))
    assert nats.shape == (4,) and torch.isfinite(nats).all() and (nats > 0).all()
    z = engine.sample(den, sampler="first-hitting", num_samples=2, length=8, mask_id=3,
                      generator=torch.Generator().manual_seed(0))
    assert z.shape == (2, 8) and not (z == 3).any()
    with torch.no_grad():
        assert math.isfinite(float(F.log_softmax(model(x0), -1).sum()))


def test_init_from_a_checkpoint_without_time_input_keeps_its_function(tmp_path):
    from mdlm_cli.build import resolve_config
    from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.errors import MdlmError
    from mdlm_cli.train.init_from import initialise_from

    tok = load_tokenizer("dna")
    cfg = resolve_config("dna-tiny", ["diffusion.objective=mlm", "model.hidden_size=8", "model.n_blocks=1"])
    torch.manual_seed(0)
    source = build_model(cfg.model, 16).eval()
    data_meta = {"length": 128, "packing": "window", "tokenizer": tok.describe(), "source": {"name": "dna-synthetic"}}
    save_checkpoint(tmp_path / "mlm", 1,
        CheckpointContents(model=source, ema_model=None, optimizer=None, cfg=cfg,
                           state={"step": 1}, tokenizer=tok, data_meta=data_meta))
    timed = resolve_config("dna-tiny", ["model.hidden_size=8", "model.n_blocks=1", "model.time_conditioning=true"])
    target = build_model(timed.model, 16).eval()
    assert "mlm model" in initialise_from(target, str(tmp_path / "mlm"), tok)
    x = dna()
    assert torch.equal(target(x, torch.tensor([0.5, 3.0])), source(x))
    wider = build_model(resolve_config("dna-tiny", ["model.hidden_size=16", "model.n_blocks=1"]).model, 16)
    with pytest.raises(MdlmError, match="has shape"):
        initialise_from(wider, str(tmp_path / "mlm"), tok)
