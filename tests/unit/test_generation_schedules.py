"""LLaDA's `generate` and Dream's `diffusion_generate`, token for token (issue 41, item 3).

The expected tokens come from line-by-line transcriptions of the published loops, written as
test code over a `model(x) -> logits` callable: LLaDA's `generate` (ML-GSAI/LLaDA
generate.py: low_confidence remasking, no CFG; `get_num_transfer_tokens`,
`add_gumbel_noise`) and Dream's `_sample` with `sample_tokens` (DreamLM's
generation_utils.py: maskgit_plus, topk_margin, entropy; alg_temp 0 and > 0). mdlm's
`confidence` sampler, given the same model (Dream's logits shifted one position right, as its
loop reads them), must give their tokens and their network calls at temperature 0, and their
law at temperature > 0.
"""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mdlm_cli import engine
from mdlm_cli.engine.categorical import drawn_probs
from mdlm_cli.engine.confident_draws import ORDERS
from mdlm_cli.engine.settings import SamplingSettings
from mdlm_cli.engine.transfer import reveal_counts

V, MASK = 12, 12  # 12 real tokens, the mask after them


class Mixer(torch.nn.Module):
    """A tiny time-agnostic model whose logits at each position read its token, its position,
    its neighbours' and the mean over the whole sequence: what is revealed anywhere changes every prediction,
    so a wrong order or count changes the tokens. It never predicts the mask."""

    def __init__(self, length: int, seed: int = 0, d: int = 16):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = torch.randn(V + 1, d, generator=g)
        self.pos = torch.randn(length, d, generator=g)
        self.mix = torch.randn(3, d, d, generator=g) / math.sqrt(d)
        self.out = torch.randn(d, V + 1, generator=g) / 2

    def forward(self, x):
        h = self.emb[x] + self.pos[: x.shape[1]]  # (B, L, d)
        near = h.roll(1, 1) @ self.mix[0] + h.roll(-1, 1) @ self.mix[1]  # the neighbours
        h = h + 3 * torch.tanh(near + h.mean(1, keepdim=True) @ self.mix[2])
        logits = h @ self.out  # (B, L, V + 1)
        logits[..., MASK] = float("-inf")
        return logits


class AsDenoiser:
    """The model as mdlm's engine calls it; `shift`: Dream's logits, read one position left."""

    time_agnostic = True

    def __init__(self, model, shift: bool = False):
        self.model, self.shift = model, shift

    def __call__(self, z, t, **kwargs):
        logits = self.model(z)
        return torch.cat([logits[:, :1], logits[:, :-1]], dim=1) if self.shift else logits


# ------------------------------------------------------------------ LLaDA's generate, transcribed

def add_gumbel_noise(logits, temperature, generator=None):
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand(logits.shape, dtype=torch.float64, generator=generator)
    gumbel_noise = (-torch.log(noise)) ** temperature
    return logits.exp() / gumbel_noise


def get_num_transfer_tokens(mask_index, steps):
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    num_transfer_tokens = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num_transfer_tokens[i, : remainder[i]] += 1
    return num_transfer_tokens


@torch.no_grad()
def llada_generate(model, prompt, steps, gen_length, block_length, temperature=0.0,
                   mask_id=MASK, generator=None):
    """LLaDA's generate (cfg_scale 0, remasking low_confidence); returns (x, model calls)."""
    calls = 0
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    assert gen_length % block_length == 0
    num_blocks = gen_length // block_length
    assert steps % num_blocks == 0
    steps = steps // num_blocks
    for num_block in range(num_blocks):
        lo = prompt.shape[1] + num_block * block_length
        block_mask_index = x[:, lo : lo + block_length] == mask_id
        num_transfer_tokens = get_num_transfer_tokens(block_mask_index, steps)
        for i in range(steps):
            mask_index = x == mask_id
            logits = model(x)
            calls += 1
            logits_with_noise = add_gumbel_noise(logits, temperature, generator)
            x0 = torch.argmax(logits_with_noise, dim=-1)
            p = F.softmax(logits, dim=-1)
            x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0_p[:, lo + block_length :] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer_index = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, select_index = torch.topk(confidence[j], k=int(num_transfer_tokens[j, i]))
                transfer_index[j, select_index] = True
            x[transfer_index] = x0[transfer_index]
    return x, calls


# ------------------------------------------------------------------ Dream's _sample, transcribed

