"""C4 streamed up to the rows a run needs, and `mdlm glue`'s tasks, metrics and fine-tuning."""

import json

import numpy as np
import pytest
import torch

from mdlm_cli.config import DataConfig
from mdlm_cli.data.sources import get_source
from mdlm_cli.data.store import prepare, prepared_folder
from mdlm_cli.errors import MdlmError
from mdlm_cli.tasks.glue import (
    GlueRecipe,
    GlueRows,
    build_classifier,
    encode,
    fine_tune,
    load_encoder,
    predict,
    run_task,
)
from mdlm_cli.tasks.glue_data import get_task, load_rows, metrics, pearson

from ..hf_models import save_tiny_mlm


class FakeStream:
    """`load_dataset(..., streaming=True)`: an endless stream of documents that counts what is read."""

    def __init__(self):
        self.calls, self.read = [], {}

    def __call__(self, hub_id, config, split, revision=None, streaming=False):
        self.calls.append((hub_id, config, split, streaming))
        self.read[split] = 0

        def records():
            while True:
                self.read[split] += 1
                yield {"text": f"document {self.read[split]} of the {split} split. " * 3, "url": "x"}

        return records()


def test_c4_streams_and_stops_at_the_rows_needed(tmp_path, monkeypatch):
    monkeypatch.setattr(get_source("c4"), "batch_size", 10)  # documents per tokeniser call (1000 for real)
    stream = FakeStream()
    cfg = DataConfig(dataset="c4", tokenizer="gpt2", length=16, cache_dir=str(tmp_path), max_rows=50,
                     max_eval_rows=7)
    data = prepare(cfg, load_dataset=stream)
    assert {c[:3] for c in stream.calls} == {("allenai/c4", "en", "train"), ("allenai/c4", "en", "validation")}
    assert all(c[3] for c in stream.calls)  # streamed, never downloaded whole
    meta = data.meta["splits"]
    assert (meta["train"]["rows"], meta["valid"]["rows"]) == (50, 7)
    assert meta["train"]["row_limit"] == 50 and meta["train"]["stopped_at_limit"]
    assert stream.read["train"] <= 4 * 10  # a few batches of documents read, not the endless stream
    assert len(data.split("train")) == 50 and "test" not in data.splits
    other = prepared_folder(DataConfig(dataset="c4", tokenizer="gpt2", length=16, cache_dir=str(tmp_path),
                                       max_rows=60, max_eval_rows=7))[0]
    assert other != data.folder  # the limits are part of the cache key
    assert get_source("c4").fingerprint.endswith(":streamed")


def test_c4_without_network_is_one_line(tmp_path):
    def offline(*args, **kwargs):
        raise ConnectionError("no route to host\nmore")

    with pytest.raises(MdlmError, match=r"could not load data set .allenai/c4. .*: no route to host\. Use --dataset"):
        prepare(DataConfig(dataset="c4", tokenizer="gpt2", length=16, cache_dir=str(tmp_path)), load_dataset=offline)


def test_glue_metrics_are_the_papers():
    labels = np.array([1, 0, 1, 1, 0, 1])
    predictions = np.array([1, 0, 0, 1, 1, 1])
    mrpc = metrics(get_task("mrpc"), predictions, labels)
    assert mrpc["accuracy"] == pytest.approx(4 / 6) and mrpc["f1"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    cola = metrics(get_task("cola"), predictions, labels)
    tp, tn, fp, fn = 3, 1, 1, 1
    denominator = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
    assert cola["matthews"] == pytest.approx((tp * tn - fp * fn) / denominator)
    x, y = np.array([1.0, 2.0, 2.0, 5.0, 4.0]), np.array([0.1, 0.2, 0.3, 0.9, 0.4])
    stsb = metrics(get_task("stsb"), x, y)
    ranks_x, ranks_y = np.array([0, 1.5, 1.5, 4, 3]), np.array([0, 1, 2, 4, 3])  # ties share their mean rank
    assert stsb["spearman"] == pytest.approx(pearson(ranks_x, ranks_y))
    assert stsb["pearson"] == pytest.approx(np.corrcoef(x, y)[0, 1])


def write_task(root, task, split, rows, suffix=".jsonl"):
    (root / task).mkdir(parents=True, exist_ok=True)
    path = root / task / f"{split}{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        keys = list(rows[0])
        path.write_text(",".join(keys) + "\n" + "".join(",".join(str(r[k]) for k in keys) + "\n" for r in rows))
    return path


def forty_rows(seed=0):
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "it", "was", "good"]
    rows = []
    for _ in range(40):
        sentence = " ".join(rng.choice(words, 6))
        rows.append({"sentence": sentence, "label": int("cat" in sentence.split())})
    return rows


