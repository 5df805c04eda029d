"""LLaDA's `generate` and Dream's `diffusion_generate`, token for token, on the real backbones
(issue 41, item 3): `mdlm sample -c FOLDER --prompt-ids ... --temperature 0` on the tiny random
folders of tests/open_model_folders.py against the transcriptions of
test_generation_schedules.py, run over the same network called as the released model is.

LLaDA's model gives its logits in place; Dream's network gives them one position to the right,
and the transcription shifts them itself, as Dream's loop does. The mask column is set to -inf
in both: a trained model never predicts the mask, a random one can, and SUBS (mdlm's denoiser)
removes it."""

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
    """diffusion_generate(alg=order, steps=12, max_new_tokens=24, temperature=0, alg_temp=0)."""
    model, mask_id = released_dream(folders["dream"])
    ids = [7, 2, 11, 40]
    expected, calls = dream_sample(model, torch.tensor([ids]), 4 + 24, 12, order,
                                   mask_token_id=mask_id)
    record = cli_sample(folders["dream"], tmp_path, ids, "--max-new-tokens", "24", "--steps",
                        "12", "--order", order)
    assert record["k_schedule"] == "dream" and record["order"] == order
    assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls == 12
    assert len(set(record["tokens"][4:])) > 3