def top_p_logits(logits, top_p=None):
    sorted_logits, sorted_indices = torch.sort(logits, descending=True)
    cumulative_probs = torch.cumsum(F.softmax(sorted_logits, dim=-1), dim=-1)
    sorted_indices_to_remove = cumulative_probs > top_p
    sorted_indices_to_remove[..., 1:] = sorted_indices_to_remove[..., :-1].clone()
    sorted_indices_to_remove[..., 0] = 0
    mask = torch.zeros_like(logits, dtype=torch.bool)
    mask = mask.scatter_(-1, sorted_indices, sorted_indices_to_remove)
    return logits.masked_fill(mask, torch.finfo(logits.dtype).min)


def top_k_logits(logits, top_k):
    top_k = min(top_k, logits.size(-1))
    indices_to_remove = logits < torch.topk(logits, top_k)[0][..., -1, None]
    return logits.masked_fill(indices_to_remove, torch.finfo(logits.dtype).min)


def dream_sample_tokens(logits, temperature=0.0, top_p=None, margin_confidence=False,
                        neg_entropy=False, generator=None, top_k=None):
    if temperature > 0:
        logits = logits / temperature
    if top_p is not None and top_p < 1:
        logits = top_p_logits(logits, top_p)
    if top_k is not None:
        logits = top_k_logits(logits, top_k)
    probs = torch.softmax(logits, dim=-1)
    if temperature > 0:
        x0 = torch.multinomial(probs, 1, generator=generator)[:, 0]  # Categorical(probs).sample()
        confidence = torch.gather(probs, -1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        confidence, x0 = probs.max(dim=-1)
    if margin_confidence:
        sorted_probs, _ = torch.sort(probs, dim=-1, descending=True)
        confidence = sorted_probs[:, 0] - sorted_probs[:, 1]
    if neg_entropy:
        epsilon = 1e-10
        log_probs = torch.log(probs + epsilon)
        confidence = torch.sum(probs * log_probs, dim=-1)
    return confidence, x0


@torch.no_grad()
def dream_sample(model, input_ids, max_length, steps, alg, alg_temp=None, temperature=0.0,
                 top_p=None, mask_token_id=MASK, eps=1e-3, generator=None, top_k=None):
    """Dream's _sample (no attention mask, no hooks); returns (x, model calls)."""
    calls = 0
    x = F.pad(input_ids, (0, max_length - input_ids.shape[1]), value=mask_token_id)
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_token_id
        logits = model(x)
        calls += 1
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        mask_logits = logits[mask_index]
        t = timesteps[i]
        s = timesteps[i + 1]
        confidence, x0 = dream_sample_tokens(
            mask_logits, temperature, top_p=top_p, margin_confidence=alg == "topk_margin",
            neg_entropy=alg == "entropy", generator=generator, top_k=top_k)
        num_mask_token = mask_index.sum() / mask_index.shape[0]
        number_transfer_tokens = (
            int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token))
        full_confidence = torch.full_like(x, -torch.inf, dtype=logits.dtype)
        full_confidence[mask_index] = confidence
        if number_transfer_tokens > 0:
            if alg_temp is None or alg_temp == 0:
                _, transfer_index = torch.topk(full_confidence, number_transfer_tokens)
            else:
                full_confidence = full_confidence / alg_temp
                full_confidence = F.softmax(full_confidence, dim=-1)
                transfer_index = torch.multinomial(
                    full_confidence, num_samples=number_transfer_tokens, generator=generator)
            x_ = torch.zeros_like(x, dtype=torch.long) + mask_token_id
            x_[mask_index] = x0.clone()
            row_indices = torch.arange(x.size(0)).unsqueeze(1).expand_as(transfer_index)
            x[row_indices, transfer_index] = x_[row_indices, transfer_index]
    return x, calls


# ------------------------------------------------------------------ mdlm's side

def prompts(batch: int, n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, V, (batch, n), generator=torch.Generator().manual_seed(seed))


def mdlm_sample(model, prompt, new_tokens, steps, *, shift=False, temperature=0.0, seed=0,
                **options):
    """mdlm's confidence sampler after `prompt` (B, P): (tokens, NFE)."""
    B, P = prompt.shape
    template = torch.full((B, P + new_tokens), MASK, dtype=torch.long)
    template[:, :P] = prompt
    how = SamplingSettings("confidence", steps, temperature=temperature, options=options)
    tokens, stats = engine.sample(
        AsDenoiser(model, shift), how, num_samples=B, length=P + new_tokens, mask_id=MASK,
        prompt=template, generator=torch.Generator().manual_seed(seed), return_stats=True)
    return tokens, stats.nfe


