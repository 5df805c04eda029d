"""`mdlm convert` through the CLI (issue 54): a tiny random LLaMA, Qwen2 and GPT-2 folder and an
mdlm AR run each convert (full attention) into a folder that `mdlm sample` and `mdlm eval-ppl`
take as --checkpoint, and a converted folder fine-tunes through train.init_from; bad sources
end in one line, exit code 1, with nothing written."""

import json
import math
import random

import pytest

from mdlm_cli.data.tokenizers import load_tokenizer
from tests.causal_lm_folders import ARCHS, edit_config, write_ar_run, write_causal_lm, write_encoder

from .conftest import invoke, one_line_error

SOURCES = [*ARCHS, "ar"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    base = tmp_path_factory.mktemp("convert-src")
    found = {arch: write_causal_lm(base / arch, arch) for arch in ARCHS}
    found["ar"] = write_ar_run(base / "ar")
    return found


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """60 documents of the tiny tokenizers' words, blank-line separated."""
    rng = random.Random(0)
    docs = [" ".join(f"w{rng.randint(1, 78)}" for _ in range(rng.randint(8, 30)))
            for _ in range(60)]
    path = tmp_path_factory.mktemp("convert-text") / "text.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return path


@pytest.mark.parametrize("source", SOURCES)
def test_a_converted_model_samples_and_evaluates(sources, text_file, tmp_path, monkeypatch,
                                                  source):
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "converted"
    said = invoke("convert", sources[source], "--out", out)
    assert "Converted" in said and "shift on" in said and "full attention" in said
    samples = tmp_path / "s.jsonl"
    text = invoke("sample", "-c", out, "-n", "2", "--length", "32", "--steps", "8",
                  "--out", samples)
    assert "converted from" in text  # every command reports what the model was made from
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    mask_id = (json.loads((out / "config.json").read_text())["mask_token_id"]
               if source != "ar" else load_tokenizer("char").mask_id)
    assert len(rows) == 2 and all(mask_id not in r["tokens"] for r in rows)
    result_file = tmp_path / "ppl.json"
    invoke("eval-ppl", "-c", out, "--dataset", text_file, "-k", "2", "--json", result_file)
    (result,) = json.loads(result_file.read_text())["results"]
    assert result["kind"] == "bound" and math.isfinite(result["nats_per_token"])


def test_a_converted_folder_fine_tunes_and_keeps_its_shift(sources, text_file, tmp_path,
                                                           monkeypatch):
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    out, run = tmp_path / "converted", tmp_path / "run"
    invoke("convert", sources["gpt2"], "--out", out)
    invoke("train", "--preset", "open-sft", "--no-print-config", "--set",
           f"train.init_from={out}", "--set", f"data.dataset={text_file}", "--set",
           "data.packing=wrap", "--set", "data.length=32", "--max-steps", "2", "--set",
           "train.global_batch_size=2", "--set", "train.micro_batch_size=2", "--set",
           "train.eval_rows=4", "--out", run)
    saved = json.loads((run / "checkpoints" / "step-00000002" / "gpt2_config.json").read_text())
    assert saved["mdlm_conversion"]["shift"] is True


def test_a_converted_folder_fine_tunes_with_dreams_token_weights(sources, text_file, tmp_path,
                                                                 monkeypatch):
    """diffusion.loss_weighting=cart: two steps of Dream's CART loss, the run's config says it,
    its final bound is the NELBO as ever."""
    import yaml

    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    out, run = tmp_path / "converted", tmp_path / "run"
    invoke("convert", sources["qwen2"], "--out", out)
    invoke("train", "--preset", "open-sft", "--no-print-config", "--set",
           f"train.init_from={out}", "--set", f"data.dataset={text_file}", "--set",
           "data.packing=wrap", "--set", "data.length=32", "--max-steps", "2", "--set",
           "train.global_batch_size=2", "--set", "train.micro_batch_size=2", "--set",
           "train.eval_rows=4", "--set", "diffusion.loss_weighting=cart", "--out", run)
    saved = yaml.safe_load((run / "config.yaml").read_text())["diffusion"]
    assert (saved["loss_weighting"], saved["cart_p"]) == ("cart", 0.3)
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in logged if "loss" in r)
    assert any("loss" in r for r in logged)


