"""Block diffusion (BD3-LM): the block attention mask, and the two limits the paper states as
equalities of the loss on the same weights: L' = L is MDLM, L' = 1 is the AR NLL."""

import pytest
import torch
import torch.nn.functional as F

from mdlm_cli.build import resolve_config
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.engine.block_sampling import BlockRows
from mdlm_cli.engine.blocks import block_attention_mask, block_rates
from mdlm_cli.engine.diffusion import without_mask
from mdlm_cli.engine.settings import SamplingSettings
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import build_model
from mdlm_cli.objectives import get_objective

TOK = load_tokenizer("char")  # mask 4
L = 32  # the test preset's row length


def setup(objective: str, *extra: str, causal: bool = False):
    cfg = resolve_config("test", [f"diffusion.objective={objective}", *extra])
    torch.manual_seed(0)
    model = build_model(cfg.model, TOK.vocab_size, causal=causal)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # every weight off its initialisation: the gates and output take part
        for _, p in sorted(model.named_parameters()):
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return cfg, get_objective(cfg, TOK), model.eval()


def rows(B: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    x0 = torch.randint(8, 35, (B, L), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones(B, L, dtype=torch.bool)
    attention_mask[-1, 20:] = False  # a padded row
    return x0, attention_mask


def test_block_attention_mask_is_the_papers_for_8_tokens_in_blocks_of_2():
    # a row per query (x_t 0..7, then x0 0..7), a column per key: q = an x_t key, x = an x0 key
    rows_ = [
        "qq...... ........", "qq...... ........",
        "..qq.... xx......", "..qq.... xx......",
        "....qq.. xxxx....", "....qq.. xxxx....",
        "......qq xxxxxx..", "......qq xxxxxx..",
        "........ xx......", "........ xx......",
        "........ xxxx....", "........ xxxx....",
        "........ xxxxxx..", "........ xxxxxx..",
        "........ xxxxxxxx", "........ xxxxxxxx",
    ]
    want = torch.tensor([[c != "." for c in r.replace(" ", "")] for r in rows_])
    assert torch.equal(block_attention_mask(8, 2), want)


def test_block_size_of_the_row_is_mdlm_on_the_same_weights():
    """One block: x_t attends x_t alone, so the loss is MDLM's at the same t and x_t."""
    _, mdlm, model = setup("mdlm")
    _, bd3lm, _ = setup("bd3lm", f"diffusion.block_size={L}")
    x0, attention_mask = rows()
    t = torch.tensor([0.2, 0.55, 0.9])
    with torch.no_grad():
        want = mdlm.loss_terms(mdlm.denoiser(model), x0, t,
                               generator=torch.Generator().manual_seed(2),
                               attention_mask=attention_mask)
        got = bd3lm.loss_terms(bd3lm.denoiser(model), x0, t[:, None],
                               generator=torch.Generator().manual_seed(2),
                               attention_mask=attention_mask)
    assert (want > 0).all()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def ar_token_nll(causal_model, x0: torch.Tensor) -> torch.Tensor:
    """-log p(x_l | x_<l) (B, L) of a causal model reading x_<l and a mask at l: one pass per
    position, nothing shared with the block pass."""
    out = torch.zeros(x0.shape)
    for pos in range(x0.shape[1]):
        z = x0.clone()
        z[:, pos] = TOK.mask_id
        logits = without_mask(causal_model(z)[:, pos], TOK.mask_id)
        out[:, pos] = F.cross_entropy(logits, x0[:, pos], reduction="none")
    return out


def test_block_size_1_is_the_exact_ar_nll_of_the_same_weights():
    """The paper's single-token case: at L' = 1 the NELBO equals the AR NLL in expectation; at t = 1
    (every token masked, weight 1: the reference's L' = 1 likelihood, what eval-ppl reports)
    it is that NLL exactly. And at any t each masked token's term is w(t) times its AR term,
    so E[term] = P(masked) w(t) AR = (1 - eps) AR under the log-linear schedule."""
    cfg, bd3lm, model = setup("bd3lm", "diffusion.block_size=1")
    causal = build_model(cfg.model, TOK.vocab_size, causal=True)
    causal.load_state_dict(model.state_dict())
    x0, _ = rows()
    draw = bd3lm.draw_times(0)
    with torch.no_grad():
        ar = ar_token_nll(causal.eval(), x0)
        t_one = draw(3, torch.Generator().manual_seed(0))
        assert bd3lm.exact and torch.equal(t_one, torch.ones(3, L))
        exact = bd3lm.loss_terms(bd3lm.denoiser(model), x0, t_one, generator=None,
                                 attention_mask=None)
        torch.testing.assert_close(exact, ar.sum(1), rtol=1e-5, atol=1e-5)
        t = bd3lm.training_times(0)(3, torch.Generator().manual_seed(1))  # (0, 1): the NELBO
        terms = bd3lm.token_terms(bd3lm.denoiser(model), x0, t,
                                  generator=torch.Generator().manual_seed(2), attention_mask=None)
    _, weight = block_rates(t, bd3lm.schedule, 1)
    masked = terms != 0
    assert 0 < masked.sum() < masked.numel()
    torch.testing.assert_close(terms[masked] / weight[masked], ar[masked], rtol=1e-5, atol=1e-5)


def test_block_times_one_per_block_on_the_clipped_interval():
    _, bd3lm, _ = setup("bd3lm", "diffusion.block_size=4", "diffusion.clip_min=0.3",
                        "diffusion.clip_max=0.8")
    train = bd3lm.training_times(0)(64, torch.Generator().manual_seed(0))
    bound = bd3lm.draw_times(0)(64, torch.Generator().manual_seed(0))
    assert train.shape == bound.shape == (64, L // 4)
    assert train.min() >= 0.3 and train.max() <= 0.8
    assert bound.min() < 0.05 and bound.max() > 0.95  # the bound: the whole interval


@pytest.mark.parametrize("overrides, message", [
    (["diffusion.objective=bd3lm", "diffusion.block_size=5"], "divisor of data.length"),
    (["diffusion.objective=bd3lm"], "divisor of data.length"),
    (["diffusion.block_size=8"], "does not apply to the mdlm objective"),
    (["diffusion.objective=bd3lm", "diffusion.block_size=8", "diffusion.clip_min=1"],
     "block size 1 only"),
    (["diffusion.objective=bd3lm", "diffusion.block_size=8", "diffusion.clip_min=0.6",
      "diffusion.clip_max=0.5"], "must not exceed"),
    (["diffusion.objective=bd3lm", "diffusion.block_size=8", "model.time_conditioning=true"],
     "time_conditioning=false"),
])
def test_config_checks(overrides, message):
    with pytest.raises(MdlmError, match=message):
        resolve_config("test", overrides)


def test_cached_and_recomputed_block_sampling_draw_the_same_tokens():
    """The finished blocks' keys and values never change (block-causal attention), so the cache
    is exact: the same tokens under one generator, past the training length too."""
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")

    def draw(cache: bool):
        return bd3lm.sample(model, SamplingSettings(steps=4), BlockRows(3, 2 * L + 8),
                            cache=cache, generator=torch.Generator().manual_seed(0))

    cached, recomputed = draw(True), draw(False)
    assert cached.tokens.shape == (3, 2 * L + 8) and not (cached.tokens == TOK.mask_id).any()
    assert torch.equal(cached.tokens, recomputed.tokens)
    assert not cached.ended.any() and (cached.lengths == 2 * L + 8).all()
    assert len(set(cached.tokens.flatten().tolist())) > 5  # draws, not one repeated token


def test_block_sampling_stops_once_every_row_has_drawn_eos():
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")
    eos = TOK.eos_id
    with torch.no_grad():  # EOS likely, not certain: rows end in different blocks
        model.output_layer.linear.bias[eos] += 3.0
    out = bd3lm.sample(model, SamplingSettings(steps=4), BlockRows(4, 4 * L, eos_id=eos),
                       generator=torch.Generator().manual_seed(1))
    assert out.ended.all() and out.tokens.shape[1] < 4 * L and out.tokens.shape[1] % 4 == 0
    for row, n in zip(out.tokens, out.lengths.tolist(), strict=True):
        assert row[n - 1] == eos and not (row[: n - 1] == eos).any()
    last_block = out.tokens[:, -4:]
    assert (last_block == eos).any(dim=1).any()  # the block in which the last row ended


def test_rows_shorter_than_the_model_length_take_their_first_blocks_times():
    """lm-eval's rows end anywhere: a partial last block is a block too."""
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=8")
    x0, _ = rows()
    t = bd3lm.draw_times(0)(3, torch.Generator().manual_seed(0))  # (3, 4): the model length's
    with torch.no_grad():
        short = bd3lm.token_terms(bd3lm.denoiser(model), x0[:, :21], t,
                                  generator=torch.Generator().manual_seed(2), attention_mask=None)
    assert short.shape == (3, 21) and torch.isfinite(short).all() and (short.sum(1) > 0).all()
    with pytest.raises(MdlmError, match="longer than"):
        bd3lm.token_terms(bd3lm.denoiser(model), torch.cat([x0, x0], 1), t, generator=None,
                          attention_mask=None)


def test_mfu_and_the_memory_check_count_the_2L_training_pass(monkeypatch):
    """bd3lm's training pass runs x_t ⊕ x_0 (2L positions per row of L tokens): the model
    FLOPs per token and the memory check's activations are those of 2L, not L."""
    from types import SimpleNamespace

    from mdlm_cli import memory
    from mdlm_cli.models.speed import model_flops
    from mdlm_cli.objectives import OBJECTIVES
    from mdlm_cli.train import setup
    from mdlm_cli.train.memory_check import check_train_memory

    cfg = resolve_config("test", ["diffusion.objective=bd3lm", "diffusion.block_size=8"])
    assert OBJECTIVES["bd3lm"].pass_factor == 2 and OBJECTIVES["mdlm"].pass_factor == 1
    model = build_model(cfg.model, 35)
    rt, dist = SimpleNamespace(device=torch.device("cpu"), dtype=None), SimpleNamespace(
        world_size=1)
    L = cfg.data.length
    speed = setup._speed(cfg, model, rt, dist, OBJECTIVES["bd3lm"].pass_factor)
    assert speed.flops_per_token == 2 * model_flops(model).per_token(2 * L)
    lengths = []
    real = memory.footprint
    monkeypatch.setattr(memory, "footprint", lambda **kw: lengths.append(kw["length"]) or
                        real(**kw))
    check_train_memory(cfg)
    assert lengths == [2 * L]
