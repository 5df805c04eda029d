"""`--checkpoint` with the reference's published formats, and `mdlm export`, through the CLI."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from mdlm_cli.build import resolve_config
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
from mdlm_cli.cli import app
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.models import DiT

from ..reference_weights import (
    lightning_checkpoint,
    reference_hydra_config,
    reference_param_shapes,
    save_hf_folder,
)

runner = CliRunner()


def run(*args, code=0) -> str:
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == code, result.output + repr(result.exception)
    return result.output


def random_dit(cfg, seed: int) -> DiT:
    torch.manual_seed(seed)
    m = cfg.model
    model = DiT(m, 35)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.2)
    return model


@pytest.fixture
def mdlm_run(tmp_path):
    """An mdlm run folder with distinct raw and EMA weights, a char tokenizer and a validation bound."""
    cfg = resolve_config("test")
    tokenizer = load_tokenizer("char")
    data_meta = {"length": cfg.data.length, "packing": cfg.data.packing, "tokenizer": tokenizer.describe(),
                 "source": {"name": "bigtxt"}}
    state = {"step": 20, "tokens_seen": 20480, "valid_nats": 2.5, "best_valid_nats": 2.4}
    save_checkpoint(tmp_path / "run", 20,
        CheckpointContents(model=random_dit(cfg, 0), ema_model=random_dit(cfg, 1), optimizer=None,
                           cfg=cfg, state=state, tokenizer=tokenizer, data_meta=data_meta))
    return tmp_path / "run"


def logits(loaded, seed=0):
    x = torch.randint(0, 35, (2, loaded.length), generator=torch.Generator().manual_seed(seed))
    x[:, ::2] = loaded.mask_id
    with torch.no_grad():
        return loaded.model(x)


def test_sample_and_semi_ar_from_hf_folder_and_lightning_checkpoint(tmp_path):
    out = tmp_path / "samples.jsonl"
    run("sample", "--checkpoint", save_hf_folder(tmp_path / "hf"), "-n", "2", "--length", "8", "--quiet",
        "--sampler", "ancestral-cache", "--steps", "4", "--out", out)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(len(r["tokens"]) == 8 and 4 not in r["tokens"] for r in records)
    torch.save(lightning_checkpoint(hyper_parameters={"config": reference_hydra_config(length=16)}),
               tmp_path / "last.ckpt")
    text = run("semi-ar", "--checkpoint", tmp_path / "last.ckpt", "--length", "20", "--stride", "4", "--no-stream",
               "--sampler", "ancestral-cache", "--steps", "4")
    assert "20 tokens per sample (window 16, stride 4)" in text


def test_export_reloads_with_identical_logits(mdlm_run, tmp_path):
    text = run("export", "--checkpoint", mdlm_run, "--out", tmp_path / "exported")
    assert "identical logits" in text
    original, exported = load_checkpoint(mdlm_run), load_checkpoint(tmp_path / "exported")
    assert torch.equal(logits(original), logits(exported))
    assert exported.tokenizer.fingerprint == original.tokenizer.fingerprint
    assert exported.config.to_dict() == original.config.to_dict() and exported.length == original.length

    # the reference's names and config fields, EMA weights by default
    weights = load_file(tmp_path / "exported" / "model.safetensors")
    assert set(weights) == {f"backbone.{k}" for k in reference_param_shapes(35, 64, 32, 2)} | {
        "backbone.rotary_emb.inv_freq"}
    ema = load_file(mdlm_run / "checkpoints" / "step-00000020" / "ema.safetensors")
    assert torch.equal(weights["backbone.vocab_embed.embedding"], ema["vocab_embed.embedding"])
    config = json.loads((tmp_path / "exported" / "config.json").read_text())
    assert {k: config[k] for k in ("model_type", "vocab_size", "model_length", "hidden_dim", "cond_dim",
                                   "n_blocks", "n_heads", "time_conditioning")} == {
        "model_type": "mdlm", "vocab_size": 35, "model_length": 32, "hidden_dim": 64, "cond_dim": 32,
        "n_blocks": 2, "n_heads": 2, "time_conditioning": False}
    card = (tmp_path / "exported" / "README.md").read_text()
    assert "| weights | ema |" in card and "perplexity <= 11.02" in card and "## Training configuration" in card
    assert "name: test" in card and (tmp_path / "exported" / "mdlm_tokenizer.json").is_file()
    assert not list((tmp_path / "exported").glob("*.py"))

    run("export", "--checkpoint", mdlm_run, "--out", tmp_path / "raw", "--raw-weights")
    raw = load_file(mdlm_run / "checkpoints" / "step-00000020" / "model.safetensors")
    exported_raw = load_file(tmp_path / "raw" / "model.safetensors")
    assert torch.equal(exported_raw["backbone.vocab_embed.embedding"], raw["vocab_embed.embedding"])
    run("sample", "--checkpoint", tmp_path / "exported", "-n", "1", "--quiet")


def test_export_of_a_lightning_checkpoint_reloads_identically(tmp_path):
    torch.save(lightning_checkpoint(), tmp_path / "last.ckpt")
    run("export", "--checkpoint", tmp_path / "last.ckpt", "--out", tmp_path / "hf")
    direct, exported = load_checkpoint(tmp_path / "last.ckpt"), load_checkpoint(tmp_path / "hf")
    assert torch.equal(logits(direct), logits(exported))
    assert exported.state["weights"] == "ema" and exported.state["step"] == 1234
    assert "imported from" in (tmp_path / "hf" / "README.md").read_text()


def test_results_go_into_the_model_card(mdlm_run, tmp_path):
    results = tmp_path / "eval.jsonl"
    results.write_text(json.dumps({"task": "eval-ppl", "dataset": "wikitext2", "perplexity": 41.234567}) + "\n")
    run("export", "--checkpoint", mdlm_run, "--out", tmp_path / "x", "--results", results, "--no-verify")
    assert "- task: eval-ppl, dataset: wikitext2, perplexity: 41.23" in (tmp_path / "x" / "README.md").read_text()


def test_export_keeps_existing_folders_and_needs_the_hub_to_push(mdlm_run, tmp_path, monkeypatch):
    from mdlm_cli.io.hub import hub_offline

    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    assert "already exists" in run("export", "--checkpoint", mdlm_run, "--out", tmp_path / "taken", code=1)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub_offline.cache_clear()
    text = run("export", "--checkpoint", mdlm_run, "--out", tmp_path / "y", "--push-to-hub", "me/x", code=1)
    assert "cannot push to 'me/x'" in text and (tmp_path / "y" / "model.safetensors").is_file()


def test_bad_checkpoints_end_in_one_line(tmp_path, monkeypatch):
    from mdlm_cli.io.hub import hub_offline

    corrupted = save_hf_folder(tmp_path / "corrupted")
    (corrupted / "model.safetensors").write_bytes(b"garbage")
    mismatched = save_hf_folder(tmp_path / "mismatched")
    config = json.loads((mismatched / "config.json").read_text())
    (mismatched / "config.json").write_text(json.dumps({**config, "n_blocks": 3}))
    torch.save(lightning_checkpoint(), tmp_path / "full.ckpt")
    data = (tmp_path / "full.ckpt").read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(data[: len(data) // 3])

    class Payload:
        def __reduce__(self):
            return (os.system, ("true",))

    torch.save({"state_dict": {}, "hyper_parameters": {"x": Payload()}}, tmp_path / "evil.ckpt")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.chdir(tmp_path)
    hub_offline.cache_clear()
    for checkpoint, message in [
        (corrupted, "not a readable safetensors file"),
        (mismatched, "missing blocks.2.adaLN_modulation.bias"),
        (tmp_path / "cut.ckpt", "not a readable PyTorch checkpoint"),
        (tmp_path / "evil.ckpt", "refusing to read"),
        ("kuleshov-group/mdlm-owt", "Hugging Face Hub cannot be reached"),
    ]:
        text = run("sample", "--checkpoint", checkpoint, code=1)
        assert message in text and len(text.strip().splitlines()) == 1, text
