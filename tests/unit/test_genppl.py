"""Generative perplexity with a tiny random Hugging Face GPT-2 judge built offline."""

import json
import math

import pytest
import torch

from mdlm_cli.errors import MdlmError
from mdlm_cli.eval.genppl import (
    HFJudge,
    MdlmARJudge,
    load_judge,
    read_samples,
    response_plan,
    score_samples,
    unigram_entropy,
)

CONTEXT = 12


@pytest.fixture(scope="module")
def judge_dir(tmp_path_factory):
    """A random 1-layer GPT-2 with the real GPT-2 tokenizer (importing transformers' models
    takes several seconds, hence the tests using it are marked slow)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from mdlm_cli.data.tokenizers import load_tokenizer

    folder = tmp_path_factory.mktemp("judge")
    tok = load_tokenizer("gpt2", tmp_path_factory.getbasetemp() / "mdlm-cache").hf  # offline GPT-2 BPE
    tok.save_pretrained(folder)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=CONTEXT, n_embd=16, n_layer=1,
                                       n_head=2, bos_token_id=tok.eos_token_id,
                                       eos_token_id=tok.eos_token_id))
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def judge(judge_dir):
    return HFJudge(str(judge_dir), device=torch.device("cpu"))


TEXTS = [
    "It was the best of times, it was the worst of times, it was the age of wisdom.",
    "Holmes",
    "",
    "a b c<|endoftext|>d e<|endoftext|>f",
    "The quick brown fox jumps over the lazy dog and then runs far away into the woods.",
]


def by_hand(judge, texts):
    """Chunks of CONTEXT tokens, each scored after the judge's start token, one at a time."""
    total, count = 0.0, 0
    for text in texts:
        ids = judge.tokenizer(text, add_special_tokens=False)["input_ids"]
        for start in range(0, len(ids), CONTEXT):
            chunk = torch.tensor(ids[start:start + CONTEXT])
            inputs = torch.cat([torch.tensor([judge.start_id]), chunk[:-1]])[None]
            with torch.no_grad():
                logp = judge.model(inputs).logits[0].double().log_softmax(-1)
            total -= logp[torch.arange(len(chunk)), chunk].sum().item()
            count += len(chunk)
    return total, count


@pytest.mark.slow
def test_gen_ppl_matches_a_hand_computation_and_scores_every_sample(judge):
    result = score_samples(judge, TEXTS, batch_size=2)  # chunks of different lengths share batches
    total, count = by_hand(judge, TEXTS)
    assert judge.context == CONTEXT and judge.start_id == judge.tokenizer.eos_token_id
    assert len(result.samples) == len(TEXTS) and result.empty == 1
    assert result.tokens == count
    assert result.chunks > len(TEXTS) - 1  # the long samples needed several chunks
    assert result.gen_ppl == pytest.approx(math.exp(total / count), rel=1e-5)
    assert result.nats_per_char == pytest.approx(total / sum(map(len, TEXTS)), rel=1e-5)
    one_batch = score_samples(judge, TEXTS, batch_size=64)
    assert one_batch.gen_ppl == pytest.approx(result.gen_ppl, rel=1e-6)


@pytest.mark.slow
def test_eos_policies(judge):
    text = ["a b c<|endoftext|>d e<|endoftext|>f"]
    ids = judge.tokenizer(text[0], add_special_tokens=False)["input_ids"]
    assert ids.count(judge.eos_id) == 2
    keep, first, skip = (score_samples(judge, text, eos_policy=p).tokens for p in ("keep", "first", "skip"))
    assert (keep, first, skip) == (len(ids), len(ids) - 1, len(ids) - 2)
    with pytest.raises(MdlmError, match="unknown EOS policy"):
        score_samples(judge, text, eos_policy="maybe")


def test_unigram_entropy_by_hand():
    assert unigram_entropy([5, 5, 7, 9]) == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    assert unigram_entropy([3] * 10) == 0.0
    assert unigram_entropy(list(range(16))) == pytest.approx(math.log(16))
    assert unigram_entropy([]) == 0.0


@pytest.mark.slow
def test_entropy_uses_the_sample_tokens_when_given(judge):
    r = score_samples(judge, ["Holmes", "Watson"], sample_tokens=[[1, 1], [1, 2]])
    assert r.entropy_of == "sample tokens"
    assert r.entropy == pytest.approx(math.log(2) / 2)


def test_read_samples(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"text": "ab", "tokens": [1, 2]}) + "\n\n" + json.dumps({"text": "c"}) + "\n")
    texts, tokens = read_samples(path)
    assert texts == ["ab", "c"] and tokens is None  # ids only when every record has them
    path.write_text("not json\n")
    with pytest.raises(MdlmError, match=":1 is not a JSON object"):
        read_samples(path)
    with pytest.raises(MdlmError, match="does not exist"):
        read_samples(tmp_path / "missing.jsonl")


