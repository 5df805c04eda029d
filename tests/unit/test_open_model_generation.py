"""LLaDA's `generate` and Dream's `diffusion_generate`, token for token, on the real backbones
(issue 41, item 3): `mdlm sample -c FOLDER --prompt-ids ... --temperature 0` on the tiny random
folders of tests/open_model_folders.py against the transcriptions of
test_generation_schedules.py, run over the same network called as the released model is.

LLaDA's model gives its logits in place; Dream's network gives them one position to the right,
and the transcription shifts them itself, as Dream's loop does. The mask column is set to -inf
in both: a trained model never predicts the mask, a random one can, and SUBS (mdlm's denoiser)
removes it."""

import json

import pytest
import torch

from mdlm_cli.checkpoints.load import load_checkpoint
from tests.open_model_folders import write_dream, write_llada

from .test_generation_schedules import cli_sample, dream_sample, llada_generate


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    base = tmp_path_factory.mktemp("open-generation")
    return {"llada": write_llada(base / "llada"), "dream": write_dream(base / "dream")}


def released_llada(folder):
    """LLaDAModelLM(x).logits: the backbone's logits, unchanged by mdlm's denoiser."""
    loaded = load_checkpoint(str(folder))

    def model(x):
        with torch.no_grad():
            logits = loaded.model(x).clone()  # (B, L, V)
        logits[..., loaded.mask_id] = float("-inf")
        return logits

    return model, loaded.mask_id


def released_dream(folder):
    """DreamModel(x).logits: lm_head over the final norm's output, before any shift (mdlm's
    module shifts inside its forward, so the norm's output is taken from a hook)."""
    loaded = load_checkpoint(str(folder))
    net, seen = loaded.model, {}
    net.model.norm.register_forward_hook(lambda module, args, out: seen.update(h=out))

    def model(x):
        with torch.no_grad():
            net(x)
            logits = (seen["h"] @ net.lm_head.weight.T)[..., : net.vocab_size].float()
        logits[..., loaded.mask_id] = float("-inf")
        return logits  # (B, L, V), unshifted

    return model, loaded.mask_id


def test_the_dream_network_is_read_unshifted(folders):
    model, _ = released_dream(folders["dream"])
    shifted = load_checkpoint(str(folders["dream"])).model
    x = torch.randint(0, 80, (2, 9), generator=torch.Generator().manual_seed(0))
    raw = model(x)
    with torch.no_grad():
        ours = shifted(x)
    keep = raw[:, :-1].isfinite()
    torch.testing.assert_close(ours[:, 1:][keep], raw[:, :-1][keep])
    assert not torch.allclose(ours[:, 1:][keep], raw[:, 1:][keep], atol=1e-3)


@pytest.mark.parametrize("block_length", [4, 16])
def test_llada_folder_samples_llada_generate_tokens(folders, tmp_path, block_length):
    """Several blocks (16 tokens in blocks of 4, 2 steps each) and a single block of 16."""
    model, mask_id = released_llada(folders["llada"])
    ids = [5, 17, 3, 9]
    expected, calls = llada_generate(model, torch.tensor([ids]), 8, 16, block_length,
                                     mask_id=mask_id)
    record = cli_sample(folders["llada"], tmp_path, ids, "--max-new-tokens", "16", "--steps",
                        "8", "--block-length", str(block_length))
    assert record["k_schedule"] == "llada"  # the family's default: no --k-schedule given
    assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls == 8
    assert len(set(record["tokens"][4:])) > 3  # not one token repeated: the test can fail


@pytest.mark.parametrize("order", ["maskgit_plus", "topk_margin", "entropy"])
def test_dream_folder_samples_diffusion_generate_tokens(folders, tmp_path, order):
    """diffusion_generate(alg=order, steps=12, max_new_tokens=24, temperature=0, alg_temp=0)
    under the transformers 4.46 the release pins: its generation config takes top_k 50 from
    the model config's inherited defaults, and its sample_tokens ranks every order over the
    50 likeliest tokens (of this folder's 96). `--top-k 0` turns it off, as top_k=None."""
    model, mask_id = released_dream(folders["dream"])
    ids = [7, 2, 11, 40]
    answers = {}
    for top_k, flags in ((50, ()), (None, ("--top-k", "0"))):
        expected, calls = dream_sample(model, torch.tensor([ids]), 4 + 24, 12, order,
                                       mask_token_id=mask_id, top_k=top_k)
        record = cli_sample(folders["dream"], tmp_path, ids, "--max-new-tokens", "24",
                            "--steps", "12", "--order", order, *flags)
        assert record["k_schedule"] == "dream" and record["order"] == order
        assert record["top_k"] == (top_k or 0)
        assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls == 12
        assert len(set(record["tokens"][4:])) > 3
        answers[top_k] = record["tokens"]
    if order != "topk_margin":  # on this folder top-k changes these two orders' answers
        assert answers[50] != answers[None]  # (the test can fail)


