"""Fine-tuning a LLaDA or Dream folder from the CLI (`--preset open-sft --set
train.init_from=FOLDER`): the folder fixes the model, the tokenizer and the objective (a
contradicting setting is one line), each example is the chat template's rendering (one BOS,
the template's own) with the loss on the answer and its end-of-turn token, and the run chats."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from mdlm_cli.build import resolve_config
from mdlm_cli.data.store import prepare
from mdlm_cli.data.tokenizers import load_tokenizer
from tests.open_model_folders import write_dream, write_llada

from .conftest import one_line_error
from .test_nothing_lost import ROOT

FAMILIES = ["llada", "dream"]
PAIR = {"prompt": "w1 w2 w3", "response": "w4 w5"}
# the rendering of PAIR as one user turn, written out by hand from each release's template
# (tests/open_model_folders.py): the prompt with the generation prompt, the answer up to and
# including the end-of-turn token (LLaDA renders its BOS itself, Dream none)
RENDERED = {
    "llada": ("<|startoftext|><|start_header_id|>user<|end_header_id|>\n\nw1 w2 w3<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n", "w4 w5<|eot_id|>"),
    "dream": ("<|im_start|>user\nw1 w2 w3<|im_end|>\n<|im_start|>assistant\n", "w4 w5<|im_end|>"),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("open-sft")
    return {"llada": write_llada(base / "llada"), "dream": write_dream(base / "dream")}


@pytest.fixture(scope="module")
def qa(tmp_path_factory):
    path = tmp_path_factory.mktemp("qa") / "qa.jsonl"
    examples = [PAIR, {"prompt": "w7", "response": "w8 w9 w10 w11"}]
    path.write_text("".join(json.dumps(e) + "\n" for e in examples * 20))
    return path


def mdlm(*args, cwd, cache):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "MDLM_CACHE": str(cache),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "mdlm_cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cli_fine_tunes_a_folder_and_the_run_chats(folders, qa, tmp_path, family):
    """The issue's command in a fresh process: the folder's modelling files raise if imported."""
    folder, run = folders[family], tmp_path / "run"
    out = mdlm("train", "--preset", "open-sft", "--set", f"train.init_from={folder}",
               "--set", f"data.dataset={qa}", "--max-steps", "2", "--out", run,
               cwd=tmp_path, cache=tmp_path / "cache")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"Initialised from {folder}" in out.stderr and "was imported" not in out.stderr
    saved = yaml.safe_load((run / "config.yaml").read_text())
    raw = json.loads((folder / "config.json").read_text())
    assert saved["model"] == {"backbone": family, "hf_model": str(folder),
                              "time_conditioning": False}
    assert saved["data"]["tokenizer"] == str(folder) and saved["data"]["packing"] == "sft"
    assert saved["data"]["length"] == 64  # the default 128, cut to the tiny model's positions
    assert (saved["diffusion"]["objective"], saved["diffusion"]["schedule"]) == ("mdlm", "linear")
    assert (run / "checkpoints" / "step-00000002" / f"{family}_config.json").is_file()
    samples = tmp_path / "s.jsonl"
    out = mdlm("sample", "-c", run, "--chat", "hi", "--max-new-tokens", "4", "--steps", "4",
               "-n", "1", "--out", samples, cwd=tmp_path, cache=tmp_path / "cache")
    assert out.returncode == 0, out.stderr[-3000:]
    (record,) = [json.loads(line) for line in samples.read_text().splitlines()]
    tokenizer = load_tokenizer(str(folder))
    question = tokenizer.encode(RENDERED[family][0].replace("w1 w2 w3", "hi"))
    assert record["tokens"][: len(question)] == question  # the prompt it was trained on
    assert raw["mask_token_id"] not in record["tokens"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("pad_as_eos", [False, True])
def test_a_packed_example_is_the_template_rendering(folders, tmp_path, family, pad_as_eos):
    folder = folders[family]
    data = tmp_path / "same.jsonl"
    data.write_text((json.dumps(PAIR) + "\n") * 30)  # every row the same pair
    cfg = resolve_config("open-sft", [f"train.init_from={folder}", f"data.dataset={data}",
                                      f"data.cache_dir={tmp_path}", "data.length=40",
                                      f"data.pad_as_eos={str(pad_as_eos).lower()}"])
    prepared = prepare(cfg.data)
    tokenizer = prepared.tokenizer()
    prompt, answer = (tokenizer.encode(text) for text in RENDERED[family])
    n = len(prompt) + len(answer)
    x0, _, targets = prepared.split("train").batch_with_targets([0])
    assert x0[0, :n].tolist() == prompt + answer
    # one BOS, the template's own (LLaDA's renders it, Dream's none): none is prepended
    assert (prompt + answer).count(tokenizer.bos_id) == (family == "llada")
    assert x0[0, 0].item() == prompt[0] != x0[0, 1].item()
    fill = tokenizer.eos_id if pad_as_eos else tokenizer.pad_id
    assert (x0[0, n:] == fill).all()
    # the loss covers the answer and its end-of-turn token; with pad_as_eos the EOS fill too
    expected = [False] * len(prompt) + [True] * len(answer) + [pad_as_eos] * (40 - n)
    assert targets[0].tolist() == expected


def test_a_template_that_always_opens_the_next_turn_ends_the_answer_at_its_end_of_turn(folders):
    """LLaDA-8B-Instruct's own template writes the assistant header after every conversation
    (it has no add_generation_prompt switch): the answer still ends at <|eot_id|>."""
    from mdlm_cli.data.sft import encode_example

    tokenizer = load_tokenizer(str(folders["llada"]))
    tokenizer.hf.chat_template = (
        "{% for m in messages %}{% set c = '<|start_header_id|>' + m['role'] + '<|end_header_id|>"
        "\n\n' + m['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set c = "
        "bos_token + c %}{% endif %}{{ c }}{% endfor %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}")
    prompt, answer = encode_example(tokenizer, PAIR)
    assert (prompt, answer) == tuple(tokenizer.encode(text) for text in RENDERED["llada"])


@pytest.mark.parametrize(("setting", "named"), [
    ("model.backbone=dit", "model.backbone='dit' contradicts"),
    ("model.hidden_size=64", "model.hidden_size=64 contradicts"),
    ("data.tokenizer=char", "data.tokenizer='char' contradicts"),
    ("diffusion.schedule=loglinear", "diffusion.schedule='loglinear' contradicts"),
    ("model.time_conditioning=true", "model.time_conditioning=True contradicts"),
    ("data.length=65", "data.length=65 exceeds the 64 positions"),
])
def test_a_setting_that_contradicts_the_folder_is_one_line(folders, qa, setting, named):
    message = one_line_error("train", "--preset", "open-sft", "--no-print-config",
                             "--set", f"train.init_from={folders['llada']}",
                             "--set", f"data.dataset={qa}", "--set", setting, "--max-steps", "2")
    assert named in message
    assert "a LLaDA folder fixes" in message or "whose config.json fixes" in message \
        or "set data.length=64 or less" in message


def test_a_preset_with_its_own_model_is_refused_naming_the_key(folders, qa):
    """demo-sft fixes a 4 x 192 DiT and the char tokenizer: not silently overridden."""
    message = one_line_error("train", "--preset", "demo-sft", "--no-print-config",
                             "--set", f"train.init_from={folders['dream']}", "--max-steps", "2")
    assert "model.hidden_size=192 contradicts" in message and "Dream folder" in message


def test_a_hub_id_is_adopted_from_its_config_files(folders, monkeypatch):
    import huggingface_hub

    def snapshot(repo_id, allow_patterns):
        if repo_id != "Dream-org/Dream-v0-Instruct-7B":
            raise FileNotFoundError(repo_id)  # as the Hub answers a repository it lacks
        return str(folders["dream"])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = resolve_config("open-sft", ["train.init_from=Dream-org/Dream-v0-Instruct-7B"])
    assert (cfg.model.backbone, cfg.model.hf_model, cfg.data.tokenizer) == (
        "dream", "Dream-org/Dream-v0-Instruct-7B", "Dream-org/Dream-v0-Instruct-7B")
    other = resolve_config("open-sft", ["train.init_from=runs/not-a-folder"])
    assert other.model.backbone == "dit"  # anything else is left to train.init_from's loading


def test_the_chat_template_is_part_of_the_data_cache_key(folders):
    """Rows rendered through a template are not the plain [BOS] prompt response [EOS] rows of
    the same tokeniser: another prepared folder (one without a template keeps its old key)."""
    from mdlm_cli.data.store import key_packing

    data = resolve_config("open-sft", [f"train.init_from={folders['llada']}"]).data
    tokenizer = load_tokenizer(str(folders["llada"]))
    templated = key_packing(data, tokenizer)
    tokenizer.hf.chat_template = None
    assert key_packing(data, tokenizer) == "sft:pad-as-eos" != templated


def test_gen_ppl_prompts_from_a_file_are_rendered_as_in_fine_tuning(folders, tmp_path):
    """`gen-ppl --prompts FILE` on a run fine-tuned through the template: a prompt record is
    the user turn the run was trained on, one BOS (the template's), none prepended."""
    from types import SimpleNamespace

    from mdlm_cli.eval.responses import file_prompts

    tokenizer = load_tokenizer(str(folders["llada"]))
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps(PAIR) + "\n" + json.dumps({"messages": [
        {"role": "user", "content": PAIR["prompt"]}]}) + "\n")
    run = SimpleNamespace(tokenizer=tokenizer, data_meta={"packing": "sft"}, length=64,
                          path=tmp_path, row_start=lambda: [tokenizer.bos_id])
    expected = tokenizer.encode(RENDERED["llada"][0])
    assert [p.ids for p in file_prompts(path, run, 2)] == [expected, expected]
