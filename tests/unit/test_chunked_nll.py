"""The loss of the folder backbones (LLaDA, Dream, GPT-2) in chunks: `forward(..., nll_of=)`
gives the -log p of the masked targets that the full logits give, and the same gradients, with
no tensor of more than NLL_CHUNK rows of logits kept for the backward pass; the training loss
(engine.nelbo_terms) takes that path for them and the DiT keeps its own."""

import pytest
import torch

import mdlm_cli.models.open_weights as open_weights
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.engine.diffusion import Masking, masked_nll, nelbo_terms
from mdlm_cli.engine.protocols import computes_nll
from mdlm_cli.engine.schedules import get_schedule
from tests.open_model_folders import write_dream, write_llada
from tests.unit.test_lora import dit


def problem(loaded, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randint(5, loaded.model.vocab_size - 1, (3, 16), generator=g)
    masked = torch.rand(3, 16, generator=g) < 0.6
    return x0, x0.masked_fill(masked, loaded.mask_id), masked


def grads_of(model, value):
    model.zero_grad()
    value.sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("write", [write_llada, write_dream])
def test_chunks_give_the_full_logits_nll_and_gradients(tmp_path, write, monkeypatch):
    loaded = load_checkpoint(str(write(tmp_path / "m")))
    model = loaded.model.float().train()
    x0, z, masked = problem(loaded)
    full = masked_nll(model(z, None, output_mask=masked), x0[masked], loaded.mask_id)
    want = grads_of(model, full)
    monkeypatch.setattr(open_weights, "NLL_CHUNK", 5)  # N = masked.sum() ~ 29: six chunks
    assert int(masked.sum()) > 3 * 5
    shapes = []

    def pack(t):
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunked = model(z, None, output_mask=masked, nll_of=(x0[masked], loaded.mask_id))
    vocab = model.vocab_size
    # the backward pass keeps at most a chunk's rows of logits (the states, not the logits)
    assert not any(len(s) == 2 and s[-1] >= vocab and s[0] > 5 for s in shapes), shapes
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)
    got = grads_of(model, chunked)
    assert got.keys() == want.keys() and got
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)


def test_the_training_loss_takes_the_chunks_for_folder_backbones_only(tmp_path, monkeypatch):
    """engine.nelbo_terms asks a folder backbone for -log p in chunks (its chunked_nll runs, a
    chunk at a time) and gets the full logits' values; without the declaration it does not."""
    loaded = load_checkpoint(str(write_llada(tmp_path / "m")))
    denoiser = loaded.denoiser()
    assert computes_nll(denoiser) and not computes_nll(dit_denoiser())
    monkeypatch.setattr(open_weights, "NLL_CHUNK", 5)
    pieces = []
    piece = open_weights.ReleasedBackbone._nll_piece
    monkeypatch.setattr(open_weights.ReleasedBackbone, "_nll_piece",
                        lambda self, h, y, m: pieces.append(len(h)) or piece(self, h, y, m))
    x0, _, _ = problem(loaded)
    schedule = get_schedule("linear")
    t = torch.tensor([0.3, 0.6, 0.9])
    chunked = nelbo_terms(denoiser, x0, t, mask_id=loaded.mask_id, schedule=schedule,
                          masking=Masking(generator=torch.Generator().manual_seed(1)))
    assert len(pieces) > 2 and max(pieces) <= 5  # the loss came in chunks of at most 5
    pieces.clear()
    denoiser.__class__ = type("Plain", (denoiser.__class__,), {"computes_nll": False})
    plain = nelbo_terms(denoiser, x0, t, mask_id=loaded.mask_id, schedule=schedule,
                        masking=Masking(generator=torch.Generator().manual_seed(1)))
    assert not pieces  # the full logits, then masked_nll
    torch.testing.assert_close(chunked, plain, rtol=1e-5, atol=1e-5)


def dit_denoiser():
    from mdlm_cli.models import DiffusionDenoiser

    return DiffusionDenoiser(dit(), get_schedule("loglinear"))
