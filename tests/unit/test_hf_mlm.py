"""The hf-mlm backbone: any Hugging Face masked LM as the MDLM denoiser (tiny random BERT,
DistilBERT and RoBERTa models built here), its checkpoints and exports, and what it refuses."""

import json

import pytest
import torch
from safetensors import safe_open

from mdlm_cli import engine
from mdlm_cli.build import config_dict, config_from_dict, resolve_config
from mdlm_cli.checkpoints.export import export_folder, verify_export
from mdlm_cli.checkpoints.folder import load_run_folder
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
from mdlm_cli.config import ModelConfig
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import DiffusionDenoiser, HFMaskedLM, build_model
from mdlm_cli.models.hf_mlm import HEADS
from mdlm_cli.objectives import get_objective

from ..hf_models import VOCAB, save_tiny_mlm, tiny_mlm

V = len(VOCAB)
ARCHS = ["bert", "distilbert", "roberta"]


def wrapper(arch: str = "bert", vocab: int = V) -> HFMaskedLM:
    return HFMaskedLM(ModelConfig(backbone="hf-mlm", hf_model=f"tiny-{arch}"), vocab, hf=tiny_mlm(arch)).eval()


def tokens(B: int = 2, L: int = 12) -> torch.Tensor:
    return torch.randint(5, V, (B, L), generator=torch.Generator().manual_seed(3))


def config(folder, data_path, **train) -> dict:
    return {"name": "tiny", "data": {"dataset": str(data_path), "tokenizer": str(folder), "length": 32},
            "model": {"backbone": "hf-mlm", "hf_model": str(folder)}, "diffusion": {"objective": "mdlm"},
            "train": {"global_batch_size": 4, "micro_batch_size": 4, "max_steps": 2, "ema": 0.9, **train}}


@pytest.mark.parametrize("arch", ARCHS)
def test_denoiser_contract_shapes_output_mask_and_no_time(arch):
    model = wrapper(arch)
    x = tokens()
    with torch.no_grad():
        full = model(x)
        out = torch.zeros_like(x, dtype=torch.bool)
        out[0, 1], out[1, 5], out[1, 7] = True, True, True
        selected = model(x, output_mask=out)
    assert full.shape == (2, 12, V) and selected.shape == (3, V)
    torch.testing.assert_close(selected, full[out], atol=1e-5, rtol=1e-5)
    assert model.head_names == HEADS[arch if arch != "roberta" else "roberta"]
    with pytest.raises(ValueError, match="no time input"):
        model(x, torch.zeros(2))
    denoiser = DiffusionDenoiser(model, engine.get_schedule("loglinear"))
    assert denoiser.time_agnostic and denoiser.supports_output_mask


