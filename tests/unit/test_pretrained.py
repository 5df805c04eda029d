"""Loading the reference implementation's published formats (pretrained.py, safe_load.py)."""

import json
import os
import sys
import types

import pytest
import torch
from safetensors.torch import save_file

from mdlm_cli.checkpoints.formats.base import Found
from mdlm_cli.checkpoints.formats.reference import partial_from_hydra
from mdlm_cli.checkpoints.formats.registry import FORMATS
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.checkpoints.pretrained import Source, pretrained_source
from mdlm_cli.config import ModelConfig
from mdlm_cli.errors import MdlmError
from mdlm_cli.io.safe_load import read_torch_file
from mdlm_cli.models import DiT

from ..reference_weights import (
    hf_config,
    lightning_checkpoint,
    reference_hydra_config,
    reference_param_shapes,
    reference_state_dict,
    save_hf_folder,
)


def test_reference_names_and_shapes_cover_the_small_dit_exactly():
    """Shape-only check at the published size (12 x 768, GPT-2 vocabulary), on the meta device."""
    with torch.device("meta"):
        model = DiT(ModelConfig(hidden_size=768, n_blocks=12, n_heads=12, cond_dim=128), 50258)
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert ours == dict(reference_param_shapes(50258, 768, 128, 12))
    assert [n for n, _ in model.named_parameters()] == list(reference_param_shapes(50258, 768, 128, 12))


def test_hf_folder_parameters_land_where_they_should(tmp_path):
    state = reference_state_dict()
    loaded = load_checkpoint(save_hf_folder(tmp_path / "hf", state, hf_config(length=48)))
    ours = loaded.model.state_dict()
    for key, value in state.items():
        if key.endswith("inv_freq"):
            continue
        assert torch.equal(ours[key.removeprefix("backbone.")], value), key
    assert torch.equal(loaded.model.blocks[1].attn_qkv.weight, state["backbone.blocks.1.attn_qkv.weight"])
    assert loaded.length == 48 and loaded.tokenizer.name == "char" and loaded.mask_id == 4
    assert loaded.config.model.n_heads == 4 and not loaded.config.model.time_conditioning
    logits = loaded.model(torch.randint(0, 35, (2, 48)))
    assert logits.shape == (2, 48, 35) and torch.isfinite(logits).all()


def test_hf_folder_without_n_heads_takes_it_from_the_rotary_table(tmp_path):
    config = hf_config()
    del config["n_heads"]
    loaded = load_checkpoint(save_hf_folder(tmp_path / "hf", reference_state_dict(n_heads=2), config))
    assert loaded.model.config.n_heads == 2
    assert any("n_heads" in item for item in loaded.state["inferred"])


def test_time_conditioning_reaches_the_denoiser(tmp_path):
    loaded = load_checkpoint(save_hf_folder(tmp_path / "hf", reference_state_dict(),
                                            hf_config(time_conditioning=True)))
    assert loaded.config.model.time_conditioning
    denoiser = loaded.denoiser()
    z = torch.full((1, 32), loaded.mask_id)
    assert not torch.allclose(denoiser(z, torch.tensor([0.9])), denoiser(z, torch.tensor([0.1])))


def test_lightning_checkpoint_takes_ema_weights_and_hydra_hyper_parameters(tmp_path):
    ckpt = lightning_checkpoint(hyper_parameters={"config": reference_hydra_config(n_heads=2, length=40)},
                                n_heads=2)
    torch.save(ckpt, tmp_path / "last.ckpt")
    names = [k.removeprefix("backbone.") for k in ckpt["state_dict"] if not k.endswith("inv_freq")]

    ema = load_checkpoint(tmp_path / "last.ckpt")
    params = dict(ema.model.named_parameters())
    for name, shadow in zip(names, ckpt["ema"]["shadow_params"], strict=True):
        assert torch.equal(params[name], shadow), name
    assert ema.state["weights"] == "ema" and ema.state["step"] == 1234
    assert ema.model.config.n_heads == 2 and ema.length == 40 and ema.tokenizer.name == "char"

    raw = load_checkpoint(tmp_path / "last.ckpt", ema=False)
    assert torch.equal(raw.model.output_layer.linear.weight, ckpt["state_dict"]["backbone.output_layer.linear.weight"])
    assert raw.state["weights"] == "raw"
    assert raw.model(torch.randint(0, 35, (1, 40))).shape == (1, 40, 35)


