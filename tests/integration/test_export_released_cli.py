"""`mdlm export` of fine-tuned LLaDA and Dream runs (issue 53): a full fine-tune and a LoRA run
(merged) become folders in their release's layout (config.json of the family, its tensor
names, tokenizer files with the chat template), which mdlm's released loaders read back with
the run's logits and every command takes as `--checkpoint`; an export never replaces a folder
it did not write."""

import json

import pytest
import torch
from safetensors.torch import load_file

from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.models.folder_weights import read_shards, shard_files
from tests.open_model_folders import write_dream, write_llada

from .conftest import invoke, one_line_error

FAMILIES = ["llada", "dream"]
CHAT = [{"role": "user", "content": "w1 w2"}]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """family -> (its released folder, a full fine-tune of it, a LoRA run on it): 2 steps each
    of open-sft on a small question-answer file."""
    root = tmp_path_factory.mktemp("export-released")
    qa = root / "qa.jsonl"
    qa.write_text("".join(json.dumps({"prompt": "w1 w2", "response": f"w{i} w3"}) + "\n"
                          for i in range(4, 12)) * 3)
    out = {}
    for family, write in (("llada", write_llada), ("dream", write_dream)):
        folder = write(root / family)
        args = ["train", "--preset", "open-sft", "--no-print-config", "--set",
                f"train.init_from={folder}", "--set", f"data.dataset={qa}", "--set",
                f"data.cache_dir={root / 'cache'}", "--max-steps", "2",
                "--set", "optim.lr=1e-2"]
        invoke(*args, "--out", root / f"{family}-full")
        invoke(*args, "--out", root / f"{family}-lora", "--set", "lora.rank=2",
               "--set", "lora.alpha=8")
        out[family] = (folder, root / f"{family}-full", root / f"{family}-lora")
    return out


def logits(loaded) -> torch.Tensor:
    x = torch.randint(0, 80, (2, 16), generator=torch.Generator().manual_seed(0))
    x[:, ::3] = loaded.mask_id
    with torch.no_grad():
        return loaded.model(x).float()


def released_tensors(folder):
    return read_shards(shard_files(folder))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_fine_tuned_folder_exports_in_its_release_layout(runs, tmp_path, family):
    folder, run, _ = runs[family]
    out = tmp_path / "export"
    text = " ".join(invoke("export", "-c", run, "--out", out).split())
    assert "Verified: the export reloads with identical logits" in text
    config, base = (json.loads((f / "config.json").read_text()) for f in (out, folder))
    assert config["model_type"] == base["model_type"] and config["mdlm"]["format"] == 1
    assert {k: v for k, v in config.items() if k != "mdlm"} == base  # the release's keys
    weights, original = load_file(out / "model.safetensors"), released_tensors(folder)
    assert sorted(weights) == sorted(original)  # the release's tensor names, every one
    assert any(not torch.equal(weights[k], original[k]) for k in weights)  # fine-tuned
    assert not list(out.glob("*.py"))
    tokenizer_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    trained, exported = load_checkpoint(run), load_checkpoint(out)
    assert torch.equal(logits(trained), logits(exported))
    assert exported.config.model.backbone == family and exported.config.model.hf_model == str(out)
    assert exported.config.data.packing == trained.config.data.packing == "sft"
    assert exported.length == trained.length and exported.state["step"] == 2
    assert exported.sampling_defaults == trained.sampling_defaults
    render = [t.tokenizer.hf.apply_chat_template(CHAT, add_generation_prompt=True)
              for t in (trained, exported)]
    assert render[0] == render[1] and tokenizer_config["chat_template"]  # the template kept
    invoke("sample", "-c", out, "--chat", "hi", "--max-new-tokens", "4", "--steps", "4", "-n", "1")
    # the export is a release again: it starts a fine-tune of its own
    invoke("train", "--preset", "open-sft", "--no-print-config", "--set",
           f"train.init_from={out}", "--set", f"data.dataset={run.parent / 'qa.jsonl'}",
           "--set", f"data.cache_dir={tmp_path / 'cache'}", "--max-steps", "1",
           "--out", tmp_path / "again")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lora_run_exports_merged_into_its_release_layout(runs, tmp_path, family):
    pytest.importorskip("peft")
    folder, _, run = runs[family]
    text = " ".join(invoke("export", "-c", run, "--out", tmp_path / "merged").split())
    assert "the merged adapter gives the unmerged model's logits" in text
    adapter = run / "checkpoints" / "step-00000002" / "adapter"
    text = " ".join(invoke("export", "-c", folder, "--merge-adapter", adapter, "--raw-weights",
                           "--out", tmp_path / "given").split())
    assert "the merged adapter gives the unmerged model's logits" in text
    base = released_tensors(folder)
    for out in (tmp_path / "merged", tmp_path / "given"):
        config = json.loads((out / "config.json").read_text())
        assert config["model_type"] == json.loads((folder / "config.json").read_text())[
            "model_type"]
        assert sorted(load_file(out / "model.safetensors")) == sorted(base)
    merged, given = load_checkpoint(tmp_path / "merged"), load_checkpoint(tmp_path / "given")
    assert torch.allclose(logits(merged), logits(load_checkpoint(run)), atol=1e-5)
    assert torch.allclose(logits(given), logits(load_checkpoint(run, ema=False)), atol=1e-5)
    assert not torch.allclose(logits(given), logits(load_checkpoint(folder)), atol=1e-3)


def test_export_never_replaces_a_released_folder(runs, tmp_path):
    folder, run, _ = runs["llada"]
    before = sorted((p.name, p.stat().st_size) for p in folder.iterdir())
    error = one_line_error("export", "-c", run, "--out", folder, "--overwrite")
    assert "not a folder mdlm export wrote" in error
    assert sorted((p.name, p.stat().st_size) for p in folder.iterdir()) == before
    out = tmp_path / "export"
    invoke("export", "-c", run, "--out", out, "--no-verify")
    invoke("export", "-c", run, "--out", out, "--overwrite")  # an earlier export is replaced
    assert "already exists" in one_line_error("export", "-c", run, "--out", out)


def test_transformers_reads_the_dream_export_as_qwen2_tensors(runs, tmp_path):
    """Dream is Qwen2 under another model_type: Qwen2's own class takes the tensors as they are."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _, run, _ = runs["dream"]
    out = tmp_path / "export"
    invoke("export", "-c", run, "--out", out, "--no-verify")
    config = json.loads((out / "config.json").read_text())
    keys = {k: v for k, v in config.items() if k not in ("mdlm", "model_type", "auto_map")}
    model = Qwen2ForCausalLM(Qwen2Config(**keys))
    weights = load_file(out / "model.safetensors")
    model.load_state_dict(weights, strict=True)
    assert torch.equal(model.lm_head.weight, weights["lm_head.weight"])
