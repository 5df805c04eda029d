"""What `mdlm lm-eval` asks of a model, without lm-eval: the conditional likelihood of a
continuation, rolling windows, is_greedy and generation, on test-size models."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mdlm_cli import engine
from mdlm_cli.build import resolve_config
from mdlm_cli.checkpoints.folder import LoadedModel
from mdlm_cli.data.store import TokenSplit
from mdlm_cli.data.tokenizers import load_tokenizer, normalize_text8
from mdlm_cli.errors import MdlmError
from mdlm_cli.eval.lm_eval.generation import (
    GenerationSettings,
    cut_generation,
    generate_after,
    generation_plan,
)
from mdlm_cli.eval.lm_eval.scoring import (
    GREEDY_TOP_P,
    ConditionalScorer,
    build_row,
    encode_pair,
    rolling_windows,
    summarise,
)
from mdlm_cli.eval.lm_eval.tasks import last_word_passages, write_tasks
from mdlm_cli.models import build_model
from mdlm_cli.objectives import SplitSweep, get_objective

from ..analytic import AnalyticDenoiser

TOK = load_tokenizer("char")  # vocab 35, mask 4, BOS 2, EOS 3; a-z and space from 8
CPU = torch.device("cpu")
L = 32


def loaded_model(name: str, packing: str = "chunk") -> LoadedModel:
    """A random test-size model whose positions interact (the zero-initialised gates perturbed)."""
    cfg = resolve_config("test", [f"diffusion.objective={name}"])
    torch.manual_seed(0)
    model = build_model(cfg.model, TOK.vocab_size, causal=get_objective(cfg, TOK).causal)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return LoadedModel(Path("in-memory"), model.eval(), cfg, TOK, {"length": L, "packing": packing}, {})


def ids(text: str) -> list[int]:
    return TOK.encode(text)


# ------------------------------------------------------------------ requests into rows


def test_encode_pair_moves_the_context_space_to_the_continuation():
    assert encode_pair(TOK, "it was", " the") == (ids("it was"), ids(" the"))
    assert encode_pair(TOK, "it was ", "the") == (ids("it was"), ids(" the"))
    assert encode_pair(TOK, "", "the end") == ([], ids("the end"))


def test_build_row_truncates_the_context_from_the_left_and_keeps_the_row_start():
    context, cont = list(range(10, 30)), [7, 8, 9]
    assert build_row([], context, cont, 32) == (context + cont, 0)
    assert build_row([2], context, cont, 10) == ([2] + context[-6:] + cont, 14)
    assert build_row([2], [], cont, 4) == ([2] + cont, 0)
    with pytest.raises(MdlmError, match="does not fit"):
        build_row([2], context, list(range(10)), 10)


def test_rolling_windows_follow_the_harness_convention():
    """lm-eval's LM.loglikelihood_rolling docstring: tokens 0..9, max length 4, one token of
    context; the last window has a full context (its prefix token is the row start here)."""
    assert rolling_windows(list(range(10)), 4) == [([], [0, 1, 2, 3]), ([3], [4, 5, 6, 7]), ([5, 6, 7], [8, 9])]
    assert rolling_windows([0, 1, 2], 4) == [([], [0, 1, 2])]
    assert rolling_windows([0, 1, 2, 3], 4) == [([], [0, 1, 2, 3])]
    assert rolling_windows([], 4) == []
    for n in (1, 5, 31, 32, 33, 100):
        tokens = list(range(100, 100 + n))
        windows = rolling_windows(tokens, 31)
        assert [t for _, pred in windows for t in pred] == tokens  # every token predicted once
        for i, (ctx, pred) in enumerate(windows):
            start = tokens.index(pred[0])
            assert ctx == tokens[start - len(ctx):start]  # the context is what comes just before
            assert len(ctx) + len(pred) == (len(pred) if i == 0 else 32)


def test_rolling_windows_with_longer_context():
    assert rolling_windows(list(range(9)), 4, context_len=2) == [([], [0, 1, 2, 3]), ([2, 3], [4, 5, 6]),
                                                                  ([4, 5, 6], [7, 8])]
    with pytest.raises(MdlmError):
        rolling_windows([1, 2], 4, context_len=5)


# ------------------------------------------------------------------ conditional likelihood


def eval_ppl_nats(loaded: LoadedModel, rows: list[list[int]]) -> list[float]:
    """Exact NLL of each row by `mdlm eval-ppl`'s code path (objective.evaluate over a split)."""
    out = []
    for row in rows:
        tokens = np.full((1, L), TOK.pad_id, dtype=np.int64)
        tokens[0, :len(row)] = row
        split = TokenSplit(tokens, np.array([len(row)], dtype=np.int32))
        (result,) = loaded.objective.evaluate(loaded.denoiser(), split, SplitSweep(4, CPU), seeds=[0])
        out.append(result.nats)
    return out