def _fake_omegaconf(monkeypatch):
    """Classes that pickle under omegaconf's names and layout (a container's state holds `_metadata`,
    `_parent`, `_content`; a value node's `_val`), without omegaconf installed."""
    made = {}
    for module, names in {"omegaconf.dictconfig": ["DictConfig"], "omegaconf.nodes": ["AnyNode"],
                          "omegaconf.base": ["ContainerMetadata", "Metadata"]}.items():
        mod = types.ModuleType(module)
        for name in names:
            cls = type(name, (), {"__module__": module, "__qualname__": name})
            setattr(mod, name, cls)
            made[name] = cls
        monkeypatch.setitem(sys.modules, module, mod)
    monkeypatch.setitem(sys.modules, "omegaconf", types.ModuleType("omegaconf"))

    def wrap(value, parent=None):
        if isinstance(value, dict):
            node = made["DictConfig"]()
            meta = made["ContainerMetadata"]()
            meta.__dict__.update({"ref_type": object, "flags": {}, "resolver_cache": {}})
            node.__dict__.update({"_metadata": meta, "_parent": parent, "_content": {}})
            node._content = {k: wrap(v, node) for k, v in value.items()}
            return node
        node = made["AnyNode"]()
        meta = made["Metadata"]()
        meta.__dict__.update({"optional": True, "key": None})
        node.__dict__.update({"_metadata": meta, "_parent": parent, "_val": value})
        return node

    return wrap


def test_pickled_hydra_config_is_read_as_inert_data(tmp_path, monkeypatch):
    """The reference saves its OmegaConf config (and tokenizer) pickled in hyper_parameters;
    they are read without importing or calling their classes."""
    with monkeypatch.context() as m:
        wrap = _fake_omegaconf(m)
        hparams = {"config": wrap(reference_hydra_config(n_heads=2, length=24))}
        torch.save(lightning_checkpoint(hyper_parameters=hparams, n_heads=2), tmp_path / "ref.ckpt")
    assert "omegaconf.dictconfig" not in sys.modules
    loaded = load_checkpoint(tmp_path / "ref.ckpt")
    assert loaded.model.config.n_heads == 2 and loaded.length == 24
    assert loaded.config.diffusion.schedule == "loglinear" and loaded.data_meta["packing"] == "wrap"


def test_code_in_a_pickle_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"state_dict": reference_state_dict(), "hyper_parameters": {"x": Payload()}}, tmp_path / "evil.ckpt")
    with pytest.raises(MdlmError, match="refusing to read .*system"):
        load_checkpoint(tmp_path / "evil.ckpt")
    assert not marker.exists()


def test_truncated_lightning_file_is_a_clear_error(tmp_path):
    torch.save(lightning_checkpoint(), tmp_path / "ok.ckpt")
    data = (tmp_path / "ok.ckpt").read_bytes()
    (tmp_path / "cut.ckpt").write_bytes(data[: len(data) // 2])
    with pytest.raises(MdlmError, match="not a readable PyTorch checkpoint"):
        read_torch_file(tmp_path / "cut.ckpt")


def test_ema_that_does_not_fit_is_named(tmp_path):
    ckpt = lightning_checkpoint()
    ckpt["ema"]["shadow_params"] = ckpt["ema"]["shadow_params"][:-1]
    torch.save(ckpt, tmp_path / "x.ckpt")
    with pytest.raises(MdlmError, match="EMA holds 29 tensors but this DiT has 30 parameters"):
        load_checkpoint(tmp_path / "x.ckpt")


@pytest.mark.parametrize(("change", "message"), [
    ({"parameterization": "gaussian"}, "parameterization='gaussian'"),  # sedd and d3pm load (test_baseline_loading)
    ({"backbone": "ar"}, "'ar' backbone"),
    ({"noise": {"type": "geometric"}}, "noise schedule 'geometric'"),
])
def test_reference_configs_mdlm_cannot_serve_are_refused(change, message):
    with pytest.raises(MdlmError, match=message):
        partial_from_hydra({**reference_hydra_config(), **change}, "x.ckpt")


def test_reference_config_interpolations_and_schedules():
    config = reference_hydra_config()
    config["model"]["length"] = "${data.block}"
    config["data"]["block"] = 128
    config["noise"] = {"type": "cosinesqr"}
    partial = partial_from_hydra(config, "x.ckpt")
    assert partial.data["length"] == 128 and partial.diffusion["schedule"] == "cosine-squared"
    assert partial.data["tokenizer"] == "char"


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d, c: c.update(hidden_dim=64), r"vocab_embed.embedding has shape \(35, 32\), the model expects \(35, 64\)"),
    (lambda d, c: c.update(n_heads=2), "rotary_emb.inv_freq has 4 frequencies, but n_heads=2"),
    (lambda d, c: c.update(vocab_size=36), r"embedding has shape \(35, 32\), the model expects \(36, 32\)"),
    (lambda d, c: d.pop("backbone.blocks.1.mlp.0.bias"), "missing blocks.1.mlp.0.bias"),
    (lambda d, c: c.update(model_type="bert"), "holds a 'bert' model"),
])
def test_mismatched_hf_folders_name_the_mismatch(tmp_path, mutate, message):
    state, config = reference_state_dict(), hf_config()
    mutate(state, config)
    with pytest.raises(MdlmError, match=message):
        load_checkpoint(save_hf_folder(tmp_path / "hf", state, config))


