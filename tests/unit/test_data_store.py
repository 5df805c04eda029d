import json

import numpy as np
import pytest

from mdlm_cli.config import DataConfig
from mdlm_cli.data.detokenize import lm1b_detokenize
from mdlm_cli.data.sources import HubDataset, get_source
from mdlm_cli.data.store import PreparedData, prepare, prepared_folder
from mdlm_cli.errors import MdlmError

from ..unpack import unpack


def write_corpus(path, n_docs=30, seed=0):
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "masked", "diffusion", "model", "token"]
    docs = [" ".join(rng.choice(words, rng.integers(5, 40))) + "." for _ in range(n_docs)]
    path.write_text("\n\n".join(docs))
    return docs


def cfg_for(path, cache, **kw):
    return DataConfig(dataset=str(path), tokenizer=kw.pop("tokenizer", "gpt2"), length=kw.pop("length", 16),
                      packing=kw.pop("packing", "wrap"), cache_dir=str(cache))


def test_prepare_local_file_round_trips_to_text(tmp_path):
    docs = write_corpus(tmp_path / "c.txt")
    data = prepare(cfg_for(tmp_path / "c.txt", tmp_path / "cache"))
    tok = data.tokenizer()
    got = []
    for split in ("train", "valid", "test"):
        s = data.split(split)
        got += [tok.decode(d) for d in unpack(np.asarray(s.tokens), np.asarray(s.lengths), "wrap",
                                                       bos=tok.bos_id, eos=tok.eos_id)]
    assert sorted(got) == sorted(docs)
    meta = json.loads((data.folder / "meta.json").read_text())
    assert meta["tokenizer"]["mask_id"] == 50257 and meta["length"] == 16
    assert sum(v["docs"] for v in meta["splits"].values()) == len(docs)
    assert meta["unigram_valid_nats"] > 0


def test_rerun_is_a_no_op_and_key_covers_tokenizer(tmp_path):
    write_corpus(tmp_path / "c.txt")
    cfg = cfg_for(tmp_path / "c.txt", tmp_path / "cache")
    first = prepare(cfg)
    stamp = (first.folder / "train.tokens.bin").stat().st_mtime_ns
    assert prepare(cfg).folder == first.folder
    assert (first.folder / "train.tokens.bin").stat().st_mtime_ns == stamp
    char = prepared_folder(cfg_for(tmp_path / "c.txt", tmp_path / "cache", tokenizer="char"))[0]
    longer = prepared_folder(cfg_for(tmp_path / "c.txt", tmp_path / "cache", length=32))[0]
    assert len({first.folder, char, longer}) == 3
    (tmp_path / "c.txt").write_text("different content\n\nentirely")
    assert prepared_folder(cfg)[0] != first.folder  # content is part of the key


def test_interrupted_prepare_leaves_no_complete_looking_cache(tmp_path, monkeypatch):
    write_corpus(tmp_path / "c.txt")
    cfg = cfg_for(tmp_path / "c.txt", tmp_path / "cache")
    import mdlm_cli.data.store as store

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(store, "unigram_baseline", boom)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg)
    folder = prepared_folder(cfg)[0]
    assert not folder.exists()
    assert not list(folder.parent.glob("*.partial-*"))
    monkeypatch.undo()
    assert prepare(cfg).meta["splits"]["train"]["rows"] > 0


def test_pad_packing_gives_attention_masks(tmp_path):
    write_corpus(tmp_path / "c.txt")
    data = prepare(cfg_for(tmp_path / "c.txt", tmp_path / "cache", packing="pad", length=64))
    x0, am = data.split("train").batch(np.arange(4))
    assert am is not None and am.dtype.name == "bool" if hasattr(am.dtype, "name") else True
    lengths = np.asarray(data.split("train").lengths[:4])
    assert am.sum(1).tolist() == lengths.tolist()


def test_hub_dataset_loader_with_local_data(tmp_path):
    datasets = pytest.importorskip("datasets")
    calls = []

    def fake_load(hub_id, config, split, revision):
        calls.append((hub_id, config, split, revision))
        return datasets.Dataset.from_dict({"text": [f"it 's sentence {i} ." for i in range(40)]})

    src = HubDataset("fake", "a fake set", ("train", "valid"), hub_id="org/fake",
                     split_specs={"train": "train[:-10]", "valid": "train[-10:]"},
                     detokenize=lm1b_detokenize)
    batches, n = src.documents("valid", fake_load)
    docs = [d for b in batches for d in b]
    assert n == 40 and docs[0] == "it's sentence 0."
    assert calls == [("org/fake", None, "train[-10:]", None)]


def test_hub_failure_is_a_one_line_error():
    def no_network(*a, **k):
        raise ConnectionError("Couldn't reach the Hub\nmore lines")

    with pytest.raises(MdlmError, match="could not load data set 'Skylion007/openwebtext'.*--dataset PATH"):
        get_source("openwebtext").documents("valid", no_network)


def test_unknown_dataset_and_corrupted_cache(tmp_path):
    with pytest.raises(MdlmError, match="unknown data set"):
        get_source("no-such-set")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "meta.json").write_text("{not json")
    with pytest.raises(MdlmError, match="prepare-data again"):
        PreparedData(tmp_path / "broken")


def test_embedded_corpus_splits(tmp_path):
    src = get_source("bigtxt")
    docs = src.all_documents()
    assert len(docs) > 1000 and not any("Project Gutenberg" in d for d in docs)
    counts = {s: src.documents(s)[1] for s in ("train", "valid", "test")}
    assert counts["valid"] > 50 and counts["test"] > 50 and sum(counts.values()) == len(docs)
