"""Every objective of the registry honours the contract the train loop, eval-ppl, the
samplers and checkpoints rely on; a new objective is covered by adding it to OBJECTIVES."""

import json
import math
import warnings

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from mdlm_cli import engine
from mdlm_cli.build import resolve_config
from mdlm_cli.checkpoints.folder import load_run_folder
from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
from mdlm_cli.config import ModelConfig
from mdlm_cli.data.store import TokenSplit
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.engine.block_sampling import BlockRows
from mdlm_cli.engine.categorical import sample_tokens
from mdlm_cli.engine.errors import EngineError
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import DiT, build_model
from mdlm_cli.objectives import OBJECTIVES, SplitSweep, get_objective, objectives_served_by

from ..analytic import AnalyticDenoiser
from ..objective_configs import overrides as objective_overrides
from .test_sampling import chi2_pvalue

TOK = load_tokenizer("char")  # vocab 35, mask 4, BOS 2
CPU = torch.device("cpu")


def setup(name: str, **overrides):
    cfg = resolve_config("test", [*objective_overrides(name), *(f"{k}={v}" for k, v in overrides.items())])
    objective = get_objective(cfg, TOK)
    torch.manual_seed(0)
    model = build_model(cfg.model, TOK.vocab_size, causal=objective.causal)
    with torch.no_grad():  # break the zero-initialised output so that the loss depends on the weights
        model.output_layer.linear.weight.normal_(0, 0.3)
    return cfg, objective, model


def batch(B: int = 3, L: int = 32) -> torch.Tensor:
    return torch.randint(8, 35, (B, L), generator=torch.Generator().manual_seed(1))  # real characters


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_loss_terms_are_nats_per_sequence_with_gradients(name):
    cfg, objective, model = setup(name)
    x0 = batch()
    t = objective.draw_times(cfg.diffusion.T)(3, torch.Generator().manual_seed(0)) if objective.uses_time else None
    terms = objective.loss_terms(objective.denoiser(model), x0, t, generator=torch.Generator().manual_seed(2),
                                 attention_mask=None)
    assert terms.shape == (3,) and torch.isfinite(terms).all() and (terms >= 0).all()
    terms.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_loss_terms_targets_cover_only_the_target_positions(name):
    """`targets`: None is every real token (bit for bit); none scored is zero; the context is
    attended (it changes the targets' terms) but not scored (its own tokens are free)."""
    _, objective, model = setup(name)
    with torch.no_grad():  # the zero-initialised adaLN gates would keep the positions apart
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    den = objective.denoiser(model.eval())
    x0 = batch()
    t = objective.draw_times(0)(3, torch.Generator().manual_seed(0)) if objective.uses_time else None
    targets = torch.zeros_like(x0, dtype=torch.bool)
    targets[:, 20:] = True

    def terms(x, targets):
        with torch.no_grad():
            return objective.loss_terms(den, x, t, generator=torch.Generator().manual_seed(2), attention_mask=None,
                                        targets=targets)

    if not objective.scores_targets:  # declared: a one-line refusal, never a wrong number
        with pytest.raises(MdlmError, match="no likelihood of chosen positions"):
            terms(x0, targets)
        return
    assert torch.equal(terms(x0, None), terms(x0, torch.ones_like(targets)))
    assert torch.equal(terms(x0, torch.zeros_like(targets)), torch.zeros(3))
    scored = terms(x0, targets)
    assert (scored > 0).all() and (scored < terms(x0, None)).all()
    other_context = x0.clone()
    other_context[:, 5] = 8 + (x0[:, 5] - 7) % 27  # another real character
    assert not torch.equal(terms(other_context, targets), scored)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_greedy_tokens_are_the_argmax_at_target_positions(name):
    _, objective, model = setup(name)
    den = objective.denoiser(model.eval())
    x0 = batch()
    targets = torch.zeros_like(x0, dtype=torch.bool)
    targets[:, 28:] = True
    with torch.no_grad():
        best = objective.greedy_tokens(den, x0, targets)
    assert torch.equal(best[~targets], x0[~targets])
    assert ((best[targets] != TOK.mask_id) & (best[targets] >= 0) & (best[targets] < TOK.vocab_size)).all()


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_evaluation_passes_and_exactness(name):
    _, objective, model = setup(name)
    split = TokenSplit(batch(5).numpy(), np.array([32, 32, 32, 32, 20], dtype=np.int32))
    results = objective.evaluate(objective.denoiser(model.eval()), split, SplitSweep(2, CPU), seeds=[0, 1, 2])
    assert len(results) == (1 if objective.exact else 3)  # an exact likelihood needs one pass
    assert all(r.exact == objective.exact and r.tokens == 4 * 32 + 20 and r.sequences == 5 for r in results)
    assert all(math.isfinite(r.nats_per_token) for r in results)


