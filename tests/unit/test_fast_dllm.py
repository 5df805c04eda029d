"""Fast-dLLM's block caches, token for token (issue 42, item 2).

The expected tokens come from a line-by-line transcription of NVlabs/Fast-dLLM's
llada/generate.py, written as test code: `generate` (with `threshold`),
`generate_with_prefix_cache`, `generate_with_dual_cache` and `get_transfer_index`
(low_confidence remasking). Their `model(x, use_cache=True)` is the DiT's full pass
`block_cache`, and `model(x[:, s:], past_key_values=...)` its `from_cache` on the slice; the
prefix cache's truncation to the positions before the block is made by zeroing the entries
from s on (`truncated`), which the slice then overwrites. mdlm's `confidence` (llada counts,
`--block-length`, `--cache`) and `threshold` (`--block-length`, `--cache`) samplers must give
their tokens and their network calls at temperature 0, rows alone or batched.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mdlm_cli import engine
from mdlm_cli.config import ModelConfig
from mdlm_cli.engine.schedules import LogLinear
from mdlm_cli.engine.settings import SamplingSettings
from mdlm_cli.models import DiffusionDenoiser, DiT
from mdlm_cli.models.block_cache import BlockCache

from .test_generation_schedules import get_num_transfer_tokens

V, MASK = 12, 12  # 12 real tokens, the mask after them


def tiny_dit(seed: int = 0) -> DiT:
    """A random 2-layer time-agnostic DiT whose positions interact."""
    cfg = ModelConfig(hidden_size=32, n_blocks=2, n_heads=4, cond_dim=16, dropout=0.0)
    torch.manual_seed(seed)
    model = DiT(cfg, V + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2 * torch.randn(p.shape))
    return model.eval()


class FastDllmModel:
    """The DiT as Fast-dLLM's loops call LLaDA: logits with the mask excluded."""

    def __init__(self, dit: DiT, mask_id: int = MASK):
        self.dit, self.mask_id = dit, mask_id

    def _no_mask(self, logits):
        logits = logits.clone()
        logits[..., self.mask_id] = float("-inf")
        return logits

    def __call__(self, x):  # model(x).logits
        return self._no_mask(self.dit(x))

    def with_cache(self, x):  # output = model(x, use_cache=True): logits, past_key_values
        logits, cache = self.dit.block_cache(x, self.dit.new_block_cache(*x.shape))
        return self._no_mask(logits), cache

    def cached(self, x_slice, cache, start):  # model(x[:, start:...], past_key_values=cache)
        return self._no_mask(self.dit.from_cache(x_slice, cache, start))


def truncated(cache: BlockCache, end: int) -> BlockCache:
    """past_key_values[i][j][:, :, :end]: the entries from `end` on dropped (zeroed)."""
    def cut(t):
        t = t.clone()
        t[:, :, end:] = 0
        return t

    return BlockCache(cache.batch, cache.length, [cut(k) for k in cache.keys],
                      [cut(v) for v in cache.values])


# ------------------------------------------------------------------ Fast-dLLM, transcribed
# (its get_num_transfer_tokens is LLaDA's: test_generation_schedules has the transcription)

def get_transfer_index(logits, mask_index, x, num_transfer_tokens, threshold=None):
    x0 = torch.argmax(logits, dim=-1)  # temperature 0: no Gumbel noise
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -np.inf)
    transfer_index = torch.zeros_like(x0, dtype=torch.bool)
    if threshold is not None:
        num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j]))
        transfer_index[j, select_index] = True
        if threshold is not None:
            for k in range(1, int(num_transfer_tokens[j])):
                if confidence[j, select_index[k]] < threshold:
                    transfer_index[j, select_index[k]] = False
    return x0, transfer_index


