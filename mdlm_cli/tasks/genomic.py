"""`mdlm classify`: fine-tune a DNA checkpoint's encoder on a Genomic Benchmarks task
(Table 7).

Caduceus's recipe (slurm_scripts/run_genomics_benchmark.sh, configs/experiment/hg38/
genomic_benchmark.yaml): for each seed, a random 90/10 train/validation split of the task's
training set (seeded by the seed); the whole model fine-tuned with a linear head on the
mean-pooled final hidden states (over the left-padded length) for 10 epochs, AdamW (weight
decay 0.1), cosine schedule with 1% warmup down to 0.1 x lr, gradient clipping 1; the
checkpoint of the best validation accuracy (checked after every epoch) is tested. A sweep
over learning rates {1e-3, 2e-3} and batch sizes {128, 256} picks, per task, the setting of
the best mean validation accuracy over the seeds; its test accuracy is reported as the mean
over the seeds and the max - min spread (Table 7's "±"). The loop is the one GLUE shares
(tasks/finetune.py), the schedule the trainer's (train/optim.py).

`folds` K > 0 is K-fold cross-validation instead (seeds/004's "Top-1 accuracy across 5-fold
cross-validation"): the training set is cut once (by the first seed) into K folds stratified
by class; run k validates on fold k and trains on the other K - 1, and the test accuracy is
reported as mean, standard deviation and max - min over the K runs.

Strands, as Caduceus treats each model: PS averages the head's logits of its two strands;
Ph trains without RC augmentation and averages the logits of x and rc(x) at evaluation
(post-hoc conjoining); Mamba trains with RC augmentation. `rc_augment` / `conjoin` override.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoints.folder import LoadedModel
from ..data.dna import GenomicTask, encode_left_padded, reverse_complement
from ..errors import MdlmError
from ..runtime import derive_seed
from ..train.optim import warmup_cosine
from .finetune import FitPlan, fit


@dataclass
class ClassifyConfig:
    lrs: list[float] = field(default_factory=lambda: [1e-3, 2e-3])
    batch_sizes: list[int] = field(default_factory=lambda: [128, 256])
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    folds: int = 0  # K > 0: stratified K-fold cross-validation (the first seed cuts the folds)
    epochs: int = 10
    val_fraction: float = 0.1
    weight_decay: float = 0.1
    warmup_fraction: float = 0.01
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    max_length: int = 0  # 0: the task's (Caduceus's table; else its longest training sequence)
    rc_augment: bool | None = None  # None: as Caduceus treats the backbone
    conjoin: bool | None = None
    eval_batch_size: int = 256


class SequenceClassifier(nn.Module):
    """A backbone's `features` mean-pooled over the length, then a linear head (`score`)."""

    def __init__(self, backbone: nn.Module, n_classes: int, *,
                 conjoin: bool,
                 complement: list[int]):
        super().__init__()
        self.backbone, self.conjoin = backbone, conjoin
        self.strands = bool(backbone.rcps)  # a trait (models/traits.py): Caduceus-PS
        self.score = nn.Linear(backbone.config.hidden_size, n_classes, bias=False)
        nn.init.normal_(self.score.weight, std=0.02)
        self.register_buffer("complement", torch.tensor(complement), persistent=False)

    def _logits(self, tokens: Tensor) -> Tensor:
        hidden = self.backbone.features(tokens)  # (B, L, H)
        if self.strands:  # PS: (B, L, d, 2) -> the mean of the two strands' logits
            pooled = self.backbone.strands(hidden).mean(dim=1)
            return (self.score(pooled[..., 0]) + self.score(pooled[..., 1])) / 2
        return self.score(hidden.mean(dim=1))

    def forward(self, tokens: Tensor) -> Tensor:  # (B, C)
        logits = self._logits(tokens)
        if self.conjoin and not self.training:
            logits = (logits + self._logits(reverse_complement(tokens, self.complement))) / 2
        return logits


def strand_recipe(model: nn.Module, cfg: ClassifyConfig) -> tuple[bool, bool]:
    """(rc_augment, conjoin) for this backbone, as Caduceus's scripts, unless the config says."""
    ps = bool(model.rcps)  # rcps: Caduceus-PS only (models/traits.py)
    causal = bool(model.causal)
    rc_aug = causal if cfg.rc_augment is None else cfg.rc_augment  # Mamba: RC augmentation
    # Ph: post-hoc conjoining
    conjoin = (not ps and not causal) if cfg.conjoin is None else cfg.conjoin
    return rc_aug, conjoin


