import numpy as np
import pytest

from mdlm_cli.data.packing import chunk_rows, pad_rows, wrap_rows

from ..unpack import unpack

BOS, EOS, PAD = 100, 101, 102


def docs(seed=0, n=23):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(0, 50, rng.integers(1, 40))) for _ in range(n)]


def collect(it):
    rows, lengths = zip(*it, strict=True)
    return np.concatenate(rows), np.concatenate(lengths)


def batched(d, size=5):
    return (d[i:i + size] for i in range(0, len(d), size))


def test_wrap_round_trip_and_layout():
    d = docs()
    rows, lengths = collect(wrap_rows(batched(d), 16, bos=BOS, eos=EOS, pad=PAD))
    assert rows.shape[1] == 16
    assert (rows[:, 0] == BOS).all()
    assert all(rows[i, n - 1] == EOS for i, n in enumerate(lengths))
    assert (lengths[:-1] == 16).all() and lengths[-1] <= 16
    assert unpack(rows, lengths, "wrap", bos=BOS, eos=EOS) == d
    # no silent loss: every document token is somewhere
    assert (lengths - 2).sum() == sum(len(x) + 1 for x in d)


def test_chunk_round_trip():
    d = docs(1)
    rows, lengths = collect(chunk_rows(batched(d), 10, pad=PAD, separator=99))
    assert unpack(rows, lengths, "chunk", bos=BOS, eos=EOS, separator=99) == d
    assert lengths.sum() == sum(len(x) + 1 for x in d)


@pytest.mark.parametrize("length", [4, 12, 64])
def test_pad_round_trip_with_truncation(length):
    d = docs(2)
    rows, lengths = collect(pad_rows(batched(d), length, bos=BOS, eos=EOS, pad=PAD))
    assert len(rows) == len(d)
    assert unpack(rows, lengths, "pad", bos=BOS, eos=EOS) == [x[: length - 2] for x in d]
    for r, n in zip(rows, lengths, strict=True):
        assert (r[n:] == PAD).all()


@pytest.mark.parametrize("packing", ["chunk", "chunk-eos"])
def test_chunk_eos_joins_character_documents_with_eos_and_adds_nothing_per_row(packing):
    """chunk-eos (demo-bd3lm): EOS only where a document ends, at any position of a row, and
    no BOS/EOS added per row, so a model learns where documents end, not where rows do;
    text8's chunk joins character documents with a space."""
    from mdlm_cli.config import DataConfig
    from mdlm_cli.data.packed_split import _pack
    from mdlm_cli.data.tokenizers import load_tokenizer

    tok = load_tokenizer("char")
    texts = ["ab cd", "efg", "h ij kl", "mno"]
    tokenized = [[tok.encode(t) for t in texts]]
    rows, lengths = collect(_pack(tokenized, tok, DataConfig(length=4, packing=packing)))
    sep = [tok.eos_id] if packing == "chunk-eos" else tok.encode(" ")
    stream = [i for t in texts for i in tok.encode(t) + sep]
    assert rows.reshape(-1)[: lengths.sum()].tolist() == stream
    assert (rows == tok.bos_id).sum() == 0
    assert (rows == tok.eos_id).sum() == (len(texts) if packing == "chunk-eos" else 0)
