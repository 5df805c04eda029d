"""BD3-LM on the folder backbones (llada, dream, gpt2; `mdlm convert --target bd3lm`): the
x_t ⊕ x_0 pass under the block mask, the x_0 copy at x_t's positions, and the shift read across
it (a block's first position from the clean copy's last state of the block before). As the
DiT's tests: one block of the whole row is MDLM's loss on the same weights; the clean half and
the earlier blocks never see a later noisy block; the training pass gives the logits sampling
computes from the finished blocks; sampling fills the rows after their prompt."""

import pytest
import torch

from mdlm_cli.checkpoints.convert import ConvertRequest, convert
from mdlm_cli.checkpoints.load import load_checkpoint
from mdlm_cli.engine.block_sampling import BlockRows
from mdlm_cli.engine.settings import SamplingSettings
from mdlm_cli.errors import MdlmError
from mdlm_cli.objectives.bd3lm import BlockDenoiser, RecomputedBlocks

from ..causal_lm_folders import ARCHS, write_causal_lm

L, BLOCK = 16, 4
TOL = 1e-5
# (source, shift): each layout with its AR head's shift, and LLaMA and GPT-2 without it
CASES = [*((arch, True) for arch in ARCHS), ("llama", False), ("gpt2", False)]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    base = tmp_path_factory.mktemp("bd3lm-folders")
    out = {}
    for arch, shift in CASES:
        src = base / f"src-{arch}"
        if not src.exists():
            write_causal_lm(src, arch)
        folder = base / f"{arch}-{shift}"
        convert(ConvertRequest(str(src), folder, target="bd3lm", block_size=BLOCK, shift=shift))
        out[arch, shift] = load_checkpoint(folder)
    return out