def test_tokenizer_that_does_not_fit_the_vocabulary(tmp_path):
    folder = save_hf_folder(tmp_path / "hf", reference_state_dict(vocab=50), hf_config(vocab=50))
    (folder / "mdlm_tokenizer.json").write_text(json.dumps({"name": "char", "type": "char", "vocab_size": 35}))
    with pytest.raises(MdlmError, match="tokenizer 'char' has 35 tokens .* model's vocabulary is 50"):
        load_checkpoint(folder)


def test_corrupted_weights_and_config(tmp_path):
    folder = save_hf_folder(tmp_path / "hf")
    (folder / "model.safetensors").write_bytes(b"\x00" * 100)
    with pytest.raises(MdlmError, match="not a readable safetensors file"):
        load_checkpoint(folder)
    folder = save_hf_folder(tmp_path / "hf2")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(MdlmError, match="config.json is not readable JSON"):
        load_checkpoint(folder)


def test_source_detection(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert pretrained_source("kuleshov-group/mdlm-owt") == Source("hub", "kuleshov-group/mdlm-owt")
    assert pretrained_source("runs/demo") is None  # mdlm's run root is never a hub owner
    (tmp_path / "outputs").mkdir()
    assert pretrained_source("outputs/demo") is None  # inside an existing folder: a missing local path
    assert pretrained_source(str(tmp_path / "a" / "b")) is None
    save_hf_folder(tmp_path / "hf")
    assert pretrained_source("hf") == Source("hf", "hf")
    assert pretrained_source("hf/model.safetensors") == Source("hf", "hf")
    torch.save({}, tmp_path / "x.ckpt")
    assert pretrained_source("x.ckpt") == Source("torch", "x.ckpt")


def test_hub_id_downloads_config_weights_and_tokenizer_only(tmp_path, monkeypatch):
    import huggingface_hub

    import mdlm_cli.io.hub

    folder = save_hf_folder(tmp_path / "snapshot")
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns):
        calls.append((repo_id, allow_patterns))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(mdlm_cli.io.hub, "hub_offline", lambda: False)
    monkeypatch.chdir(tmp_path)
    loaded = load_checkpoint("kuleshov-group/mdlm-owt")
    assert calls[0][0] == "kuleshov-group/mdlm-owt"
    assert not any(p.endswith(".py") or p in ("*", "*.*") for p in calls[0][1])
    assert loaded.state["source"] == "kuleshov-group/mdlm-owt" and loaded.config.name == "mdlm-owt"


def test_hub_id_without_network_is_a_one_line_error(tmp_path, monkeypatch):
    from mdlm_cli.io.hub import hub_offline

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.chdir(tmp_path)
    hub_offline.cache_clear()
    with pytest.raises(MdlmError, match="does not exist locally, and the Hugging Face Hub cannot be reached"):
        load_checkpoint("kuleshov-group/mdlm-owt")


def test_safetensors_file_of_a_folder_and_sharded_index(tmp_path):
    state = reference_state_dict()
    folder = tmp_path / "sharded"
    folder.mkdir()
    keys = list(state)
    save_file({k: state[k] for k in keys[:10]}, folder / "model-00001-of-00002.safetensors")
    save_file({k: state[k] for k in keys[10:]}, folder / "model-00002-of-00002.safetensors")
    weight_map = {k: f"model-0000{1 + (i >= 10)}-of-00002.safetensors" for i, k in enumerate(keys)}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(hf_config()))
    loaded = load_checkpoint(folder)
    assert torch.equal(loaded.model.vocab_embed.embedding, state["backbone.vocab_embed.embedding"])


@pytest.mark.parametrize("name,config", [
    ("caduceus", {"model_type": "caduceus", "d_model": 8}),
    ("sedd", {"config": {"tokens": 50257, "graph": {"type": "absorb"}, "model": {}}}),
    ("bd3lm-hf", {"model_type": "bd3lm", "block_size": 4, "vocab_size": 50258}),
    ("hf-mlm", {"model_type": "bert", "vocab_size": 30522}),
    ("hub-mixin", {"config": {"model": {"hidden_size": 32}}}),
    ("reference-hf", {"vocab_size": 35, "model_type": "mdlm"}),
    ("lightning", None),
])
def test_each_format_is_the_first_of_formats_to_detect_its_checkpoints(name, config, tmp_path):
    found = Found(tmp_path / ("last.ckpt" if config is None else "folder"), config, "x")
    assert [n for n, fmt in FORMATS.items() if fmt.detect(found)][0] == name
