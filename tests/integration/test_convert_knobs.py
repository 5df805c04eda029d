"""The conversion's training knobs through the CLI (issue 54, docs/conversion.md): a converted
tiny folder fine-tunes with attention annealing, each step's ratio in metrics.jsonl; a LLaMA,
Qwen2 and GPT-2 folder and an mdlm AR run convert into BD3-LM models that fine-tune with the
block objective and sample block by block after a prompt."""

import json
import math
import random

import pytest

from mdlm_cli.data.tokenizers import load_tokenizer
from tests.causal_lm_folders import ARCHS, write_ar_run, write_causal_lm

from .conftest import invoke, one_line_error


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """60 documents of the tiny tokenizers' words, blank-line separated."""
    rng = random.Random(0)
    docs = [" ".join(f"w{rng.randint(1, 78)}" for _ in range(rng.randint(8, 30)))
            for _ in range(60)]
    path = tmp_path_factory.mktemp("knobs-text") / "text.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return path


def starts_with_prompt(row: list[int], prompt: list[int]) -> bool:
    """The row is the prompt's tokens, after one start token (BOS) where the sampler put one."""
    return row[:len(prompt)] == prompt or row[1:1 + len(prompt)] == prompt


def fine_tune(folder, text_file, run, *extra) -> str:
    return invoke("train", "--preset", "open-sft", "--no-print-config", "--set",
                  f"train.init_from={folder}", "--set", f"data.dataset={text_file}", "--set",
                  "data.packing=wrap", "--set", "data.length=32", "--max-steps", "2", "--set",
                  "train.global_batch_size=2", "--set", "train.micro_batch_size=2", "--set",
                  "train.eval_rows=4", "--set", "train.log_every=1", "--out", run, *extra)


def test_a_converted_folder_fine_tunes_with_attention_annealing(text_file, tmp_path,
                                                                monkeypatch):
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    out, run = tmp_path / "converted", tmp_path / "run"
    invoke("convert", write_causal_lm(tmp_path / "src", "llama"), "--out", out)
    fine_tune(out, text_file, run, "--set", "train.attention_anneal_steps=4")
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["attention_ratio"] for r in steps] == [0.25, 0.5]
    assert all(math.isfinite(r["loss"]) for r in steps)
    saved = json.loads((run / "checkpoints" / "step-00000002" / "llada_config.json").read_text())
    assert saved["mdlm_conversion"]["attention"] == "full"  # the record is what it was


def test_annealing_a_causally_converted_folder_is_refused(text_file, tmp_path, monkeypatch):
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "converted"
    invoke("convert", write_causal_lm(tmp_path / "src", "gpt2"), "--out", out,
           "--attention", "causal")
    error = one_line_error("train", "--preset", "open-sft", "--no-print-config", "--set",
                           f"train.init_from={out}", "--set", f"data.dataset={text_file}",
                           "--set", "data.packing=wrap", "--set", "data.length=32", "--set",
                           "train.attention_anneal_steps=4", "--out", tmp_path / "run")
    assert "attends causally" in error
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("arch", ARCHS)
def test_a_bd3lm_conversion_fine_tunes_and_samples_block_by_block(text_file, tmp_path,
                                                                  monkeypatch, arch):
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    out, run = tmp_path / "converted", tmp_path / "run"
    said = invoke("convert", write_causal_lm(tmp_path / "src", arch), "--out", out,
                  "--target", "bd3lm", "--block-size", "8")
    assert "as bd3lm, block size 8" in said
    text = fine_tune(out, text_file, run)
    assert "objective bd3lm" in text
    step = run / "checkpoints" / "step-00000002"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(math.isfinite(r["loss"]) for r in records if "loss" in r)
    for checkpoint in (out, step):  # the converted folder and the fine-tuned run
        samples = tmp_path / "s.jsonl"
        invoke("sample", "-c", checkpoint, "-n", "2", "--length", "24", "--prompt", "w1 w2 w3",
               "--no-stop-at-eos", "--out", samples)
        rows = [json.loads(line) for line in samples.read_text().splitlines()]
        # the prompt's tokens (after the tokenizer's BOS where it adds one), then the blocks
        # (the tiny Qwen2 tokenizer encodes these words to nothing: only its blocks are drawn)
        prompt = load_tokenizer(str(out)).encode("w1 w2 w3")
        assert len(rows) == 2 and all(len(r["tokens"]) == 24 and r["response"] for r in rows)
        assert all(starts_with_prompt(r["tokens"], prompt) for r in rows)


def test_an_ar_run_converts_to_a_shifted_bd3lm_dit_that_samples(tmp_path, monkeypatch):
    monkeypatch.setenv("MDLM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "converted"
    invoke("convert", write_ar_run(tmp_path / "ar"), "--out", out, "--target", "bd3lm",
           "--block-size", "8")
    samples = tmp_path / "s.jsonl"
    invoke("sample", "-c", out, "-n", "2", "--length", "32", "--prompt", "the ", "--out",
           samples)
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 2 and all(r["text"].startswith("the ") for r in rows)
