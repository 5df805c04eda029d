"""Gradient checkpointing (train.checkpointing) of the LLaDA and Dream backbones: the same loss
and gradients as without it, with adapters too; a backbone without it is refused."""

import copy

import pytest
import torch

from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.config import LoraConfig
from mdlm_cli.errors import MdlmError
from mdlm_cli.models.lora import add_lora
from mdlm_cli.train.setup import _checkpointing
from tests.open_model_folders import write_dream, write_llada
from tests.unit.test_lora import dit


def grads(model, tokens):
    model.train()
    model.zero_grad()
    loss = model(tokens, None).logsumexp(-1).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


@pytest.mark.parametrize("write", [write_llada, write_dream])
@pytest.mark.parametrize("lora", [False, True])
def test_checkpointed_blocks_give_the_same_loss_and_gradients(tmp_path, write, lora):
    base = load_checkpoint(str(write(tmp_path / "m"))).model.float()
    if lora:
        base = add_lora(base, LoraConfig(rank=2), "base")
    plain, recomputed = base, copy.deepcopy(base)
    _checkpointing(recomputed)
    tokens = torch.arange(12).view(2, 6)
    calls = []
    for block in recomputed.blocks:
        block.register_forward_pre_hook(lambda *_: calls.append(1))
    (loss_a, a), (loss_b, b) = grads(plain, tokens), grads(recomputed, tokens)
    assert len(calls) == 2 * len(recomputed.blocks)  # each block run again in the backward pass
    torch.testing.assert_close(loss_a, loss_b)
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name)


def test_a_backbone_without_it_is_refused():
    with pytest.raises(MdlmError, match="does not recompute its blocks"):
        _checkpointing(dit())
