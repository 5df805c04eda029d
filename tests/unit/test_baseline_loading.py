"""Loading the baselines' checkpoints: the reference's Lightning files with parameterization
sedd or d3pm, and SEDD's own published format (a fake `louaaron/sedd-small` folder)."""

import json
import math

import pytest
import torch
from safetensors.torch import save_file

from mdlm_cli.checkpoints.formats.reference import partial_from_hydra
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.errors import MdlmError
from mdlm_cli.objectives import objectives_served_by

from ..reference_weights import (
    inv_freq,
    lightning_checkpoint,
    reference_hydra_config,
    reference_state_dict,
)


def _lightning(tmp_path, **changes):
    config = {**reference_hydra_config(n_heads=2), **changes}
    torch.save(lightning_checkpoint(hyper_parameters={"config": config}, n_heads=2), tmp_path / "last.ckpt")
    return load_checkpoint(tmp_path / "last.ckpt")


def test_reference_sedd_checkpoint_loads_into_the_sedd_objective(tmp_path):
    loaded = _lightning(tmp_path, parameterization="sedd", time_conditioning=True)
    assert loaded.objective.name == "sedd" and loaded.config.model.time_conditioning
    assert loaded.state["weights"] == "ema"
    denoiser = loaded.denoiser()
    z = torch.full((2, 32), loaded.mask_id)
    z[:, ::2] = 9
    masked = z == loaded.mask_id
    scores = denoiser.log_score(z, torch.tensor([0.3, 0.8]), output_mask=masked)
    logits = loaded.model(z, loaded.objective.schedule.sigma(torch.tensor([0.3, 0.8])))[masked]
    sigma = loaded.objective.schedule.sigma(torch.tensor([0.3, 0.8], dtype=torch.float64))
    shift = (torch.log(torch.expm1(sigma))[:, None].expand(2, 32)[masked] + math.log(34)).float()
    expected = (logits - shift[:, None]).index_fill(-1, torch.tensor([loaded.mask_id]), 0.0)
    assert torch.allclose(scores, expected, atol=1e-4)  # the reference's _sedd_parameterization


@pytest.mark.parametrize("subs_masking", [False, True])
def test_reference_d3pm_checkpoint_loads_with_its_switches(tmp_path, subs_masking):
    loaded = _lightning(tmp_path, parameterization="d3pm", T=1000, time_conditioning=True, subs_masking=subs_masking)
    d = loaded.config.diffusion
    assert (loaded.objective.name, d.T, d.zero_masking, d.carry_over) == ("d3pm", 1000, subs_masking, False)
    logits = loaded.denoiser()(torch.full((1, 32), loaded.mask_id), torch.tensor([0.5]))
    assert torch.isneginf(logits[..., loaded.mask_id]).all() == subs_masking


def test_reference_configs_the_baselines_cannot_use_are_refused(tmp_path):
    with pytest.raises(MdlmError, match="SEDD model trained without time conditioning"):
        partial_from_hydra({**reference_hydra_config(), "parameterization": "sedd"}, "x.ckpt")
    with pytest.raises(MdlmError, match=r"d3pm objective is discrete-time \(eq. 9\)"):  # the reference asserts T > 0
        _lightning(tmp_path, parameterization="d3pm", T=0)
    with pytest.raises(MdlmError, match="parameterization='gaussian'"):
        partial_from_hydra({**reference_hydra_config(), "parameterization": "gaussian"}, "x.ckpt")
    config = {**reference_hydra_config(), "noise": {"type": "geometric", "sigma_min": 1e-4, "sigma_max": 20}}
    assert partial_from_hydra(config, "x.ckpt").diffusion["schedule"] == "geometric"


# ----------------------------------------------------------------------------- SEDD's hub format

