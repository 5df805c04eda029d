"""DNA data and objectives: the tokeniser's ids and complement, HG38 windowing on a generated
3-chromosome FASTA + BED (N kept out of masking and loss), RC augmentation, the MLM recipe,
and a tiny Genomic Benchmarks folder through `mdlm classify`."""

import dataclasses
import json
import random

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from mdlm_cli.cli import app
from mdlm_cli.config import DataConfig
from mdlm_cli.data.dna import merged_pieces, rc_augment, read_genomic_task
from mdlm_cli.data.sources import HG38
from mdlm_cli.data.store import prepare
from mdlm_cli.data.tokenizers import load_tokenizer
from mdlm_cli.errors import MdlmError
from mdlm_cli.objectives.mlm import bert_corruption

TOK = load_tokenizer("dna")


def test_dna_tokenizer_ids_complement_and_files(tmp_path):
    assert TOK.encode("ACGTN") == [7, 8, 9, 10, 11] and TOK.encode("acgtn") == [7, 8, 9, 10, 11]
    assert TOK.encode("R") == [6]  # other letters: [UNK]
    assert (TOK.mask_id, TOK.bos_id, TOK.eos_id, TOK.pad_id, TOK.vocab_size) == (3, 2, 1, 4, 16)
    assert TOK.complement[7:12] == [10, 9, 8, 7, 11] and TOK.complement[:7] == list(range(7))
    assert all(TOK.complement[TOK.complement[i]] == i for i in range(16))  # an involution
    assert TOK.decode(TOK.encode("GATTACA")) == "GATTACA"
    TOK.save(tmp_path / "tok")
    again = load_tokenizer(str(tmp_path / "tok"))
    assert again.fingerprint == TOK.fingerprint and again.complement == TOK.complement
    assert TOK.fingerprint != load_tokenizer("char").fingerprint


def test_merged_pieces_union_clamp_and_split():
    # two overlapping intervals and one past the chromosome's end, extended to 100
    assert merged_pieces([(0, 5), (50, 60), (950, 990)], 1000, extend=100) == [(0, 100), (100, 150), (900, 1000)]
    assert merged_pieces([(10, 20)], 60, extend=100) == [(0, 60)]  # a chromosome shorter than the extension


def write_genome(folder):
    rng = random.Random(0)
    chroms = {"chr1": 1500, "chr2": 700, "chrX": 300}
    seqs = {c: "".join(rng.choice("ACGT") for _ in range(n)) for c, n in chroms.items()}
    seqs["chr1"] = seqs["chr1"][:100] + "N" * 30 + seqs["chr1"][130:]
    folder.mkdir()
    lines = [f">{c} description\n" + "\n".join(s[i:i + 60] for i in range(0, len(s), 60)) for c, s in seqs.items()]
    (folder / "hg38.ml.fa").write_text("\n".join(lines) + "\n")
    (folder / "sequences_human.bed").write_text("chr1\t0\t10\ttrain\nchr1\t200\t210\ttrain\nchr1\t1000\t1010\tvalid\n"
                                                "chr2\t650\t660\ttrain\nchrX\t0\t5\ttest\n")
    return seqs


