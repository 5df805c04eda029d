"""`mdlm glue`: fine-tune a classification / regression head on an encoder, per GLUE task
(Table 4).

The encoder is the Hugging Face model inside an hf-mlm checkpoint (an mdlm run, step folder or
export, EMA weights), or a Hugging Face masked LM itself (hub id or folder: the "before MDLM
fine-tuning" row). `AutoModelForSequenceClassification` of the same architecture gets the
encoder's weights; its pooler (BERT) and classifier are freshly initialised (seeded) whatever
the source, so an encoder saved with or without a pooler is compared on equal terms.

Recipe (`GlueRecipe`, run by the fine-tuning loop both tasks share, tasks/finetune.py): batch
16, as app. D.6 says the paper ran the Hugging Face script; the seeds give no epochs or
learning rate, so those come from the Hugging Face text-classification example's README
(`run_glue.py`: 3 epochs, lr 2e-5, max_seq_length 128), with the Trainer's defaults for the
rest (AdamW, weight decay 0, no warmup, linear decay to 0, gradient clipping at 1.0, seed 42).
Evaluation on GLUE's validation splits (its test labels are hidden).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import MdlmError
from .finetune import FitPlan, epochs_for, fit
from .glue_data import GlueTask, load_rows, metrics, subset


@dataclass
class GlueRecipe:
    batch_size: int = 16  # app. D.6
    epochs: float = 3.0  # the HF text-classification example
    lr: float = 2e-5  # idem
    max_length: int = 128  # idem
    weight_decay: float = 0.0  # HF Trainer defaults from here on
    grad_clip: float = 1.0
    seed: int = 42
    eval_batch_size: int = 64


@dataclass
class Encoder:
    """What a classifier is built from: the HF config, the encoder's weights, the tokeniser."""

    name: str  # where it was loaded from, and what it is
    config: object  # transformers.PretrainedConfig
    weights: dict[str, torch.Tensor]  # the base model's state dict (no MLM head)
    tokenizer: object  # a transformers tokeniser


def load_encoder(checkpoint: str) -> Encoder:
    """An hf-mlm checkpoint's encoder, or a Hugging Face masked LM's (hub id, folder, packaged
    name)."""
    from ..checkpoints.load import load_checkpoint
    from ..checkpoints.pretrained import pretrained_source
    from ..models import HFMaskedLM

    path = Path(checkpoint)
    if not path.exists() and pretrained_source(checkpoint) is None and "/" not in checkpoint:
        from ..io.hub import download  # a bare hub name such as bert-base-uncased

        checkpoint = str(download(checkpoint))
    loaded = load_checkpoint(checkpoint)
    if not isinstance(loaded.model, HFMaskedLM):
        raise MdlmError(
            f"{checkpoint} holds a {loaded.config.model.backbone} model; mdlm glue "
            "fine-tunes an encoder: an hf-mlm checkpoint or a Hugging Face masked LM"
        )
    hf = loaded.model.hf
    weights = {k: v.detach().clone() for k, v in hf.base_model.state_dict().items()}
    return Encoder(
        f"{loaded.path}: {loaded.model.describe()}", hf.config, weights, loaded.tokenizer.hf
    )


def build_classifier(encoder: Encoder, task: GlueTask, seed: int) -> nn.Module:
    """AutoModelForSequenceClassification with the encoder's weights; pooler and classifier
    fresh."""
    from transformers import AutoModelForSequenceClassification

    from ..models.hf_mlm import quiet_transformers

    config = copy.deepcopy(encoder.config)
    config.num_labels = task.num_labels
    config.problem_type = "regression" if task.num_labels == 1 else "single_label_classification"
    with quiet_transformers(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config, trust_remote_code=False)
    missing, unexpected = model.base_model.load_state_dict(encoder.weights, strict=False)
    foreign = [k for k in missing if not k.startswith("pooler.")] + list(unexpected)
    if foreign:
        raise MdlmError(
            f"the encoder of {encoder.name} does not fit {type(model).__name__} ({foreign[0]})"
        )
    return model


def encode(tokenizer, task: GlueTask, rows: list[dict], max_length: int) -> list[dict]:
    """Token ids (and segment ids where the model takes them) of every row, truncated to
    max_length."""
    texts = [[row[f] for row in rows] for f in task.fields]
    enc = tokenizer(*texts, truncation=True, max_length=max_length)
    keys = [
        k for k in ("input_ids", "token_type_ids")
        if k in enc and k in tokenizer.model_input_names
    ]
    return [{**{k: enc[k][i] for k in keys}, "label": row["label"]}
            for i, row in enumerate(rows)]


