"""The autoregressive baseline: exact likelihood, KV-cache generation, training dispatch."""

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.build import resolve_config
from mdlm_cli.config import ModelConfig
from mdlm_cli.data.store import TokenSplit
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.engine import EngineError
from mdlm_cli.errors import MdlmError
from mdlm_cli.models import DiT, KVCache, build_model
from mdlm_cli.objectives import SplitSweep, get_objective
from mdlm_cli.objectives.ar import CausalLMAdapter, sequence_nll

from .test_sampling import chi2_pvalue

SAMPLER = "autoregressive-kv-cache"
BOS, MASK = 3, 4  # real tokens 0..2, BOS 3 (a token the model may also emit), mask 4
V = 5


def tiny(scale: float = 0.1, seed: int = 0, vocab: int = V) -> DiT:
    torch.manual_seed(seed)
    model = DiT(ModelConfig(hidden_size=32, n_blocks=2, n_heads=4, cond_dim=16, dropout=0.0), vocab, causal=True)
    with torch.no_grad():  # break adaLN-zero / zero output init so outputs depend on inputs
        for p in model.parameters():
            if p.abs().sum() == 0:
                p.normal_(0, scale)
    return model.eval()


def test_kv_cache_matches_the_full_forward():
    model = tiny(vocab=11)
    x = torch.randint(0, 11, (3, 12))
    full = model(x)
    cache = KVCache.empty(model, 3, 12, torch.device("cpu"), torch.float32)
    pieces, start = [], 0
    for n in (4, 1, 1, 3, 1, 2):  # a prefill, then single tokens and short runs
        pieces.append(model(x[:, start:start + n], kv_cache=cache))
        start += n
    assert cache.length == 12
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-5)
    with pytest.raises(ValueError, match="cache holds 12"):
        model(x[:, :1], kv_cache=cache)


def test_sequence_nll_matches_a_hand_computation():
    model = tiny(scale=0.5)
    x0 = torch.tensor([[0, 2, 1, 1, 3], [2, 2, 0, 1, 0]])
    expected = torch.zeros(2)
    for b in range(2):
        for pos in range(5):
            prefix = torch.cat([torch.tensor([BOS]), x0[b, :pos]])[None]  # BOS, x_<pos
            logits = model(prefix)[0, -1].clone()
            logits[MASK] = float("-inf")
            expected[b] -= torch.log_softmax(logits, -1)[x0[b, pos]]
    got = sequence_nll(model, x0, bos_id=BOS, mask_id=MASK)
    assert torch.allclose(got, expected, atol=1e-5)
    # padding at the end is neither scored nor seen
    am = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    padded = x0.clone()
    padded[0, 3:] = torch.tensor([1, 0])
    got_pad = sequence_nll(model, padded, bos_id=BOS, mask_id=MASK, attention_mask=am)
    short = sequence_nll(model, x0[:1, :3], bos_id=BOS, mask_id=MASK)
    assert torch.allclose(got_pad[0], short[0], atol=1e-5)


def test_exact_nll_covers_every_row_and_token():
    model = tiny(scale=0.5)
    rows = np.random.default_rng(0).integers(0, 3, size=(5, 6))
    lengths = np.array([6, 6, 6, 6, 4], dtype=np.int32)
    split = TokenSplit(rows, lengths)
    objective = get_objective(resolve_config("demo-ar"), SimpleNamespace(mask_id=MASK, bos_id=BOS))
    results = objective.evaluate(objective.denoiser(model), split, SplitSweep(2, torch.device("cpu")),
                                 seeds=[0, 1, 2])
    assert len(results) == 1  # exact: one pass whatever the number of seeds
    result = results[0]
    x0, am = split.batch(np.arange(5))
    expected = sequence_nll(model, x0, bos_id=BOS, mask_id=MASK, attention_mask=am).sum()
    assert result.exact and result.sequences == 5 and result.tokens == 28  # the remainder batch counts
    assert result.nats == pytest.approx(expected.item(), rel=1e-5)


