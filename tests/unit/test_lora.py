"""LoRA adapters (models/lora.py): injected into mdlm's own module, written in peft's folder
format, loaded by peft itself onto the same module with the same logits; merged = unmerged;
an adapter refused on another base; the defaults stay inside the blocks."""

import copy
import re

import pytest
import torch

from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.config import LoraConfig, ModelConfig
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import build_model
from mdlm_cli.models.lora import (
    add_lora,
    block_pattern,
    load_adapter,
    merged,
    trainable,
    write_adapter,
)
from tests.open_model_folders import write_dream, write_llada

peft = pytest.importorskip("peft")


def dit(seed=0):
    torch.manual_seed(seed)
    model = build_model(ModelConfig(hidden_size=32, n_blocks=2, n_heads=2, cond_dim=16,
                                    dropout=0.0), 40).eval()
    with torch.no_grad():  # the DiT's output layer starts at zero: give every weight a value
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-bases")
    return {"dit": dit(),
            "llada": load_checkpoint(str(write_llada(root / "llada"))).model.float().eval(),
            "dream": load_checkpoint(str(write_dream(root / "dream"))).model.float().eval()}


def trained_adapter(base, lora: LoraConfig, seed=1):
    """`base` with adapters whose B is no longer zero (as after training)."""
    model = add_lora(copy.deepcopy(base), lora, "base")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in trainable(model):
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model.eval()


def logits(model, tokens):
    with torch.no_grad():
        return model(tokens, None)


@pytest.mark.parametrize("family", ["dit", "llada", "dream"])
@pytest.mark.parametrize("embeddings", [False, True])
def test_peft_loads_the_adapter_onto_mdlms_module_and_merging_keeps_the_logits(
        bases, tmp_path, family, embeddings):
    base = bases[family]
    adapted = trained_adapter(base, LoraConfig(rank=4, alpha=8, train_embeddings=embeddings))
    tokens = torch.randint(0, base.vocab_size - 1, (2, 12), generator=torch.Generator()
                           .manual_seed(0))
    want = logits(adapted, tokens)
    assert not torch.allclose(want, logits(base, tokens), atol=1e-3)  # the adapter matters
    write_adapter(adapted, tmp_path)
    # peft's own loader, onto a plain copy of mdlm's module
    by_peft = peft.PeftModel.from_pretrained(copy.deepcopy(base), str(tmp_path)).eval()
    torch.testing.assert_close(logits(by_peft, tokens), want)
    merged_in = load_adapter(copy.deepcopy(base), tmp_path)  # what --adapter does
    assert type(merged_in) is type(base)
    assert sorted(merged_in.state_dict()) == sorted(base.state_dict())
    torch.testing.assert_close(logits(merged_in, tokens), want, atol=1e-5, rtol=1e-5)
    folded = merged(copy.deepcopy(adapted))  # export's merge of a trained model
    torch.testing.assert_close(logits(folded, tokens), want, atol=1e-5, rtol=1e-5)


def test_fresh_adapters_keep_the_function_and_only_they_train(bases):
    base = bases["llada"]
    adapted = add_lora(copy.deepcopy(base), LoraConfig(rank=2), "base").eval()
    tokens = torch.arange(10).view(1, 10)
    torch.testing.assert_close(logits(adapted, tokens), logits(base, tokens))  # B = 0
    names = [n for n, _ in trainable(adapted)]
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    # 7 projections a block, A and B each, 2 blocks; never the output layer transformer.ff_out
    assert len(names) == 7 * 2 * 2
    assert not any(n.startswith("model.transformer.ff_out") for n in names)


def test_the_default_targets_stay_inside_the_blocks():
    pattern = block_pattern(("ff_out", "mlp.0"))
    assert re.fullmatch(pattern, "model.transformer.blocks.3.ff_out")
    assert re.fullmatch(pattern, "blocks.0.mlp.0")
    assert not re.fullmatch(pattern, "model.transformer.ff_out")
    assert not re.fullmatch(pattern, "blocks.0.mlp.01")


def test_an_adapter_for_another_base_is_refused(tmp_path):
    adapted = trained_adapter(dit(seed=0), LoraConfig(rank=4))
    write_adapter(adapted, tmp_path)
    with pytest.raises(MdlmError, match="adapter for another base"):
        load_adapter(dit(seed=5), tmp_path)  # same shapes, other weights
    other = build_model(ModelConfig(hidden_size=48, n_blocks=2, n_heads=2, cond_dim=16), 40)
    with pytest.raises(MdlmError, match="does not fit this model") as e:
        load_adapter(other, tmp_path)  # other shapes: peft's size mismatch, in one line
    assert "\n" not in str(e.value)


def test_unknown_targets_and_missing_files_are_one_line(tmp_path):
    with pytest.raises(MdlmError, match="its linear layers are named .*attn_qkv"):
        add_lora(dit(), LoraConfig(rank=2, targets=("q_proj",)), "base")
    with pytest.raises(MdlmError, match="not a LoRA adapter folder"):
        load_adapter(dit(), tmp_path)


@pytest.mark.parametrize("family", ["dit", "llada", "dream"])
def test_embeddings_trained_whole_are_the_ones_the_logits_use(bases, family):
    """peft's copies of the embedding and output layer (modules_to_save) are what the forward
    reads, also where a backbone reads `.weight` itself (LLaDA's and Dream's output layer)."""
    adapted = add_lora(copy.deepcopy(bases[family]), LoraConfig(rank=2, train_embeddings=True),
                       "base").eval()
    copies = [(n, p) for n, p in trainable(adapted) if "modules_to_save" in n
              and n.rsplit(".", 1)[-1] in ("weight", "embedding")]
    assert len(copies) >= 2
    tokens, g = torch.arange(10).view(1, 10), torch.Generator().manual_seed(0)
    for name, p in copies:
        before = logits(adapted, tokens)
        with torch.no_grad():
            p.add_(torch.randn(p.shape, generator=g))
        assert not torch.allclose(logits(adapted, tokens), before, atol=1e-3), name