def test_every_sampler_serves_an_objective():
    """The engine names no objective: what ties a sampler to the models it samples is the
    objectives' `sampler_names`, checked here and not at import."""
    unserved = [name for name in engine.SAMPLERS if not objectives_served_by(name)]
    assert not unserved, unserved
    declared = {n for cls in OBJECTIVES.values() for n in cls.sampler_names}
    assert declared <= set(engine.SAMPLERS), declared - set(engine.SAMPLERS)


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_samplers_are_the_objectives_own_and_run(name):
    cfg, objective, model = setup(name)
    names = [spec.name for spec in objective.samplers]
    assert names == list(OBJECTIVES[name].sampler_names) and len(set(names)) == len(names)
    assert all(n in engine.SAMPLERS for n in names)  # every name it declares is a sampler
    if not objective.default_sampler:  # an objective declared without samplers (mlm)
        assert names == []
        return
    assert objective.default_sampler in names
    denoiser = objective.denoiser(model.eval())
    if getattr(objective, "samples_by_blocks", False):  # bd3lm: its own block-by-block loop
        with pytest.raises(EngineError, match="block by block"):
            engine.sample(denoiser, sampler=objective.default_sampler, num_samples=2, length=8,
                          mask_id=TOK.mask_id, steps=5)
        for spec in objective.samplers:
            rows = BlockRows(2, cfg.data.length)
            out = objective.sample(model, engine.SamplingSettings(spec.name, 5), rows,
                                   generator=torch.Generator().manual_seed(0))
            assert out.tokens.shape == (2, cfg.data.length) and not (out.tokens == TOK.mask_id).any()
        return
    for spec in objective.samplers:
        tokens = engine.sample(denoiser, sampler=spec.name, num_samples=2, length=cfg.data.length,
                               mask_id=TOK.mask_id, steps=5, schedule=objective.schedule,
                               generator=torch.Generator().manual_seed(0))
        assert tokens.shape == (2, cfg.data.length) and not (tokens == TOK.mask_id).any(), spec.name


@pytest.mark.parametrize("name", list(OBJECTIVES))
def test_checkpoint_round_trip_keeps_objective_and_logits(name, tmp_path):
    cfg, objective, model = setup(name)
    data_meta = {"length": cfg.data.length, "packing": cfg.data.packing, "tokenizer": TOK.describe(),
                 "source": {"name": "bigtxt"}}
    save_checkpoint(tmp_path / "run", 3,
        CheckpointContents(model=model, ema_model=None, optimizer=None, cfg=cfg, state={"step": 3},
                           tokenizer=TOK, data_meta=data_meta))
    meta = json.loads(next((tmp_path / "run" / "checkpoints").glob("step-*/model.json")).read_text())
    assert meta["schema_version"] == 2 and meta["causal"] == objective.causal and meta["objective"] == name
    loaded = load_run_folder(tmp_path / "run")
    assert loaded.objective.name == name and loaded.model.causal == objective.causal
    x = batch(2)
    assert torch.equal(loaded.model(x), model.eval()(x))


def test_version_1_checkpoints_are_upgraded(tmp_path):
    """A folder as mdlm wrote it before schema_version (model.json = the DiT's config) still loads."""
    cfg, objective, model = setup("ar")
    step = tmp_path / "run" / "checkpoints" / "step-00000003"
    step.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, step / "model.safetensors")
    import yaml

    from mdlm_cli.build import config_dict

    legacy = config_dict(cfg)  # as a checkpoint saves it
    del legacy["model"]["mlp_ratio"], legacy["model"]["backbone"]  # keys the old config did not have
    (step / "config.yaml").write_text(yaml.safe_dump(legacy))
    (step / "model.json").write_text(json.dumps({"vocab_size": 35, "hidden_size": 64, "n_blocks": 2, "n_heads": 2,
                                                 "cond_dim": 32, "mlp_ratio": 4, "dropout": 0.0, "causal": True}))
    (step / "state.json").write_text(json.dumps({"step": 3}))
    (step / "data.json").write_text(json.dumps({"length": 32, "packing": "chunk", "tokenizer": TOK.describe()}))
    TOK.save(step / "tokenizer")
    (tmp_path / "run" / "latest").write_text("step-00000003\n")
    loaded = load_run_folder(tmp_path / "run")
    assert loaded.objective.name == "ar" and loaded.model.causal and loaded.config.model.mlp_ratio == 4
    x = batch(2)
    assert torch.equal(loaded.model(x), model.eval()(x))
    (step / "model.json").write_text(json.dumps({"vocab_size": 35, "causal": False}))  # contradicts the objective
    with pytest.raises(MdlmError, match="causal=False.*inconsistent"):
        load_run_folder(tmp_path / "run")


