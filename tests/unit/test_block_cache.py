"""The DiT's block cache (models/block_cache.py, issue 42): exact when nothing changed, the
approximation Fast-dLLM makes when tokens change, refused where the keys depend on t."""

import pytest
import torch

from mdlm_cli.config import ModelConfig
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import DiT

V, L = 11, 24


def tiny(n_blocks: int = 2, **keys) -> DiT:
    cfg = ModelConfig(hidden_size=32, n_blocks=n_blocks, n_heads=4, cond_dim=16, dropout=0.0,
                      **keys)
    torch.manual_seed(0)
    model = DiT(cfg, V)
    with torch.no_grad():  # break adaLN-zero's zeros so that outputs depend on inputs
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape))
    return model.eval()


def tokens(batch: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (batch, L), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def test_the_full_pass_is_the_forward_and_a_cached_slice_matches_it_when_nothing_changed():
    model, x = tiny(), tokens()
    full = model(x)
    logits, cache = model.block_cache(x, model.new_block_cache(3, L))
    assert torch.equal(logits, full)
    for s, e in [(8, 16), (8, L), (0, 4), (20, L)]:  # dual's block, prefix's block + suffix
        assert torch.allclose(model.from_cache(x[:, s:e], cache, s), full[:, s:e], atol=1e-4)


@torch.no_grad()
def test_a_call_on_some_rows_reads_and_writes_only_theirs():
    model, x, y = tiny(), tokens(), tokens(seed=1)
    _, cache = model.block_cache(x, model.new_block_cache(3, L))
    rows = torch.tensor([0, 2])
    _, cache = model.block_cache(y[rows], cache, rows)  # rows 0 and 2 refreshed from y
    before = [k.clone() for k in cache.keys]
    out = model.from_cache(y[rows, 8:16], cache, 8, rows)
    assert torch.allclose(out, model(y[rows])[:, 8:16], atol=1e-4)
    assert all(torch.equal(a[1], b[1]) for a, b in zip(before, cache.keys, strict=True))
    assert torch.allclose(model.from_cache(x[1:2, 8:16], cache, 8, torch.tensor([1])),
                          model(x[1:2])[:, 8:16], atol=1e-4)  # row 1 still holds x's


@torch.no_grad()
def test_the_approximation():
    """After a full pass on x, the block [8, 16) changes (tokens revealed) and, for the suffix
    case, the suffix too. A first layer's keys read only their own token, so with one layer a
    call sees exactly what changed in its slice: exact; the suffix's stale keys (dual) are not.
    With two layers the cached keys of the other positions saw the old block: inexact, until
    a full pass refreshes them."""
    x = tokens()
    block, suffix = x.clone(), x.clone()
    block[:, 8:16] = (block[:, 8:16] + 1) % V
    suffix[:, 8:] = (suffix[:, 8:] + 1) % V
    one, two = tiny(n_blocks=1), tiny(n_blocks=2)

    def cached(model, new, end):
        _, cache = model.block_cache(x, model.new_block_cache(3, L))
        return model.from_cache(new[:, 8:end], cache, 8)[:, :8], model(new)[:, 8:16]

    for end in (16, L):  # dual, prefix
        assert torch.allclose(*cached(one, block, end), atol=1e-4)
        approx, exact = cached(two, block, end)
        assert not torch.allclose(approx, exact, atol=1e-3)
    assert torch.allclose(*cached(one, suffix, L), atol=1e-4)  # prefix: the suffix is fresh
    assert not torch.allclose(*cached(one, suffix, 16), atol=1e-3)  # dual: it is stale
    _, cache = two.block_cache(block, two.new_block_cache(3, L))  # the refresh at the next block's start
    assert torch.allclose(two.from_cache(block[:, 8:16], cache, 8), two(block)[:, 8:16],
                          atol=1e-4)


@torch.no_grad()
def test_cached_slices_take_their_absolute_rotary_positions():
    model, x = tiny(), tokens()
    _, cache = model.block_cache(x, model.new_block_cache(3, L))
    shifted = model.from_cache(x[:, 8:16], cache, 0)  # the same tokens placed at 0..7
    assert not torch.allclose(shifted, model(x)[:, 8:16], atol=1e-3)


def test_time_conditioned_models_refuse_in_one_line():
    model = tiny(time_conditioning=True)
    with pytest.raises(MdlmError, match="without time conditioning") as info:
        model.block_cache(tokens(), model.new_block_cache(3, L))
    assert "\n" not in str(info.value)
