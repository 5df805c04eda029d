"""GLUE tasks for `mdlm glue` (Table 4): what each one reads, its metric, where its rows come
from.

Rows are dicts with the task's text fields and `label` (an int class, a float for STS-B). They
come from Hugging Face `nyu-mll/glue` (the network once, then the datasets cache), from local
files in the same format (`--data DIR`: DIR/TASK/SPLIT.jsonl, .csv or .tsv, SPLIT = train,
validation, or validation_matched / validation_mismatched for MNLI), or, for the offline
task `bigtxt-swap`, from the embedded corpus. Metrics are the paper's (tab. 4): F1 for QQP
and MRPC, Spearman for STS-B, accuracy otherwise (CoLA's Matthews correlation and STS-B's
Pearson are reported beside them).
"""

from __future__ import annotations

import csv
import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import MdlmError


@dataclass(frozen=True)
class GlueTask:
    name: str
    fields: tuple[str, ...]  # one sentence, or a pair
    num_labels: int  # 1 = regression (STS-B)
    metric: str  # the paper's: accuracy | f1 | spearman
    eval_splits: tuple[str, ...] = (
        "validation",
    )  # GLUE's test labels are hidden: its validation splits
    hub: bool = True  # in nyu-mll/glue (else built in)


TASKS = {
    t.name: t
    for t in (
        GlueTask("cola", ("sentence",), 2, "accuracy"),
        GlueTask("sst2", ("sentence",), 2, "accuracy"),
        GlueTask("mrpc", ("sentence1", "sentence2"), 2, "f1"),
        GlueTask("qqp", ("question1", "question2"), 2, "f1"),
        GlueTask("stsb", ("sentence1", "sentence2"), 1, "spearman"),
        GlueTask(
            "mnli",
            ("premise", "hypothesis"),
            3,
            "accuracy",
            ("validation_matched", "validation_mismatched"),
        ),
        GlueTask("qnli", ("question", "sentence"), 2, "accuracy"),
        GlueTask("rte", ("sentence1", "sentence2"), 2, "accuracy"),
        # offline, CoLA's format
        GlueTask("bigtxt-swap", ("sentence",), 2, "accuracy", hub=False),
    )
}
GLUE = [name for name, task in TASKS.items() if task.hub]
LOCAL_SUFFIXES = (".jsonl", ".csv", ".tsv")


def get_task(name: str) -> GlueTask:
    if name not in TASKS:
        raise MdlmError(f"unknown task {name!r}; choose from: {', '.join(TASKS)}")
    return TASKS[name]


# ---------------------------------------------------------------------- rows

def load_rows(
    task: GlueTask, split: str, data_dir: str | None = None, load_dataset=None
) -> list[dict]:
    """The rows of one split: local files under `data_dir` first, then the built-in or hub
    source."""
    if data_dir is not None:
        return _local_rows(task, split, Path(data_dir))
    if not task.hub:
        return corpus_swap_rows(split)
    return _hub_rows(task, split, load_dataset)


def _local_rows(task: GlueTask, split: str, root: Path) -> list[dict]:
    path = next((root / task.name / f"{split}{s}" for s in LOCAL_SUFFIXES
                 if (root / task.name / f"{split}{s}").is_file()), None)
    if path is None:
        raise MdlmError(
            f"no {split} file for {task.name} under {root}: expected "
            f"{root / task.name}/{split}.jsonl, .csv or .tsv"
        )
    if path.suffix == ".jsonl":
        raw = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                raw.append(json.loads(line))
            except json.JSONDecodeError:
                raise MdlmError(f"{path}:{n} is not JSON") from None
    else:
        with open(path, newline="", encoding="utf-8") as f:
            raw = list(csv.DictReader(f, delimiter="\t" if path.suffix == ".tsv" else ","))
    return [_row(task, r, f"{path}:{i + 1}") for i, r in enumerate(raw)]


def _row(task: GlueTask, record, where: str) -> dict:
    if not isinstance(record, dict) or any(k not in record for k in (*task.fields, "label")):
        raise MdlmError(
            f"{where}: a {task.name} row needs the fields {', '.join((*task.fields, 'label'))}"
        )
    try:
        label = float(record["label"]) if task.num_labels == 1 else int(float(record["label"]))
    except (TypeError, ValueError):
        raise MdlmError(f"{where}: label {record['label']!r} is not a number") from None
    if task.num_labels > 1 and not 0 <= label < task.num_labels:
        raise MdlmError(
            f"{where}: label {label} is not one of {task.name}'s {task.num_labels} classes"
        )
    return {**{k: str(record[k]) for k in task.fields}, "label": label}