@pytest.mark.parametrize("packing", ["chunk", "wrap"])
def test_ar_loglikelihood_equals_the_exact_nll_of_eval_ppl(packing):
    """-log p(cont | ctx) = NLL(row start + ctx + cont) - NLL(row start + ctx), each by eval-ppl's
    path; a context longer than the model is cut from the left first."""
    loaded = loaded_model("ar", packing)
    start = [TOK.bos_id] if packing == "wrap" else []
    pairs = [(ids("it was the"), ids(" best")), ([], ids("call me")), (ids("x" * 40), ids(" of times")),
             (ids("a"), ids("b"))]
    scorer = ConditionalScorer(loaded, mc_samples=5, batch_size=3)
    scores = scorer.score(pairs)
    assert scorer.mc_samples == 1 and all(s.exact and s.standard_error == 0.0 and len(s.passes) == 1 for s in scores)
    for (ctx, cont), s in zip(pairs, scores, strict=True):
        row, dropped = build_row(start, ctx, cont, L)
        full, prefix = eval_ppl_nats(loaded, [row, row[:len(row) - len(cont)]])
        assert s.nll == pytest.approx(full - prefix, rel=1e-5, abs=1e-4)
        assert s.dropped == dropped and s.tokens == len(cont)
    assert scores[2].dropped == 40 - (L - len(start) - len(ids(" of times")))


def test_ar_rolling_equals_the_exact_nll_of_a_short_document_and_sums_windows():
    loaded = loaded_model("ar")
    scorer = ConditionalScorer(loaded, batch_size=2)
    short, long = ids("the cat sat on the mat"), ids("it was the best of times it was the worst of times " * 2)
    s_short, s_long = scorer.score_rolling([short, long])
    assert s_short.nll == pytest.approx(eval_ppl_nats(loaded, [short])[0], rel=1e-5)
    windows = rolling_windows(long, scorer.rolling_max_len)
    assert len(windows) > 2 and s_long.tokens == len(long)
    assert s_long.nll == pytest.approx(sum(s.nll for s in scorer.score(windows)), rel=1e-5)


def test_diffusion_loglikelihood_passes_and_standard_error():
    loaded = loaded_model("mdlm")
    pairs = [(ids("it was the"), ids(" best")), (ids("the"), ids(" end of the story"))]
    scorer = ConditionalScorer(loaded, mc_samples=6, batch_size=2, seed=3)
    a = scorer.score(pairs)
    assert all(len(s.passes) == 6 and s.standard_error > 0 and not s.exact for s in a)
    again = ConditionalScorer(loaded, mc_samples=6, batch_size=2, seed=3).score(pairs)
    assert [s.passes for s in again] == [s.passes for s in a]  # seeded
    other = ConditionalScorer(loaded, mc_samples=6, batch_size=2, seed=4).score(pairs)
    assert [s.passes for s in other] != [s.passes for s in a]
    summary = summarise(a)
    assert summary["tokens"] == 5 + 17 and summary["nats_per_token_se"] > 0
    assert summary["nats_per_token"] == pytest.approx(sum(s.nll for s in a) / 22)


class AnalyticCheckpoint:
    """What the scorer reads of a checkpoint, around the exact toy denoiser (vocab 4, so its
    mask id is the character tokeniser's, 4)."""

    def __init__(self):
        self.exact_denoiser = AnalyticDenoiser.random(length=4, vocab=4, seed=5)
        self.objective = get_objective(resolve_config("test"), TOK)
        self.tokenizer, self.length, self.data_meta = TOK, 4, {"packing": "chunk"}
        self.mask_id, self.sampling_defaults = TOK.mask_id, {}  # no family: the t estimator

    def denoiser(self, dtype=None):
        return self.exact_denoiser

    def row_start(self) -> list[int]:  # chunk-packed rows start anywhere: no BOS
        return []