def test_generation_samples_the_model_distribution():
    """KV-cache ancestral sampling draws sequences with probability exp(-NLL): the model's
    exact joint, which sums to one over every sequence of non-mask tokens."""
    model = tiny(scale=0.6, seed=3)
    L = 3
    configs = torch.tensor(list(itertools.product(range(MASK), repeat=L)))  # every non-mask sequence
    probs = torch.exp(-sequence_nll(model, configs, bos_id=BOS, mask_id=MASK)).double().detach()
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)
    n = 6000
    lm = CausalLMAdapter(model, bos_id=BOS, mask_id=MASK)
    tokens, stats = engine.sample(lm, sampler=SAMPLER, num_samples=n,
                                  length=L, mask_id=MASK, generator=torch.Generator().manual_seed(0), batch_size=2000,
                                  return_stats=True)
    assert not (tokens == MASK).any()
    index = (tokens * MASK ** torch.arange(L - 1, -1, -1)).sum(1)
    counts = torch.bincount(index, minlength=len(configs)).double()
    assert chi2_pvalue(counts, probs / probs.sum()) > 1e-3
    assert stats.nfe == L and stats.ncs == L  # one cached call and one draw per token


def test_prompt_is_continued_and_infill_refused():
    model = tiny(scale=0.5)
    lm = CausalLMAdapter(model, bos_id=BOS, mask_id=MASK)
    template = torch.tensor([2, 0, MASK, MASK, MASK])
    tokens, stats = engine.sample(lm, sampler=SAMPLER, num_samples=4, length=5, mask_id=MASK, prompt=template,
                                  generator=torch.Generator().manual_seed(1), return_stats=True)
    assert torch.equal(tokens[:, :2], torch.tensor([[2, 0]] * 4))
    assert stats.calls == 3  # one call per new token, the first also reads the prefix
    with pytest.raises(EngineError, match="only continue a prefix"):
        engine.sample(lm, sampler=SAMPLER, num_samples=1, length=4, mask_id=MASK,
                      prompt=torch.tensor([2, MASK, 1, MASK]))


def test_ar_objective_builds_a_causal_model_without_time():
    cfg, tok = resolve_config("demo-ar"), load_tokenizer("char")
    assert cfg.diffusion.objective == "ar"
    objective = get_objective(cfg, tok)
    assert objective.causal and not objective.takes_time and objective.exact
    assert build_model(cfg.model, 35, causal=objective.causal).causal
    assert not get_objective(resolve_config("demo"), tok).causal
    with pytest.raises(MdlmError, match="no time input"):
        resolve_config("demo-ar", ["model.time_conditioning=true"])
    for name in ("owt-ar", "lm1b-ar"):
        ar_cfg, base = resolve_config(name).to_dict(), resolve_config(name.removesuffix("-ar")).to_dict()
        for section in ("data", "model", "optim", "train"):  # the same recipe as the diffusion preset
            assert ar_cfg[section] == base[section], (name, section)


class _Reads(CausalLMAdapter):
    """Records how many tokens each call reads."""

    def __call__(self, tokens, cache):
        self.reads.append(tokens.shape[1])
        return super().__call__(tokens, cache)


def test_recompute_sampler_draws_what_the_cache_draws_reading_the_whole_prefix_each_call():
    """The reference's AR (no cache) and the KV-cache AR are one law and one draw stream: the
    same tokens from the same seed; the recompute sampler's calls read BOS + 0, 1, ..., L - 1."""
    lm = _Reads(tiny(scale=0.5), bos_id=BOS, mask_id=MASK)
    out = {}
    for sampler in (SAMPLER, "autoregressive-recompute"):
        lm.reads = []
        tokens, stats = engine.sample(lm, sampler=sampler, num_samples=3, length=8, mask_id=MASK,
                                      generator=torch.Generator().manual_seed(1), return_stats=True)
        out[sampler] = tokens, stats.calls, lm.reads
    assert torch.equal(out[SAMPLER][0], out["autoregressive-recompute"][0])
    assert out[SAMPLER][2] == [1] + [1] * 7 and out[SAMPLER][1] == 8
    assert out["autoregressive-recompute"][2] == list(range(1, 9))
    assert out["autoregressive-recompute"][1] == 8
