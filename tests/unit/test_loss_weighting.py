"""diffusion.loss_weighting (docs/conversion.md, "Loss weighting"): the default trains on the
NELBO exactly as before; `cart` weights each masked token by Dream's CART, checked against a
hand computation on a hand-made row; the bound evaluation reports is the NELBO either way."""

import math

import pytest
import torch

from mdlm_cli.build import resolve_config
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.engine.diffusion import Masking, cart_terms, cart_weights
from mdlm_cli.engine.schedules import get_schedule
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import build_model
from mdlm_cli.objectives import get_objective

TOK = load_tokenizer("char")
V = TOK.vocab_size


def objective_and_model(*sets):
    cfg = resolve_config("test", list(sets))
    objective = get_objective(cfg, TOK)
    torch.manual_seed(0)
    model = build_model(cfg.model, V)
    with torch.no_grad():  # the zero-initialised output would make every loss log(V - 1)
        model.output_layer.linear.weight.normal_(0, 0.3)
    return objective, objective.denoiser(model)


def terms(objective, denoiser, method):
    x0 = torch.randint(8, 35, (3, 32), generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0.2, 0.5, 0.9])
    return getattr(objective, method)(denoiser, x0, t, generator=torch.Generator().manual_seed(2),
                                      attention_mask=None)


def test_the_default_trains_on_the_bound_bit_for_bit():
    objective, denoiser = objective_and_model()
    assert torch.equal(terms(objective, denoiser, "training_terms"),
                       terms(objective, denoiser, "loss_terms"))


def test_cart_changes_the_training_loss_but_not_the_bound():
    nelbo, denoiser = objective_and_model()
    cart, _ = objective_and_model("diffusion.loss_weighting=cart")
    assert torch.equal(terms(cart, denoiser, "loss_terms"), terms(nelbo, denoiser, "loss_terms"))
    trained = terms(cart, denoiser, "training_terms")
    assert not torch.allclose(trained, terms(nelbo, denoiser, "loss_terms"))
    assert torch.isfinite(trained).all() and (trained > 0).all()


class Uniform:
    """Zero logits: -log p = log(V - 1) at every masked position (SUBS drops the mask)."""

    def __init__(self):
        self.seen = None

    def __call__(self, z_t, t, **_):
        self.seen = z_t
        return torch.zeros(*z_t.shape, V)


@pytest.mark.parametrize("padded", [False, True])
def test_cart_on_a_hand_made_row(padded):
    """Positions 1, 2, 4 masked, 0, 3, 5 clean (5 padding in the second case), p = 1/2:
    w_n = 1/2 sum over clean i of (1/2)^|n - i|."""
    masked = torch.tensor([[False, True, True, False, True, False]])
    real = torch.tensor([[1, 1, 1, 1, 1, 0 if padded else 1]])
    by_hand = ([0.375, 0.375, 0.28125] if padded  # (1/2 + 1/4)/2, (1/4 + 1/2)/2, (1/16 + 1/2)/2
               else [0.40625, 0.4375, 0.53125])  # the same, plus 1/16, 1/8, 1/2 from position 5
    weights = cart_weights(masked, real.bool() & ~masked, 0.5)
    assert weights[masked].tolist() == by_hand and (weights[~masked] == 0).all()
    # the loss: x0 masked at t = 1 on its targets (rate 0.999: all three here), each token's
    # log(V - 1) weighted
    denoiser, x0 = Uniform(), torch.tensor([[10, 11, 12, 13, 14, 15]])
    got = cart_terms(denoiser, x0, torch.ones(1), mask_id=TOK.mask_id,
                     schedule=get_schedule("linear", 1e-3), p=0.5,
                     masking=Masking(torch.Generator().manual_seed(0), real, masked))
    assert torch.equal(denoiser.seen == TOK.mask_id, masked)
    assert math.isclose(got.item(), sum(by_hand) * math.log(V - 1), rel_tol=1e-6)


def test_cart_weighs_at_most_one_and_less_far_from_context():
    masked = torch.zeros(1, 64, dtype=torch.bool)
    masked[0, 10:50] = True
    w = cart_weights(masked, ~masked, 0.3)[0]
    assert w.max() <= 1 and w[10] > w[20] > w[30] > 0 and math.isclose(w[30], w[29], rel_tol=0.2)


@pytest.mark.parametrize("sets, says", [
    (["diffusion.loss_weighting=dream"], "diffusion.loss_weighting must be one of: nelbo, cart"),
    (["diffusion.loss_weighting=cart", "diffusion.cart_p=0"], "diffusion.cart_p"),
    (["diffusion.cart_p=0.5"], "read by diffusion.loss_weighting=cart only"),
    (["diffusion.loss_weighting=cart", "diffusion.objective=sedd"],
     "diffusion.loss_weighting does not apply to the sedd objective"),
])
def test_bad_weightings_are_refused_in_one_line(sets, says):
    with pytest.raises(MdlmError, match=says):
        resolve_config("test", sets)