@pytest.mark.slow
def test_judge_loading(tmp_path, judge_dir):
    with pytest.raises(MdlmError, match="judge file"):
        load_judge(str(tmp_path / "missing.gguf"), device=torch.device("cpu"))
    assert load_judge(str(judge_dir), device=torch.device("cpu"), context=8).context == 8


# ----------------------------------------------------------------------------- responses

def save_ar_judge(folder, length: int = 32):
    """A random 2-layer mdlm AR checkpoint with the char tokenizer (offline, no transformers);
    its weights are perturbed so that what it reads changes what it predicts."""
    from mdlm_cli.build import resolve_config
    from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.models import build_model

    cfg = resolve_config("test", ["diffusion.objective=ar", f"data.length={length}"])
    tok = load_tokenizer("char")
    torch.manual_seed(0)
    model = build_model(cfg.model, tok.vocab_size, causal=True)
    with torch.no_grad():  # the zero-initialised output layer and gates would predict uniformly
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    data_meta = {"length": length, "packing": "wrap"}
    save_checkpoint(folder, 1,
        CheckpointContents(model=model, ema_model=None, optimizer=None, cfg=cfg, state={"step": 1},
                           tokenizer=tok, data_meta=data_meta))
    return folder


@pytest.fixture(scope="module")
def ar_judge(tmp_path_factory):
    return load_judge(str(save_ar_judge(tmp_path_factory.mktemp("ar") / "judge")),
                      device=torch.device("cpu"))


def conditional_by_hand(judge, prompt: str, response: str, windows) -> float:
    """-sum log p of the response's tokens, window by window: (start, first, end) of the
    prompt + response ids, the judge reading start:end after its start token."""
    ids = judge.encode([prompt])[0] + judge.encode([response])[0]
    total = 0.0
    for start, first, end in windows:
        chunk = torch.tensor(ids[start:end])
        inputs = torch.cat([torch.tensor([judge.start_id]), chunk[:-1]])[None]
        logp = judge.logits(inputs, torch.ones_like(inputs, dtype=torch.bool))[0].double()
        logp = logp.log_softmax(-1)[torch.arange(len(chunk)), chunk]
        total -= logp[first - start:].sum().item()
    return total


PAIRS = [("he said nothing ", "and went away"), ("why ", "because"), ("a ", "")]


def test_conditional_scores_count_only_the_response_given_its_prompt(ar_judge):
    prompts, responses = [p for p, _ in PAIRS], [r for _, r in PAIRS]
    result = score_samples(ar_judge, responses, prompts=prompts, batch_size=2)
    assert result.conditional and result.to_dict()["conditional"]
    for (prompt, response), s in zip(PAIRS, result.samples, strict=True):
        n, p = len(response), len(prompt)  # characters: one token each
        assert (s.scored, s.judge_tokens, s.context_tokens) == (n, n, p)
        assert s.nll == pytest.approx(conditional_by_hand(ar_judge, prompt, response,
                                                          [(0, p, p + n)]), rel=1e-5)
    assert result.tokens == sum(len(r) for r in responses) and result.empty == 1
    other = score_samples(ar_judge, responses[:1], prompts=["she was silent "])
    assert other.samples[0].nll != pytest.approx(result.samples[0].nll, rel=1e-3)  # it reads it
    plain = score_samples(ar_judge, responses)
    empty = score_samples(ar_judge, responses, prompts=[""] * len(responses))
    assert [s.nll for s in empty.samples] == pytest.approx([s.nll for s in plain.samples])


def test_long_responses_are_scored_in_windows_after_their_prompt(ar_judge):
    # 6 prompt and 13 response tokens, context 8: pieces of 4 tokens, each read after the
    # 4 before it; every response token scored once, none of the prompt's
    assert response_plan(6, 19, 8) == [(2, 6, 10), (6, 10, 14), (10, 14, 18), (11, 18, 19)]
    assert response_plan(3, 7, 8) == [(0, 3, 7)]  # it fits: one window from the start
    assert response_plan(0, 0, 8) == []
    judge = MdlmARJudge(ar_judge.loaded, device=torch.device("cpu"), context=8)
    prompt, response = "abcdef", "ghijklmnopqrs"
    result = score_samples(judge, [response], prompts=[prompt], batch_size=3)
    assert result.chunks == 4 and result.tokens == 13
    by_hand = conditional_by_hand(judge, prompt, response, response_plan(6, 19, 8))
    assert result.samples[0].nll == pytest.approx(by_hand, rel=1e-5)
