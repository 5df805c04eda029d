"""The within-block steps of block diffusion sampling (engine/block_sampling.py): every step
fills the block and keeps the prompt, the cache is exact for each, each step makes the network
calls it should, nucleus filtering reaches the draws, and EOS inside the prompt ends nothing."""

import pytest
import torch

from mdlm_cli.engine.block_sampling import BLOCK_STEPS, BlockHooks, BlockRows
from mdlm_cli.engine.settings import SamplingSettings
from mdlm_cli.errors import MdlmError

from .test_bd3lm import TOK, setup

L = 32


SETTINGS = {"sampler", "steps", "temperature", "top_p", "top_k", "precision"}


def draw(bd3lm, model, seed: int = 0, **kw):
    """`BD3LM.sample` with the settings and hooks among `kw` put in their types."""
    kw = {"num_samples": 3, "length": L + 8, "steps": 4, **kw}
    how = SamplingSettings(**{k: kw.pop(k) for k in SETTINGS & set(kw)},
                           options={k: kw.pop(k) for k in ("tokens_per_step",) if k in kw})
    hooks = BlockHooks(on_block=kw.pop("on_block", None), before_call=kw.pop("before_call", None))
    rows = BlockRows(kw.pop("num_samples"), kw.pop("length"), kw.pop("prompt", None),
                     kw.pop("eos_id", None))
    return bd3lm.sample(model, how, rows, generator=torch.Generator().manual_seed(seed),
                        hooks=hooks, **kw)


@pytest.mark.parametrize("sampler", list(BLOCK_STEPS))
def test_every_within_block_step_fills_the_blocks_and_its_cache_is_exact(sampler):
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")
    prompt = torch.tensor([9, 10, 11, 12, 13, 14])  # a whole block and half of the next
    cached = draw(bd3lm, model, sampler=sampler, prompt=prompt)
    recomputed = draw(bd3lm, model, sampler=sampler, prompt=prompt, cache=False)
    assert torch.equal(cached.tokens, recomputed.tokens)
    assert cached.tokens.shape == (3, L + 8) and not (cached.tokens == TOK.mask_id).any()
    assert (cached.tokens[:, :6] == prompt).all()
    assert len(set(cached.tokens[:, 6:].flatten().tolist())) > 5  # draws, not one token


def calls_per_block(bd3lm, model, **kw) -> float:
    """Network calls per block and row, the commit of each block left out."""
    out = draw(bd3lm, model, num_samples=2, length=16, **kw)
    return (out.stats.nfe - 16 / 4) / (16 / 4)


def test_each_step_makes_the_calls_it_should():
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")
    assert calls_per_block(bd3lm, model, sampler="first-hitting") == 4  # one per token
    assert calls_per_block(bd3lm, model, sampler="first-hitting", tokens_per_step=2) == 2
    assert calls_per_block(bd3lm, model, sampler="confidence", steps=1) == 1  # all at once
    assert calls_per_block(bd3lm, model, sampler="confidence", steps=2) == 2
    assert calls_per_block(bd3lm, model, sampler="confidence", steps=50) == 4  # one per token
    # ancestral: a call only at a step that reveals something in some row: at most one per
    # token of the batch (2 rows of 4), not one per step (1000)
    assert 1 <= calls_per_block(bd3lm, model, sampler="ancestral", steps=1000) <= 8


def test_confidence_keeps_the_most_likely_draws():
    """At temperature 0 every draw is the argmax; the confidence step keeps, at each step, the
    positions whose argmax is likeliest, so one step per block is the argmax of all at once."""
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")
    one = draw(bd3lm, model, sampler="confidence", steps=1, temperature=0.0)
    block = torch.full((3, 4), TOK.mask_id)
    with torch.no_grad():
        logits = model(block, None)
    logits[..., TOK.mask_id] = float("-inf")
    assert torch.equal(one.tokens[:, :4], logits.argmax(-1))


@pytest.mark.parametrize("sampler", list(BLOCK_STEPS))
def test_nucleus_filtering_reaches_every_step(sampler):
    """top_p tiny keeps only the likeliest token of each draw: the seed then changes only
    which positions are revealed when, and at top_p = 1 it changes the tokens too."""
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")
    narrow = [draw(bd3lm, model, seed, sampler=sampler, top_p=1e-9).tokens for seed in (0, 1)]
    wide = [draw(bd3lm, model, seed, sampler=sampler).tokens for seed in (0, 1)]
    assert not torch.equal(*wide)
    assert (narrow[0] != narrow[1]).float().mean() < (wide[0] != wide[1]).float().mean()


def test_an_eos_in_the_prompt_ends_no_row():
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")
    eos = TOK.eos_id
    with torch.no_grad():
        model.output_layer.linear.bias[eos] -= 50.0  # the model never draws EOS
    out = draw(bd3lm, model, prompt=torch.tensor([eos, 9, 10]), eos_id=eos)
    assert not out.ended.any() and out.tokens.shape[1] == L + 8 and (out.lengths == L + 8).all()


def test_a_prompt_as_long_as_the_length_and_an_unknown_step_are_refused():
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")
    with pytest.raises(MdlmError, match="the prompt is 8 tokens"):
        draw(bd3lm, model, length=8, prompt=torch.arange(9, 17))
    with pytest.raises(MdlmError, match="choose one of: ancestral, first-hitting, confidence"):
        draw(bd3lm, model, sampler="remdm")


def test_on_block_sees_each_final_block_and_may_end_the_sampling():
    """`on_block` gets every committed block as it ends in the samples (the prompt's whole
    block too), in order; returning True ends the sampling there, the blocks drawn so far
    those of the whole run (the same draws); `before_call` runs before every network call."""
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")
    prompt = torch.tensor([9, 10, 11, 12, 13])
    seen, calls = [], []

    def keep(start, block):
        seen.append((start, block.clone()))
        return False

    whole = draw(bd3lm, model, prompt=prompt, on_block=keep,
                 before_call=lambda: calls.append(1))
    assert [s for s, _ in seen] == list(range(0, L + 8, 4))
    assert torch.equal(torch.cat([b for _, b in seen], dim=1), whole.tokens)
    assert len(calls) == whole.stats.calls
    cut = draw(bd3lm, model, prompt=prompt, on_block=lambda start, _: start == 12)
    assert torch.equal(cut.tokens, whole.tokens[:, :16])
