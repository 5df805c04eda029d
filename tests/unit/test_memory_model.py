"""The memory model's activation coefficients (train/memory_model.py) against what autograd
really keeps for the native LLaDA block, counted with saved-tensor hooks: one block's share
per token, full fine-tuning and LoRA, at several shapes."""

import copy

import pytest
import torch

from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.config import LoraConfig
from mdlm_cli.models.lora import add_lora
from mdlm_cli.train.memory_model import Plan, Shape, block_floats_per_token, estimate
from tests.open_model_folders import write_llada


def saved_floats(model, tokens) -> float:
    """The floats autograd keeps for one training forward (storages counted once, the
    parameters' own excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, total = set(), [0]

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen | params:
            seen.add(storage.data_ptr())
            total[0] += storage.nbytes()
        return t

    model.train()
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(tokens, None, output_mask=mask)
    return total[0] / 4


@pytest.mark.parametrize(("hidden", "mlp"), [(64, 96), (128, 96), (64, 256)])
@pytest.mark.parametrize("rank", [0, 4])
def test_one_blocks_activations_are_the_models(tmp_path, hidden, mlp, rank):
    length, counts = 32, []
    for layers in (2, 3):
        folder = write_llada(tmp_path / f"l{layers}", d_model=hidden, n_layers=layers,
                             n_heads=4, mlp_hidden=mlp, window=length)
        model = load_checkpoint(str(folder)).model.float()
        if rank:
            model = add_lora(copy.deepcopy(model), LoraConfig(rank=rank), "base")
        counts.append(saved_floats(model, torch.randint(0, 80, (1, length))))
    measured = (counts[1] - counts[0]) / length  # one more block, per token
    shape = Shape(hidden, mlp, 2, 96, 0, 0)
    modelled = block_floats_per_token(shape, Plan(1, length, 0, lora_rank=rank))
    assert modelled == pytest.approx(measured, rel=0.05)


def test_the_parts_add_up():
    shape = Shape(hidden=4096, mlp=12288, layers=32, vocab=126464, parameters=8_000_000_000,
                  block_linear=7_000_000_000)
    plan = Plan(rows=1, length=2048, masked=1024, lora_rank=32, lora_parameters=80_000_000,
                checkpointing=True, weight_bytes=2)
    e = estimate(shape, plan)
    assert e.weights == 8_000_000_000 * 2 and e.trainable == 80_000_000 * 4 * 3
    assert e.logits == 1024 * 126464 * 4 * 3
    assert e.activations < estimate(shape, Plan(1, 2048, 1024, lora_rank=32,
                                                lora_parameters=80_000_000)).activations / 10
    qlora = estimate(shape, Plan(1, 2048, 1024, lora_rank=32, lora_parameters=80_000_000,
                                 quantize=True, checkpointing=True, weight_bytes=2))
    assert qlora.weights < e.weights / 2
    chunked = estimate(shape, Plan(1, 2048, 1024, lora_rank=32, lora_parameters=80_000_000,
                                   checkpointing=True, weight_bytes=2, chunk=256))
    assert chunked.logits == 256 * 126464 * 4 * 3 and chunked.weights == e.weights