@torch.no_grad()
def accuracy(model: nn.Module, x: Tensor, y: Tensor, batch_size: int,
             device: torch.device) -> float:
    model.eval()
    correct = 0
    for i in range(0, len(x), batch_size):
        predicted = model(x[i:i + batch_size].to(device)).argmax(-1)
        correct += int((predicted == y[i:i + batch_size].to(device)).sum())
    return correct / max(len(x), 1)


def validation_split(n: int, fraction: float, g: torch.Generator) -> tuple[Tensor, Tensor]:
    """(validation, training) indices of n sequences: a random `fraction` (at least one) for
    validation, drawn from `g`."""
    order = torch.randperm(n, generator=g)
    n_val = max(1, round(fraction * n))
    return order[:n_val], order[n_val:]


def stratified_folds(y: Tensor, k: int, g: torch.Generator) -> list[Tensor]:
    """k disjoint index sets covering range(len(y)), each holding every class's share (within
    one sequence): each class's indices in a random order from `g`, dealt round robin."""
    if not 2 <= k <= len(y):
        raise MdlmError(f"--folds must be between 2 and the {len(y)} training sequences, got "
                        f"{k}")
    folds: list[list[Tensor]] = [[] for _ in range(k)]
    start = 0  # where each class's deal starts, so the folds' sizes stay within one
    for c in torch.unique(y):
        idx = (y == c).nonzero()[:, 0]
        idx = idx[torch.randperm(len(idx), generator=g)]
        for i in range(k):
            folds[(start + i) % k].append(idx[i::k])
        start = (start + len(idx)) % k
    return [torch.cat(parts) for parts in folds]


def splits(y: Tensor, cfg: ClassifyConfig) -> list[tuple[int, tuple[Tensor, Tensor] | None]]:
    """(seed, (validation, training) indices) per run: a fold each with `folds`, else a seed
    each (None: `fine_tune` draws the seed's random split)."""
    if not cfg.folds:
        return [(seed, None) for seed in cfg.seeds]
    folds = stratified_folds(y, cfg.folds, torch.Generator().manual_seed(cfg.seeds[0]))
    return [(cfg.seeds[0] + i, (fold, torch.cat(folds[:i] + folds[i + 1:])))
            for i, fold in enumerate(folds)]


def new_classifier(loaded: LoadedModel, task: GenomicTask, *,
                   conjoin: bool,
                   seed: int) -> SequenceClassifier:
    """A copy of the checkpoint's backbone under a fresh head, its init seeded by the run's
    seed."""
    torch.manual_seed(derive_seed(seed, "classify-head"))
    return SequenceClassifier(
        copy.deepcopy(loaded.model),
        len(task.classes),
        conjoin=conjoin,
        complement=loaded.tokenizer.complement,
    )


@dataclass(frozen=True)
class EncodedTask:
    """A task's sequences as token ids: the training rows `x` (N, L) and their labels `y`
    (N,), the test rows and theirs."""

    task: GenomicTask
    x: Tensor
    y: Tensor
    x_test: Tensor
    y_test: Tensor

    def validate(self) -> EncodedTask:
        """One label per row, in both splits."""
        for name, rows, labels in (("train", self.x, self.y),
                                   ("test", self.x_test, self.y_test)):
            if len(rows) != len(labels):
                raise MdlmError(f"{self.task.name}: {len(rows)} {name} sequences but "
                                f"{len(labels)} labels")
        return self


def fine_tune(loaded: LoadedModel, data: EncodedTask, *,
              lr: float,
              batch_size: int,
              seed: int,
              cfg: ClassifyConfig,
              device: torch.device,
              split: tuple[Tensor, Tensor] | None = None) -> dict:
    """One seed of one sweep setting: split (the seed's random one unless `split` gives the
    (validation, training) indices), fine-tune (the shared loop, tasks/finetune.py), keep the
    epoch of the best validation accuracy, test."""
    task, x, y = data.task, data.x, data.y
    g = torch.Generator().manual_seed(seed)
    val_idx, train_idx = split or validation_split(len(x), cfg.val_fraction, g)
    rc_aug, conjoin = strand_recipe(loaded.model, cfg)
    model = new_classifier(loaded, task, conjoin=conjoin, seed=seed).to(device)
    steps_per_epoch = -(-len(train_idx) // batch_size)  # the last batch may be short
    total = cfg.epochs * steps_per_epoch

    def batches():
        perm = train_idx[torch.randperm(len(train_idx), generator=g)]
        for i in range(0, len(perm), batch_size):
            rows = perm[i:i + batch_size]
            xb, yb = x[rows].to(device), y[rows].to(device)
            if rc_aug:
                flip = (torch.rand(len(rows), generator=g) < 0.5).to(device)
                xb = torch.where(flip[:, None], reverse_complement(xb, model.complement), xb)
            yield xb, yb

    warmup = max(1, round(cfg.warmup_fraction * total))
    x_val, y_val = x[val_idx], y[val_idx]

    def lr_at(step: int) -> float:
        return warmup_cosine(step, lr=lr, warmup=warmup, total=total,
                             min_lr_ratio=cfg.min_lr_ratio)

    plan = FitPlan(epochs=cfg.epochs, total_steps=total, lr_at=lr_at,
                   weight_decay=cfg.weight_decay, grad_clip=cfg.grad_clip)
    result = fit(model, batches, lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]), plan,
                 evaluate=lambda m: accuracy(m, x_val, y_val, cfg.eval_batch_size, device))
    test = accuracy(model, data.x_test, data.y_test, cfg.eval_batch_size, device)
    return {
        "seed": seed,
        "val_accuracy": result.best_score,
        "best_epoch": result.best_epoch,
        "test_accuracy": test,
        "rc_augment": rc_aug,
        "conjoin": conjoin,
    }