def test_local_files_are_read_and_checked(tmp_path):
    rows = forty_rows()
    write_task(tmp_path, "sst2", "train", rows, ".csv")
    assert load_rows(get_task("sst2"), "train", str(tmp_path)) == rows
    write_task(tmp_path, "mrpc", "train", [{"sentence1": "a", "label": 1}])
    with pytest.raises(MdlmError, match="needs the fields sentence1, sentence2, label"):
        load_rows(get_task("mrpc"), "train", str(tmp_path))
    write_task(tmp_path, "rte", "train", [{"sentence1": "a", "sentence2": "b", "label": 2}])
    with pytest.raises(MdlmError, match="label 2 is not one of rte's 2 classes"):
        load_rows(get_task("rte"), "train", str(tmp_path))
    with pytest.raises(MdlmError, match="no validation file for sst2"):
        load_rows(get_task("sst2"), "validation", str(tmp_path))
    with pytest.raises(MdlmError, match="unknown task 'wnli'"):
        get_task("wnli")


def test_glue_fine_tunes_a_head_on_a_40_row_task_and_reports_its_metric(tmp_path):
    folder = save_tiny_mlm(tmp_path / "bert")
    rows = forty_rows()
    write_task(tmp_path / "data", "cola", "train", rows)
    write_task(tmp_path / "data", "cola", "validation", rows)  # the rows it trained on: it must fit them
    encoder = load_encoder(str(folder))
    record = run_task(encoder, get_task("cola"), GlueRecipe(epochs=30, lr=2e-3), device=torch.device("cpu"),
                      rows=GlueRows(data_dir=str(tmp_path / "data")))
    assert record["metric"] == "accuracy" and record["train_rows"] == 40
    assert record["value"] == record["validation"]["accuracy"] >= 0.9  # chance is 0.6 (majority class)
    assert set(record["validation"]) == {"accuracy", "matthews", "rows"}


def test_mnli_reports_matched_and_mismatched(tmp_path):
    folder = save_tiny_mlm(tmp_path / "bert")
    rows = [{"premise": "the cat sat", "hypothesis": h, "label": i % 3}
            for i, h in enumerate(["a cat sat", "the mat", "it was good"] * 4)]
    for split in ("train", "validation_matched", "validation_mismatched"):
        write_task(tmp_path / "data", "mnli", split, rows)
    record = run_task(load_encoder(str(folder)), get_task("mnli"), GlueRecipe(epochs=1),
                      device=torch.device("cpu"), rows=GlueRows(data_dir=str(tmp_path / "data"), max_eval_rows=5))
    assert record["matched"]["rows"] == record["mismatched"]["rows"] == 5
    assert record["value"] == record["matched"]["accuracy"]


def test_classifier_takes_the_encoder_and_a_fresh_pooler(tmp_path):
    folder = save_tiny_mlm(tmp_path / "bert")
    encoder = load_encoder(str(folder))
    task = get_task("stsb")
    model = build_classifier(encoder, task, seed=1)
    same = model.bert.embeddings.word_embeddings.weight
    assert torch.equal(same, encoder.weights["embeddings.word_embeddings.weight"])
    assert model.config.problem_type == "regression"
    rows = encode(encoder.tokenizer, task, [{"sentence1": "the cat", "sentence2": "a mat", "label": 2.5}] * 3, 16)
    assert rows[0]["input_ids"][0] == 2 and 1 in rows[0]["token_type_ids"]  # [CLS] a [SEP] b [SEP]
    fine_tune(model, rows, task, GlueRecipe(epochs=1), pad_id=0, device=torch.device("cpu"))
    assert predict(model, rows, task, GlueRecipe(), pad_id=0, device=torch.device("cpu")).shape == (3,)