def test_the_scorer_bound_of_an_exact_denoiser_is_unbiased_for_the_conditional_nll():
    fake = AnalyticCheckpoint()
    den = fake.exact_denoiser
    assert den.mask_id == TOK.mask_id
    x = den.configs[100]
    context, cont = x[:2].tolist(), x[2:].tolist()
    n = 1500
    scores = ConditionalScorer(fake, mc_samples=2, batch_size=500, seed=1).score([(context, cont)] * n)
    est = torch.tensor([s.nll for s in scores], dtype=torch.float64)
    marginal = den.probs[(den.configs[:, :2] == x[:2]).all(1)].sum()
    truth = float(-den.log_prob(x[None])[0] + marginal.log())
    assert abs(est.mean().item() - truth) < 4 * est.std().item() / n ** 0.5 + 1e-3
    assert truth < float(-den.log_prob(x[None])[0]) - 0.1  # the context matters: a real test of conditioning


# ------------------------------------------------------------------ is_greedy


class FixedDenoiser:
    """Logits favouring token PATTERN[l] at every position l; records what it was called with."""

    PATTERN = torch.tensor(ids("abcdefghijklmnop"))

    def __init__(self):
        self.calls = []

    def __call__(self, z, t, **kwargs):
        self.calls.append(z.clone())
        logits = torch.zeros(*z.shape, TOK.vocab_size)
        logits.scatter_(-1, self.PATTERN[:z.shape[1]].expand(z.shape[0], -1)[..., None], 5.0)
        logits[..., TOK.mask_id] = 50.0  # never an output: the argmax excludes the mask
        return logits


def test_diffusion_is_greedy_reads_the_argmax_at_the_fully_masked_continuation():
    objective = loaded_model("mdlm").objective
    den = FixedDenoiser()
    x0 = torch.tensor([ids("zzzzzzzzzzklmnop"), ids("zzzzzzzzzzklmnoq")])  # context unlike the pattern
    targets = torch.zeros_like(x0, dtype=torch.bool)
    targets[:, 10:] = True
    best = objective.greedy_tokens(den, x0, targets)
    assert ((best == x0) | ~targets).all(1).tolist() == [True, False]
    (z,) = den.calls
    assert (z[targets] == TOK.mask_id).all() and torch.equal(z[~targets], x0[~targets])


def test_diffusion_is_greedy_of_one_token_is_the_model_argmax():
    loaded = loaded_model("mdlm")
    context = ids("it was the best of")
    z = torch.tensor([context + [TOK.mask_id]])
    with torch.no_grad():
        logits = loaded.denoiser()(z, torch.ones(1))[0, -1]
    logits[TOK.mask_id] = -float("inf")
    best = int(logits.argmax())
    other = 8 + (best - 7) % 27
    scores = ConditionalScorer(loaded, mc_samples=2).score([(context, [best]), (context, [other])])
    assert [s.greedy for s in scores] == [True, False]


def test_ar_is_greedy_matches_greedy_decoding():
    loaded = loaded_model("ar")
    context = ids("it was the")
    prompt = torch.tensor(context + [TOK.mask_id] * 6)
    decoded = engine.sample(loaded.denoiser(), sampler="autoregressive-kv-cache", num_samples=1, length=len(prompt),
                            mask_id=TOK.mask_id, prompt=prompt, top_p=GREEDY_TOP_P,
                            generator=torch.Generator().manual_seed(0))[0, len(context):].tolist()
    changed = decoded[:3] + [8 + (decoded[3] - 7) % 27] + decoded[4:]
    scores = ConditionalScorer(loaded).score([(context, decoded), (context, changed), (context, decoded[:2])])
    assert [s.greedy for s in scores] == [True, False, True]


# ------------------------------------------------------------------ generation


def test_generation_plan_truncates_from_the_left_within_one_window():
    assert generation_plan(0, 10, 8, 32, causal=False, stride=16) == (10, 8)
    assert generation_plan(1, 40, 8, 32, causal=True, stride=16) == (23, 8)
    assert generation_plan(0, 40, 50, 32, causal=False, stride=16) == (16, 50)  # semi-AR
    assert generation_plan(0, 40, 50, 32, causal=True, stride=16) == (16, 16)  # left to right: half the room


@pytest.mark.parametrize(("name", "sampler", "max_gen"), [
    ("mdlm", "first-hitting", 6), ("mdlm", "first-hitting", 40), ("mdlm", "ancestral", 5),
    ("ar", "autoregressive-kv-cache", 6)])
