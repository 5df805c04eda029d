import pytest
import yaml

from mdlm_cli.build import config_from_dict, config_yaml, resolve_config
from mdlm_cli.config import (
    Config,
    apply_override,
    list_presets,
    load_preset,
)
from mdlm_cli.errors import MdlmError


def test_every_shipped_preset_loads_and_validates():
    names = list(list_presets())
    assert {"owt", "lm1b", "text8", "demo", "test"} <= set(names)
    for name in names:
        cfg = resolve_config(name)
        assert cfg.name == name
        assert cfg.train.global_batch_size % cfg.train.micro_batch_size == 0


def test_baseline_presets_name_their_paper_rows():
    described = list_presets()
    rows = {"lm1b-sedd": "28.90", "owt-sedd": "24.10", "lm1b-d3pm": "28.56", "lm1b-T1000": "27.19",
            "owt-tc": "23.21", "owt": "23.05", "text8-ar": "1.23", "text8-sedd": "1.39", "text8-d3pm": "1.45",
            "demo-sedd": "Table 8", "demo-d3pm": "Table 8"}
    for name, row in rows.items():
        assert row in " ".join(load_preset(name)["description"].split()), name
        assert name in described
    objectives = {name: resolve_config(name).diffusion.objective for name in rows}
    assert objectives["lm1b-d3pm"] == objectives["text8-d3pm"] == objectives["demo-d3pm"] == "d3pm"
    assert objectives["owt-sedd"] == objectives["demo-sedd"] == "sedd" and objectives["text8-ar"] == "ar"
    demo = resolve_config("demo").to_dict()
    for name in ("demo-sedd", "demo-d3pm"):  # the demo's data, blocks, steps, batch and recipe
        other = resolve_config(name).to_dict()
        assert all(other[section] == demo[section] for section in ("data", "optim", "train")), name
        assert {k: v for k, v in other["model"].items() if k != "time_conditioning"} == \
            {k: v for k, v in demo["model"].items() if k != "time_conditioning"}
    assert resolve_config("lm1b-T1000").diffusion.T == resolve_config("lm1b-d3pm").diffusion.T == 1000
    assert resolve_config("owt-tc").model.time_conditioning and not resolve_config("owt").model.time_conditioning


def test_owt_preset_matches_the_paper_recipe():
    cfg = resolve_config("owt")
    assert (cfg.data.tokenizer, cfg.data.length, cfg.data.packing) == ("gpt2", 1024, "wrap")
    assert (cfg.model.n_blocks, cfg.model.hidden_size, cfg.model.n_heads) == (12, 768, 12)
    assert cfg.optim.lr == 3e-4 and cfg.optim.warmup_steps == 2500 and cfg.optim.schedule == "constant"
    assert cfg.train.global_batch_size == 512 and cfg.train.max_steps == 1_000_000
    assert cfg.train.ema == 0.9999 and cfg.optim.grad_clip == 1.0
    assert cfg.diffusion.schedule == "loglinear" and cfg.diffusion.antithetic
    assert not cfg.model.time_conditioning


def test_precedence_defaults_preset_set_flags():
    assert Config().optim.lr == 3e-4
    cfg = resolve_config("test", ["optim.lr=1e-2", "train.seed=5"], {"train.seed": 9, "train.max_steps": None})
    assert cfg.optim.lr == 1e-2  # --set beats the preset
    assert cfg.train.seed == 9  # an explicit flag beats --set
    assert cfg.train.max_steps == load_preset("test")["train"]["max_steps"]  # None = unset


def test_unknown_keys_and_sections_list_the_valid_ones():
    with pytest.raises(MdlmError, match="valid keys: .*lr"):
        resolve_config("test", ["optim.learning_rate=1"])
    with pytest.raises(MdlmError, match="valid sections"):
        config_from_dict({"optimizer": {"lr": 1}})
    with pytest.raises(MdlmError, match="unknown preset 'nope'"):
        resolve_config("nope")
    with pytest.raises(MdlmError, match="section.key=value"):
        apply_override({}, "lr=3")


