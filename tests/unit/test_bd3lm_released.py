"""The released BD3-LM folders (formats/bd3lm_hf.py) load natively as mdlm bd3lm models: their
logits equal the released module's forward (transcribed in tests/bd3lm_released.py) on the same
weights, at training (x_t ⊕ x0) and at sampling time; the folder's code is never run; what
mdlm cannot honour is refused in one line naming the key."""

import sys

import pytest
import torch

from mdlm_cli.checkpoints.formats.base import Found
from mdlm_cli.checkpoints.formats.registry import FORMATS
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.config import ModelConfig
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import DiT
from mdlm_cli.objectives.bd3lm import CachedBlocks, RecomputedBlocks

from ..bd3lm_released import (
    GPT2_VOCAB,
    released_config,
    released_logits,
    released_weights,
    save_released_folder,
)

MASK = GPT2_VOCAB - 1  # GPT-2's mask: the id after its 50257 tokens (the reference's mask_index)


def noisy_pair(length: int, seed: int = 0, rows: int = 2):
    gen = torch.Generator().manual_seed(seed)
    x0 = torch.randint(0, MASK, (rows, length), generator=gen)
    z_t = x0.masked_fill(torch.rand(rows, length, generator=gen) < 0.5, MASK)
    return z_t, x0


def test_released_folder_loads_as_a_bd3lm_model_without_running_its_code(tmp_path):
    folder = save_released_folder(tmp_path / "bd3lm-owt-block_size4")
    loaded = load_checkpoint(folder)
    # its modeling_bd3lm.py / configuration_bd3lm.py raise on import: none of them ran
    assert not any(name.split(".")[-1].endswith("_bd3lm") for name in sys.modules)
    found = Found.at(folder, "x")
    assert [name for name, fmt in FORMATS.items() if fmt.detect(found)][0] == "bd3lm-hf"
    cfg = loaded.config
    assert loaded.objective.name == "bd3lm" and cfg.diffusion.block_size == 4
    assert cfg.data.length == loaded.length == 64 and cfg.data.tokenizer == "gpt2"
    assert loaded.tokenizer.vocab_size == GPT2_VOCAB and loaded.mask_id == MASK
    assert (cfg.diffusion.clip_min, cfg.diffusion.clip_max) == (0.3, 0.8)  # the weights' buffers
    assert cfg.data.dataset == "openwebtext" and not cfg.model.time_conditioning
    assert (cfg.model.hidden_size, cfg.model.n_blocks, cfg.model.n_heads, cfg.model.cond_dim) == \
        (32, 2, 4, 16)
    weights = released_weights()
    ours = loaded.model.state_dict()
    assert set(ours) == {k.removeprefix("backbone.") for k in weights
                         if k.startswith("backbone.") and not k.endswith("inv_freq")}
    assert all(torch.equal(v, weights[f"backbone.{k}"]) for k, v in ours.items())


@pytest.mark.parametrize("block_size", [1, 4, 16, 64])  # 64 = L: the pretraining checkpoint's
def test_training_pass_equals_the_released_forward(tmp_path, block_size):
    config = released_config(block_size=block_size)
    folder = save_released_folder(tmp_path / "f", config)
    loaded = load_checkpoint(folder)
    z_t, x0 = noisy_pair(64, seed=block_size)
    with torch.no_grad():
        ours = loaded.objective.denoiser(loaded.model)(z_t, x0)  # (B, L, V)
        theirs = released_logits(released_weights(), config, torch.cat([z_t, x0], dim=1))
    assert ours.shape == theirs.shape == (2, 64, GPT2_VOCAB)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    # the x0 half matters: another x0 with the same z_t changes every block after the first
    other = x0.roll(1, dims=1)
    with torch.no_grad():
        moved = loaded.objective.denoiser(loaded.model)(z_t, other)
    if block_size < 64:
        assert not torch.allclose(moved[:, block_size:], ours[:, block_size:])
    torch.testing.assert_close(moved[:, :block_size], ours[:, :block_size], rtol=1e-4, atol=1e-4)