def sedd_hub_folder(folder, *, tokens=50257, hidden=16, cond=8, n_blocks=2, n_heads=2, nested=False, **changes):
    """What `SEDD.save_pretrained` writes for SEDD's own repository: its Hydra config as config.json
    and the `SEDD` module's state dict under bare names (persistent rotary buffer included)."""
    config = {"ngpus": 8, "tokens": tokens, "training": {"batch_size": 512, "ema": 0.9999},
              "data": {"train": "openwebtext", "valid": "wikitext103"},
              "graph": {"type": "absorb", "file": "data", "report_all": False},
              "noise": {"type": "loglinear", "sigma_min": 1e-4, "sigma_max": 20},
              "sampling": {"predictor": "euler", "steps": 128, "noise_removal": True},
              "model": {"name": "small", "type": "ddit", "hidden_size": hidden, "cond_dim": cond, "length": 64,
                        "n_blocks": n_blocks, "n_heads": n_heads, "scale_by_sigma": True, "dropout": 0.1}}
    for key, value in changes.items():
        section, name = key.split("__")
        config[section][name] = value
    state = reference_state_dict(vocab=tokens + 1, hidden=hidden, cond=cond, n_blocks=n_blocks, n_heads=n_heads,
                                 prefix="")
    assert torch.equal(state["rotary_emb.inv_freq"], inv_freq(hidden, n_heads))
    folder.mkdir(parents=True)
    save_file(dict(state), folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"config": config} if nested else config))
    return folder, state


@pytest.mark.parametrize("nested", [False, True])
def test_sedd_published_format_loads_into_the_sedd_objective(tmp_path, nested):
    folder, state = sedd_hub_folder(tmp_path / "sedd-small", nested=nested)
    loaded = load_checkpoint(folder)
    assert loaded.objective.name == "sedd" and loaded.config.model.time_conditioning
    assert loaded.tokenizer.name == "gpt2" and loaded.mask_id == 50257 and loaded.length == 64
    assert loaded.config.data.dataset == "openwebtext" and loaded.config.diffusion.schedule == "loglinear"
    params = dict(loaded.model.named_parameters())
    assert all(torch.equal(params[k], v) for k, v in state.items() if k in params)
    assert loaded.objective.samplers
    assert all("sedd" in objectives_served_by(s.name) for s in loaded.objective.samplers)


@pytest.mark.parametrize(("change", "message"), [
    ({"graph__type": "uniform"}, "'uniform' graph"),
    ({"model__scale_by_sigma": False}, "without scale_by_sigma"),
    ({"noise__type": "geometric", "noise__sigma_max": 10}, "geometric noise with sigma"),
    ({"tokens": 34}, "mask .*is id 34, but the tokenizer 'char' masks with id 4"),
])
def test_sedd_models_mdlm_cannot_serve_are_refused(tmp_path, change, message):
    tokens = change.pop("tokens", 50257)
    folder, _ = sedd_hub_folder(tmp_path / "sedd", tokens=tokens, **change)
    with pytest.raises(MdlmError, match=message):
        load_checkpoint(folder)


def test_sedd_hub_id_without_safetensors_fetches_the_state_dict_only(tmp_path, monkeypatch):
    """A hub upload with `pytorch_model.bin` only: fetched in a second call, read weights_only."""
    import huggingface_hub

    import mdlm_cli.io.hub

    folder, state = sedd_hub_folder(tmp_path / "snapshot")
    (folder / "model.safetensors").unlink()
    torch.save(dict(state), folder / "pytorch_model.bin")
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns):
        calls.append(list(allow_patterns))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    monkeypatch.setattr(mdlm_cli.io.hub, "hub_offline", lambda: False)
    monkeypatch.chdir(tmp_path)
    loaded = load_checkpoint("louaaron/sedd-small")
    assert loaded.objective.name == "sedd" and loaded.state["source"] == "louaaron/sedd-small"
    assert len(calls) == 2 and "pytorch_model.bin" not in calls[0] and "pytorch_model.bin" in calls[1]
    assert not any(p.endswith(".py") or p in ("*", "*.*") for p in calls[1])