LLADA_CASES = [(24, 8, 6), (24, 8, 12), (16, 16, 8), (16, 16, 16), (12, 4, 9)]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("gen_length, block_length, steps", LLADA_CASES)
def test_llada_generate_token_for_token_at_temperature_0(batch, gen_length, block_length, steps,
                                                          monkeypatch):
    model, prompt = Mixer(5 + gen_length), prompts(batch, 5)
    expected, calls = llada_generate(model, prompt, steps, gen_length, block_length)
    single = block_length == gen_length
    options = {"k_schedule": "llada", **({} if single else {"block_length": block_length})}
    tokens, nfe = mdlm_sample(model, prompt, gen_length, steps, **options)
    assert torch.equal(tokens, expected)
    assert nfe == calls  # every step of these cases reveals at least one token
    # the model tells a wrong order (the least confident first), and the wrong blocks, apart
    with monkeypatch.context() as m:
        m.setitem(ORDERS, "maskgit_plus", lambda w, tokens, uniform: -drawn_probs(w, tokens))
        broken, _ = mdlm_sample(model, prompt, gen_length, steps, **options)
    assert not torch.equal(broken, expected)
    if not single:
        broken, _ = mdlm_sample(model, prompt, gen_length, steps, k_schedule="llada")
        assert not torch.equal(broken, expected)


DREAM_CASES = [(24, 12), (16, 16), (20, 5)]


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("order", ["maskgit_plus", "topk_margin", "entropy"])
@pytest.mark.parametrize("new_tokens, steps", DREAM_CASES)
def test_dream_diffusion_generate_token_for_token_at_temperature_0(batch, order, new_tokens,
                                                                     steps, monkeypatch):
    model, prompt = Mixer(6 + new_tokens, seed=2), prompts(batch, 6)
    expected, calls = dream_sample(model, prompt, 6 + new_tokens, steps, order)
    tokens, nfe = mdlm_sample(model, prompt, new_tokens, steps, shift=True, k_schedule="dream",
                              order=order)
    assert torch.equal(tokens, expected)
    revealing = int((reveal_counts([new_tokens], steps, "dream") > 0).sum())
    assert nfe == revealing and (nfe == calls or new_tokens == steps)  # Dream calls at every step
    with monkeypatch.context() as m:  # the least confident first: other tokens
        wrong = ORDERS[order]
        m.setitem(ORDERS, order, lambda w, tokens, uniform: -wrong(w, tokens, uniform))
        broken, _ = mdlm_sample(model, prompt, new_tokens, steps, shift=True,
                                k_schedule="dream", order=order)
    assert not torch.equal(broken, expected)


def test_dream_counts_are_its_grid_and_llada_its_equal_shares():
    for n, steps in [(24, 12), (16, 16), (20, 5), (7, 3), (100, 7)]:
        mask = torch.ones(1, n, dtype=torch.bool)
        expected, left = [], n
        t = torch.linspace(1, 1e-3, steps + 1)
        for i in range(steps):
            k = int((mask.sum() / 1) * (1 - t[i + 1] / t[i])) if i < steps - 1 else left
            expected.append(k)
            left -= k
            mask[0, :k] = False
            mask = mask[:, k:]
        assert reveal_counts([n], steps, "dream")[0].tolist() == expected
        llada = get_num_transfer_tokens(torch.ones(1, n, dtype=torch.bool), steps)
        assert reveal_counts([n], steps, "llada").tolist() == llada.tolist()


def test_blocks_that_do_not_divide_the_steps_are_refused():
    model, prompt = Mixer(29), prompts(1, 5)
    with pytest.raises(engine.EngineError, match=r"steps \(10\) must be a multiple of the "
                       r"number of blocks \(3: 24 tokens after the prompt in blocks of 8\)"):
        mdlm_sample(model, prompt, 24, 10, k_schedule="llada", block_length=8)


# ------------------------------------------------------------------ temperature > 0: the same law

class FewTokens(Mixer):
    """The Mixer restricted to its first 3 tokens: few enough outcomes to count."""

    def forward(self, x):
        logits = super().forward(x) / 3  # flatter: more outcomes
        logits[..., 3:] = float("-inf")
        return logits


def outcome_counts(rows: torch.Tensor, start: int) -> dict[tuple, int]:
    keys, counts = rows[:, start:].unique(dim=0, return_counts=True)
    return {tuple(k.tolist()): int(c) for k, c in zip(keys, counts, strict=True)}


def same_law(a: dict, b: dict) -> float:
    """The two-sample chi-square p-value of two outcome counts."""
    keys = sorted(set(a) | set(b))
    table = torch.tensor([[a.get(k, 0) for k in keys], [b.get(k, 0) for k in keys]],
                         dtype=torch.float64)
    expected = table.sum(1, keepdim=True) * table.sum(0, keepdim=True) / table.sum()
    stat = ((table - expected) ** 2 / expected).sum()
    df = len(keys) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2))