def test_type_errors_and_invalid_values():
    with pytest.raises(MdlmError, match="train.max_steps expects int"):
        resolve_config("test", ["train.max_steps=ten"])
    with pytest.raises(MdlmError, match="multiple of"):
        resolve_config("test", ["train.global_batch_size=10", "train.micro_batch_size=4"])
    with pytest.raises(MdlmError, match="data.packing must be one of"):
        resolve_config("test", ["data.packing=zip"])
    assert resolve_config("test", ["optim.betas=[0.9, 0.95]"]).optim.betas == (0.9, 0.95)
    assert resolve_config("test", ["train.max_steps=1e3"]).train.max_steps == 1000


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = resolve_config("owt", ["optim.lr=1e-4"])
    path = tmp_path / "c.yaml"
    path.write_text(config_yaml(cfg))
    again = resolve_config(str(path))
    assert again.to_dict() == cfg.to_dict()
    assert yaml.safe_load(config_yaml(cfg))["optim"]["lr"] == 1e-4


def test_every_package_and_preset_is_shipped_in_the_wheel(tmp_path):
    """The wheel holds every module of mdlm_cli/ and every preset (the presets folder is mapped
    into mdlm_cli.presets): a new subpackage or preset works in an editable install, so only a
    built wheel shows one left out."""
    import pathlib
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("setuptools")
    root = pathlib.Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    str(root), "-w", str(tmp_path)], check=True, capture_output=True)
    names = set(zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist())
    modules = {str(p.relative_to(root)) for p in (root / "mdlm_cli").rglob("*.py")}
    presets = {"mdlm_cli/" + str(p.relative_to(root)) for p in (root / "presets").rglob("*.yaml")}
    pages = {str(p.relative_to(root)) for p in (root / "mdlm_cli").rglob("*.html")}  # mdlm serve's
    assert modules | presets | pages <= names, sorted((modules | presets | pages) - names)


def test_each_backbone_reads_its_own_dataclass_with_the_flat_sections_defaults():
    """A backbone's config dataclass names the model.* keys it reads (config_keys) and starts
    from the same defaults as the flat section, so presets and checkpoints mean what they meant."""
    import dataclasses

    from mdlm_cli.config import ModelConfig
    from mdlm_cli.models import BACKBONES
    from mdlm_cli.models.caduceus import CaduceusConfig, MambaConfig
    from mdlm_cli.models.dit import DiTConfig
    from mdlm_cli.models.hf_mlm import HFMaskedLMConfig
    from mdlm_cli.models.section import keys_of, read_section

    flat = ModelConfig()
    sections = (DiTConfig, MambaConfig, CaduceusConfig, HFMaskedLMConfig)
    assert {cls.config_keys for cls in BACKBONES.values()} == {keys_of(s) for s in sections}
    for section in sections:
        own = read_section(section, flat)
        assert all(getattr(own, f.name) == getattr(flat, f.name) for f in dataclasses.fields(section))
    assert read_section(DiTConfig, ModelConfig(hidden_size=64, n_heads=2)).hidden_size == 64


def test_bd3lm_presets_fine_tune_their_pretraining_run_at_each_block_size():
    for corpus, length in (("lm1b", 128), ("owt", 1024)):
        pre = resolve_config(f"bd3lm-{corpus}-pretrain")
        assert pre.diffusion.block_size == pre.data.length == length and pre.train.max_steps == 850_000
        for block in (4, 8, 16):
            cfg = resolve_config(f"bd3lm-{corpus}-{block}")
            assert cfg.diffusion.objective == "bd3lm" and cfg.diffusion.block_size == block
            # OWT fine-tunes the released pre-training checkpoint (formats/bd3lm_hf.py), LM1B
            # a local run (none is released)
            released = "kuleshov-group/bd3lm-owt-block_size1024-pretrain"
            assert cfg.train.init_from == (released if corpus == "owt"
                                           else f"runs/bd3lm-{corpus}-pretrain")
            assert cfg.train.max_steps + pre.train.max_steps == 1_000_000
            assert cfg.diffusion.clip_search_widths == (0.5, 0.6, 0.7, 0.8, 0.9)
            assert cfg.data == pre.data and cfg.model == pre.model and cfg.optim == pre.optim
    demo, bd3 = resolve_config("demo").to_dict(), resolve_config("demo-bd3lm")
    assert bd3.diffusion.block_size == 16 and bd3.data.packing == "chunk-eos"  # EOS at doc ends
    assert bd3.to_dict()["train"] == demo["train"] and bd3.to_dict()["optim"] == demo["optim"]
    assert {k: v for k, v in demo["data"].items() if k != "packing"} == \
        {k: v for k, v in bd3.to_dict()["data"].items() if k != "packing"}
