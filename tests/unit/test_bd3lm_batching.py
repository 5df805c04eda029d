"""Several requests in one batch of block sampling (`BlockDraw.groups`): each request's rows
draw from its own generator, so with a network that gives a row the same logits in any batch
each request gets, row for row, the tokens it gets alone, whatever its seed, its n and its
prompt, for every within-block step."""

import pytest
import torch

from mdlm_cli.engine.block_sampling import BlockHooks, BlockRows, GroupCounts
from mdlm_cli.engine.settings import SamplingSettings
from mdlm_cli.objectives.bd3lm import RecomputedBlocks

from .test_bd3lm import setup

LENGTH = 40  # 10 blocks of 4, past the training length 32
# (seed, n, prompt): a whole block and half of the next, a different prompt each
REQUESTS = [(5, 2, [9, 10, 11, 12, 13, 14]), (6, 1, [20, 21, 22, 23, 24, 25]),
            (7, 3, [30, 31, 32, 8, 9, 10])]


class RowByRow:
    """A `BlockModel` that runs each row alone: a row's logits cannot depend on its batch, so
    what is compared is the draws only."""

    def __init__(self, model, block_size: int):
        self.model, self.block_size = model, block_size
        self.rows: list[RecomputedBlocks] = []

    def start(self, batch: int, max_len: int, device: torch.device) -> None:
        self.rows = [RecomputedBlocks(self.model, self.block_size) for _ in range(batch)]
        for row in self.rows:
            row.start(1, max_len, device)

    def logits(self, block: torch.Tensor) -> torch.Tensor:
        return torch.cat([row.logits(block[i:i + 1]) for i, row in enumerate(self.rows)])

    def commit(self, block: torch.Tensor) -> None:
        for i, row in enumerate(self.rows):
            row.commit(block[i:i + 1])


@pytest.fixture(scope="module")
def bd3():
    _, bd3lm, model = setup("bd3lm", "diffusion.block_size=4")
    bd3lm.block_model = lambda model, cache=True, autocast_dtype=None: RowByRow(model, 4)
    return bd3lm, model


@pytest.mark.parametrize("how", [
    SamplingSettings("ancestral", 3),
    SamplingSettings("ancestral", 1000, top_p=0.9),
    SamplingSettings("first-hitting", options={"tokens_per_step": 1}),
    SamplingSettings("first-hitting", options={"tokens_per_step": 3}, temperature=0.7),
    SamplingSettings("confidence", 2),
    SamplingSettings("confidence", 3, top_k=5),
])
def test_each_request_gets_its_alone_tokens_in_a_batch(bd3, how):
    bd3lm, model = bd3
    alone_stats = [bd3lm.sample(model, how, BlockRows(n, LENGTH, torch.tensor(prompt)),
                                generator=torch.Generator().manual_seed(seed))
                   for seed, n, prompt in REQUESTS]
    alone = [out.tokens for out in alone_stats]
    # (8, 6) one per row: the requests' 6, and 2 padding rows (a server's) of their own
    prompts = torch.tensor([p for _, n, p in REQUESTS for _ in range(n)] + [REQUESTS[0][2]] * 2)
    groups = [(n, torch.Generator().manual_seed(seed)) for seed, n, _ in REQUESTS]
    groups.append((2, torch.Generator().manual_seed(0)))
    counts = GroupCounts()
    together = bd3lm.sample(model, how, BlockRows(len(prompts), LENGTH, prompts),
                            generator=None, groups=groups, hooks=BlockHooks(counts=counts))
    assert torch.equal(together.tokens[:6], torch.cat(alone))
    assert len(set(together.tokens[:, 6:].flatten().tolist())) > 5  # draws, not one token
    assert sum(counts.draws) == together.stats.draws
    # each request's work is what it takes alone, though the batch calls more (ancestral)
    assert counts.draws[:3] == [out.stats.draws for out in alone_stats]
    assert counts.calls[:3] == [out.stats.calls for out in alone_stats]
    if how.sampler == "ancestral":  # a step calls the network if any group reveals there
        assert together.stats.calls > min(counts.calls)
    # the seeds matter: the same rows under one generator draw other tokens
    shared = bd3lm.sample(model, how, BlockRows(6, LENGTH, prompts[:6]),
                          generator=torch.Generator().manual_seed(5))
    assert not torch.equal(shared.tokens, together.tokens[:6])


def test_a_request_that_ends_early_keeps_its_tokens_while_the_others_go_on(bd3):
    """With EOS, a request alone stops after the block where its rows ended; in the batch its
    rows go on being drawn (from its generator) until every row has ended: up to its end its
    tokens are its alone tokens, and its lengths the same."""
    bd3lm, model = bd3
    how = SamplingSettings("first-hitting")
    eos = 12  # a token the tiny model draws often enough to end some rows
    alone = [bd3lm.sample(model, how, BlockRows(n, LENGTH, torch.tensor(prompt), eos),
                          generator=torch.Generator().manual_seed(seed))
             for seed, n, prompt in REQUESTS]
    prompts = torch.tensor([p for _, n, p in REQUESTS for _ in range(n)])
    groups = [(n, torch.Generator().manual_seed(seed)) for seed, n, _ in REQUESTS]
    together = bd3lm.sample(model, how, BlockRows(len(prompts), LENGTH, prompts, eos),
                            generator=None, groups=groups)
    first = 0
    for out in alone:
        n, width = out.tokens.shape
        rows = slice(first, first + n)
        assert torch.equal(together.tokens[rows, :width], out.tokens)
        assert torch.equal(together.lengths[rows], out.lengths)
        first += n
    assert {out.tokens.shape[1] for out in alone} == {24, LENGTH}  # one ended 2 blocks in


def test_groups_must_cover_the_batch(bd3):
    bd3lm, model = bd3
    with pytest.raises(ValueError, match="the groups hold 3 rows; the batch has 4"):
        bd3lm.sample(model, SamplingSettings("first-hitting"), BlockRows(4, 8), generator=None,
                     groups=[(3, torch.Generator())])