def _start(model, prompt, steps, gen_length, block_length):
    x = torch.full((1, prompt.shape[1] + gen_length), model.mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    return x, num_blocks, steps // num_blocks


@torch.no_grad()
def generate(model, prompt, steps, gen_length, block_length, threshold=None):
    MASK = model.mask_id  # noqa: N806 - the mask id of LLaDA's code
    x, num_blocks, steps = _start(model, prompt, steps, gen_length, block_length)
    nfe = 0
    for num_block in range(num_blocks):
        lo, hi = prompt.shape[1] + num_block * block_length, prompt.shape[1] + (num_block + 1) * block_length
        num_transfer_tokens = get_num_transfer_tokens(x[:, lo:hi] == MASK, steps)
        i = 0
        while True:
            nfe += 1
            mask_index = x == MASK
            logits = model(x)
            mask_index[:, hi:] = 0
            k = num_transfer_tokens[:, i] if threshold is None else None
            x0, transfer_index = get_transfer_index(logits, mask_index, x, k, threshold)
            x[transfer_index] = x0[transfer_index]
            i += 1
            if (x[:, lo:hi] == MASK).sum() == 0:
                break
    return x, nfe


@torch.no_grad()
def generate_with_cache(model, prompt, steps, gen_length, block_length, dual, threshold=None):
    """generate_with_prefix_cache (dual False) and generate_with_dual_cache (dual True)."""
    MASK = model.mask_id  # noqa: N806
    x, num_blocks, steps = _start(model, prompt, steps, gen_length, block_length)
    nfe = 0
    for num_block in range(num_blocks):
        lo = prompt.shape[1] + num_block * block_length
        hi = lo + block_length
        num_transfer_tokens = get_num_transfer_tokens(x[:, lo:hi] == MASK, steps)
        logits, past_key_values = model.with_cache(x)
        mask_index = x == MASK
        mask_index[:, hi:] = 0
        k = num_transfer_tokens[:, 0] if threshold is None else None
        x0, transfer_index = get_transfer_index(logits, mask_index, x, k, threshold)
        x[transfer_index] = x0[transfer_index]
        if not dual:
            past_key_values = truncated(past_key_values, lo)
        nfe += 1
        i = 1
        while True:
            nfe += 1
            end = hi if dual else x.shape[1]
            mask_index = x[:, lo:end] == MASK
            mask_index[:, block_length:] = 0
            logits = model.cached(x[:, lo:end], past_key_values, lo)
            k = num_transfer_tokens[:, i] if threshold is None else None
            x0, transfer_index = get_transfer_index(logits, mask_index, x[:, lo:end], k, threshold)
            x[:, lo:end][transfer_index] = x0[transfer_index]
            if (x[:, lo:hi] == MASK).sum() == 0:
                break
            i += 1
    return x, nfe


def fast_dllm(model, prompt, steps, gen_length, block_length, cache, threshold=None):
    if cache == "none":
        return generate(model, prompt, steps, gen_length, block_length, threshold)
    return generate_with_cache(model, prompt, steps, gen_length, block_length, cache == "dual",
                               threshold)


# ------------------------------------------------------------------ mdlm's side

def mdlm_sample(dit, template, steps, cache, block_length, threshold=None, mask_id=MASK):
    """mdlm's sampler over `template` (B, L), masks at the free positions: (tokens, NFE)."""
    if threshold is None:
        how = SamplingSettings("confidence", steps, temperature=0.0, options={
            "k_schedule": "llada", "block_length": block_length, "cache": cache})
    else:
        how = SamplingSettings("threshold", steps, temperature=0.0, options={
            "threshold": threshold, "block_length": block_length, "cache": cache})
    tokens, stats = engine.sample(
        DiffusionDenoiser(dit, LogLinear()), how, num_samples=len(template),
        length=template.shape[1], mask_id=mask_id, prompt=template, return_stats=True)
    return tokens, stats.nfe


def template_of(prompt, gen_length, mask_id=MASK):
    x = torch.full((len(prompt), prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt
    return x


def prompts(batch, n, seed=1):
    return torch.randint(0, V, (batch, n), generator=torch.Generator().manual_seed(seed))


CASES = [(16, 4, 8), (24, 8, 12), (12, 12, 6)]


@pytest.mark.parametrize("threshold", [None, 0.5])
@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("gen_length, block_length, steps", CASES)
def test_fast_dllm_token_for_token_at_temperature_0(gen_length, block_length, steps, cache,
                                                     threshold):
    dit = tiny_dit()
    model, prompt = FastDllmModel(dit), prompts(2, 5)
    expected = [fast_dllm(model, row[None], steps, gen_length, block_length, cache, threshold)
                for row in prompt]
    tokens, nfe = mdlm_sample(dit, template_of(prompt, gen_length), steps, cache, block_length,
                              threshold)
    assert torch.equal(tokens, torch.cat([x for x, _ in expected]))
    assert nfe == sum(n for _, n in expected) / len(expected)


@pytest.mark.parametrize("threshold", [None, 0.5])
@pytest.mark.parametrize("cache", ["prefix", "dual"])
def test_llada_caches_token_for_token_at_temperature_0(tmp_path, cache, threshold):
    """The same equality on a tiny random LLaDA in the released layout (its own block cache,
    rotary positions of the slice, mask id 85), rows batched."""
    from mdlm_cli.checkpoints.load import load_checkpoint

    from ..open_model_folders import write_llada

    llada = load_checkpoint(str(write_llada(tmp_path / "llada", n_layers=3))).model.eval()
    mask = 85
    model = FastDllmModel(llada, mask_id=mask)
    prompt = torch.randint(0, 80, (2, 5), generator=torch.Generator().manual_seed(2))
    for gen_length, block_length, steps in CASES[:2]:
        expected = [fast_dllm(model, row[None], steps, gen_length, block_length, cache,
                              threshold) for row in prompt]
        tokens, nfe = mdlm_sample(llada, template_of(prompt, gen_length, mask), steps, cache,
                                  block_length, threshold, mask_id=mask)
        assert torch.equal(tokens, torch.cat([x for x, _ in expected]))
        assert nfe == sum(n for _, n in expected) / len(expected)
    none = fast_dllm(model, prompt[:1], 12, 24, 8, "none")[0]
    assert not torch.equal(none, fast_dllm(model, prompt[:1], 12, 24, 8, cache)[0])


def test_the_caches_are_approximations_this_model_tells_apart():
    """The tests above are worth something: on the same model, no cache, prefix and dual cache
    give three different answers."""
    dit = tiny_dit()
    model, prompt = FastDllmModel(dit), prompts(1, 5)
    answers = {cache: fast_dllm(model, prompt, 12, 24, 8, cache)[0] for cache in
               ("none", "prefix", "dual")}
    assert not torch.equal(answers["none"], answers["prefix"])
    assert not torch.equal(answers["none"], answers["dual"])
    assert not torch.equal(answers["prefix"], answers["dual"])


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("threshold", [None, 0.5])
def test_rows_progress_independently(cache, threshold):
    """Prompts of different lengths (blocks at different positions), each row under a
    threshold its own number of calls per block: a row's tokens and calls are what it gets
    alone."""
    dit, L, block_length, steps = tiny_dit(seed=3), 26, 4, 12
    template = torch.full((3, L), MASK, dtype=torch.long)
    for b, n in enumerate((2, 6, 10)):  # 24, 20 and 16 tokens after the prompt: 6, 5, 4 blocks
        template[b, :n] = prompts(1, n, seed=b)[0]
    if threshold is None:  # the llada counts need the blocks to divide the steps: one row each
        template = template[[0]].expand(3, -1).clone()
        template[1, :2] = prompts(1, 2, seed=9)[0]
    alone = [mdlm_sample(dit, template[b:b + 1], steps, cache, block_length, threshold)
             for b in range(3)]
    together, nfe = mdlm_sample(dit, template, steps, cache, block_length, threshold)
    assert torch.equal(together, torch.cat([x for x, _ in alone]))
    assert nfe == pytest.approx(sum(n for _, n in alone) / 3)
    if threshold is not None:
        assert len({n for _, n in alone}) > 1  # the rows did progress differently


def test_a_cache_without_blocks_or_on_a_time_conditioned_model_is_refused():
    template = template_of(prompts(1, 4), 8)
    with pytest.raises(engine.EngineError, match="cache dual needs block_length"):
        mdlm_sample(tiny_dit(), template, 4, "dual", 0)
    timed = DiT(ModelConfig(hidden_size=32, n_blocks=1, n_heads=4, cond_dim=16,
                            time_conditioning=True), V + 1)
    how = SamplingSettings("confidence", 4, temperature=0.0,
                           options={"block_length": 4, "cache": "prefix"})
    denoiser = DiffusionDenoiser(timed, LogLinear(), time_conditioning=True)
    with pytest.raises(engine.EngineError, match="needs a time-agnostic model"):
        engine.sample(denoiser, how, num_samples=1, length=12, mask_id=MASK, prompt=template)


def test_mdlm_sample_cache_dual_is_generate_with_dual_cache(tmp_path):
    """Through the command line, on a checkpoint: `mdlm sample --prompt-ids ... --sampler
    confidence --k-schedule llada --block-length 4 --cache dual --temperature 0` and the
    threshold sampler with --cache prefix; their records carry the NFE."""
    from .test_generation_schedules import cli_sample, save_dit

    folder = save_dit(tmp_path / "run")
    from mdlm_cli.checkpoints.load import load_checkpoint

    loaded = load_checkpoint(folder)
    model, ids = FastDllmModel(loaded.model, loaded.mask_id), [5, 17, 3, 9]
    expected, calls = fast_dllm(model, torch.tensor([ids]), 8, 16, 4, "dual")
    record = cli_sample(folder, tmp_path, ids, "--max-new-tokens", "16", "--steps", "8",
                        "--k-schedule", "llada", "--block-length", "4", "--cache", "dual")
    assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls
    expected, calls = fast_dllm(model, torch.tensor([ids]), 8, 16, 4, "prefix", 0.5)
    record = cli_sample(folder, tmp_path, ids, "--max-new-tokens", "16", "--sampler",
                        "threshold", "--threshold", "0.5", "--block-length", "4", "--cache",
                        "prefix")
    assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls
    assert record["sampler"] == "threshold" and record["cache"] == "prefix"


def test_bench_sampler_rows_per_cache(tmp_path):
    """`bench-sampler --cache none,prefix,dual`: one row each, the same NFE, and the positions
    the calls ran: at L = 32 in 4 blocks of 8 with 2 steps each, a full pass (32) and one
    cached call per block: the whole row (none), the block and the suffix (prefix), the block
    (dual)."""
    from typer.testing import CliRunner

    from mdlm_cli.cli import app

    from .test_generation_schedules import save_dit

    folder, out = save_dit(tmp_path / "run"), tmp_path / "b.json"
    args = ["bench-sampler", "-c", str(folder), "--samplers", "confidence", "--steps", "8",
            "-n", "2", "--batch-size", "2", "--repeats", "1", "--length", "32", "--k-schedule",
            "llada", "--block-length", "8", "--cache", "none,prefix,dual", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert [r["options"]["cache"] for r in rows] == ["none", "prefix", "dual"]
    assert [r["nfe"] for r in rows] == [8.0] * 3
    assert [r["input_tokens"] for r in rows] == [8 * 32, 4 * 32 + 32 + 24 + 16 + 8, 4 * 40]
    # the table's positions/call column: input_tokens / NFE
    assert "positions/call" in result.output
    for cells in (["none", "32.0"], ["prefix", "26.0"], ["dual", "20.0"]):
        assert any(all(c in line for c in cells) for line in result.output.splitlines())


def test_the_server_runs_a_cached_request_alone_with_the_clis_tokens():
    """`"cache": "dual"` on /v1/completions: the request runs by itself on the model (its
    cached calls do not batch), concurrently with plain requests, and gives the tokens that
    the engine gives with the same seed; stream_states with a cache is refused."""
    from mdlm_cli.serve.completion import parse_completion
    from mdlm_cli.serve.schema import ApiError, Limits
    from mdlm_cli.serve.worker import Batching, Worker

    from .test_serve_batching import run, served_model

    served = served_model("mdlm")
    cached = {"prompt": "the ", "sampler": "confidence", "steps": 12, "block_length": 4,
              "max_tokens": 12, "seed": 5, "temperature": 0, "cache": "dual"}
    plain = {"prompt": "a", "sampler": "first-hitting", "seed": 1, "max_tokens": 6}
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id,
                    batching=Batching(max_batch=4, max_wait_s=0.05))
    try:
        together = run(worker, served, [plain, cached, plain])
        alone = run(worker, served, [cached])[0]
    finally:
        worker.stop()
    assert together[1].choices[0]["text"] == alone.choices[0]["text"]
    assert together[1].stats.calls == alone.stats.calls
    uncached = dict(cached, cache="none")
    worker = Worker(served.denoiser, mask_id=served.loaded.mask_id, batching=Batching(max_batch=1))
    try:
        run_uncached = run(worker, served, [uncached])[0]
    finally:
        worker.stop()
    # the cache ran: a cached call gives (and the sampler draws from) its block's logits only
    assert alone.stats.calls == run_uncached.stats.calls
    assert alone.stats.draws < run_uncached.stats.draws
    plan = parse_completion(cached, served, Limits())  # the engine on the model, as the CLI
    row = plan.rows[0].template  # the prompt and its 12 tokens (generation/layout.py)
    tokens = engine.sample(served.denoiser, plan.settings, num_samples=1, length=len(row),
                           mask_id=served.loaded.mask_id, prompt=row[None],
                           schedule=served.loaded.objective.schedule,
                           generator=torch.Generator().manual_seed(plan.seed))
    start = len(plan.rows[0].prefix)
    expected = served.loaded.tokenizer.decode(tokens[0, start : start + 12].tolist())
    assert alone.choices[0]["text"] == expected
    with pytest.raises(ApiError, match="stream_states needs cache none"):
        parse_completion(dict(cached, stream=True, stream_states=True), served, Limits())


@pytest.mark.parametrize("sampler, options", [
    ("confidence", {"k_schedule": "llada", "order_temperature": 0.5}),
    ("threshold", {"threshold": 0.5}),
])
def test_at_temperature_above_0_a_seed_gives_one_answer_and_no_mask(sampler, options):
    dit, template = tiny_dit(), template_of(prompts(3, 4), 16)

    def draw(seed):
        how = SamplingSettings(sampler, 8, temperature=0.8,
                               options={**options, "block_length": 4, "cache": "dual"})
        return engine.sample(DiffusionDenoiser(dit, LogLinear()), how, num_samples=3,
                             length=20, mask_id=MASK, prompt=template,
                             generator=torch.Generator().manual_seed(seed))

    a, b, c = draw(0), draw(0), draw(1)
    assert torch.equal(a, b) and not torch.equal(a, c) and not (a == MASK).any()
    assert torch.equal(a[:, :4], template[:, :4])
