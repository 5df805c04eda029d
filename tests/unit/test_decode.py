"""Decoders as generators (generation/decode.py): for every registered sampler the events are
its own steps (each position revealed once, remdm's remasked ones again), the tokens are
engine.sample's with the same seed, the calls its NFE; closing the generator stops the
sampling; BD3-LM's blocks come out as the same events."""

import time

import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.engine.block_sampling import BlockRows
from mdlm_cli.engine.registry import SAMPLERS
from mdlm_cli.generation.decode import Finished, Revealed, decode, decode_blocks

from .test_serve_batching import objective_of, served_model


def steps_of(sampler: str) -> int | None:
    return 8 if SAMPLERS[sampler].uses_steps else None


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_the_events_are_the_samplers_steps_and_its_tokens(sampler):
    served = served_model(objective_of(sampler))
    mask, schedule = served.loaded.mask_id, served.loaded.objective.schedule
    how = engine.SamplingSettings(sampler, steps_of(sampler))
    prompt = torch.full((32,), mask)
    prompt[:3] = torch.tensor([5, 6, 7])
    canvas = engine.Canvas(3, 32, mask, prompt, batch_size=2)
    events = list(decode(served.denoiser, how, canvas, schedule=schedule,
                         generator=torch.Generator().manual_seed(0), stop_ids=[9]))
    expected, stats = engine.sample(served.denoiser, how, canvas, schedule=schedule,
                                    generator=torch.Generator().manual_seed(0),
                                    return_stats=True)
    *steps, done = events
    assert isinstance(done, Finished) and torch.equal(done.tokens, expected)
    assert done.stats.calls == stats.calls and all(isinstance(e, Revealed) for e in steps)
    assert len(steps) <= stats.calls and [e.call for e in steps] == sorted(e.call for e in steps)
    times = torch.zeros(3, 32, dtype=torch.long)
    for e in steps:
        rows = slice(e.first_row, e.first_row + len(e.revealed))
        times[rows] += e.revealed.long()
        # a revealed token is the one the rows end with, but where a sampler remasks it later
        if sampler != "remdm":
            assert torch.equal(e.tokens[e.revealed], expected[rows][e.revealed])
    assert (times[:, :3] == 0).all() and (times[:, 3:] >= 1).all()  # the prompt is never drawn
    if sampler != "remdm":
        assert (times[:, 3:] == 1).all()
    assert done.reasons == tuple("stop" if 9 in row[3:] else "length"
                                 for row in expected.tolist())


def test_closing_the_generator_stops_the_sampling():
    served = served_model("mdlm")
    calls = []

    def counting(z, t, **kw):
        calls.append(len(z))
        return served.denoiser(z, t, **kw)

    counting.supports_output_mask = True
    how = engine.SamplingSettings("first-hitting")
    events = decode(counting, how, engine.Canvas(1, 32, served.loaded.mask_id),
                    generator=torch.Generator().manual_seed(0))
    first = next(events)
    assert isinstance(first, Revealed) and int(first.revealed.sum()) == 1
    events.close()
    time.sleep(0.2)  # the thread ends at its next call
    assert len(calls) < 32


def test_block_diffusion_decodes_block_by_block():
    served = served_model("bd3lm")
    objective, model = served.loaded.objective, served.loaded.model
    how = engine.SamplingSettings("ancestral", 4)
    rows = BlockRows(2, 3 * objective.block_size)
    events = list(decode_blocks(objective, model, how, rows,
                                generator=torch.Generator().manual_seed(0)))
    *blocks, done = events
    assert len(blocks) == 3 and isinstance(done, Finished)
    for i, e in enumerate(blocks):
        size = objective.block_size
        assert e.revealed[:, i * size:(i + 1) * size].all() and int(e.revealed.sum()) == 2 * size
        assert torch.equal(e.tokens[e.revealed].view(2, size), done.tokens[:, i * size:(i + 1) * size])
    again = objective.sample(model, how, rows, generator=torch.Generator().manual_seed(0))
    assert torch.equal(done.tokens, again.tokens) and done.reasons == ("length", "length")