def test_the_diffugpt_s_preset_without_its_converted_folder_stops_before_any_data(
        tmp_path, monkeypatch):
    """Its train.init_from (runs/convert/gpt2) not written yet: one line, before OpenWebText
    would be downloaded and prepared."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    error = one_line_error("train", "--preset", "diffugpt-s", "--no-print-config")
    assert "train.init_from runs/convert/gpt2 does not exist" in error
    assert not (tmp_path / "cache").exists() and not (tmp_path / "runs").exists()


def test_a_converted_ar_run_fine_tunes_and_keeps_its_shift(sources, text_file, tmp_path,
                                                           monkeypatch):
    """train.init_from of a converted AR run: model.shift adopted, never restated."""
    import yaml

    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    out, run = tmp_path / "converted", tmp_path / "run"
    invoke("convert", sources["ar"], "--out", out)
    invoke("train", "--preset", "test", "--no-print-config", "--set", f"train.init_from={out}",
           "--set", f"data.dataset={text_file}", "--max-steps", "2", "--set",
           "train.eval_rows=4", "--out", run)
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["shift"] is True
    error = one_line_error("train", "--preset", "test", "--set", f"train.init_from={out}",
                           "--set", "model.shift=false", "--out", tmp_path / "refused")
    assert "contradicts train.init_from" in error and not (tmp_path / "refused").exists()


@pytest.mark.parametrize("case", ["encoder", "auto_map", "gpt-neox", "no-weights", "not-cached",
                                  "out-not-empty"])
def test_bad_sources_end_in_one_line(sources, tmp_path, monkeypatch, case):
    source, out = tmp_path / "src", tmp_path / "out"
    if case == "encoder":
        write_encoder(source)
    elif case == "not-cached":
        monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
        source = "nobody/no-such-model"
    elif case == "out-not-empty":
        source = sources["llama"]
        out.mkdir()
        (out / "mine.txt").write_text("mine")
    else:
        write_causal_lm(source, "llama")
        if case == "auto_map":
            edit_config(source, auto_map={"AutoModelForCausalLM": "modeling_x.X"})
        elif case == "gpt-neox":
            edit_config(source, architectures=["GPTNeoXForCausalLM"], model_type="gpt_neox")
        else:
            (source / "model.safetensors").unlink()
    error = one_line_error("convert", source, "--out", out)
    assert {"encoder": "is an encoder", "auto_map": "remote code",
            "gpt-neox": "LlamaForCausalLM (onto llada)", "no-weights": "no model.safetensors",
            "not-cached": "not in the local Hugging Face cache",
            "out-not-empty": "--force"}[case] in error
    written = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("src", "empty-cache"))
    assert written == (["out"] if case == "out-not-empty" else [])


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_a_converted_model_lora_fine_tunes_and_samples(sources, text_file, tmp_path, monkeypatch,
                                                       arch):
    """LoRA on each converted backbone (GPT-2's Conv1D projections through peft's
    fan_in_fan_out); the run samples with its adapter merged."""
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    out, run = tmp_path / "converted", tmp_path / "run"
    invoke("convert", sources[arch], "--out", out)
    text = invoke("train", "--preset", "open-sft", "--no-print-config", "--set",
                  f"train.init_from={out}", "--set", f"data.dataset={text_file}", "--set",
                  "data.packing=wrap", "--set", "data.length=32", "--max-steps", "2", "--set",
                  "train.global_batch_size=2", "--set", "train.micro_batch_size=2", "--set",
                  "train.eval_rows=4", "--set", "lora.rank=2", "--out", run)
    assert "LoRA: rank 2" in text
    assert (run / "checkpoints" / "step-00000002" / "adapter" / "adapter_config.json").is_file()
    invoke("sample", "-c", run, "-n", "1", "--length", "16", "--steps", "4")
