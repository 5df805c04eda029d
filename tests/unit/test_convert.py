"""`mdlm convert` (issue 54): a causal LM becomes a masked diffusion model that keeps its weights.

The key property, without any training: with the shift on and causal attention, the converted
model's distribution for a masked last token is the source AR model's next-token distribution
after the same prefix (the source run by transformers, or the mdlm AR run itself), for each
source layout. Then what the conversion writes (every tensor kept, the mask row), what stays as
it was (released LLaDA and Dream folders, the DiT without the shift) and the refusals, each
before anything is written.
"""

import json

import pytest
import torch
from safetensors.torch import load_file

from mdlm_cli.checkpoints.convert import ConvertRequest, convert
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import DiT

from ..causal_lm_folders import ARCHS, edit_config, write_ar_run, write_causal_lm, write_encoder
from ..open_model_folders import write_dream, write_llada

TOL = 1e-4  # float32 on the CPU: the same network, summed in another order


def next_token_logprobs(logits: torch.Tensor, mask_id: int, vocab: int) -> torch.Tensor:
    """log p over the source's vocabulary without the mask (SUBS gives the mask probability 0;
    the AR models never draw it)."""
    keep = [i for i in range(vocab) if i != mask_id]
    return logits[..., keep].double().log_softmax(-1)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("causal")
    return {arch: write_causal_lm(base / arch, arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_shift_and_causal_attention_give_the_source_next_token_distribution(sources, tmp_path,
                                                                            arch):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "out"
    convert(ConvertRequest(str(sources[arch]), out, attention="causal"))
    loaded = load_checkpoint(out)
    hf = AutoModelForCausalLM.from_pretrained(sources[arch]).eval()
    prefix = torch.randint(1, 80, (3, 13), generator=torch.Generator().manual_seed(1))
    z_t = torch.cat([prefix, torch.full((3, 1), loaded.mask_id)], dim=1)  # the last one masked
    with torch.no_grad():
        ours = loaded.denoiser()(z_t, torch.full((3,), 0.5))[:, -1]  # the samplers' call
        theirs = hf(prefix).logits[:, -1]
    vocab = theirs.shape[-1]
    assert torch.allclose(next_token_logprobs(ours, loaded.mask_id, vocab),
                          next_token_logprobs(theirs, loaded.mask_id, vocab), atol=TOL)
    assert loaded.model.shifted_logits and loaded.state["converted_from"]["attention"] == "causal"


def test_an_ar_run_converted_with_the_shift_gives_its_next_token_distribution(tmp_path):
    """The converted DiT, run with causal attention, on [BOS, x, MASK] gives at the mask what the
    AR run gives after [BOS, x]."""
    run = write_ar_run(tmp_path / "ar")
    convert(ConvertRequest(str(run), tmp_path / "out"))
    source, converted = load_checkpoint(run), load_checkpoint(tmp_path / "out")
    assert converted.objective.name == "mdlm" and not converted.model.causal
    causal = DiT(converted.config.model, converted.tokenizer.vocab_size, causal=True).eval()
    causal.load_state_dict(converted.model.state_dict())
    x = torch.randint(5, 30, (3, 12), generator=torch.Generator().manual_seed(2))
    x[:, 0] = source.tokenizer.bos_id
    with torch.no_grad():
        theirs = source.model(x)[:, -1]
        ours = causal(torch.cat([x, torch.full((3, 1), converted.mask_id)], dim=1))[:, -1]
    vocab = theirs.shape[-1]
    assert torch.allclose(next_token_logprobs(ours, converted.mask_id, vocab),
                          next_token_logprobs(theirs, converted.mask_id, vocab), atol=TOL)
    assert converted.state["converted_from"]["shift"] is True


def test_full_attention_lets_a_position_see_the_tokens_after_it(sources, tmp_path):
    """The default (diffusion) attention: changing a later token changes an earlier position's
    logits; under causal attention it cannot."""
    for attention in ("full", "causal"):
        convert(ConvertRequest(str(sources["llama"]), tmp_path / attention, attention=attention))
        model = load_checkpoint(tmp_path / attention).model
        x = torch.randint(1, 80, (1, 10), generator=torch.Generator().manual_seed(3))
        y = x.clone()
        y[0, -1] = (x[0, -1] % 79) + 1
        with torch.no_grad():
            changed = not torch.allclose(model(x)[0, 3], model(y)[0, 3])
        assert changed == (attention == "full")


def test_every_tensor_is_kept_and_the_mask_row_is_the_mean_or_a_spare_one(sources, tmp_path):
    """LLaMA's 82 rows have no spare id: one row is added, the mean of the others; Qwen2's 96
    rows have: the embedding is the source's, byte for byte. GPT-2's tensors keep their names
    and Conv1D layout."""
    for arch in ARCHS:
        convert(ConvertRequest(str(sources[arch]), tmp_path / arch))
    src = load_file(sources["llama"] / "model.safetensors")
    out = load_file(tmp_path / "llama" / "model.safetensors")
    embedding = out["model.transformer.wte.weight"]
    assert embedding.shape[0] == 83 and torch.equal(embedding[:82], src["model.embed_tokens.weight"])
    assert torch.allclose(embedding[82], src["model.embed_tokens.weight"].mean(0))
    assert torch.equal(out["model.transformer.blocks.1.ff_out.weight"],
                       src["model.layers.1.mlp.down_proj.weight"])
    config = json.loads((tmp_path / "llama" / "config.json").read_text())
    assert (config["mask_token_id"], config["embedding_size"], config["model_type"]) == (
        82, 83, "llada")
    qwen_src = load_file(sources["qwen2"] / "model.safetensors")
    qwen = load_file(tmp_path / "qwen2" / "model.safetensors")
    assert set(qwen) == set(qwen_src) and all(torch.equal(qwen[k], qwen_src[k]) for k in qwen)
    gpt2 = load_file(tmp_path / "gpt2" / "model.safetensors")
    gpt2_src = load_file(sources["gpt2"] / "model.safetensors")
    assert torch.equal(gpt2["transformer.h.0.attn.c_attn.weight"],
                       gpt2_src["transformer.h.0.attn.c_attn.weight"])  # (in, out): kept
    saved_tokenizer = json.loads((tmp_path / "gpt2" / "tokenizer_config.json").read_text())
    assert "<|mdm_mask|>" in json.dumps(saved_tokenizer)


def test_released_folders_keep_their_own_shift_and_full_attention(tmp_path):
    """No conversion record: LLaDA predicts in place, Dream shifts, both attend both ways."""
    llada, dream = (load_checkpoint(write(tmp_path / name)).model
                    for name, write in (("llada", write_llada), ("dream", write_dream)))
    assert (llada.shift, llada.attention, llada.conversion) == (False, "full", {})
    assert (dream.shift, dream.attention) == (True, "full")
    assert "converted" not in llada.describe()


@pytest.mark.parametrize("case", ["encoder", "auto_map", "mistral", "no-weights", "corrupt",
                                  "qwen2-no-shift", "not-cached", "out-not-empty"])
def test_bad_sources_are_refused_in_one_line_and_nothing_is_written(sources, tmp_path, case,
                                                                    monkeypatch):
    source, request = tmp_path / "src", {}
    if case == "encoder":
        write_encoder(source)
    elif case in ("auto_map", "mistral", "no-weights", "corrupt"):
        write_causal_lm(source, "llama")
        if case == "auto_map":
            edit_config(source, auto_map={"AutoModelForCausalLM": "modeling_x.X"})
        elif case == "mistral":
            edit_config(source, architectures=["MistralForCausalLM"], model_type="mistral")
        elif case == "no-weights":
            (source / "model.safetensors").unlink()
        else:
            (source / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    elif case == "qwen2-no-shift":
        source, request = sources["qwen2"], {"shift": False}
    elif case == "not-cached":
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
        source = "nobody/no-such-model"
    else:
        source = sources["gpt2"]
        (tmp_path / "out").mkdir()
        (tmp_path / "out" / "keep.txt").write_text("mine")
    expected = {"encoder": "is an encoder", "auto_map": "needs remote code",
                "mistral": "MistralForCausalLM, which no mdlm backbone implements",
                "no-weights": "no model.safetensors", "corrupt": "not a readable safetensors",
                "qwen2-no-shift": "always reads position i", "not-cached": "not in the local",
                "out-not-empty": "pass --force"}[case]
    with pytest.raises(MdlmError, match=expected) as e:
        convert(ConvertRequest(str(source), tmp_path / "out", **request))
    assert "\n" not in str(e.value)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("src", "empty-cache"))
    assert left == (["out"] if case == "out-not-empty" else [])
    if case == "out-not-empty":
        assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def test_force_replaces_a_folder_and_the_record_names_the_source(sources, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("old")
    convert(ConvertRequest(str(sources["gpt2"]), out, shift=False, force=True))
    assert not (out / "old.txt").exists()
    record = json.loads((out / "config.json").read_text())["mdlm_conversion"]
    assert record["source"] == str(sources["gpt2"]) and record["shift"] is False
    model = load_checkpoint(out).model
    assert not model.shifted_logits and "converted from" in model.describe()


def test_the_dit_shift_is_refused_where_it_has_no_meaning():
    from mdlm_cli.build import resolve_config

    with pytest.raises(MdlmError, match="model.shift"):
        resolve_config("test", ["model.shift=true", "diffusion.objective=ar"])
    assert resolve_config("test", ["model.shift=true"]).model.shift  # MDLM takes it
    bd3lm = ["model.shift=true", "diffusion.objective=bd3lm", "diffusion.block_size=4"]
    assert resolve_config("test", bd3lm).model.shift  # so does BD3-LM (test_bd3lm_folders.py)


def test_a_hub_id_is_read_from_the_local_cache(sources, tmp_path, monkeypatch):
    """A hub id converts offline from its snapshot in the Hugging Face cache (the layout
    huggingface_hub writes: refs/main naming a snapshot folder)."""
    import shutil

    repo = tmp_path / "hub" / "models--me--tiny-qwen"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    shutil.copytree(sources["qwen2"], repo / "snapshots" / ("0" * 40))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    done = convert(ConvertRequest("me/tiny-qwen", tmp_path / "out"))
    assert done.backbone == "dream" and done.record["source"] == "me/tiny-qwen"
    assert load_checkpoint(tmp_path / "out").model.shifted_logits


def test_a_converted_ar_run_as_init_from_keeps_its_shift(tmp_path):
    """train.init_from of a converted (shifted) run adopts model.shift, so its weights load
    into a DiT that reads where they were trained; saying otherwise is refused in one line."""
    from mdlm_cli.build import resolve_config
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.models import build_model
    from mdlm_cli.train.init_from import initialise_from

    run, out = write_ar_run(tmp_path / "ar"), tmp_path / "out"
    convert(ConvertRequest(str(run), out))
    cfg = resolve_config("test", [f"train.init_from={out}"])
    assert cfg.model.shift and resolve_config("test", [f"train.init_from={out}",
                                                       "model.shift=true"]).model.shift
    with pytest.raises(MdlmError, match="model.shift=False contradicts"):
        resolve_config("test", [f"train.init_from={out}", "model.shift=false"])
    tokenizer = load_tokenizer(cfg.data.tokenizer)
    model = build_model(cfg.model, tokenizer.vocab_size)
    initialise_from(model, str(out), tokenizer)
    assert model.shifted_logits
    unshifted = build_model(resolve_config("test").model, tokenizer.vocab_size)
    with pytest.raises(MdlmError, match="set model.shift=true"):  # the loader's own check
        initialise_from(unshifted, str(out), tokenizer)


def test_an_ar_run_as_init_from_leaves_the_shift_to_the_run(tmp_path):
    """An AR source fixes no shift: off is today's conversion by init_from, on is the shift."""
    from mdlm_cli.build import resolve_config

    run = write_ar_run(tmp_path / "ar")
    (run / "config.yaml").write_text(
        (run / "checkpoints" / "step-00000001" / "config.yaml").read_text())  # as training does
    assert not resolve_config("test", [f"train.init_from={run}"]).model.shift
    assert resolve_config("test", [f"train.init_from={run}", "model.shift=true"]).model.shift


def test_the_diffugpt_s_preset_takes_a_converted_gpt2_at_its_init_from(tmp_path, monkeypatch):
    """presets/diffugpt-s.yaml validates alone, and with a (tiny, 1024-position) GPT-2 converted
    to its train.init_from it is that folder's shifted gpt2 model, trained as DiffuGPT was."""
    from transformers import AutoModelForCausalLM, GPT2Config

    from mdlm_cli.build import resolve_config

    from ..causal_lm_folders import TOKENS
    from ..open_model_folders import write_tokenizer

    monkeypatch.chdir(tmp_path)
    assert resolve_config("diffugpt-s").train.init_from == "runs/convert/gpt2"
    source = tmp_path / "gpt2"
    AutoModelForCausalLM.from_config(GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=81, n_positions=1024, bos_token_id=80,
        eos_token_id=80)).save_pretrained(source)
    specials, settings, _ = TOKENS["gpt2"]
    write_tokenizer(source, specials, {**settings, "tokenizer_class": "PreTrainedTokenizerFast"})
    convert(ConvertRequest(str(source), tmp_path / "runs" / "convert" / "gpt2"))
    cfg = resolve_config("diffugpt-s")
    assert (cfg.model.backbone, cfg.data.tokenizer, cfg.data.length) == (
        "gpt2", "runs/convert/gpt2", 1024)
    assert (cfg.diffusion.objective, cfg.diffusion.schedule, cfg.diffusion.loss_weighting) == (
        "mdlm", "linear", "nelbo")
    assert (cfg.optim.lr, cfg.train.global_batch_size, cfg.train.max_steps) == (3e-4, 160, 160000)
    assert load_checkpoint("runs/convert/gpt2").model.shifted_logits