def test_generate_after_the_context(name, sampler, max_gen):
    loaded = loaded_model(name)
    how = engine.SamplingSettings(sampler, steps=8 if sampler == "ancestral" else None)
    settings = GenerationSettings(how, stride=8)
    tokens = generate_after(loaded, ids("it was the"), max_gen=max_gen, settings=settings)
    assert len(tokens) == max_gen and TOK.mask_id not in tokens
    again = generate_after(loaded, ids("it was the"), max_gen=max_gen, settings=settings)
    assert tokens == again  # seeded


def test_cut_generation_at_eos_and_the_first_stop_sequence():
    tokens = ids("the end. more") + [TOK.eos_id] + ids("after")
    assert cut_generation(TOK, tokens, []) == "the end more"
    assert cut_generation(TOK, tokens, [" mo", "end"]) == "the "
    assert cut_generation(TOK, ids("abc"), ["", "x"]) == "abc"


# ------------------------------------------------------------------ local tasks


def test_last_word_passages_end_on_a_real_word():
    words = "a bb ccc dddd e ff ggggg h i jjjj k".split()
    assert list(last_word_passages(words, 2)) == ["a bb ccc dddd", "e ff ggggg", "h i jjjj"]
    assert list(last_word_passages(words, 20)) == []


def test_write_tasks_from_a_local_file(tmp_path):
    text = "\n\n".join(f"Document {i}: it was the best of times, it was the worst of times. " * 6 for i in range(40))
    (tmp_path / "books.txt").write_text(text)
    rows = write_tasks(tmp_path / "tasks", dataset=str(tmp_path / "books.txt"), split="test", char_level=True,
                       words=12, passages=5)
    assert rows == {"books_lastword": 5, "books_rolling": rows["books_rolling"]} and rows["books_rolling"] > 0
    def texts(name):
        return [json.loads(line)["text"] for line in (tmp_path / "tasks" / name).read_text().splitlines()]

    assert all(d == normalize_text8(d).strip() for d in texts("books_rolling.jsonl"))  # as the tokeniser reads it
    passages = texts("books_lastword.jsonl")
    assert all(p.split()[-1].isalpha() and len(p.split()[-1]) >= 4 for p in passages)
    yaml_text = (tmp_path / "tasks" / "books_lastword.yaml").read_text()
    assert "task: books_lastword" in yaml_text and "{{text.split(' ')[:-1]|join(' ')}}" in yaml_text


def test_gen_length_overrides_every_tasks_max_gen_toks():
    """LLaDA's and Dream's lm-eval runs fix gen_length whatever a task's max_gen_toks; the
    mdlm model's `gen_length` does so, each generation that many tokens; without it, the
    task's."""
    pytest.importorskip("lm_eval")
    from types import SimpleNamespace

    from mdlm_cli.errors import MdlmError
    from mdlm_cli.eval.lm_eval.adapter import MdlmLM, ModelArgs

    loaded = loaded_model("mdlm")
    fixed = MdlmLM(ModelArgs(gen_length=7, steps=4, sampler="ancestral"), loaded=loaded)
    task = MdlmLM(ModelArgs(steps=4, sampler="ancestral"), loaded=loaded)
    assert fixed._generation_options({"max_gen_toks": 3})[1] == 7
    assert task._generation_options({"max_gen_toks": 3})[1] == 3
    request = SimpleNamespace(args=("it was the", {"max_gen_toks": 3, "until": []}))
    out = fixed.generate_until([request], disable_tqdm=True)
    assert len(out[0]) == 7  # the character tokeniser: 7 tokens, 7 characters (no EOS here)
    with pytest.raises(MdlmError, match="gen_length must be at least 1"):
        MdlmLM(ModelArgs(gen_length=0), loaded=loaded)


class LeftReads:
    """At position i the likeliest token is 'y' (p ~ 0.9) once position i - 1 is clean, 'x'
    (p ~ 0.5) while it is masked: decoding one token a call, the most confident first, reads
    'yy' where one call with both masked reads 'yx'."""

    def __call__(self, z, t, output_mask=None, attention_mask=None):
        B, L = z.shape
        x, y = TOK.encode("x")[0], TOK.encode("y")[0]
        logits = torch.zeros(B, L, TOK.vocab_size)
        left_masked = torch.zeros(B, L, dtype=torch.bool)
        left_masked[:, 1:] = z[:, :-1] == TOK.mask_id
        logits[..., y] = torch.where(left_masked, 0.0, 6.0)
        logits[..., x] = torch.where(left_masked, 3.0, 0.0)
        return logits if output_mask is None else logits[output_mask]