def _hub_rows(task: GlueTask, split: str, load_dataset) -> list[dict]:
    if load_dataset is None:
        from datasets import load_dataset

        from ..io.hub import hub_offline

        hub_offline()
    try:
        ds = load_dataset("nyu-mll/glue", task.name, split=split)
    except Exception as e:  # noqa: BLE001 - any failure here is "could not load"
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise MdlmError(
            f"could not load GLUE {task.name} ({split}) from the Hugging Face Hub (no "
            f"network?): {first}. Offline, pass --data DIR with {task.name}/{split}.jsonl "
            "files"
        ) from None
    return [_row(task, r, f"nyu-mll/glue {task.name} {split}") for r in ds]


def subset(rows: list[dict], n: int, seed: int) -> list[dict]:
    """`n` rows drawn without replacement (all rows if n <= 0 or there are fewer)."""
    if n <= 0 or n >= len(rows):
        return rows
    return random.Random(seed).sample(rows, n)


# ---------------------------------------------------------------------- the offline task

def corpus_swap_rows(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
    """bigtxt-swap, a CoLA-format acceptability task from the embedded corpus: sentences of
    8-30 words from the documents of one split (train: train documents; validation: valid
    documents), half of them kept (label 1) and half with two words of different spelling
    swapped (label 0). The same rows on every call (seed 0); 2,000 train, 500 validation."""
    from ..data.sources import BigTxt, split_of

    source_split = {"train": "train", "validation": "valid"}.get(split)
    if source_split is None:
        raise MdlmError(f"bigtxt-swap has the splits train and validation (not {split})")
    docs = BigTxt().all_documents()
    sentences = [
        s
        for i, doc in enumerate(docs)
        if split_of(i, len(docs)) == source_split
        for s in re.split(r"(?<=[.!?])\s+", doc.replace("\n", " "))
        if 8 <= len(s.split()) <= 30
    ]
    rng = random.Random(f"bigtxt-swap/{split}/{seed}")
    chosen = rng.sample(sentences, min(n or (2000 if split == "train" else 500), len(sentences)))
    rows = []
    for i, sentence in enumerate(chosen):
        words = sentence.split()
        if i % 2:  # label 0: two words that differ, swapped
            a, b = rng.sample(range(len(words)), 2)
            while words[a].lower() == words[b].lower():
                a, b = rng.sample(range(len(words)), 2)
            words[a], words[b] = words[b], words[a]
        rows.append({"sentence": " ".join(words), "label": 0 if i % 2 else 1})
    return rows


# ---------------------------------------------------------------------- metrics

def metrics(task: GlueTask, predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """The task's metrics: accuracy (+ F1 for MRPC/QQP, + Matthews for CoLA); Spearman and
    Pearson for regression."""
    if task.num_labels == 1:
        return {
            "spearman": pearson(_ranks(predictions), _ranks(labels)),
            "pearson": pearson(predictions, labels),
        }
    out = {"accuracy": float((predictions == labels).mean())}
    if task.metric == "f1":
        out["f1"] = f1(predictions, labels)
    if task.name == "cola":
        out["matthews"] = matthews(predictions, labels)
    return out


def f1(predictions: np.ndarray, labels: np.ndarray) -> float:
    """F1 of the positive class (label 1)."""
    tp = float(((predictions == 1) & (labels == 1)).sum())
    fp, fn = (
        float(((predictions == 1) & (labels != 1)).sum()),
        float(((predictions != 1) & (labels == 1)).sum()),
    )
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews(predictions: np.ndarray, labels: np.ndarray) -> float:
    tp, tn = (
        float(((predictions == 1) & (labels == 1)).sum()),
        float(((predictions == 0) & (labels == 0)).sum()),
    )
    fp, fn = (
        float(((predictions == 1) & (labels == 0)).sum()),
        float(((predictions == 0) & (labels == 1)).sum()),
    )
    denominator = ((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)) ** 0.5
    return (tp * tn - fp * fn) / denominator if denominator else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    x, y = x - x.mean(), y - y.mean()
    denominator = float(np.sqrt((x * x).sum() * (y * y).sum()))
    return float((x * y).sum() / denominator) if denominator else 0.0


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (Spearman's rho is Pearson's r of the ranks)."""
    _, inverse, counts = np.unique(
        np.asarray(x, dtype=np.float64), return_inverse=True, return_counts=True
    )
    ends = np.cumsum(counts)
    return ((ends - counts + ends - 1) / 2.0)[inverse]
