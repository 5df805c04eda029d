"""Attention-mask annealing (DiffuLLaMA; models/anneal.py, train.attention_anneal_steps): a
training pass attends through the causal mask OR a Bernoulli(ratio) mask, one draw shared by the
batch. At ratio 0 the training forward is the causal model's, at ratio 1 the full model's; in
between the random share matches the ratio and no query loses its own key. Evaluation (eval
mode) never anneals. Backbones and objectives that cannot anneal are refused in one line."""

import pytest
import torch

from mdlm_cli.build import config_from_dict, resolve_config
from mdlm_cli.checkpoints.convert import ConvertRequest, convert
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.config import ModelConfig
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import DiT
from mdlm_cli.models.anneal import AttentionAnneal, anneal_ratio, set_attention_anneal
from mdlm_cli.models.decoder_layers import restricted_keys

from ..causal_lm_folders import ARCHS, write_causal_lm

TOL = 1e-5


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Each tiny source converted with full attention (the anneal's end)."""
    base = tmp_path_factory.mktemp("anneal")
    out = {}
    for arch in ARCHS:
        convert(ConvertRequest(str(write_causal_lm(base / f"src-{arch}", arch)), base / arch))
        out[arch] = load_checkpoint(base / arch).model.float()
    return out


def tokens_and_padding(mask_id: int):
    g = torch.Generator().manual_seed(3)
    x = torch.randint(1, 80, (3, 12), generator=g)
    x[:, 5] = mask_id
    padding = torch.ones(3, 12, dtype=torch.long)
    padding[1, 9:] = 0  # a row with padded keys
    return x, padding


def training_forward(model, x, padding, anneal=None, attention="full"):
    """The training-mode forward (dropout on: the same torch seed for every call compared)."""
    model.attention = attention
    set_attention_anneal(model, anneal)
    model.train()
    torch.manual_seed(0)
    try:
        return model(x, None, attention_mask=padding)
    finally:
        model.attention = "full"
        set_attention_anneal(model, None)
        model.eval()


def test_the_ratio_rises_with_the_step_to_one():
    assert [anneal_ratio(s, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("arch", ARCHS)
def test_ratio_zero_is_the_causal_model_and_ratio_one_the_full_one(converted, arch):
    model = converted[arch]
    x, padding = tokens_and_padding(model.raw["mask_token_id"])
    causal = training_forward(model, x, padding, attention="causal")
    full = training_forward(model, x, padding)
    at_zero = training_forward(model, x, padding, AttentionAnneal(0.0))
    at_one = training_forward(model, x, padding, AttentionAnneal(1.0))
    assert torch.allclose(at_zero, causal, atol=TOL) and torch.allclose(at_one, full, atol=TOL)
    assert not torch.allclose(causal, full, atol=1e-3)  # the two ends differ: the test can fail
    gen = torch.Generator().manual_seed(1)
    between = training_forward(model, x, padding, AttentionAnneal(0.5, gen))
    assert torch.isfinite(between).all()
    assert not torch.allclose(between, causal, atol=1e-3)
    assert not torch.allclose(between, full, atol=1e-3)


@pytest.mark.parametrize("arch", ARCHS)
def test_evaluation_ignores_the_anneal(converted, arch):
    model = converted[arch].eval()
    x, padding = tokens_and_padding(model.raw["mask_token_id"])
    with torch.no_grad():
        own = model(x, None, attention_mask=padding)
        set_attention_anneal(model, AttentionAnneal(0.0))
        try:
            annealed = model(x, None, attention_mask=padding)
        finally:
            set_attention_anneal(model, None)
    assert torch.equal(own, annealed)


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
def test_the_random_share_matches_the_ratio_and_every_query_keeps_its_key(ratio):
    L = 200
    allowed = AttentionAnneal(ratio, torch.Generator().manual_seed(0)).allowed(L, "cpu")
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    assert bool(allowed[causal].all())  # the causal pairs always, the diagonal with them
    share = allowed[~causal].float().mean().item()  # 19,900 draws: sd <= 0.0036
    assert abs(share - ratio) < 0.015
    padding = torch.ones(2, L, dtype=torch.long)
    padding[0, 1:] = 0  # a row whose every key but the first is padded
    keys = restricted_keys(allowed, padding)  # (2, 1, L, L)
    assert keys.shape == (2, 1, L, L) and bool(keys.any(-1).all())  # no empty row: no NaN
    assert bool(keys[1, 0].eq(allowed).all())  # one draw for the whole batch


def test_the_draws_follow_the_generator():
    def draw(seed):
        return AttentionAnneal(0.5, torch.Generator().manual_seed(seed)).allowed(16, "cpu")

    assert torch.equal(draw(1), draw(1)) and not torch.equal(draw(1), draw(2))


def tiny_dit(causal: bool) -> DiT:
    torch.manual_seed(0)
    model = DiT(ModelConfig(hidden_size=32, n_blocks=2, n_heads=4, cond_dim=16, dropout=0.0),
                11, causal=causal)
    with torch.no_grad():  # break adaLN-zero so outputs depend on inputs
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, 0.1)
    return model


def test_the_dit_anneals_between_its_causal_and_full_attention():
    full, causal = tiny_dit(False), tiny_dit(True)
    causal.load_state_dict(full.state_dict())
    x = torch.randint(0, 10, (2, 10), generator=torch.Generator().manual_seed(0))
    padding = torch.ones(2, 10, dtype=torch.long)
    padding[0, 7:] = 0
    full.train()
    with torch.no_grad():
        plain, own_causal = full(x, None, padding), causal(x, None, padding)
        set_attention_anneal(full, AttentionAnneal(0.0))
        at_zero = full(x, None, padding)
        set_attention_anneal(full, AttentionAnneal(1.0))
        at_one = full(x, None, padding)
    real = padding.bool()  # a padded query keeps its own key here, not in the causal DiT
    assert torch.allclose(at_zero[real], own_causal[real], atol=TOL)
    assert torch.equal(at_one, plain)
    assert not torch.allclose(plain, own_causal, atol=1e-3)


@pytest.mark.parametrize("case", ["negative", "backbone", "causal-objective", "bd3lm"])
def test_annealing_is_refused_where_it_cannot_apply(case):
    sets = {"negative": ["train.attention_anneal_steps=-1"],
            "backbone": None,
            "causal-objective": ["train.attention_anneal_steps=10", "diffusion.objective=ar"],
            "bd3lm": ["train.attention_anneal_steps=10", "diffusion.objective=bd3lm",
                      "diffusion.block_size=8"]}[case]
    with pytest.raises(MdlmError) as e:
        if sets is None:  # a backbone that does not anneal (hf-mlm: transformers' own attention)
            config_from_dict({"model": {"backbone": "hf-mlm", "hf_model": "bert-base-uncased"},
                              "train": {"attention_anneal_steps": 10}})
        else:
            resolve_config("test", sets)
    assert "attention_anneal_steps" in str(e.value) and "\n" not in str(e.value)


def test_the_default_is_off_and_a_dit_run_accepts_it():
    assert resolve_config("test").train.attention_anneal_steps == 0
    assert resolve_config("test", ["train.attention_anneal_steps=5"]).train.attention_anneal_steps \
        == 5
