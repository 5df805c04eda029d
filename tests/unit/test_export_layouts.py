"""`mdlm export` of the folder backbones (checkpoints/export_layouts.py, released.py): converted
LLaMA / Qwen2 / GPT-2 folders keep their conversion record and reload with the same logits, a
shifted DiT reloads shifted, large weights are sharded with an index, a merge in bf16 is checked
against the unmerged model at that precision, and a backbone with no layout is refused before
anything is written."""

import copy
import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from mdlm_cli.checkpoints.convert import ConvertRequest, convert
from mdlm_cli.checkpoints.export import export_folder, verify_export, verify_merge
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.errors import MdlmError
from mdlm_cli.models.folder_weights import INDEX, read_shards, shard_files

from ..causal_lm_folders import ARCHS, write_ar_run, write_causal_lm
from ..open_model_folders import write_llada

# (arch, attention): causal attention for one of them, so that the record's both fields travel
SOURCES = [("llama", "causal"), ("qwen2", "full"), ("gpt2", "full")]
assert {a for a, _ in SOURCES} == set(ARCHS)


def released(folder):
    return read_shards(shard_files(folder))


@pytest.mark.parametrize(("arch", "attention"), SOURCES)
def test_a_converted_folder_exports_with_its_conversion_record(tmp_path, arch, attention):
    convert(ConvertRequest(str(write_causal_lm(tmp_path / "src", arch)), tmp_path / "conv",
                           attention=attention))
    loaded = load_checkpoint(tmp_path / "conv")
    out = export_folder(loaded, tmp_path / "export", weights="as stored")
    assert verify_export(loaded, out) == 0.0
    config, source = (json.loads((f / "config.json").read_text())
                      for f in (out, tmp_path / "conv"))
    drop = ("mdlm", "torch_dtype", "dtype")
    assert {k: v for k, v in config.items() if k not in drop} == \
        {k: v for k, v in source.items() if k not in drop}
    weights, original = load_file(out / "model.safetensors"), released(tmp_path / "conv")
    assert sorted(weights) == sorted(original)
    assert all(torch.equal(weights[k], original[k]) for k in weights)
    reloaded = load_checkpoint(out)
    assert reloaded.state["converted_from"] == loaded.state["converted_from"]
    assert reloaded.model.shifted_logits and reloaded.model.attention == attention
    card = (out / "README.md").read_text()
    assert "mdlm_conversion" in card
    if arch == "llama":  # LLaDA's own code predicts in place, attending both ways
        assert "not as it was trained" in card


def test_transformers_reads_the_gpt2_export_as_gpt2_tensors(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    convert(ConvertRequest(str(write_causal_lm(tmp_path / "src", "gpt2")), tmp_path / "conv"))
    out = export_folder(load_checkpoint(tmp_path / "conv"), tmp_path / "export", weights="raw")
    config = json.loads((out / "config.json").read_text())
    keys = {k: v for k, v in config.items() if k not in ("mdlm", "model_type", "mdlm_conversion")}
    model = GPT2LMHeadModel(GPT2Config(**keys))
    weights = load_file(out / "model.safetensors")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing)  # tied to wte
    fc = weights["transformer.h.1.mlp.c_fc.weight"]
    assert torch.equal(model.transformer.h[1].mlp.c_fc.weight, fc)


def test_large_weights_are_sharded_with_an_index_and_an_export_exports_again(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr("mdlm_cli.checkpoints.released.SHARD_BYTES", 20_000)
    folder = write_llada(tmp_path / "llada")
    loaded = load_checkpoint(folder)
    out = export_folder(loaded, tmp_path / "export", weights="as stored")
    index = json.loads((out / INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and not (out / "model.safetensors").exists()
    assert sorted(json.loads((out / "config.json").read_text())["mdlm"]["files"]) == \
        sorted(p.name for p in out.iterdir())
    assert sorted(index["weight_map"]) == sorted(released(folder))
    assert verify_export(loaded, out) == 0.0
    again = export_folder(load_checkpoint(out), tmp_path / "again", weights="as stored")
    assert verify_export(loaded, again) == 0.0  # an export is a release: it exports in turn
    section = json.loads((again / "config.json").read_text())["mdlm"]
    assert section["config"]["model"]["hf_model"] == str(out)


def test_a_shifted_dit_exports_and_reloads_shifted(tmp_path):
    """The reference's fields cannot say the shift: mdlm's section does, its loader honours
    it, and the card warns that the reference's own class would read it unshifted."""
    convert(ConvertRequest(str(write_ar_run(tmp_path / "ar")), tmp_path / "out"))
    loaded = load_checkpoint(tmp_path / "out")
    assert loaded.model.shifted_logits
    out = export_folder(loaded, tmp_path / "export", weights="raw")
    assert verify_export(loaded, out) == 0.0  # an unshifted reload would differ everywhere
    reloaded = load_checkpoint(out)
    assert reloaded.config.model.shift and reloaded.model.shifted_logits
    config = json.loads((out / "config.json").read_text())
    assert "shift" not in config and config["mdlm"]["config"]["model"]["shift"] is True
    card = " ".join((out / "README.md").read_text().split())
    assert "would read these weights unshifted" in card and "shifted (logits at i" in card
    unshifted = copy.deepcopy(reloaded.model)
    unshifted.config = dataclasses.replace(unshifted.config, shift=False)
    x = torch.randint(0, 20, (1, 16))
    with torch.no_grad():
        assert not torch.allclose(unshifted(x, torch.zeros(1)), reloaded.model(x, torch.zeros(1)))


def test_a_backbone_without_a_layout_is_refused_before_anything_is_written(tmp_path):
    loaded = load_checkpoint(write_ar_run(tmp_path / "ar"))
    other = dataclasses.replace(loaded, model=torch.nn.Identity())
    with pytest.raises(MdlmError, match="shared as its run folder") as e:
        export_folder(other, tmp_path / "export", weights="raw")
    assert "\n" not in str(e.value) and not (tmp_path / "export").exists()


def test_a_bf16_merge_is_checked_at_bf16_precision(tmp_path):
    pytest.importorskip("peft")
    from mdlm_cli.config import LoraConfig
    from mdlm_cli.models.lora import add_lora, trainable, write_adapter

    folder = write_llada(tmp_path / "llada", dtype=torch.bfloat16)  # as the releases are
    torch.manual_seed(0)
    adapted = add_lora(load_checkpoint(folder).model, LoraConfig(rank=4, alpha=8), "base")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _, p in trainable(adapted):
            p.add_(0.1 * torch.randn(p.shape, generator=gen).to(p.dtype))
    write_adapter(adapted, tmp_path / "adapter")
    merged = load_checkpoint(folder, adapter=tmp_path / "adapter")
    assert next(merged.model.parameters()).dtype == torch.bfloat16
    assert "bfloat16 rounding" in verify_merge(merged, str(folder), tmp_path / "adapter")
    with pytest.raises(MdlmError, match="not the adapted model"):  # the base, not merged
        verify_merge(load_checkpoint(folder), str(folder), tmp_path / "adapter")