def test_hg38_windows_from_fasta_and_bed(tmp_path, monkeypatch):
    seqs = write_genome(tmp_path / "hg38")
    source = HG38(spec=f"hg38:{tmp_path / 'hg38'}", extend=256)
    import mdlm_cli.data.store as store

    monkeypatch.setattr(store, "get_source", lambda name: source)
    data = prepare(DataConfig(dataset="hg38", tokenizer="dna", length=64, packing="window",
                              cache_dir=str(tmp_path / "cache")))
    assert data.meta["pad_anywhere"]
    train = data.split("train")
    # train: chr1 [0, 456) (two overlapping extended intervals merged, pieces of 256), chr2 [444, 700)
    expected = [seqs["chr1"][0:256], seqs["chr1"][256:456], seqs["chr2"][444:700]]
    rows = [TOK.decode([t for t in r[:n] if t != TOK.pad_id]) for r, n in zip(train.tokens, train.lengths, strict=True)]
    windows = [s[i:i + 64].replace("N", "") for s in expected for i in range(0, len(s), 64)]
    assert rows == windows
    assert list(train.lengths) == [64] * 4 + [64, 64, 64, 8] + [64] * 4
    x0, mask = train.batch(np.arange(len(train)))
    assert mask is not None and int(mask.sum()) == train.num_tokens == 256 + 200 + 256 - 30
    assert not bool(mask[x0 == TOK.pad_id].any())  # N (stored as PAD) is excluded wherever it stands
    assert data.split("valid").num_tokens == 256 and data.split("test").num_tokens == 256
    with pytest.raises(MdlmError, match="HG38 data not found"):
        _ = HG38(spec=f"hg38:{tmp_path / 'missing'}").fingerprint