def check_dna_encoder(loaded: LoadedModel) -> None:
    """classify fine-tunes a DNA encoder: a DNA tokeniser and a backbone with `features`."""
    if loaded.tokenizer.complement is None:
        raise MdlmError(
            f"classify needs a DNA model (tokenizer dna); {loaded.path} uses "
            f"{loaded.tokenizer.name}"
        )
    if not hasattr(loaded.model, "features"):
        raise MdlmError(
            "classify fine-tunes a DNA encoder (backbone caduceus or mamba); "
            f"{loaded.path} is a {loaded.config.model.backbone} model"
        )


def classify(loaded: LoadedModel, task: GenomicTask, cfg: ClassifyConfig, device: torch.device,
             on_run=None) -> dict:
    """The whole sweep on one task: every (lr, batch size) x seed; the best setting by mean
    validation accuracy."""
    check_dna_encoder(loaded)
    length = cfg.max_length or task.max_length
    tok = loaded.tokenizer
    x, x_test = (
        encode_left_padded([s for s, _ in rows], tok, length) for rows in (task.train, task.test)
    )
    y, y_test = (torch.tensor([label for _, label in rows]) for rows in (task.train, task.test))
    data = EncodedTask(task, x, y, x_test, y_test).validate()
    t0, settings = time.perf_counter(), []
    for lr in cfg.lrs:
        for batch_size in cfg.batch_sizes:
            runs = []
            for seed, split in splits(y, cfg):
                run = fine_tune(loaded, data, lr=lr, batch_size=batch_size, seed=seed, cfg=cfg,
                                device=device, split=split)
                if split is not None:
                    run["fold"] = len(runs)
                runs.append(run)
                if on_run is not None:
                    on_run(lr, batch_size, runs[-1])
            settings.append({
                "lr": lr,
                "batch_size": batch_size,
                "runs": runs,
                "mean_val_accuracy": statistics.fmean(r["val_accuracy"] for r in runs),
                "mean_test_accuracy": statistics.fmean(r["test_accuracy"] for r in runs),
            })
    report = sweep_report(loaded, task, cfg, settings, length)
    report["seconds"] = time.perf_counter() - t0
    return report


def sweep_report(loaded: LoadedModel, task: GenomicTask, cfg: ClassifyConfig,
                 settings: list[dict], length: int) -> dict:
    """classify's JSON record: the best setting by mean validation accuracy, its test accuracy
    as mean, standard deviation and max - min over the seeds or folds (Table 7's "±" is the
    max - min), and the whole sweep."""
    best = max(settings, key=lambda s: s["mean_val_accuracy"])
    tests = [r["test_accuracy"] for r in best["runs"]]
    return {
        "task": task.name,
        "classes": task.classes,
        "checkpoint": str(loaded.path),
        "backbone": loaded.config.model.backbone,
        "rcps": loaded.config.model.rcps,
        "max_length": length,
        "train_sequences": len(task.train),
        "test_sequences": len(task.test),
        "best": {
            "lr": best["lr"],
            "batch_size": best["batch_size"],
            "test_accuracy_mean": statistics.fmean(tests),
            "test_accuracy_max_minus_min": max(tests) - min(tests),
            "test_accuracy_std": statistics.stdev(tests) if len(tests) > 1 else 0.0,
            "over": f"{cfg.folds} folds" if cfg.folds else f"{len(tests)} seeds",
            "test_accuracies": tests,
        },
        "sweep": settings,
        "config": asdict(cfg),
    }