def test_the_by_confidence_greedy_check_decodes_one_token_a_call():
    objective = loaded_model("mdlm").objective
    x0 = torch.tensor([ids("abyy")])
    targets = torch.tensor([[False, False, True, True]])
    one_call = objective.greedy_tokens(LeftReads(), x0, targets)
    by_confidence = objective.greedy_by_confidence(LeftReads(), x0, targets)
    assert TOK.decode(one_call[0].tolist()) == "abyx"
    assert TOK.decode(by_confidence[0].tolist()) == "abyy"


def test_a_task_may_take_its_own_number_of_passes():
    """LLaDA's runs score MMLU with one pass beside 128 elsewhere: `task_mc_samples`."""
    pytest.importorskip("lm_eval")
    from types import SimpleNamespace

    from mdlm_cli.errors import MdlmError
    from mdlm_cli.eval.lm_eval.adapter import MdlmLM, ModelArgs

    lm = MdlmLM(ModelArgs(mc_samples=6, task_mc_samples="one_pass=1"), loaded=loaded_model("mdlm"))
    requests = [SimpleNamespace(args=("it was the", " best"), task_name=name)
                for name in ("one_pass", "many", "one_pass")]
    lm.loglikelihood(requests, disable_tqdm=True)
    assert [len(s.passes) for _, s in lm.scores["one_pass"]] == [1, 1]
    assert [len(s.passes) for _, s in lm.scores["many"]] == [6]
    assert lm.mc_samples == 6  # the default back once the call is done
    with pytest.raises(MdlmError, match="task_mc_samples expects task=K"):
        MdlmLM(ModelArgs(task_mc_samples="mmlu:1"), loaded=loaded_model("mdlm"))


@pytest.mark.parametrize("max_gen", [6, 40])
def test_generate_after_lays_its_row_out_by_the_one_rule(max_gen, monkeypatch):
    """One window: the row start, the context and max_gen masks (lay_out); past it, the
    semi-AR row (lay_out_semi_ar): the engine gets the rule's row."""
    from mdlm_cli.generation.capabilities import capabilities_of
    from mdlm_cli.generation.layout import lay_out, lay_out_semi_ar

    loaded = loaded_model("mdlm")
    seen = {}
    real_sample, real_semi = engine.sample, engine.semi_ar
    monkeypatch.setattr(engine, "sample", lambda *a, **k: seen.setdefault("one", k) and
                        real_sample(*a, **k))
    monkeypatch.setattr(engine, "semi_ar", lambda *a, **k: seen.setdefault("semi", k) and
                        real_semi(*a, **k))
    context = ids("it was the")
    generate_after(loaded, context, max_gen=max_gen,
                   settings=GenerationSettings(engine.SamplingSettings("first-hitting"), stride=8))
    caps = capabilities_of(loaded)
    if max_gen + len(context) + len(caps.row_start) <= loaded.length:
        rule = lay_out(caps, context, answer=max_gen)
        assert seen["one"]["prompt"].tolist() == rule.template(loaded.mask_id).tolist()
    else:
        rule = lay_out_semi_ar(caps, context, stride=8, answer=max_gen)
        assert seen["semi"]["target_length"] == rule.length
        assert seen["semi"]["prompt"].tolist() == rule.prefix


def test_own_sampling_draws_with_the_settings_whatever_the_task_says():
    """Dream's eval.py samples at its own temperature and top_p whatever a task's generation
    kwargs: `own_sampling` (--own-sampling) does the same; without it a task's do_sample false
    makes the draw greedy."""
    pytest.importorskip("lm_eval")
    from mdlm_cli.engine.settings import SamplingSettings
    from mdlm_cli.eval.lm_eval.adapter import MdlmLM, ModelArgs

    loaded = loaded_model("mdlm")
    how = SamplingSettings(sampler="ancestral", steps=4, temperature=0.7, top_p=0.95)
    task = {"max_gen_toks": 3, "do_sample": False, "temperature": 0.0, "until": ["x"]}
    own = MdlmLM(ModelArgs(own_sampling=True), loaded=loaded, sampling=how)
    until, _, drawing = own._generation_options(dict(task))
    assert until == ["x"] and drawing["temperature"] == 0.7 and drawing["top_p"] == 0.95
    plain = MdlmLM(ModelArgs(), loaded=loaded, sampling=how)
    assert plain._generation_options(dict(task))[2]["temperature"] == 0.0
