"""Generative perplexity with a tiny random Hugging Face GPT-2 judge built offline."""

import json
import math

import pytest
import torch

from mdlm_cli.errors import MdlmError
from mdlm_cli.eval.genppl import HFJudge, load_judge, read_samples, score_samples, unigram_entropy

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