def collate(examples: list[dict], pad_id: int, device: torch.device, regression: bool) -> dict:
    """A padded batch (B, longest row) with its attention mask and labels."""
    width = max(len(e["input_ids"]) for e in examples)
    batch = {}
    for key in ("input_ids", "token_type_ids"):
        if key in examples[0]:
            fill = pad_id if key == "input_ids" else 0
            batch[key] = torch.tensor([e[key] + [fill] * (width - len(e[key]))
                                       for e in examples])
    batch["attention_mask"] = torch.tensor(
        [[1] * len(e["input_ids"]) + [0] * (width - len(e["input_ids"])) for e in examples]
    )
    labels = [e["label"] for e in examples]
    batch["labels"] = torch.tensor(labels, dtype=torch.float32 if regression else torch.long)
    return {k: v.to(device) for k, v in batch.items()}


def fine_tune(model: nn.Module, train: list[dict], task: GlueTask, recipe: GlueRecipe, *,
              pad_id: int,
              device: torch.device,
              on_step: Callable[[int, int, float], None] | None = None) -> float:
    """The shared loop (tasks/finetune.py) with the HF Trainer's recipe: AdamW with a linear
    decay to 0 over `epochs` (fractional epochs end mid-epoch), gradients clipped, no
    evaluation during training; returns the mean loss of the last epoch."""
    model.to(device)
    steps_per_epoch = math.ceil(len(train) / recipe.batch_size)
    total = max(1, math.ceil(recipe.epochs * steps_per_epoch))
    rng = np.random.default_rng(recipe.seed)

    def batches():
        order = rng.permutation(len(train))
        for start in range(0, len(train), recipe.batch_size):
            rows = [train[i] for i in order[start:start + recipe.batch_size]]
            yield collate(rows, pad_id, device, task.num_labels == 1)

    plan = FitPlan(epochs=epochs_for(total, steps_per_epoch), total_steps=total,
                   lr_at=lambda step: recipe.lr * max(0.0, 1 - step / total),
                   weight_decay=recipe.weight_decay, grad_clip=recipe.grad_clip)
    result = fit(model, batches, lambda m, batch: m(**batch).loss, plan, on_step=on_step)
    return result.last_epoch_loss


@torch.no_grad()
def predict(model: nn.Module, rows: list[dict], task: GlueTask, recipe: GlueRecipe, *,
            pad_id: int,
            device: torch.device) -> np.ndarray:
    """Class predictions (or regression outputs) for every row."""
    model.eval()
    out = []
    for start in range(0, len(rows), recipe.eval_batch_size):
        batch = collate(
            rows[start : start + recipe.eval_batch_size], pad_id, device, task.num_labels == 1
        )
        batch.pop("labels")
        logits = model(**batch).logits.float().cpu()
        out.append(logits[:, 0] if task.num_labels == 1 else logits.argmax(-1))
    return torch.cat(out).numpy()


@dataclass(frozen=True)
class GlueRows:
    """The rows a task runs on: local files under `data_dir` (None: the built-in or Hub source,
    read with `load_dataset`), at most `max_train_rows` training rows drawn at random and the
    first `max_eval_rows` of each evaluation split (0: all of them)."""

    data_dir: str | None = None
    max_train_rows: int = 0
    max_eval_rows: int = 0
    load_dataset: Callable | None = None

    def train(self, task: GlueTask, seed: int) -> list[dict]:
        rows = load_rows(task, "train", self.data_dir, self.load_dataset)
        return subset(rows, self.max_train_rows, seed)

    def evaluation(self, task: GlueTask, split: str) -> list[dict]:
        rows = load_rows(task, split, self.data_dir, self.load_dataset)
        return rows[:self.max_eval_rows] if self.max_eval_rows > 0 else rows


def run_task(encoder: Encoder, task: GlueTask, recipe: GlueRecipe, *,
             device: torch.device,
             rows: GlueRows | None = None,
             on_step: Callable[[int, int, float], None] | None = None) -> dict:
    """Fine-tune on the task's train split, evaluate on its validation split(s) (`rows`: which
    rows; default all of the built-in or Hub source's): one JSON record."""
    t0 = time.perf_counter()
    tok, rows = encoder.tokenizer, rows or GlueRows()
    train = rows.train(task, recipe.seed)
    model = build_classifier(encoder, task, recipe.seed)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    train_examples = encode(tok, task, train, recipe.max_length)
    loss = fine_tune(model, train_examples, task, recipe,
                     pad_id=pad_id, device=device, on_step=on_step)
    record = {
        "task": task.name,
        "metric": task.metric,
        "train_rows": len(train),
        "final_train_loss": loss,
    }
    for split in task.eval_splits:
        evaluated = rows.evaluation(task, split)
        examples = encode(tok, task, evaluated, recipe.max_length)
        predictions = predict(model, examples, task, recipe, pad_id=pad_id, device=device)
        labels = np.array([r["label"] for r in evaluated])
        name = split.replace("validation_", "") if len(task.eval_splits) > 1 else "validation"
        record[name] = {**metrics(task, predictions, labels), "rows": len(evaluated)}
    first = record["matched" if "matched" in record else "validation"]
    record.update(value=first[task.metric], seconds=time.perf_counter() - t0)
    return record


def recipe_dict(recipe: GlueRecipe) -> dict:
    return asdict(recipe)