@pytest.mark.parametrize("arch", ARCHS)
def test_padding_is_kept_out_of_attention(arch):
    model = wrapper(arch)
    x = tokens(2, 12)
    mask = torch.ones_like(x, dtype=torch.bool)
    mask[1, 8:] = False
    other = x.clone()
    other[1, 8:] = 7  # different tokens under the padding
    longer = torch.cat([x, torch.full((2, 4), 0)], dim=1)  # and four more padded positions
    longer_mask = torch.cat([mask, torch.zeros(2, 4, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        a, b = model(x, attention_mask=mask), model(other, attention_mask=mask)
        c = model(longer, attention_mask=longer_mask)
    torch.testing.assert_close(a[1, :8], b[1, :8], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a[:, :8], c[:, :8], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(model(other)[1, :8], a[1, :8], atol=1e-3)  # without the mask they differ


def test_unknown_head_falls_back_to_every_position_then_the_rows():
    fast, slow = wrapper(), wrapper()
    slow.head_names = ()
    x, out = tokens(), torch.rand(2, 12, generator=torch.Generator().manual_seed(0)) < 0.5
    with torch.no_grad():
        torch.testing.assert_close(slow(x, output_mask=out), fast(x, output_mask=out), atol=1e-5, rtol=1e-5)


def test_output_layer_padded_beyond_the_tokenizer_is_cut():
    model = HFMaskedLM(ModelConfig(backbone="hf-mlm", hf_model="tiny"), V, hf=tiny_mlm(vocab=V + 6))
    assert model(tokens()).shape[-1] == V
    with pytest.raises(MdlmError, match=f"tokenizer has {V + 7} tokens but tiny's output layer only {V + 6}"):
        HFMaskedLM(ModelConfig(backbone="hf-mlm", hf_model="tiny"), V + 7, hf=tiny_mlm(vocab=V + 6))


def test_mask_id_is_the_tokenizers_own_and_training_lowers_the_loss(tmp_path):
    folder = save_tiny_mlm(tmp_path / "bert")
    tok = load_tokenizer(str(folder))
    assert (tok.mask_id, tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (4, 2, 3, 0, V)
    cfg = config_from_dict(config(folder, tmp_path / "x.txt"))
    objective = get_objective(cfg, tok)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.vocab_size).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x0 = torch.tensor([[2] + tok.encode("it was the best of times it was the worst of times")[:14] + [3]] * 4)
    t = torch.full((4,), 0.5)

    def loss():
        return objective.loss_terms(objective.denoiser(model), x0, t, generator=torch.Generator().manual_seed(0),
                                    attention_mask=None).sum() / x0.numel()

    first = loss().item()
    for _ in range(15):
        value = loss()
        value.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss().item() < 0.5 * first


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    folder = save_tiny_mlm(root / "bert")
    cfg = config_from_dict({**config(folder, root / "x.txt"), "train": {"out_dir": str(root / "run")}})
    tok = load_tokenizer(str(folder))
    model = build_model(cfg.model, tok.vocab_size)
    with torch.no_grad():  # make the head's tied and untied tensors differ from a fresh model's
        model.hf.cls.predictions.bias.normal_()
    step = save_checkpoint(root / "run", 5,
        CheckpointContents(model=model, ema_model=None, optimizer=None, cfg=cfg, state={"step": 5},
                           tokenizer=tok, data_meta={"length": 32, "packing": "wrap"}))
    return root, folder, model, step


def test_checkpoint_round_trip_offline_gives_identical_logits(checkpoint, tmp_path):
    root, folder, model, step = checkpoint
    assert (step / "hf_config.json").is_file()
    with safe_open(step / "model.safetensors", "pt") as f:  # tied tensors are stored once
        keys = set(f.keys())
    assert "hf.bert.embeddings.word_embeddings.weight" in keys and "hf.cls.predictions.decoder.weight" not in keys
    moved = tmp_path / "moved"  # the original model folder is not needed any more
    folder.rename(moved)
    try:
        loaded = load_run_folder(root / "run")
    finally:
        moved.rename(folder)
    x = tokens()
    with torch.no_grad():
        assert torch.equal(loaded.model(x), model.eval()(x))
    hf = loaded.model.hf
    assert hf.get_output_embeddings().weight is hf.get_input_embeddings().weight  # still tied after loading


def test_export_is_the_models_own_folder_and_loads_back(checkpoint, tmp_path):
    from transformers import AutoModelForMaskedLM

    root, _, model, _ = checkpoint
    loaded = load_run_folder(root / "run")
    out = export_folder(loaded, tmp_path / "export", weights="raw")
    assert verify_export(loaded, out) == 0.0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "bert" and config["mdlm"]["config"]["model"]["backbone"] == "hf-mlm"
    again = load_checkpoint(out)
    assert again.config.data.length == 32 and again.tokenizer.mask_id == 4
    plain = AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=False).eval()  # transformers alone
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=x).logits, model.eval()(x), atol=1e-6, rtol=1e-6)


def test_samplers_run_on_it(checkpoint):
    root, *_ = checkpoint
    loaded = load_run_folder(root / "run")
    for sampler, steps in (("first-hitting", None), ("ancestral-cache", 8), ("ancestral", 8)):
        out = engine.sample(loaded.denoiser(), sampler=sampler, num_samples=2, length=16, mask_id=loaded.mask_id,
                            steps=steps, generator=torch.Generator().manual_seed(0))
        assert out.shape == (2, 16) and not (out == loaded.mask_id).any()


def test_encoder_without_head_gets_the_standard_head_freshly_initialised(tmp_path):
    folder = save_tiny_mlm(tmp_path / "encoder", head=False)
    a, b = load_checkpoint(folder), load_checkpoint(folder)
    assert any("no MLM head" in note and "freshly initialised" in note for note in a.state["notes"])
    hf = a.model.hf
    assert type(hf).__name__ == "BertForMaskedLM"
    assert hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
    assert a.config.model.backbone == "hf-mlm" and a.config.data.packing == "wrap"
    x = tokens()
    with torch.no_grad():
        assert torch.equal(a.model(x), b.model(x))  # the fresh head is seeded: the same on every load


@pytest.mark.parametrize(("change", "message"), [
    ({"auto_map": {"AutoModelForMaskedLM": "bert_layers.BertForMaskedLM"}}, "needs remote code"),
    ({"model_type": "mosaic_bert"}, "does not implement as a masked LM"),
    ({"architectures": ["MosaicBertForMaskedLM"]}, "architecture 'MosaicBertForMaskedLM'"),
])
def test_remote_code_models_are_refused_in_one_line(tmp_path, change, message):
    folder = save_tiny_mlm(tmp_path / "m")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, **change}))
    for attempt in (lambda: load_checkpoint(folder),
                    lambda: HFMaskedLM(ModelConfig(backbone="hf-mlm", hf_model=str(folder)), V)):
        with pytest.raises(MdlmError, match=message) as e:
            attempt()
        assert "\n" not in str(e.value) and "trust_remote_code" in str(e.value)