def test_rc_augment_flips_about_half_the_rows_with_their_masks():
    x0 = torch.randint(7, 11, (400, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(x0, dtype=torch.bool)
    mask[:, -3:] = False
    out, out_mask = rc_augment(x0, mask, TOK.complement, torch.Generator().manual_seed(1))
    comp = torch.tensor(TOK.complement)
    flipped = (out != x0).any(1)
    assert 150 < int(flipped.sum()) < 250
    assert torch.equal(out[flipped], comp[x0[flipped].flip(-1)]) and torch.equal(out[~flipped], x0[~flipped])
    assert torch.equal(out_mask[flipped], mask[flipped].flip(-1))


def test_mlm_corruption_follows_the_bert_recipe_and_skips_padding():
    x0 = torch.randint(7, 11, (200, 500), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(x0, dtype=torch.bool)
    mask[:, :50] = False
    z, selected = bert_corruption(x0, mask_id=3, n_tokens=12, generator=torch.Generator().manual_seed(1),
                                  attention_mask=mask)
    assert not selected[:, :50].any() and torch.equal(z[:, :50], x0[:, :50])
    assert torch.equal(z[~selected], x0[~selected])
    n = int(selected.sum())
    assert abs(n / (200 * 450) - 0.15) < 0.005
    to_mask = (z[selected] == 3).float().mean()
    kept = (z[selected] == x0[selected]).float().mean()  # unchanged: 10%, plus random draws of the same token
    assert abs(float(to_mask) - 0.8 - 0.1 / 12) < 0.01 and abs(float(kept) - 0.1 - 0.1 / 12) < 0.01
    assert int(z.max()) < 12


def write_task(folder, n_train=32, n_test=16, length=30):
    rng = random.Random(0)
    for split, n in (("train", n_train), ("test", n_test)):
        for cls, alphabet in (("gc_rich", "GGGCCCAT"), ("at_rich", "AAATTTGC")):
            (folder / split / cls).mkdir(parents=True)
            for i in range(n // 2):
                (folder / split / cls / f"{i}.txt").write_text("".join(rng.choice(alphabet)
                                                                       for _ in range(rng.randint(20, length))))


def test_classify_fine_tunes_a_tiny_checkpoint_on_a_two_class_folder(tmp_path):
    from mdlm_cli.build import resolve_config
    from mdlm_cli.checkpoints.save import CheckpointContents, save_checkpoint
    from mdlm_cli.models import build_model

    write_task(tmp_path / "toy_task")
    task = read_genomic_task(tmp_path / "toy_task")
    assert task.classes == ["at_rich", "gc_rich"] and len(task.train) == 32 and task.max_length <= 30
    cfg = resolve_config("dna-tiny", ["model.rcps=true", "model.hidden_size=8", "model.n_blocks=1", "data.length=64"])
    torch.manual_seed(0)
    model = build_model(cfg.model, TOK.vocab_size)
    data_meta = {"length": 64, "packing": "window", "tokenizer": TOK.describe(), "source": {"name": "dna-synthetic"}}
    save_checkpoint(tmp_path / "run", 1,
        CheckpointContents(model=model, ema_model=None, optimizer=None, cfg=cfg, state={"step": 1},
                           tokenizer=TOK, data_meta=data_meta))
    out = tmp_path / "c.json"
    result = CliRunner().invoke(app, ["classify", "-c", str(tmp_path / "run"), "--data", str(tmp_path / "toy_task"),
                                      "--lrs", "2e-2", "--batch-sizes", "8", "--seeds", "1,2", "--epochs", "2",
                                      "--device", "cpu", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    best = report["best"]
    assert report["classes"] == ["at_rich", "gc_rich"] and len(best["test_accuracies"]) == 2
    assert best["test_accuracy_mean"] >= 0.9  # composition separates the classes: the head must learn it
    assert best["test_accuracy_max_minus_min"] == max(best["test_accuracies"]) - min(best["test_accuracies"])
    assert all(r["conjoin"] is False and r["rc_augment"] is False for r in report["sweep"][0]["runs"])  # PS
    folds = CliRunner().invoke(app, ["classify", "-c", str(tmp_path / "run"), "--data", str(tmp_path / "toy_task"),
                                     "--lrs", "2e-2", "--batch-sizes", "8", "--folds", "5", "--epochs", "2",
                                     "--device", "cpu", "--json", str(out)])
    assert folds.exit_code == 0, folds.output
    best = json.loads(out.read_text())["best"]
    assert best["over"] == "5 folds" and len(best["test_accuracies"]) == 5 and "over 5 folds" in folds.output
    assert best["test_accuracy_std"] == pytest.approx(float(np.std(best["test_accuracies"], ddof=1)))
    runs = json.loads(out.read_text())["sweep"][0]["runs"]
    assert [r["fold"] for r in runs] == [0, 1, 2, 3, 4]
    bad = CliRunner().invoke(app, ["classify", "-c", str(tmp_path / "run"), "--data", str(tmp_path)])
    assert bad.exit_code == 1 and "not a Genomic Benchmarks task folder" in bad.output


def test_dna_objective_backbone_pairs_are_checked():
    from mdlm_cli.build import resolve_config

    with pytest.raises(MdlmError, match="causal; the mdlm objective needs bidirectional attention"):
        resolve_config("dna-tiny", ["model.backbone=mamba"])
    with pytest.raises(MdlmError, match="model.rcps does not apply to the dit backbone"):
        resolve_config("test", ["model.rcps=true"])
    with pytest.raises(MdlmError, match="model.dropout does not apply to the caduceus backbone"):
        resolve_config("dna-tiny", ["model.dropout=0.1"])
    assert dataclasses.asdict(resolve_config("dna-mamba-ar-1k").model)["backbone"] == "mamba"


def test_stratified_folds_partition_the_training_set_with_each_class_share():
    from mdlm_cli.tasks.genomic import ClassifyConfig, splits, stratified_folds

    y = torch.tensor([0] * 13 + [1] * 7 + [2] * 3)
    folds = stratified_folds(y, 5, torch.Generator().manual_seed(7))  # what the first seed cuts
    assert sorted(torch.cat(folds).tolist()) == list(range(len(y)))  # disjoint and covering
    assert max(map(len, folds)) - min(map(len, folds)) <= 1
    for c in range(3):
        counts = [int((y[f] == c).sum()) for f in folds]
        assert max(counts) - min(counts) <= 1, (c, counts)
    runs = splits(y, ClassifyConfig(seeds=[7], folds=5))
    assert [seed for seed, _ in runs] == [7, 8, 9, 10, 11]
    for (_, (val, train)), fold in zip(runs, folds, strict=True):  # validate on one, train on the rest
        assert torch.equal(val, fold) and sorted(torch.cat([val, train]).tolist()) == list(range(len(y)))
    assert splits(y, ClassifyConfig(seeds=[1, 2])) == [(1, None), (2, None)]
    with pytest.raises(MdlmError, match="--folds must be between 2"):
        stratified_folds(y, 1, torch.Generator())
