"""MAUVE's text features from tiny random Hugging Face models built offline: a causal LM
(last-token hidden state) and a BERT encoder (mean over tokens)."""

import pytest
import torch

from mdlm_cli.errors import MdlmError
from mdlm_cli.eval.features import CausalFeatures, EncoderFeatures, load_featurizer, text_mauve
from mdlm_cli.eval.genppl import HFJudge

TEXTS = ["It was the best of times, it was the worst of times.", "Holmes", "",
         "The quick brown fox jumps over the lazy dog and then runs far away into the woods."]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    from mdlm_cli.data.tokenizers import load_tokenizer

    gpt2, bert = tmp_path_factory.mktemp("gpt2"), tmp_path_factory.mktemp("bert")
    tok = load_tokenizer("gpt2", tmp_path_factory.getbasetemp() / "mdlm-cache").hf
    tok.save_pretrained(gpt2)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=12, n_embd=16, n_layer=1, n_head=2,
                               bos_token_id=tok.eos_token_id,
                               eos_token_id=tok.eos_token_id)).save_pretrained(gpt2)
    tok.pad_token = tok.eos_token  # the encoder test reuses the BPE with a pad token
    tok.save_pretrained(bert)
    BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1,
                               num_attention_heads=2, intermediate_size=32,
                               max_position_embeddings=16, pad_token_id=tok.eos_token_id)
                    ).save_pretrained(bert)
    return gpt2, bert


@pytest.mark.slow
def test_causal_features_are_the_last_tokens_hidden_state_whatever_the_batch(folders):
    judge = HFJudge(str(folders[0]), device=torch.device("cpu"))
    feats = load_featurizer(None, device=torch.device("cpu"), judge=judge)
    assert isinstance(feats, CausalFeatures) and feats.pooling == "last token"
    batched = feats.features(TEXTS, batch_size=4)
    assert batched.shape == (4, 16) and batched.dtype == torch.float64
    one_by_one = torch.cat([feats.features([t]) for t in TEXTS])
    # right padding is never seen: a padded key would move the features by far more than the
    # float32 rounding that another batch shape's kernels give (seen: 2.4e-7 on an AMX CPU)
    torch.testing.assert_close(batched, one_by_one, rtol=1e-5, atol=1e-6)
    ids = [judge.start_id] + judge.encode([TEXTS[1]])[0]
    with torch.no_grad():
        out = judge.model(torch.tensor([ids]), output_hidden_states=True).hidden_states[-1][0, -1]
    torch.testing.assert_close(batched[1], out.double())
    # a text longer than the context: cut to it (start token included)
    assert feats.features([" word" * 40]).shape == (1, 16)


@pytest.mark.slow
def test_masked_lm_features_are_mean_pooled_and_mauve_runs_on_them(folders):
    feats = load_featurizer(str(folders[1]), device=torch.device("cpu"))
    assert isinstance(feats, EncoderFeatures) and feats.pooling == "mean"
    x = feats.features(TEXTS, batch_size=3)
    torch.testing.assert_close(x, torch.cat([feats.features([t]) for t in TEXTS]))
    causal = load_featurizer(str(folders[0]), device=torch.device("cpu"))
    assert isinstance(causal, CausalFeatures)
    result = text_mauve(causal, TEXTS * 3, TEXTS * 3, seeds=(0,))
    assert result.mauve == pytest.approx(1.0)


def test_a_featurizer_is_needed():
    with pytest.raises(MdlmError, match="featurizer"):
        load_featurizer(None, device=torch.device("cpu"))