def test_config_keys_apply_per_backbone(tmp_path):
    base = config(tmp_path, tmp_path / "x.txt")
    with pytest.raises(MdlmError, match="model.hidden_size does not apply to the hf-mlm backbone"):
        config_from_dict({**base, "model": {**base["model"], "hidden_size": 64}})
    with pytest.raises(MdlmError, match="model.hf_model does not apply to the dit backbone"):
        resolve_config("test", ["model.hf_model=bert-base-uncased"])
    with pytest.raises(MdlmError, match="takes no time input"):
        config_from_dict({**base, "model": {**base["model"], "time_conditioning": True}})
    with pytest.raises(MdlmError, match="hf-mlm backbone is bidirectional; the ar objective needs causal attention"):
        config_from_dict({**base, "diffusion": {"objective": "ar"}})
    with pytest.raises(MdlmError, match="model.hf_model must name"):
        config_from_dict({**base, "model": {"backbone": "hf-mlm"}})
    cfg = config_from_dict(base)
    assert config_dict(cfg)["model"] == {"backbone": "hf-mlm", "hf_model": str(tmp_path), "time_conditioning": False}
    assert config_from_dict(config_dict(cfg)).to_dict() == cfg.to_dict()
    assert "hf_model" not in config_dict(resolve_config("test"))["model"]  # a DiT config saves what it saved before


def test_training_refuses_another_tokenizer_before_preparing_data(tmp_path):
    from mdlm_cli.models import check_data

    folder = save_tiny_mlm(tmp_path / "bert")
    data = {"dataset": "bigtxt", "tokenizer": "gpt2", "length": 32, "cache_dir": str(tmp_path)}
    cfg = config_from_dict({**config(folder, tmp_path / "x.txt"), "data": data})
    with pytest.raises(MdlmError, match=r"data.tokenizer 'gpt2' \(50258 tokens\) is not the tokenizer of"):
        check_data(cfg)
    too_long = config_from_dict({**config(folder, tmp_path / "x.txt"), "data": {"tokenizer": str(folder),
                                                                                 "length": 65}})
    with pytest.raises(MdlmError, match="data.length 65 exceeds the 64 positions"):
        check_data(too_long)