N = 3000


@pytest.mark.parametrize("case", ["llada", "dream-maskgit_plus", "dream-entropy"])
def test_at_temperature_above_0_the_law_is_the_published_loops(case):
    model, P = FewTokens(9, seed=4), 5
    prompt = prompts(1, P).expand(N, -1)
    g = torch.Generator().manual_seed(0)
    if case == "llada":  # 2 blocks of 2, LLaDA's untempered confidence at temperature 0.8
        expected, _ = llada_generate(model, prompt, 4, 4, 2, temperature=0.8, generator=g)
        tokens, _ = mdlm_sample(model, prompt, 4, 4, temperature=0.8, k_schedule="llada",
                                block_length=2)
    else:  # Dream with alg_temp 0.5
        order = case.split("-")[1]
        temperature = 0.8 if order == "maskgit_plus" else 1.0
        expected, _ = dream_sample(model, prompt, P + 4, 3, order, alg_temp=0.5,
                                   temperature=temperature, generator=g)
        tokens, _ = mdlm_sample(model, prompt, 4, 3, shift=True, temperature=temperature,
                                k_schedule="dream", order=order, order_temperature=0.5)
    theirs, ours = outcome_counts(expected, P), outcome_counts(tokens, P)
    assert len(theirs) > 5  # a law worth comparing
    assert same_law(theirs, ours) > 1e-3, (theirs, ours)


# ------------------------------------------------------------------ from the command line

def save_dit(folder, state: dict | None = None):
    """A random 2-layer DiT without time conditioning (mdlm, char tokenizer, L = 32), its
    weights perturbed so that what it reads changes what it predicts."""
    from mdlm_cli.build import resolve_config
    from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.models import build_model

    cfg = resolve_config("test", ["diffusion.objective=mdlm"])
    tok = load_tokenizer("char")
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.vocab_size, causal=False)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    save_checkpoint(folder, 1,
        CheckpointContents(model=model, ema_model=None, optimizer=None, cfg=cfg,
                           state={"step": 1, **(state or {})}, tokenizer=tok,
                           data_meta={"length": 32, "packing": "chunk"}))
    return folder


@pytest.fixture(scope="module")
def dit(tmp_path_factory):
    return save_dit(tmp_path_factory.mktemp("dit") / "run")


def model_of(folder):
    """The checkpoint's model as LLaDA's loop calls it: logits (B, L, V), the mask excluded."""
    from mdlm_cli.checkpoints.load import load_checkpoint

    loaded = load_checkpoint(folder)
    den = loaded.denoiser(None)
    assert den.time_agnostic

    def model(x):
        with torch.no_grad():
            logits = den(x, torch.zeros(len(x))).clone()
        logits[..., loaded.mask_id] = float("-inf")
        return logits

    return model, loaded.mask_id


def cli_sample(folder, tmp_path, ids: list[int], *flags: str) -> dict:
    from typer.testing import CliRunner

    from mdlm_cli.cli import app

    out = tmp_path / "s.jsonl"
    args = ["sample", "-c", str(folder), "--prompt-ids", ",".join(map(str, ids)), "-n", "1",
            "--sampler", "confidence", "--temperature", "0", "--quiet", "--out", str(out), *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text().splitlines()[0])


@pytest.mark.parametrize("block_length", [4, 16])
def test_mdlm_sample_prompt_ids_gives_llada_tokens(dit, tmp_path, block_length):
    model, mask_id = model_of(dit)
    ids = [5, 17, 3, 9]
    expected, calls = llada_generate(model, torch.tensor([ids]), 8, 16, block_length,
                                     mask_id=mask_id)
    record = cli_sample(dit, tmp_path, ids, "--max-new-tokens", "16", "--steps", "8",
                        "--k-schedule", "llada", "--block-length", str(block_length))
    assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls
    assert record["prompt_ids"] == ids and record["tokens"][:4] == ids  # no BOS added


def test_mdlm_sample_prompt_ids_gives_dream_tokens(dit, tmp_path):
    """Through the CLI with topk_margin: this random DiT gives its masked positions nearly the
    same logits, and near-equal entropies (ties to float32's last bits, which its output-mask
    path and its full path round apart) may order either way; the Mixer tests cover entropy."""
    model, mask_id = model_of(dit)
    ids = [7, 2, 11]
    unshifted = lambda x: torch.cat([model(x)[:, 1:], model(x)[:, -1:]], 1)  # noqa: E731
    expected, calls = dream_sample(unshifted, torch.tensor([ids]), 3 + 12, 6, "topk_margin",
                                   mask_token_id=mask_id)
    record = cli_sample(dit, tmp_path, ids, "--max-new-tokens", "12", "--steps", "6",
                        "--k-schedule", "dream", "--order", "topk_margin")
    assert record["tokens"] == expected[0].tolist() and record["nfe"] == calls


