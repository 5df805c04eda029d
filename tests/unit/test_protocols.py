"""The written contracts: every backbone provides the `Backbone` members, the objectives'
adapters declare what the engine reads through the `Denoiser` helpers, and `unwrap` finds the
module under torch.compile's wrapper."""

import inspect

import pytest
import torch

from mdlm_cli.build import resolve_config
from mdlm_cli.engine.protocols import CausalLM, is_time_agnostic, score_method, supports_output_mask
from mdlm_cli.engine.schedules import LogLinear
from mdlm_cli.models import BACKBONES, Backbone, DiffusionDenoiser, build_model, unwrap
from mdlm_cli.objectives.ar import CausalLMAdapter
from mdlm_cli.objectives.sedd import ScoreDenoiser

REQUIRED = [name for name in vars(Backbone) if not name.startswith("_")]  # its methods


@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_every_backbone_has_the_members_of_the_contract(name):
    cls = BACKBONES[name]
    missing = [member for member in ["config_keys", *REQUIRED] if not hasattr(cls, member)]
    assert not missing, missing
    assert isinstance(cls.config_keys, tuple) and all(k in resolve_config("test").model.__dict__
                                                      for k in cls.config_keys)
    call = inspect.signature(cls.forward).parameters
    assert list(call)[:3] == ["self", "tokens", "sigma"]
    assert {"attention_mask", "output_mask"} <= set(call)


def test_a_built_backbone_and_its_adapters_keep_the_contracts():
    cfg = resolve_config("test")
    model = build_model(cfg.model, 35)
    assert isinstance(model.vocab_size, int) and model.causal is False
    assert model.config.hidden_size == cfg.model.hidden_size
    plain = DiffusionDenoiser(model, LogLinear())
    timed = DiffusionDenoiser(model, LogLinear(), time_conditioning=True)
    assert is_time_agnostic(plain) and not is_time_agnostic(timed) and supports_output_mask(plain)
    assert score_method(plain) is None
    assert score_method(ScoreDenoiser(model, LogLinear())) is not None
    assert not is_time_agnostic(object()) and not supports_output_mask(lambda z, t: z)
    lm = CausalLMAdapter(build_model(cfg.model, 35, causal=True), bos_id=0, mask_id=34)
    methods = [m for m in vars(CausalLM) if not m.startswith("_")]
    members = [*CausalLM.__annotations__, *methods, "__call__"]
    assert all(hasattr(lm, m) for m in members), members


def test_unwrap_finds_the_module_under_torch_compile():
    model = torch.nn.Linear(2, 2)
    compiled = torch.compile(model)
    assert unwrap(compiled) is model and unwrap(model) is model