def test_sampling_calls_equal_the_released_sample_mode(tmp_path):
    config = released_config(block_size=4)
    loaded = load_checkpoint(save_released_folder(tmp_path / "f", config))
    z_t, x0 = noisy_pair(12, seed=3)
    done, block = x0[:, :8], z_t[:, 8:12]  # two finished blocks and a noisy third
    with torch.no_grad():
        theirs = released_logits(released_weights(), config, torch.cat([done, block], dim=1),
                                 sample_mode=True)[:, -4:]
        for blocks in (CachedBlocks(loaded.model), RecomputedBlocks(loaded.model, 4)):
            blocks.start(2, 64, torch.device("cpu"))
            blocks.commit(done[:, :4])
            blocks.commit(done[:, 4:])
            torch.testing.assert_close(blocks.logits(block), theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("change, message", [
    ({"cross_attn": False}, "cross_attn=false"),
    ({"adaln": False}, "adaln=false"),
    ({"causal": True}, "causal=true"),
    ({"time_conditioning": True}, "time_conditioning=true"),
    ({"attn_backend": "flash"}, "attn_backend='flash'"),
    ({"block_size": 5}, "block_size must be a positive divisor of model_length (64)"),
    ({"block_size": None}, "block_size must be a positive divisor"),
    ({"sampling_eps_min": 0.9, "sampling_eps_max": 0.2}, "sampling_eps_min=0.9"),
])
def test_what_mdlm_cannot_honour_is_refused_naming_the_key(tmp_path, change, message):
    config = released_config(**change)
    weights = released_weights()
    if "sampling_eps_min" in change:  # the config's fields, read where the buffers are absent
        del weights["sampling_eps_min"], weights["sampling_eps_max"]
    folder = save_released_folder(tmp_path / "f", config, weights)
    with pytest.raises(MdlmError) as e:
        load_checkpoint(folder)
    assert message in str(e.value) and len(str(e.value).splitlines()) == 1


def test_weights_without_a_counterpart_are_named(tmp_path):
    weights = released_weights()
    weights["backbone.blocks.0.attn_bias"] = torch.zeros(3)
    with pytest.raises(MdlmError, match="unexpected blocks.0.attn_bias"):
        load_checkpoint(save_released_folder(tmp_path / "a", weights=weights))
    weights = released_weights()
    weights["noise.sigmas"] = torch.zeros(3)
    with pytest.raises(MdlmError, match="noise.sigmas is not a weight of the released BD3LM"):
        load_checkpoint(save_released_folder(tmp_path / "b", weights=weights))


def test_without_var_min_the_clip_is_the_whole_interval(tmp_path):
    weights = released_weights()
    del weights["sampling_eps_min"], weights["sampling_eps_max"]
    loaded = load_checkpoint(save_released_folder(tmp_path / "f", released_config(var_min=False),
                                                  weights))
    assert (loaded.config.diffusion.clip_min, loaded.config.diffusion.clip_max) == (0.0, 1.0)


def fake_hub(monkeypatch, folder, calls):
    import huggingface_hub

    import mdlm_cli.io.hub

    def fake_snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(mdlm_cli.io.hub, "hub_offline", lambda: False)


def test_hub_id_downloads_no_code_and_loads(tmp_path, monkeypatch):
    calls = []
    fake_hub(monkeypatch, save_released_folder(tmp_path / "snapshot", released_config(16)), calls)
    monkeypatch.chdir(tmp_path)
    loaded = load_checkpoint("kuleshov-group/bd3lm-owt-block_size16")
    assert calls[0][0] == "kuleshov-group/bd3lm-owt-block_size16"
    assert not any(p.endswith(".py") or p in ("*", "*.*") for p in calls[0][1])
    assert loaded.config.name == "bd3lm-owt-block_size16" and loaded.objective.block_size == 16
    assert loaded.state["source"] == "kuleshov-group/bd3lm-owt-block_size16"


def test_init_from_takes_the_released_pretraining_hub_id(tmp_path, monkeypatch):
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.train.init_from import initialise_from

    pretrain = "kuleshov-group/bd3lm-owt-block_size1024-pretrain"
    config = released_config(block_size=64, _name_or_path=pretrain)
    fake_hub(monkeypatch, save_released_folder(tmp_path / "snapshot", config), [])
    monkeypatch.chdir(tmp_path)
    model = DiT(ModelConfig(hidden_size=32, n_blocks=2, n_heads=4, cond_dim=16), GPT2_VOCAB)
    line = initialise_from(model, pretrain, load_tokenizer("gpt2"))
    assert line.startswith(f"{pretrain} (bd3lm model")
    weights = released_weights()
    assert torch.equal(model.blocks[1].attn_qkv.weight, weights["backbone.blocks.1.attn_qkv.weight"])