@pytest.mark.parametrize("flags, message", [
    (["--prompt-ids", "5,x"], "--prompt-ids expects comma-separated token ids"),
    (["--prompt-ids", "5,-1"], "--prompt-ids expects token ids of at least 0"),
    (["--prompt-ids", "5,99999"], "--prompt-ids holds 99999, not a token"),
    (["--prompt-ids", "5", "--prompt", "a"], "give --prompt or --prompt-ids, not both"),
    (["--prompt-ids", "5", "--steps", "10", "--sampler", "confidence", "--k-schedule", "llada",
      "--block-length", "8", "--max-new-tokens", "24"], "steps (10) must be a multiple"),
    # a rule across settings, checked with them (SamplingSettings.validate), before any call
    (["--prompt-ids", "5", "--sampler", "confidence", "--cache", "dual"],
     "--cache dual needs --block-length"),
])
def test_prompt_ids_mistakes_are_one_line(dit, flags, message):
    from typer.testing import CliRunner

    from mdlm_cli.cli import app

    result = CliRunner().invoke(app, ["sample", "-c", str(dit), "-n", "1", *flags])
    assert result.exit_code == 1 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


# ------------------------------------------------------------------ a model family's own defaults

@pytest.fixture(scope="module")
def llada_like(tmp_path_factory):
    """A DiT checkpoint whose state names LLaDA's schedule, as the LLaDA loader's does."""
    return save_dit(tmp_path_factory.mktemp("llada") / "run",
                    {"sampling_defaults": {"k_schedule": "llada"}})


def test_a_models_sampling_defaults_apply_unless_given(llada_like, tmp_path):
    model, mask_id = model_of(llada_like)
    ids = [5, 17, 3, 9]
    expected, _ = llada_generate(model, torch.tensor([ids]), 6, 16, 16, mask_id=mask_id)
    record = cli_sample(llada_like, tmp_path, ids, "--max-new-tokens", "16", "--steps", "6")
    assert record["k_schedule"] == "llada" and record["tokens"] == expected[0].tolist()
    record = cli_sample(llada_like, tmp_path, ids, "--max-new-tokens", "16", "--steps", "5",
                        "--k-schedule", "linear")
    assert record["k_schedule"] == "linear"


def test_the_defaults_are_not_forced_on_samplers_that_do_not_read_them(llada_like):
    from typer.testing import CliRunner

    from mdlm_cli.cli import app

    result = CliRunner().invoke(app, ["sample", "-c", str(llada_like), "-n", "1", "--sampler",
                                      "first-hitting", "--quiet"])
    assert result.exit_code == 0 and "does not apply" not in result.output, result.output
    how = SamplingSettings("threshold").with_defaults({"k_schedule": "dream"})
    assert how.options == {}
    given = SamplingSettings("confidence", options={"k_schedule": "cosine"})
    assert given.with_defaults({"k_schedule": "dream"}).options == {"k_schedule": "cosine"}


def test_the_server_applies_the_defaults_to_a_request():
    from mdlm_cli.serve.fields import sampler_settings
    from mdlm_cli.serve.schema import Limits

    from .test_serve_batching import served_model

    served = served_model("mdlm")
    served.loaded.state["sampling_defaults"] = {"k_schedule": "dream"}
    body = {"prompt": "x", "sampler": "confidence", "steps": 4}
    assert sampler_settings(body, served, Limits()).options["k_schedule"] == "dream"
    body["k_schedule"] = "linear"
    assert sampler_settings(body, served, Limits()).options["k_schedule"] == "linear"


def test_bench_sampler_rows_take_the_defaults(llada_like, tmp_path):
    from typer.testing import CliRunner

    from mdlm_cli.cli import app

    out = tmp_path / "b.json"
    args = ["bench-sampler", "-c", str(llada_like), "--samplers", "confidence", "--steps", "4",
            "-n", "2", "--batch-size", "2", "--repeats", "1", "--length", "16", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert [r["options"] for r in rows] == [{"k_schedule": "llada"}]
    result = CliRunner().invoke(app, [*args, "--k-schedule", "cosine,dream"])
    rows = json.loads(out.read_text())["results"]
    assert [r["options"]["k_schedule"] for r in rows] == ["cosine", "dream"]
