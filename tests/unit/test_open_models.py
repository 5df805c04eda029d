"""LLaDA and Dream as native backbones: tiny random folders in the releases' layout
(tests/open_model_folders.py) load without any of their Python files, give the logits of an
independent transcription of the published architectures, and sample from the CLI."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.errors import MdlmError
from tests.open_model_folders import write_dream, write_llada

ROOT = Path(__file__).resolve().parents[2]
WRITERS = {"llada": write_llada, "dream": write_dream}

# the families' other defaults: Dream's top_k and scoring conventions, LLaDA's estimator
FAMILY_DEFAULTS = {"dream": {"top_k": 50, "append_eos": True, "tokenizer_bos": True},
                   "llada": {"estimator": "l"}}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("open-models")
    return {name: write(base / name) for name, write in WRITERS.items()}


def released_weights(folder: Path) -> dict[str, torch.Tensor]:
    weights = {}
    for shard in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(shard))
    return weights


# ---------------------------------------------------------------- the published forward passes
def rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(q, k, theta):
    """LLaDA's RotaryEmbedding / Dream's apply_rotary_pos_emb, both halves-split."""
    T, hs = q.shape[-2], q.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float) / hs))
    freqs = torch.einsum("i , j -> i j", torch.arange(T, dtype=torch.float), inv_freq)
    positions = torch.cat((freqs, freqs), dim=-1)
    sin, cos = positions.sin()[None, None], positions.cos()[None, None]

    def rotate_half(x):
        x1, x2 = x[..., : hs // 2], x[..., hs // 2:]
        return torch.cat((-x2, x1), dim=-1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def attention(q, k, v, n_heads, n_kv):
    """Full (non-causal) softmax attention written out, k/v heads repeated as repeat_kv does."""
    B, T, C = q.shape
    hs = C // n_heads
    q = q.view(B, T, n_heads, hs).transpose(1, 2)
    k = k.view(B, T, n_kv, hs).transpose(1, 2)
    v = v.view(B, T, n_kv, hs).transpose(1, 2)
    return q, k, v


def mix(q, k, v, n_heads, n_kv):
    B, _, T, hs = q.shape
    k = k[:, :, None].expand(B, n_kv, n_heads // n_kv, T, hs).reshape(B, n_heads, T, hs)
    v = v[:, :, None].expand(B, n_kv, n_heads // n_kv, T, hs).reshape(B, n_heads, T, hs)
    weights = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(hs), dim=-1)
    return (weights @ v).transpose(1, 2).reshape(B, T, n_heads * hs)


def llada_reference(w, c, tokens):
    """LLaDAModel.forward with LLaDALlamaBlock (modeling_llada.py), no cache, no mask."""
    eps, H, Hkv = c["rms_norm_eps"], c["n_heads"], c["n_kv_heads"]
    x = w["model.transformer.wte.weight"][tokens]
    for i in range(c["n_layers"]):
        b = lambda name, i=i: w[f"model.transformer.blocks.{i}.{name}.weight"]  # noqa: E731
        h = rms(x, b("attn_norm"), eps)
        q, k, v = attention(h @ b("q_proj").T, h @ b("k_proj").T, h @ b("v_proj").T, H, Hkv)
        q, k = rope(q, k, c["rope_theta"])
        x = x + mix(q, k, v, H, Hkv) @ b("attn_out").T
        h = rms(x, b("ff_norm"), eps)
        x = x + (F.silu(h @ b("ff_proj").T) * (h @ b("up_proj").T)) @ b("ff_out").T
    return rms(x, w["model.transformer.ln_f.weight"], eps) @ w["model.transformer.ff_out.weight"].T


def dream_network(w, c, tokens):
    """DreamModel.forward (modeling_dream.py): the logits before generation's shift."""
    eps, H, Hkv = c["rms_norm_eps"], c["num_attention_heads"], c["num_key_value_heads"]
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        p = lambda name, i=i: w[f"model.layers.{i}.{name}"]  # noqa: E731
        h = rms(x, p("input_layernorm.weight"), eps)
        proj = [h @ p(f"self_attn.{n}_proj.weight").T + p(f"self_attn.{n}_proj.bias")
                for n in "qkv"]
        q, k, v = attention(*proj, H, Hkv)
        q, k = rope(q, k, c["rope_theta"])
        x = x + mix(q, k, v, H, Hkv) @ p("self_attn.o_proj.weight").T
        h = rms(x, p("post_attention_layernorm.weight"), eps)
        gate, up = h @ p("mlp.gate_proj.weight").T, h @ p("mlp.up_proj.weight").T
        x = x + (F.silu(gate) * up) @ p("mlp.down_proj.weight").T
    return rms(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def dream_reference(w, c, tokens):
    """As diffusion_generate reads the logits (generation_utils.py)."""
    logits = dream_network(w, c, tokens)
    return torch.cat([logits[:, :1], logits[:, :-1]], dim=1)


REFERENCES = {"llada": llada_reference, "dream": dream_reference}


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_released_folder_loads_as_its_native_backbone(folders, family):
    loaded = load_checkpoint(str(folders[family]))
    raw = json.loads((folders[family] / "config.json").read_text())
    assert loaded.config.model.backbone == family
    assert loaded.config.diffusion.objective == "mdlm"
    assert loaded.config.diffusion.schedule == "linear"
    assert loaded.tokenizer.mask_id == raw["mask_token_id"] == loaded.objective.mask_id
    assert loaded.tokenizer.eos_id == raw["eos_token_id"]
    assert loaded.tokenizer.vocab_size == raw.get("embedding_size", raw["vocab_size"])
    assert loaded.state["family"] == family
    assert loaded.state["sampling_defaults"] == {"k_schedule": family, **FAMILY_DEFAULTS[family]}
    assert loaded.denoiser().time_agnostic
    assert loaded.tokenizer.hf.chat_template  # tokenizer_config.json's template


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_logits_equal_the_published_forward_in_float32(folders, family):
    loaded = load_checkpoint(str(folders[family]))
    raw = json.loads((folders[family] / "config.json").read_text())
    tokens = torch.randint(0, 90, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = loaded.model(tokens)
        expected = REFERENCES[family](released_weights(folders[family]), raw, tokens)
        picked = torch.rand(3, 12, generator=torch.Generator().manual_seed(2)) < 0.5
        rows = loaded.model(tokens, output_mask=picked)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rows, expected[picked], atol=1e-5, rtol=1e-5)


def test_dream_reads_each_position_from_the_one_before(folders):
    loaded = load_checkpoint(str(folders["dream"]))
    raw = json.loads((folders["dream"] / "config.json").read_text())
    tokens = torch.randint(0, 80, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ours = loaded.model(tokens)
        network = dream_network(released_weights(folders["dream"]), raw, tokens)
    torch.testing.assert_close(ours[:, 1:], network[:, :-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours[:, 0], network[:, 0], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(ours[:, 1:], network[:, 1:], atol=1e-3)


def test_the_folders_python_files_are_never_imported_and_the_cli_samples(folders):
    """Each folder's modelling files raise on import; `mdlm sample` runs in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    for family, folder in folders.items():
        out = subprocess.run(
            [sys.executable, "-m", "mdlm_cli", "sample", "-c", str(folder), "-n", "2",
             "--length", "16", "--sampler", "ancestral", "--steps", "8", "--seed", "0"],
            capture_output=True, text=True, env=env, cwd=folder.parent, timeout=240)
        assert out.returncode == 0, (family, out.stdout[-2000:], out.stderr[-2000:])
        assert "sample 1" in out.stdout and "was imported" not in out.stderr
    assert not [m for m in sys.modules if m.startswith(("modeling_", "tokenization_dream"))]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_missing_shard_or_a_corrupted_config_is_one_line(tmp_path, family):
    folder = WRITERS[family](tmp_path / family)
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    shard.rename(tmp_path / "aside")
    with pytest.raises(MdlmError, match=f"lacks the shard {shard.name}") as e:
        load_checkpoint(str(folder))
    assert "\n" not in str(e.value)
    (tmp_path / "aside").rename(shard)
    (folder / "config.json").write_text('{"model_type": "llada", "d_model": ')
    with pytest.raises(MdlmError, match="not readable JSON") as e:
        load_checkpoint(str(folder))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("key", "value"), [("alibi", True), ("block_type", "sequential"),
                                            ("moe_num_experts", 8)])
def test_an_unimplemented_llada_variant_is_refused_naming_its_key(tmp_path, key, value):
    folder = write_llada(tmp_path / "llada")
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, key: value}))
    with pytest.raises(MdlmError, match=f"{key}={value!r}"):
        load_checkpoint(str(folder))


def test_bf16_weights_stay_bf16_and_fp32_on_request(tmp_path):
    from mdlm_cli.checkpoints.load import load_on_device

    folder = write_llada(tmp_path / "llada", dtype=torch.bfloat16)
    loaded = load_checkpoint(str(folder))
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.model(torch.tensor([[1, 2, 3]])).dtype == torch.float32
    loaded, _ = load_on_device(str(folder), device="cpu", precision="fp32")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.float32}


def test_weights_that_cannot_fit_are_refused_before_loading(tmp_path, monkeypatch):
    from mdlm_cli import memory

    folder = write_llada(tmp_path / "llada")
    monkeypatch.setattr(memory, "available", lambda device: (1000, "available RAM"))
    with pytest.raises(MdlmError, match=r"needs 0\.\d GiB for its weights; this machine has "
                                        r"0\.0 GiB available RAM") as e:
        load_checkpoint(str(folder))
    assert "\n" not in str(e.value)


def test_a_hub_download_fetches_the_released_files_and_never_code():
    from fnmatch import fnmatch

    from mdlm_cli.io.hub import HUB_FILES

    def fetched(name):
        return any(fnmatch(name, pattern) for pattern in HUB_FILES)

    for name in ("config.json", "model-00001-of-00006.safetensors",
                 "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "generation_config.json"):
        assert fetched(name), name
    for name in ("modeling_llada.py", "configuration_dream.py", "tokenization_dream.py",
                 "generation_utils.py", "__init__.py"):
        assert not fetched(name), name


def test_the_load_memory_benchmark_runs_on_a_tiny_folder():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "open_model_memory.py"),
                          "--tiny"], capture_output=True, text=True, cwd=ROOT, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout.strip().splitlines()[-2])
    assert figures["dtypes"] == ["torch.bfloat16"]
    assert figures["peak_rss"] >= figures["rss_before_load"] > 0
    assert figures["weights_bytes"] == 2 * figures["params"]


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_fine_tuning_from_a_folder_saves_and_reloads(tmp_path, family):
    """`train.init_from=FOLDER` on prompt/response data: the run starts from the folder's weights
    (its logits move by about the learning rate), saves the family's config beside the weights
    and reloads offline as the same backbone with the family's sampling defaults."""
    import io

    from rich.console import Console

    from mdlm_cli.build import config_from_dict
    from mdlm_cli.train.loop import train

    folder = WRITERS[family](tmp_path / family)
    data = tmp_path / "qa.jsonl"
    examples = [{"prompt": "w1 w2 w3", "response": "w4 w5"},
                {"prompt": "w7", "response": "w8 w9 w10 w11"}]
    data.write_text("".join(json.dumps(e) + "\n" for e in examples * 20))
    cfg = config_from_dict({
        "name": "ft", "model": {"backbone": family, "hf_model": str(folder)},
        "diffusion": {"objective": "mdlm", "schedule": "linear"},
        "data": {"dataset": str(data), "tokenizer": str(folder), "length": 32, "packing": "sft",
                 "cache_dir": str(tmp_path)},
        "train": {"global_batch_size": 4, "micro_batch_size": 4, "max_steps": 2, "ema": 0,
                  "precision": "fp32", "init_from": str(folder), "out_dir": str(tmp_path / "run")}})
    log = io.StringIO()
    result = train(cfg, console=Console(file=log, width=300))
    assert f"Initialised from {folder}" in log.getvalue()
    assert all(math.isfinite(loss) for loss in result.losses)
    step = next((tmp_path / "run" / "checkpoints").glob("step-*"))
    assert (step / f"{family}_config.json").is_file()
    tuned, released = load_checkpoint(str(tmp_path / "run")), load_checkpoint(str(folder))
    assert type(tuned.model) is type(released.model)
    assert tuned.state["sampling_defaults"] == {"k_schedule": family, **FAMILY_DEFAULTS[family]}
    assert tuned.tokenizer.mask_id == released.tokenizer.mask_id
    tokens = torch.randint(0, 80, (2, 8), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        moved = (tuned.model(tokens) - released.model(tokens)).abs().max()
    assert 0 < moved < 1e-2


def test_a_hub_id_names_the_same_tokenizer_as_its_folder(folders, monkeypatch):
    """data.tokenizer=OWNER/NAME of a LLaDA repository: its config and tokeniser files (a
    stand-in snapshot here), the model's mask id, never AutoTokenizer with the repo's code."""
    import huggingface_hub

    from mdlm_cli.data.tokenizers import load_tokenizer

    asked = []

    def snapshot(repo_id, allow_patterns):
        asked.append(allow_patterns)
        return str(folders["llada"])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = load_tokenizer("GSAI-ML/LLaDA-8B-Instruct")
    own = load_checkpoint(str(folders["llada"])).tokenizer
    assert tokenizer.name == "GSAI-ML/LLaDA-8B-Instruct"
    assert tokenizer.describe() | {"name": own.name} == own.describe()
    assert not any(p.endswith(".py") for p in asked[0])


def test_the_sampling_estimate_reads_the_models_own_shape_and_dtype(tmp_path, monkeypatch):
    """check_memory counts bf16 weights at 2 bytes and the activations of config.json's shape
    (the flat model.* defaults describe no released model)."""
    from mdlm_cli import memory

    folder = write_llada(tmp_path / "llada", dtype=torch.bfloat16, d_model=64, n_layers=3)
    loaded = load_checkpoint(str(folder))
    seen = {}
    monkeypatch.setattr(memory, "check_fits", lambda what, need, device, fix: seen.update(n=need))
    memory.check_memory(loaded.model, loaded.config.model, loaded.tokenizer.vocab_size,
                        memory.Workload(batch=2, length=16, what="sampling", fix="fewer"),
                        device=torch.device("cpu"))
    params = sum(p.numel() for p in loaded.model.parameters())
    assert seen["n"].weights == 2 * params
    expected = memory.footprint(params=params, hidden=64, n_blocks=3, mlp_ratio=2, vocab=96,
                                batch=2, length=16)
    assert seen["n"].activations == expected.activations


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_padding_is_kept_out_of_attention(folders, family):
    """Right-padded rows give the unpadded sequence's logits at its own positions."""
    loaded = load_checkpoint(str(folders[family]))
    tokens = torch.randint(0, 80, (1, 10), generator=torch.Generator().manual_seed(5))
    padded = torch.cat([tokens, torch.full((1, 6), loaded.tokenizer.pad_id)], dim=1)
    keep = torch.cat([torch.ones(1, 10), torch.zeros(1, 6)], dim=1)
    with torch.no_grad():
        alone = loaded.model(tokens)
        within = loaded.model(padded, attention_mask=keep)[:, :10]
        attended = loaded.model(padded)[:, :10]
    torch.testing.assert_close(within, alone, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(attended, alone, atol=1e-4)
