"""The CUDA training path and the draws on the device: bf16 gradients against fp32, a compiled
model's loss and gradients against eager ones, flash-attn against SDPA, the fp64 draw's
frequencies (and its never-drawn mask) on CUDA, samplers repeatable per seed, and a few steps
of the training loop on CUDA whose checkpoint loads on the CPU.

Skipped where no CUDA device exists (CI); run on a GPU machine with `pytest tests/gpu`.
"""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.build import resolve_config
from mdlm_cli.engine.categorical import sample_tokens
from mdlm_cli.models import DiT, dit
from mdlm_cli.objectives import get_objective

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

V, L = 101, 64
ROOT = Path(__file__).resolve().parents[2]


def random_dit(causal: bool = False) -> DiT:
    """The test preset's shape at 2x128, every layer random (the zero-initialised ones too)."""
    cfg = resolve_config("test", ["model.hidden_size=128", "model.n_heads=4"]).model
    torch.manual_seed(0)
    m = DiT(cfg, V, causal=causal)
    with torch.no_grad():
        for p in m.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.05)
    return m.cuda()


def objective():
    return get_objective(resolve_config("test"), SimpleNamespace(mask_id=V - 1, bos_id=V - 2))


def loss_and_grad(net, params, dtype, seed: int = 0) -> tuple[float, torch.Tensor]:
    """The MDLM training loss of a fixed batch, and its flattened gradient."""
    obj = objective()
    g = torch.Generator(device="cuda").manual_seed(seed)
    x0 = torch.randint(0, V - 1, (8, L), device="cuda", generator=g)
    t = obj.draw_times(0, True)(8, g)
    loss = (
        obj.loss_terms(obj.denoiser(net, dtype), x0, t, generator=g, attention_mask=None).sum()
        / x0.numel()
    )
    grads = torch.autograd.grad(loss, params)
    return loss.item(), torch.cat([x.flatten() for x in grads])


@pytest.fixture
def fp32_matmuls():
    """TF32 off: fp32 means fp32 (mdlm's runtime turns TF32 on for training)."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_bf16_gradients_follow_fp32(fp32_matmuls):
    m = random_dit()
    params = list(m.parameters())
    loss32, grad32 = loss_and_grad(m, params, None)
    loss16, grad16 = loss_and_grad(m, params, torch.bfloat16)
    assert abs(loss16 - loss32) < 0.02 * loss32
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.99


def test_compiled_model_trains_like_eager(fp32_matmuls):
    """`train.compile`: torch.compile of the whole model (the masked-position gather breaks
    the graph; the second call recompiles with a dynamic count), same loss and gradient."""
    m = random_dit()
    params = list(m.parameters())
    eager_loss, eager_grad = loss_and_grad(m, params, None)
    compiled = torch.compile(m)
    for seed in (1, 2):  # the first compilation and the dynamic-shape recompilation
        loss_and_grad(compiled, params, None, seed)
    loss, grad = loss_and_grad(compiled, params, None)
    assert abs(loss - eager_loss) < 1e-4 * abs(eager_loss)
    assert torch.allclose(grad, eager_grad, atol=1e-5, rtol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attn_matches_sdpa(causal, monkeypatch):
    if dit.flash_attn_func is None:
        pytest.skip("needs flash-attn (pip install flash-attn)")
    m = random_dit(causal).eval()
    x = torch.randint(0, V - 1, (2, 256), device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        flash = m(x).float()
        monkeypatch.setattr(dit, "flash_attn_func", None)
        sdpa = m(x).float()
    assert (flash - sdpa).abs().max() < 0.02 * sdpa.abs().max() + 0.02


@pytest.mark.parametrize("precision", engine.PRECISIONS)
def test_draws_on_cuda_follow_the_probabilities(precision):
    """200,000 draws from one row of logits: frequencies within 5 standard errors of the
    SUBS probabilities, and the mask (a class in the middle, weight 0) never drawn, also
    where CUDA's parallel running sum rounds."""
    mask_id = 50
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(1, V, device="cuda", generator=g) * 2
    probs = logits.clone()
    probs[0, mask_id] = float("-inf")
    probs = probs.softmax(-1)[0].double()
    n = 200_000
    tokens = sample_tokens(logits.expand(n, V), mask_id, generator=g, precision=precision)
    freq = torch.bincount(tokens, minlength=V).double() / n
    assert freq[mask_id] == 0
    se = (probs * (1 - probs) / n).sqrt()
    assert ((freq - probs).abs() <= 5 * se + 1e-6).all()


@pytest.mark.parametrize("sampler", ["ancestral", "ancestral-cache", "first-hitting"])
def test_cuda_samples_repeat_per_seed(sampler):
    den = objective().denoiser(random_dit().eval(), torch.bfloat16)

    def draw():
        return engine.sample(
            den,
            sampler=sampler,
            num_samples=4,
            length=L,
            mask_id=V - 1,
            steps=16,
            generator=torch.Generator(device="cuda").manual_seed(3),
            device="cuda",
        )

    first = draw()
    assert first.is_cuda and not (first == V - 1).any()
    assert torch.equal(first, draw())


def test_training_loop_on_cuda(tmp_path):
    """A few steps of the training loop on CUDA (bf16 autocast, fused AdamW, accumulation),
    then the checkpoint loads on the CPU and its model runs there."""
    from mdlm_cli.checkpoints.load import load_checkpoint
    from mdlm_cli.train.loop import train

    corpus = tmp_path / "corpus.txt"
    corpus.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    cfg = resolve_config(
        "test",
        [
            f"data.dataset={corpus}",
            "train.device=cuda",
            "train.max_steps=4",
            f"train.out_dir={tmp_path / 'run'}",
            "train.save_every=4",
            "train.eval_every=100",
        ],
    )
    result = train(cfg)
    assert result.step == 4 and all(torch.isfinite(torch.tensor(result.losses)))
    loaded = load_checkpoint(tmp_path / "run", device="cpu")
    x = torch.randint(0, loaded.tokenizer.vocab_size - 1, (2, cfg.data.length))
    with torch.no_grad():
        assert torch.isfinite(loaded.model(x)).all()