def test_objective_config_checks():
    with pytest.raises(MdlmError, match="no time input"):
        resolve_config("demo-ar", ["model.time_conditioning=true"])
    with pytest.raises(MdlmError, match="diffusion.T does not apply"):
        resolve_config("demo-ar", ["diffusion.T=10"])
    with pytest.raises(MdlmError, match="diffusion.T must be 0"):
        resolve_config("demo", ["diffusion.T=-1"])
    with pytest.raises(MdlmError, match="diffusion.carry_over does not apply to the mlm objective"):
        resolve_config("test", ["diffusion.objective=mlm", "diffusion.carry_over=false"])  # no switch ignored
    with pytest.raises(MdlmError, match="diffusion.objective must be one of"):
        resolve_config("demo", ["diffusion.objective=sdd"])


def test_one_model_config_builds_the_backbone():
    cfg = ModelConfig(hidden_size=32, n_blocks=3, n_heads=4, cond_dim=8, mlp_ratio=2)
    model = build_model(cfg, 17, causal=True)
    from mdlm_cli.models.dit import DiTConfig  # the DiT's own keys, read out of the flat section

    assert model.config == DiTConfig(hidden_size=32, n_blocks=3, n_heads=4, cond_dim=8, mlp_ratio=2)
    assert isinstance(model, DiT) and model.vocab_size == 17 and model.causal
    assert model.blocks[0].mlp[0].out_features == 2 * 32 and len(model.blocks) == 3


# ----------------------------------------------------------------------------- the engine contract

def test_a_plain_callable_declared_time_agnostic_gets_the_cache():
    den = AnalyticDenoiser.random(length=4, vocab=3, seed=1)

    def plain(z, t):  # no attributes: nothing is guessed
        return den(z, t)

    kw = dict(sampler="ancestral-cache", num_samples=16, length=4, mask_id=den.mask_id, steps=200)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _, fallback = engine.sample(plain, generator=torch.Generator().manual_seed(0), return_stats=True, **kw)
    assert any("falling back to ancestral" in str(w.message) for w in caught)
    plain.time_agnostic = True  # a plain function declares it by the attribute
    _, declared = engine.sample(plain, generator=torch.Generator().manual_seed(0), return_stats=True, **kw)
    assert declared.nfe <= 4 < fallback.nfe  # a call only where a sequence changes


def test_the_exact_draw_honours_float64_logits():
    """Logits offset by 2^24 are exact in float64 and lose their differences in float32: the
    draw must normalise them in float64."""
    probs = torch.tensor([0.6, 0.3, 0.1 - 1e-3, 1e-3], dtype=torch.float64)
    logits = torch.cat([probs.log(), torch.tensor([-math.inf], dtype=torch.float64)]) + 2.0 ** 24  # + the mask
    draws = sample_tokens(logits.expand(200_000, -1), 4, generator=torch.Generator().manual_seed(0))
    assert chi2_pvalue(torch.bincount(draws, minlength=4).double(), probs) > 1e-3


def test_subs_log_probs_in_one_buffer_matches_the_definition():
    logits = torch.randn(2, 6, 9, dtype=torch.bfloat16)
    z = torch.tensor([[8, 1, 8, 3, 8, 8], [0, 8, 8, 8, 2, 8]])
    got = engine.subs_log_probs(logits, z, 8)
    expected = logits.float().index_fill(-1, torch.tensor([8]), -math.inf).log_softmax(-1)
    carried = z != 8
    expected[carried] = torch.full((9,), -math.inf).expand(int(carried.sum()), -1).scatter(-1, z[carried][:, None], 0.0)
    assert got.dtype == torch.float32 and torch.equal(got, expected)