def batch(mask_id: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x0 = torch.randint(1, 80, (3, L), generator=g)
    z_t = torch.where(torch.rand(3, L, generator=g) < 0.5, mask_id, x0)
    return x0, z_t


@pytest.mark.parametrize("case", CASES)
def test_the_folder_loads_as_a_bd3lm_model(loaded, case):
    model = loaded[case]
    assert model.config.diffusion.objective == "bd3lm"
    assert model.config.diffusion.block_size == BLOCK
    assert model.config.data.length % BLOCK == 0
    assert model.model.shifted_logits is case[1]


@pytest.mark.parametrize("case", CASES)
def test_one_block_of_the_whole_row_is_mdlm_on_the_same_weights(loaded, case):
    model = loaded[case].model.float()
    x0, z_t = batch(loaded[case].mask_id)
    with torch.no_grad():
        want = model(z_t)  # the MDLM denoiser's pass: z_t alone, full attention
        got = BlockDenoiser(model, L)(z_t, x0)
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("case", CASES)
def test_later_noisy_blocks_change_nothing_before_them(loaded, case):
    """Perturbing x_t of block b leaves blocks < b as they were, and with the shift its own
    first position too (read from x_0's last state of block b - 1); perturbing x_0 of block b
    leaves blocks <= b."""
    model, mask_id = loaded[case].model.float(), loaded[case].mask_id
    x0, z_t = batch(mask_id)
    denoiser, b = BlockDenoiser(model, BLOCK), 2
    start, end = b * BLOCK, (b + 1) * BLOCK
    noisy, clean = z_t.clone(), x0.clone()
    noisy[:, start:end] = torch.randint(1, 80, (3, BLOCK))
    clean[:, start:end] = (x0[:, start:end] + 7) % 79 + 1
    with torch.no_grad():
        base, moved_t, moved_0 = denoiser(z_t, x0), denoiser(noisy, x0), denoiser(z_t, clean)
    torch.testing.assert_close(moved_t[:, :start], base[:, :start], rtol=0, atol=0)
    assert not torch.allclose(moved_t[:, start:end], base[:, start:end], atol=1e-4)
    torch.testing.assert_close(moved_0[:, :end], base[:, :end], rtol=0, atol=0)
    assert not torch.allclose(moved_0[:, end:], base[:, end:], atol=1e-4)
    first = moved_t[:, start], base[:, start]  # shifted: read from the clean copy alone
    assert torch.allclose(*first, atol=0) is case[1]


@pytest.mark.parametrize("case", CASES)
def test_the_training_pass_gives_the_logits_sampling_computes(loaded, case):
    """Block b's logits over x_t ⊕ x_0 equal the recomputing sampler's over the finished
    blocks (x_0's) and the noisy block: the x_0 copy at x_t's positions, the shift the same."""
    model, mask_id = loaded[case].model.float(), loaded[case].mask_id
    x0, z_t = batch(mask_id)
    with torch.no_grad():
        train = BlockDenoiser(model, BLOCK)(z_t, x0)
        blocks = RecomputedBlocks(model, BLOCK)
        blocks.start(3, L, x0.device)
        for b in range(L // BLOCK):
            start = b * BLOCK
            got = blocks.logits(z_t[:, start:start + BLOCK])
            torch.testing.assert_close(got, train[:, start:start + BLOCK], rtol=1e-4,
                                       atol=1e-4)
            blocks.commit(x0[:, start:start + BLOCK])


@pytest.mark.parametrize("case", CASES)
def test_block_sampling_fills_the_rows_after_the_prompt(loaded, case):
    model = loaded[case]
    prompt = torch.tensor([5, 9, 13, 17, 21, 25])  # one whole block and part of the next
    how = SamplingSettings(sampler="first-hitting").validate()
    out = model.objective.sample(model.model, how, BlockRows(2, 12, prompt),
                                 generator=torch.Generator().manual_seed(0))
    assert out.tokens.shape == (2, 12)
    assert torch.equal(out.tokens[:, :6], prompt.expand(2, -1))
    assert not bool((out.tokens == model.mask_id).any())


@pytest.mark.parametrize("request_, message", [
    (dict(target="bd3lm"), "--block-size"),
    (dict(block_size=4), "has no blocks"),
    (dict(target="bd3lm", block_size=4, attention="causal"), "block mask"),
    (dict(target="bd3lm", block_size=128), "exceeds the 64 positions"),
])
def test_bad_block_targets_are_refused_before_anything_is_written(tmp_path, request_, message):
    src = write_causal_lm(tmp_path / "src", "gpt2")
    with pytest.raises(MdlmError, match=message):
        convert(ConvertRequest(str(src), tmp_path / "out", **request_))
    assert not (tmp_path / "out").exists()


def test_a_shifted_dit_reads_a_blocks_first_position_from_the_clean_copy():
    """The DiT with model.shift (an AR run converted with --target bd3lm) follows the same
    read: its training pass gives the recomputing sampler's logits; it samples by recomputing
    (a shifted DiT decodes no key/value cache)."""
    from mdlm_cli.build import resolve_config
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.models import build_model
    from mdlm_cli.objectives import get_objective

    cfg = resolve_config("test", ["model.shift=true", "diffusion.objective=bd3lm",
                                  f"diffusion.block_size={BLOCK}"])
    tok = load_tokenizer("char")
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.vocab_size)
    with torch.no_grad():  # off the zero initialisation: the gates and output take part
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.eval()
    x0 = torch.randint(8, 35, (2, L), generator=torch.Generator().manual_seed(1))
    z_t = x0.masked_fill(torch.rand(2, L, generator=torch.Generator().manual_seed(2)) < 0.5,
                         tok.mask_id)
    with torch.no_grad():
        train = BlockDenoiser(model, BLOCK)(z_t, x0)
        blocks = RecomputedBlocks(model, BLOCK)
        blocks.start(2, L, x0.device)
        for b in range(L // BLOCK):
            start = b * BLOCK
            got = blocks.logits(z_t[:, start:start + BLOCK])
            torch.testing.assert_close(got, train[:, start:start + BLOCK], rtol=1e-4, atol=1e-4)
            blocks.commit(x0[:, start:start + BLOCK])
    assert not model.kv_cache_blocks
    out = get_objective(cfg, tok).sample(model, SamplingSettings(sampler="ancestral", steps=2)
                                         .validate(), BlockRows(2, 8),
                                         generator=torch.Generator().manual_seed(0))
    assert out.tokens.shape == (2, 8) and not bool((out.tokens == tok.mask_id).any())