# ------------------------------------------------------------------ mdlm sample --chat

# the templates of tests/open_model_folders.py by hand, "w1 w2 w3" asked (the word-level
# tokeniser reads "user" and "assistant" as [UNK], 0, and drops the newlines)
CHAT_PROMPTS = {"llada": [80, 82, 0, 83, 2, 3, 4, 84, 82, 0, 83],  # BOS, header, eot, header
                "dream": [81, 0, 2, 3, 4, 82, 81, 0]}  # im_start user ... im_end im_start
END_OF_TURN = {"llada": 84, "dream": 82}  # <|eot_id|>, <|im_end|>
OUTPUT_LAYER = {"llada": "model.transformer.ff_out.weight", "dream": "lm_head.weight"}


def talkative(folder, family):
    """The folder with its end-of-turn row of the output layer a little above the row of the
    token greedy decoding draws most: the answers end early, at that token."""
    from safetensors.torch import load_file, save_file

    loaded = load_checkpoint(str(folder))
    start = CHAT_PROMPTS[family]
    with torch.no_grad():  # the answer's 16 positions all masked
        logits = loaded.model(torch.tensor([start + [loaded.mask_id] * 16]))[0, len(start):]
    logits[:, loaded.mask_id] = float("-inf")
    common = int(logits.argmax(-1).mode().values)
    for shard in folder.glob("model-*.safetensors"):
        weights = load_file(shard)
        if OUTPUT_LAYER[family] in weights:
            w = weights[OUTPUT_LAYER[family]]
            w[END_OF_TURN[family]] = 1.05 * w[common]
            save_file(weights, shard, metadata={"format": "pt"})
    return folder


def cli_chat(folder, tmp_path, *flags):
    from typer.testing import CliRunner

    from mdlm_cli.cli import app

    out = tmp_path / "chat.jsonl"
    args = ["sample", "-c", str(folder), "--chat", "w1 w2 w3", "-n", "1", "--max-new-tokens",
            "16", "--steps", "16", "--sampler", "confidence", "--temperature", "0", "--quiet",
            "--out", str(out), *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text().splitlines()[0])


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_chat_samples_after_the_template_and_stops_at_the_end_of_turn(tmp_path, family):
    folder = talkative((write_llada if family == "llada" else write_dream)(tmp_path / family),
                       family)
    start = CHAT_PROMPTS[family]
    whole = cli_chat(folder, tmp_path, "--no-stop-at-eos")
    assert whole["tokens"][: len(start)] == start and whole["chat"] == "w1 w2 w3"
    answer = whole["tokens"][len(start):]
    assert len(answer) == 16
    stops = {END_OF_TURN[family], load_checkpoint(str(folder)).tokenizer.eos_id}
    end = next(i for i, t in enumerate(answer) if t in stops)
    assert answer[end] == END_OF_TURN[family] and 0 < end < 15  # a real cut
    cut = cli_chat(folder, tmp_path)
    assert cut["tokens"] == start + answer[:end]
    assert cut["length"] == end and cut["ended"] is True


@pytest.mark.parametrize("flags, message", [
    (["--prompt", "w1"], "give --prompt or --chat, not both"),
    (["--prompt-ids", "5"], "give --prompt-ids or --chat, not both"),
    (["--infill", "w1 <mask>"], "give --infill or --chat, not both"),
])
def test_chat_is_exclusive_with_the_other_prompts(folders, flags, message):
    from typer.testing import CliRunner

    from mdlm_cli.cli import app

    args = ["sample", "-c", str(folders["dream"]), "-n", "1", "--chat", "w1", *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_chat_without_a_chat_template_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from mdlm_cli.cli import app

    from .test_generation_schedules import save_dit

    dit = save_dit(tmp_path / "dit")  # the character tokenizer: no template
    result = CliRunner().invoke(app, ["sample", "-c", str(dit), "-n", "1", "--chat", "hi"])
    assert result.exit_code == 1, result.output
    assert "--chat needs a tokenizer with a chat template; char's has none" in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
